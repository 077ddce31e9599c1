"""test_chat_pipe: `varent chat` with stdin not a terminal, the line protocol scripts use
(issue 23 item 4): one message per line, slash commands that never reach the model, a
trailing backslash continuing a message, and a full context that shifts its oldest turns
out instead of failing every later turn. /save shows exactly what the model was sent."""
import json
import os
import shutil

from vtest import TESTDATA, check, done, stories_dir, tmpdir, varent

work = tmpdir("chat-pipe")
model = os.path.join(work, "model")
shutil.copytree(stories_dir("f32"), model)
cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
cfg["chat_template"] = open(os.path.join(TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
json.dump(cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))


def chat(stdin, *extra, n=24):
    return varent("chat", "-m", model, "--temp", "0", "-n", n, *extra, stdin=stdin)


u1 = "Tell me about a dog."
plain = chat(f"{u1}\n")
f1 = os.path.join(work, "one.json")
r = chat(f"/help\n/nonsense\n/system Be kind.\n/system -\n{u1}\n/save {f1}\n/quit\nnever sent\n")
check(r.returncode == 0 and plain.returncode == 0 and r.stdout == plain.stdout and r.stdout.count("\n") == 1,
      "pipe_commands_never_reach_model", f"{r.stdout!r} vs {plain.stdout!r} {r.stderr[-300:]}")
check("/reset" in r.stderr and "unknown command /nonsense" in r.stderr and "system prompt removed" in r.stderr,
      "pipe_command_messages_on_stderr", r.stderr[-600:])
conv = json.load(open(f1)) if os.path.exists(f1) else []
check([m["role"] for m in conv] == ["user", "assistant"] and conv[0]["content"] == u1
      and conv[1]["content"].strip() == plain.stdout.strip(), "pipe_save", str(conv))

# /load then a turn equals the same two turns typed.
u2 = "What did the dog do next?"
both = chat(f"{u1}\n{u2}\n")
r = chat(f"/load {f1}\n{u2}\n")
check(r.returncode == 0 and both.stdout.split("\n")[1] == r.stdout.split("\n")[0], "pipe_load_continues",
      f"{r.stdout!r} vs {both.stdout!r} {r.stderr[-300:]}")
f2 = os.path.join(work, "two.json")
r = chat(f"/system Be kind.\n/save {f2}\n")
bad = os.path.join(work, "bad.json")
open(bad, "w").write('[{"role": "wizard", "content": "x"}]')
r = chat(f"/load {bad}\n/save {f1}\n")
check("unknown role 'wizard'" in r.stderr and "not replaced" in r.stderr and json.load(open(f1)) == conv,
      "pipe_bad_load_and_existing_save_change_nothing", r.stderr[-400:])
check(json.load(open(f2)) == [{"role": "system", "content": "Be kind."}], "pipe_system_set", open(f2).read())

# "//" sends a message that starts with "/"; a trailing backslash continues it.
f3 = os.path.join(work, "three.json")
r = chat(f"//etc is a folder\nThe dog ran \\\nto the park.\n/save {f3}\n")
users = [m["content"] for m in json.load(open(f3)) if m["role"] == "user"] if os.path.exists(f3) else []
check(r.returncode == 0 and users == ["/etc is a folder", "The dog ran \nto the park."] and r.stdout.count("\n") == 2,
      "pipe_slash_escape_and_backslash_continuation", f"{users} {r.stdout!r}")

# A full context shifts: every turn of `--ctx 96 -n 40` is answered (issue 23's row:
# turn 2 was cut off silently and every later turn failed until /reset).
turns = [f"Tell me about the cat number {i}." for i in range(5)]
f4 = os.path.join(work, "shift.json")
r = chat("".join(t + "\n" for t in turns) + f"/save {f4}\n", "--ctx", 96, n=40)
conv = json.load(open(f4)) if os.path.exists(f4) else []
check(r.returncode == 0 and len(conv) >= 2 and conv[-2] == {"role": "user", "content": turns[-1]}
      and len(conv[-1]["content"].strip()) > 5 and "[context full (96 tokens): dropped the oldest" in r.stderr
      and "do not fit" not in r.stderr and "varent chat:" not in r.stderr, "pipe_context_shift_answers_every_turn",
      f"{conv} {r.stderr[-600:]}")
# A message alone larger than the context is refused; the chat goes on.
r = chat("word " * 200 + "\n" + turns[0] + "\n", "--ctx", 96, n=10)
check(r.returncode == 0 and "more than the context of 96 holds" in r.stderr and r.stdout.count("\n") == 1
      and len(r.stdout.strip()) > 3, "pipe_oversized_message_refused_chat_continues", f"{r.stdout!r} {r.stderr[-300:]}")
done()
