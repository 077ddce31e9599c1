"""The stock penalties of `varent run` (issue 33 row 9) against a numpy computation:
--repeat-penalty, --presence-penalty, --frequency-penalty (OpenAI's: c * F + (c > 0) * P
off the logit of an id seen c times in the window) and the --repeat-last-n window.

Greedy runs on stories260K: at every step the reference takes the numpy model's logits
(tests/reference/ref_model.py) of the ids so far, applies the penalties as numpy
computes them from the window's counts, and the token varent chose must be the
reference's argmax (within a tie margin). Each setting must also change the text, so a
penalty that does nothing fails. The emulated CUDA device (its draws read the same host
copy of the penalised logits) must choose the same tokens as the CPU. `varent serve` takes
the same penalties as OpenAI's presence_penalty and frequency_penalty and llama-server's
repeat_penalty and repeat_last_n: its greedy tokens must follow the same reference."""
import json
import os

import numpy as np

import servertest
import vtest
from vtest import check, done, skip, stories_dir, tmpdir
import ref_model

work = tmpdir("penalties")
model_dir = stories_dir("f32")
model = ref_model.Model(model_dir)
PROMPT = [1, 403, 407, 261, 378, 29, 260, 260, 260, 260]  # BOS "Once upon a time He" and a repeated id
N = 48
TIE = 1e-3


def generated(*extra, varent=None):
    out = os.path.join(work, "m.jsonl")
    if os.path.exists(out):
        os.remove(out)
    args = ["run", "-m", model_dir, "--ids", ",".join(map(str, PROMPT)), "-n", N, "--temp", "0", "--ignore-eos",
            "--metrics-out", out, *extra]
    if varent:
        import subprocess
        r = subprocess.run([varent, *map(str, args)], capture_output=True, text=True, timeout=300)
    else:
        r = vtest.varent(*args, timeout=300)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-300:]}"
    with open(out) as f:
        return [json.loads(line)["token"] for line in f], ""


def penalised(logits, ids, repeat=1.0, presence=0.0, frequency=0.0, last_n=-1):
    """The penalties on logits (float64) given the ids so far, as numpy computes them."""
    x = logits.copy()
    window = ids if last_n < 0 else ids[max(0, len(ids) - last_n):] if last_n > 0 else []
    counts = np.bincount(np.asarray(window, dtype=np.int64), minlength=len(x)) if len(window) else np.zeros(len(x))
    seen = counts > 0
    if repeat != 1:
        x[seen] = np.where(x[seen] > 0, x[seen] / repeat, x[seen] * repeat)
    return x - counts * frequency - seen * presence


def reference_greedy(**kw):
    ids = list(PROMPT)
    for _ in range(N):
        ids.append(int(penalised(ref_model.forward(model, ids)[-1], ids, **kw).argmax()))
    return ids[len(PROMPT):]


def against_reference(name, toks, **kw):
    """Each of varent's tokens is the argmax (within TIE) of the penalised reference logits."""
    ids = list(PROMPT)
    for i, t in enumerate(toks):
        x = penalised(ref_model.forward(model, ids)[-1], ids, **kw)
        if x[t] < x.max() - TIE:
            return check(False, name, f"step {i}: varent chose {t} ({x[t]:.6f}), the reference {int(x.argmax())} "
                                      f"({x.max():.6f})")
        ids.append(t)
    return check(len(toks) == N, name, f"{len(toks)} tokens, want {N}")


plain, why = generated()
check(plain is not None and len(plain) == N, "penalties_plain_run", why)
# (name, the penalties, their flags, a plausible mistake the run must not match): each
# mistake gives another greedy text on this prompt, so a penalty computed that way fails.
CASES = [
    ("presence", dict(presence=2.0), ["--presence-penalty", 2], dict(frequency=2.0)),
    ("frequency", dict(frequency=0.3), ["--frequency-penalty", 0.3], dict(presence=0.3)),
    ("presence_frequency_window", dict(presence=0.8, frequency=0.5, last_n=16),
     ["--presence-penalty", 0.8, "--frequency-penalty", 0.5, "--repeat-last-n", 16], dict(presence=0.8, frequency=0.5)),
    ("repeat_window", dict(repeat=1.8, last_n=8), ["--repeat-penalty", 1.8, "--repeat-last-n", 8], dict(repeat=1.8)),
    ("negative_presence", dict(presence=-1.0), ["--presence-penalty", -1], dict(frequency=-1.0)),
    ("all_with_repeat", dict(repeat=1.3, presence=0.4, frequency=0.3, last_n=24),
     ["--repeat-penalty", 1.3, "--presence-penalty", 0.4, "--frequency-penalty", 0.3, "--repeat-last-n", 24],
     dict(presence=0.4, frequency=0.3, last_n=24)),
]
results = {}
for name, kw, flags, wrong in CASES:
    toks, why = generated(*flags)
    results[name] = (toks, flags)
    if toks is None:
        check(False, f"penalty_{name}", why)
        continue
    check(toks != plain, f"penalty_{name}_changes_text", "the same tokens as without the penalty")
    against_reference(f"penalty_{name}_matches_numpy", toks, **kw)
    check(toks != reference_greedy(**wrong), f"penalty_{name}_is_not_{'_'.join(wrong)}",
          f"the text of the penalties {wrong}: the reference cannot tell them apart here")

# --repeat-last-n 0: the window is empty, nothing is penalised
toks, why = generated("--presence-penalty", 2, "--frequency-penalty", 2, "--repeat-last-n", 0)
check(toks == plain, "penalty_window_zero_is_off", why or f"{toks} vs {plain}")

# the server: each request's tokens (its metrics name them) follow the same reference, up
# to an end of text the server stops at (the CLI runs with --ignore-eos)
FIELDS = {"presence": "presence_penalty", "frequency": "frequency_penalty", "repeat": "repeat_penalty",
          "last_n": "repeat_last_n"}
srv = servertest.Server(model_dir, "-t", 1, "--max-tokens-limit", N, name="penalties")
try:
    for name, kw, flags, wrong in CASES:
        body = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "metrics": True}
        body.update({FIELDS[k]: v for k, v in kw.items()})
        st, r = srv.post("/v1/completions", body)
        got = [m["token"] for m in r["choices"][0]["metrics"]] if st == 200 else None
        if got is None or len(got) < 8:
            check(False, f"serve_penalty_{name}", f"status {st}: {str(r)[:300]}")
            continue
        cli = results[name][0] or []
        check(got == cli[:len(got)], f"serve_penalty_{name}_same_as_run", f"{got} vs run's {cli[:len(got)]}")
        ids = list(PROMPT)
        bad = ""
        for i, t in enumerate(got):
            x = penalised(ref_model.forward(model, ids)[-1], ids, **kw)
            if x[t] < x.max() - TIE and not bad:
                bad = f"step {i}: the server chose {t}, the reference {int(x.argmax())}"
            ids.append(t)
        check(not bad, f"serve_penalty_{name}_matches_numpy", bad)
    st, r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "metrics": True})
    got = [m["token"] for m in r["choices"][0]["metrics"]] if st == 200 else None
    check(got is not None and got == plain[:len(got)], "serve_penalty_none_is_plain", f"{got} vs {plain}")
finally:
    srv.stop()

# the emulated CUDA device chooses the same tokens (the draw reads the penalised host copy)
emu = os.path.join(os.environ.get("EMU_BUILD", os.path.join(vtest.ROOT, "build", "emu")), "varent")
if not os.path.exists(emu):
    skip("penalty_emulated_device", f"{emu} is not built (make emu)")
else:
    toks, flags = results["all_with_repeat"]
    got, why = generated(*flags, "--device", "cuda", varent=emu)
    check(got is not None and got == toks, "penalty_emulated_device_same_tokens", why or f"{got} vs {toks}")
done()
