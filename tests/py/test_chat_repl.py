"""test_chat_repl: `varent chat` driven as a person drives it (issue 23 item 4). A tmux
session types into the chat and the test reads the screen (tmux capture-pane): the
banner, history with Up, slash commands that never reach the model, a multi-line message
(trailing backslash and bracketed paste), Ctrl-C mid-reply and at the prompt, the context
shifting its oldest turns out, Ctrl-D. /save writes the conversation as JSON, so what the
model was sent is checked exactly, not guessed from the screen.

Models: stories260K with the Llama 2 chat template (fast: context shift, multi-line), and
a random 10M-parameter Llama with the same tokenizer (slow enough to stop mid-reply; its
end-of-turn logits are zero, so replies run to -n)."""
import json
import os
import shutil
import subprocess
import time

from slowmodel import write_slow_model
from vtest import TESTDATA, VARENT, check, done, skip, stories_dir, tmpdir

work = tmpdir("chat-repl")
if not shutil.which("tmux"):
    skip("chat_repl_tmux", "tmux is not installed (tools/install-deps.sh installs it)")
    done()

fast = os.path.join(work, "fast")
shutil.copytree(stories_dir("f32"), fast)
template = open(os.path.join(TESTDATA, "chat-templates", "meta-llama-Llama-2-chat.jinja")).read()
cfg = json.load(open(os.path.join(fast, "tokenizer_config.json")))
cfg["chat_template"] = template
json.dump(cfg, open(os.path.join(fast, "tokenizer_config.json"), "w"))


slow = os.path.join(work, "slow")
write_slow_model(slow, fast)

SOCKS = []  # one tmux server per chat run: a server being killed never takes the next session
ENV = {**os.environ, "HOME": work, "VARENT_HISTORY": os.path.join(work, "history"), "TERM": "xterm-256color"}


def tmux(*args, check_rc=True):
    r = subprocess.run(["tmux", "-L", SOCKS[-1], *args], capture_output=True, text=True, env=ENV)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"tmux {args}: {r.stderr}")
    return r.stdout


def screen():
    return tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "chat")


def wait_for(pred, timeout=60):
    """Polls the screen until pred(text) holds; returns the last screen and the verdict."""
    end = time.time() + timeout
    while True:
        s = screen()
        if pred(s) or time.time() > end:
            return s, pred(s)
        time.sleep(0.1)


def start(args):
    if SOCKS:
        tmux("kill-server", check_rc=False)
    SOCKS.append(f"varent-test-{os.getpid()}-{len(SOCKS)}")
    cmd = " ".join([VARENT, "chat", *map(str, args)]) + "; echo EXIT=$?; sleep 600"
    tmux("new-session", "-d", "-s", "chat", "-x", "160", "-y", "50", cmd)


def keys(*k):
    tmux("send-keys", "-t", "chat", *k)


def type_line(text):
    keys("-l", text)
    keys("Enter")


def prompt_back(s, n):
    """The n-th prompt is on screen (n replies finished)."""
    return sum(1 for line in s.splitlines() if line.startswith(">")) >= n


def saved(path):
    return json.load(open(path)) if os.path.exists(path) else None


try:
    # ---- the slow model: banner, Ctrl-C mid-reply, history, /system, /reset ----
    start(["-m", slow, "--temp", "0", "-n", 1500, "--ctx", 2048])
    s, ok = wait_for(lambda s: "/help" in s and s.rstrip().endswith(">"))
    editing = "no line editing" not in s
    check(ok and "context 2048 tokens" in s and "greedy" in s and "slow" in s, "repl_banner", s[-800:])
    if not editing:
        skip("repl_line_editing", "varent was built without libedit (apt-get install libedit-dev; make)")
    type_line("Tell me a long story.")
    # Ctrl-C once the reply has some text on screen (under load the first tokens can be
    # slow, and a stop before any text keeps an empty reply).
    def reply_started(s):
        after = s.split("Tell me a long story.", 1)[-1].splitlines()
        return sum(len(l.strip()) for l in after if not l.startswith(">")) >= 12
    s, ok = wait_for(reply_started, 60)
    keys("C-c")
    s, ok = wait_for(lambda s: "[stopped]" in s and prompt_back(s, 2), 30)
    check(ok and "EXIT=" not in s, "repl_ctrl_c_stops_reply_keeps_chat", s[-1200:])
    save1 = os.path.join(work, "after-stop.json")
    type_line(f"/save {save1}")
    wait_for(lambda s: "saved" in s, 10)
    conv = saved(save1)
    check(conv and len(conv) == 2 and conv[0] == {"role": "user", "content": "Tell me a long story."}
          and conv[1]["role"] == "assistant" and 0 < len(conv[1]["content"]) and "/save" not in json.dumps(conv),
          "repl_stopped_reply_kept_commands_not_sent", str(conv)[:400])
    if editing:
        keys("Up")
        keys("Up")  # the /save line, then the message before it
        s, ok = wait_for(lambda s: s.rstrip().splitlines()[-1] == "> Tell me a long story.", 10)
        check(ok, "repl_history_up", s.rstrip().splitlines()[-1:])
        keys("C-c")  # drops the recalled line; not counted toward quitting
        s, ok = wait_for(lambda s: s.rstrip().endswith(">") and s.count("^C") >= 1, 10)
    type_line("/system Be brief.")
    s, ok = wait_for(lambda s: "system prompt set" in s, 10)
    check(ok, "repl_system_command", s[-300:])
    type_line("/reset")
    s, ok = wait_for(lambda s: "[y/N]" in s, 10)
    check(ok and "clear the conversation (1 turn)?" in s, "repl_reset_asks", s[-300:])
    type_line("y")
    s, ok = wait_for(lambda s: "conversation cleared (system prompt kept)" in s, 10)
    check(ok, "repl_reset_confirmed", s[-300:])
    save2 = os.path.join(work, "after-reset.json")
    type_line(f"/save {save2}")
    wait_for(lambda s: s.count("saved") >= 2, 10)
    check(saved(save2) == [{"role": "system", "content": "Be brief."}], "repl_reset_keeps_system", str(saved(save2)))
    type_line("/nonsense")
    s, ok = wait_for(lambda s: "unknown command /nonsense" in s, 10)
    check(ok, "repl_unknown_command", s[-300:])
    keys("C-c")
    s, ok = wait_for(lambda s: "Ctrl-C again" in s, 10)
    keys("C-c")
    s, ok = wait_for(lambda s: "EXIT=" in s, 10)
    check(ok and "EXIT=130" in s, "repl_second_ctrl_c_at_empty_prompt_quits", s[-300:])

    # ---- the fast model: multi-line, bracketed paste, context shift, Ctrl-D ----
    start(["-m", fast, "--temp", "0", "-n", 40, "--ctx", 96])
    s, ok = wait_for(lambda s: s.rstrip().endswith(">"))
    keys("-l", "The dog ran \\")
    keys("Enter")
    s, ok = wait_for(lambda s: s.rstrip().endswith("..."), 10)
    check(ok, "repl_backslash_continues", s[-300:])
    type_line("to the park.")
    s, ok = wait_for(lambda s: prompt_back(s, 2), 30)
    if editing:
        tmux("set-buffer", "-b", "p", "The cat sat.\nThe cat ran.\nThe end")
        tmux("paste-buffer", "-p", "-b", "p", "-t", "chat")
        # every pasted line is on the screen, the first one too (issue 33 row 6: it was sent unseen)
        s, ok = wait_for(lambda s: "> The cat sat.\n... The cat ran." in s and s.rstrip().endswith("... The end"), 10)
        check(ok, "repl_bracketed_paste_shown", s[-400:])
        keys("Enter")
        s, ok = wait_for(lambda s: prompt_back(s, 3), 30)
    for i in range(4):
        type_line(f"Tell me about the bird number {i}.")
        s, ok = wait_for(lambda s, n=(4 if editing else 3) + i: prompt_back(s, n), 30)
    save3 = os.path.join(work, "shifted.json")
    type_line(f"/save {save3}")
    s, ok = wait_for(lambda s: "saved" in s, 10)
    conv = saved(save3) or []
    users = [m["content"] for m in conv if m["role"] == "user"]
    errors = [l for l in s.splitlines() if l.startswith("varent chat:") and "M params" not in l]
    check("[context full (96 tokens): dropped the oldest" in s and not errors and conv
          and users[-1] == "Tell me about the bird number 3." and conv[-1]["role"] == "assistant"
          and "The dog ran \nto the park." not in users, "repl_context_shift", f"{users} {s[-600:]}")
    keys("C-d")
    s, ok = wait_for(lambda s: "EXIT=" in s, 10)
    check(ok and "\nEXIT=0" in s, "repl_ctrl_d_exits_with_newline", s[-200:])

    # the multi-line message was one user turn (a fresh run: the shift above dropped it)
    start(["-m", fast, "--temp", "0", "-n", 8])
    wait_for(lambda s: s.rstrip().endswith(">"))
    keys("-l", "The dog ran \\")
    keys("Enter")
    type_line("to the park.")
    wait_for(lambda s: prompt_back(s, 2), 30)
    if editing:
        tmux("set-buffer", "-b", "p", "The cat sat.\nThe cat ran.\nThe end")
        tmux("paste-buffer", "-p", "-b", "p", "-t", "chat")
        wait_for(lambda s: s.rstrip().endswith("... The end"), 10)
        keys("Enter")
        wait_for(lambda s: prompt_back(s, 3), 30)
    save4 = os.path.join(work, "multiline.json")
    type_line(f"/save {save4}")
    wait_for(lambda s: "saved" in s, 10)
    users = [m["content"] for m in saved(save4) or [] if m["role"] == "user"]
    want = ["The dog ran \nto the park."] + (["The cat sat.\nThe cat ran.\nThe end"] if editing else [])
    check(users == want, "repl_multiline_is_one_message", str(users))
    type_line("/quit")
    s, ok = wait_for(lambda s: "EXIT=0" in s, 10)
    check(ok, "repl_quit", s[-200:])
finally:
    if SOCKS:
        tmux("kill-server", check_rc=False)
done()
