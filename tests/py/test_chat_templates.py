"""Chat templates: `varent template` must match the real Hugging Face templates rendered by
jinja2 the way transformers' apply_chat_template does, byte for byte."""
import datetime
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

import vtest

TPL_DIR = os.path.join(vtest.TESTDATA, "chat-templates")
TMP = vtest.tmpdir("chat")


class TemplateError(Exception):
    pass


def hf_env():
    """The jinja2 environment of transformers' chat_template_utils."""
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = hf_env()

# Special tokens each model's tokenizer_config gives the template.
TOKENS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen": {"bos_token": None, "eos_token": "<|im_end|>"},
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "llama2": {"bos_token": "<s>", "eos_token": "</s>"},
}

# file -> (token set, extra variants: list of (name, cli flags, template kwargs))
DATE = ("date", ["--date", "15 Mar 2025"], {"date_string": "15 Mar 2025"})
NOTHINK = ("nothink", ["--no-think"], {"enable_thinking": False})
TEMPLATES = {
    "meta-llama-Meta-Llama-3-tokenizer_config.jinja": ("llama3", []),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3", [DATE]),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3", [DATE]),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("qwen", []),
    "Qwen-Qwen3-0.6B.jinja": ("qwen", [NOTHINK]),
    "Qwen-Qwen3-tokenizer_config.jinja": ("qwen", [NOTHINK]),
    "HuggingFaceTB-SmolLM2-Instruct.jinja": ("smollm2", []),
    "meta-llama-Llama-2-chat.jinja": ("llama2", []),
}


def msg(role, content, **kw):
    return {"role": role, "content": content, **kw}


WS = "  \u3000 Hello\xa0\x1f there \x85\n\n"
ODD = 'Quote " backslash \\ tab\t ctl\x01 caf\u00e9 \U0001F600 {{ not jinja }} <|eot_id|>'
THINK = "<think>\nI should greet.\n\n</think>\n\nHello! How can I help?"
CONVS = {
    "single": [msg("user", "What is 2+2?")],
    "system": [msg("system", "You are terse."), msg("user", "What is 2+2?")],
    "multi": [msg("system", "You are terse."), msg("user", "Hi"), msg("assistant", "Hello."),
              msg("user", "What is 2+2?")],
    "multi-nosys": [msg("user", "Hi"), msg("assistant", "Hello."), msg("user", "Bye")],
    "whitespace": [msg("system", WS), msg("user", WS), msg("assistant", "\n" + WS), msg("user", ODD)],
    "empty-system": [msg("system", ""), msg("user", "x")],
    "think-history": [msg("user", "Hi"), msg("assistant", THINK), msg("user", "And now?")],
    "think-last": [msg("user", "Hi"), msg("assistant", THINK)],
    "reasoning-field": [msg("user", "Hi"), msg("assistant", "Answer.", reasoning_content="\nWhy.\n")],
    "think-nested": [msg("user", "Q"), msg("assistant", "pre<think>a<think>\nb\n</think>c</think>\n\nd")],
    "tools": [msg("user", "Weather?"), msg("assistant", "Calling."), msg("tool", '{"t": 21}'),
              msg("tool", "sunny\n"), msg("user", "Thanks")],
    "tool-last": [msg("system", "S"), msg("user", "<tool_response>\nx\n</tool_response>"),
                  msg("assistant", THINK), msg("tool", "r")],
    "system-late": [msg("user", "a"), msg("system", "late"), msg("user", "b")],
}
# Llama 2's template rejects non-alternating roles; these are its own cases.
LLAMA2_CONVS = ["single", "system", "multi", "multi-nosys", "whitespace", "empty-system"]


def jinja_render(text, messages, tokens, gen, kwargs):
    try:
        return ENV.from_string(text).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=gen, **tokens, **kwargs)
    except (TemplateError, jinja2.TemplateError) as e:
        return e


def write_json(name, obj):
    path = os.path.join(TMP, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    return path


def compare(name, template_args, messages, flags, expected):
    mpath = write_json(name.replace("/", "_") + ".json", messages)
    r = vtest.varent("template", *template_args, "--messages", mpath, *flags)
    if isinstance(expected, Exception):
        return vtest.check(r.returncode != 0 and r.stderr, name,
                           f"jinja raised {expected!r} but varent exited {r.returncode}")
    if r.returncode != 0:
        return vtest.check(False, name, f"exit {r.returncode}: {r.stderr.strip()}")
    return vtest.check(r.stdout == expected, name,
                       f"mismatch\n  want {expected!r}\n  got  {r.stdout!r}")


def test_real_templates():
    for fname, (tok, variants) in TEMPLATES.items():
        with open(os.path.join(TPL_DIR, fname), encoding="utf-8") as f:
            text = f.read()
        convs = LLAMA2_CONVS if tok == "llama2" else list(CONVS)
        for cname in convs:
            for vname, flags, kwargs in [("default", [], {})] + variants:
                for gen in (True, False):
                    want = jinja_render(text, CONVS[cname], TOKENS[tok], gen, kwargs)
                    gflags = [] if gen else ["--no-generation-prompt"]
                    name = f"{fname[:-6]}/{cname}/{vname}/{'gen' if gen else 'nogen'}"
                    compare(name, ["-m", os.path.join(TPL_DIR, fname)], CONVS[cname], flags + gflags, want)


def test_llama2_alternation():
    with open(os.path.join(TPL_DIR, "meta-llama-Llama-2-chat.jinja"), encoding="utf-8") as f:
        text = f.read()
    bad = [msg("user", "a"), msg("user", "b")]
    want = jinja_render(text, bad, TOKENS["llama2"], True, {})
    vtest.check(isinstance(want, Exception), "llama2/alternation/jinja-raises", "expected a raise")
    compare("llama2/alternation", ["-m", os.path.join(TPL_DIR, "meta-llama-Llama-2-chat.jinja")], bad, [], want)


def test_config_sources():
    """tokenizer_config.json (file and model dir): the template and its bos/eos tokens."""
    with open(os.path.join(TPL_DIR, "meta-llama-Llama-2-chat.jinja"), encoding="utf-8") as f:
        l2 = f.read()
    cfg = {"bos_token": {"content": "<BOS>", "lstrip": False}, "eos_token": "<EOS>", "chat_template": l2}
    path = write_json("l2_tokenizer_config.json", cfg)
    conv = CONVS["multi"]
    want = jinja_render(l2, conv, {"bos_token": "<BOS>", "eos_token": "<EOS>"}, True, {})
    compare("config/json-file", ["-m", path], conv, [], want)
    with open(os.path.join(TPL_DIR, "Qwen-Qwen2.5-7B-Instruct.jinja"), encoding="utf-8") as f:
        q = f.read()
    model = os.path.join(TMP, "qwen-model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "chat_template": [{"name": "tool_use", "template": "x"},
                                                                 {"name": "default", "template": q}]}, f)
    want = jinja_render(q, conv, TOKENS["qwen"], True, {})
    compare("config/model-dir-template-list", ["-m", model], conv, [], want)
    # Newer checkpoints keep the template in chat_template.jinja beside the config.
    model2 = os.path.join(TMP, "qwen3-model")
    os.makedirs(model2, exist_ok=True)
    with open(os.path.join(model2, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>"}, f)
    with open(os.path.join(TPL_DIR, "Qwen-Qwen3-0.6B.jinja"), encoding="utf-8") as f:
        q3 = f.read()
    with open(os.path.join(model2, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(q3)
    conv = CONVS["think-history"]
    want = jinja_render(q3, conv, TOKENS["qwen"], True, {"enable_thinking": False})
    compare("config/model-dir-chat_template.jinja", ["-m", model2], conv, ["--no-think"], want)
    # Messages from stdin.
    r = vtest.varent("template", "--chat-template", "qwen3", "--messages", "-", stdin=json.dumps(conv))
    want = jinja_render(q3, conv, TOKENS["qwen"], True, {})
    vtest.check(r.returncode == 0 and r.stdout == want, "config/messages-stdin", f"{r.returncode} {r.stderr!r}")


def test_named_override():
    """--chat-template NAME without a template file gives the named model's output."""
    cases = [("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen", [], {}),
             ("smollm2", "HuggingFaceTB-SmolLM2-Instruct.jinja", "smollm2", [], {}),
             ("qwen3", "Qwen-Qwen3-0.6B.jinja", "qwen", ["--no-think"], {"enable_thinking": False}),
             ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", [], {}),
             ("llama3.2", "meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", ["--date", "1 Jan 2025"],
              {"date_string": "1 Jan 2025"}),
             ("llama3", "meta-llama-Meta-Llama-3-tokenizer_config.jinja", "llama3", [], {}),
             ("llama2", "meta-llama-Llama-2-chat.jinja", "llama2", [], {})]
    for name, fname, tok, flags, kwargs in cases:
        with open(os.path.join(TPL_DIR, fname), encoding="utf-8") as f:
            text = f.read()
        for cname in ("single", "multi"):
            want = jinja_render(text, CONVS[cname], TOKENS[tok], True, kwargs)
            compare(f"named/{name}/{cname}", ["--chat-template", name], CONVS[cname], flags, want)


def expect_error(name, args, needle):
    r = vtest.varent("template", *args)
    vtest.check(r.returncode != 0 and needle in r.stderr and r.stdout == "", name,
                f"exit {r.returncode}, stderr {r.stderr.strip()!r}, want {needle!r}")


def test_errors():
    good = write_json("good.json", CONVS["single"])
    unknown = os.path.join(TMP, "gemma.jinja")
    with open(unknown, "w") as f:
        f.write("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}")
    expect_error("error/unknown-template", ["-m", unknown, "--messages", good], "not recognised")
    expect_error("error/unknown-name", ["--chat-template", "gemma", "--messages", good], "unknown chat template name")
    bad = os.path.join(TMP, "bad.json")
    with open(bad, "w") as f:
        f.write('[{"role": "user",\n  "content": "x",}]')
    expect_error("error/bad-json", ["--chat-template", "chatml", "--messages", bad], "invalid JSON at line 2")
    role = write_json("role.json", [msg("narrator", "x")])
    expect_error("error/unknown-role", ["--chat-template", "chatml", "--messages", role], "unknown role 'narrator'")
    nocontent = write_json("nocontent.json", [{"role": "user"}])
    expect_error("error/no-content", ["--chat-template", "chatml", "--messages", nocontent], "message 0")
    empty = write_json("empty.json", [])
    expect_error("error/no-messages", ["--chat-template", "chatml", "--messages", empty], "no messages")
    expect_error("error/missing-file", ["-m", os.path.join(TMP, "nope.jinja"), "--messages", good], "nope.jinja")
    expect_error("error/typo-option", ["--chat-template", "chatml", "--messages", good, "--no-thinking"],
                 "--no-thinking")


def main():
    r = vtest.varent("template", "--help")
    if r.returncode != 0:
        vtest.check(False, "template/command", f"`varent template --help` exited {r.returncode}: {r.stderr.strip()}")
        vtest.done()
    test_real_templates()
    test_llama2_alternation()
    test_config_sources()
    test_named_override()
    test_errors()
    vtest.done()


if __name__ == "__main__":
    main()
