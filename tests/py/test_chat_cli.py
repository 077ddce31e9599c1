"""`varent run --chat` and `varent chat` on stories260K given the Llama 2 chat template.
The chat paths must feed exactly the jinja2-rendered conversation: their greedy answer
equals `varent run --ids` on the ids of the jinja2 rendering, and a second turn (which
reuses the cached prefix) equals a fresh run on the whole rendered conversation."""
import json
import os
import shutil

from jinja2.sandbox import ImmutableSandboxedEnvironment

from vtest import TESTDATA, check, done, stories_dir, tmpdir, varent

work = tmpdir("chat")
model = os.path.join(work, "model")
shutil.copytree(stories_dir("f32"), model)
template = open(os.path.join(TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
cfg_path = os.path.join(model, "tokenizer_config.json")
cfg = json.load(open(cfg_path))
cfg["chat_template"] = template
json.dump(cfg, open(cfg_path, "w"))


def render(messages):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(Exception(m))
    return env.from_string(template).render(messages=messages, bos_token="<s>", eos_token="</s>",
                                            add_generation_prompt=True)


def ids_of(text):
    r = varent("tokenize", "-m", model, text)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def greedy_ids(ids, n=24):
    r = varent("run", "-m", model, "--temp", "0", "-n", n, "--ids", ",".join(map(str, ids)))
    return r.stdout.strip()


msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me about a cat."}]
r = varent("run", "-m", model, "--chat", "--system", msgs[0]["content"], "-p", msgs[1]["content"], "--temp", "0", "-n", 24)
want = greedy_ids(ids_of(render(msgs)))
check(r.returncode == 0 and r.stdout.strip() == want, "run_chat_feeds_jinja_rendering", f"{r.stdout!r} vs {want!r} {r.stderr}")

# Two turns in `varent chat`: turn 2 reuses the cache and must equal a fresh run.
u1, u2 = "Tell me about a dog.", "What did the dog do next?"
r = varent("chat", "-m", model, "--temp", "0", "-n", 24, stdin=f"{u1}\n{u2}\n/reset\n{u1}\n")
lines = r.stdout.split("\n")
check(r.returncode == 0 and len(lines) >= 3, "chat_runs_three_turns", f"{r.stdout!r} {r.stderr}")
a1 = greedy_ids(ids_of(render([{"role": "user", "content": u1}])))
check(len(a1) > 10 and lines[0].strip() == a1, "chat_turn1_matches", f"{lines[0]!r} vs {a1!r}")
conv = [{"role": "user", "content": u1}, {"role": "assistant", "content": lines[0].strip()}, {"role": "user", "content": u2}]
a2 = greedy_ids(ids_of(render(conv)))
check(len(lines) > 1 and len(a2) > 10 and lines[1].strip() == a2, "chat_turn2_reuses_cache_correctly", f"{lines[1:2]!r} vs {a2!r}")
check(len(lines) > 2 and lines[2].strip() == a1, "chat_reset_starts_over", f"{lines[2:3]!r} vs {a1!r}")

# Errors: no template, unknown template name, --chat without -p.
plain = stories_dir("f32")
r = varent("run", "-m", plain, "--chat", "-p", "hi")
check(r.returncode == 1 and "chat_template" in r.stderr, "no_template_error", r.stderr)
r = varent("run", "-m", model, "--chat", "--chat-template", "nope", "-p", "hi")
check(r.returncode == 2 and "nope" in r.stderr, "unknown_template_name", r.stderr)
r = varent("run", "-m", model, "--chat")
check(r.returncode == 2 and "-p" in r.stderr, "chat_needs_prompt", r.stderr)
done()
