"""tools/random_gguf.py (the GPU window's llama.cpp weights): the GGUF it writes holds the
same numbers as tools/gen_random_checkpoint.py's directory of the same preset and seed.
Checked by converting it back with `varent convert gguf` (an independent reader: C, not
the Python writer) and comparing every tensor bit for bit, for a llama preset (q/k rows
permuted into llama.cpp's order and back) and a Qwen3 one (q/k norms, no permutation);
and the llama.cpp metadata keys of the architecture are there."""
import os
import subprocess
import sys

from vtest import ROOT, check, done, read_st, tmpdir, varent

sys.path.insert(0, os.path.join(ROOT, "tools"))
from gguf_np import read_gguf  # noqa: E402

PY = sys.executable


def tensors(path):
    hdr, data = read_st(path)
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if k != "__metadata__"}


for preset, arch in (("llama3-tiny", "llama"), ("qwen3-tiny", "qwen3")):
    d = tmpdir(f"random_gguf_{preset}")
    g, hf, conv = os.path.join(d, "m.gguf"), os.path.join(d, "hf"), os.path.join(d, "conv")
    r1 = subprocess.run([PY, os.path.join(ROOT, "tools", "random_gguf.py"), "--preset", preset, "--seed", "3", g],
                        capture_output=True, text=True)
    r2 = subprocess.run([PY, os.path.join(ROOT, "tools", "gen_random_checkpoint.py"), "--preset", preset, "--seed", "3",
                         "--dtype", "bf16", hf], capture_output=True, text=True)
    r3 = varent("convert", "gguf", g, conv, "--dtype", "bf16")
    ok = r1.returncode == 0 and r2.returncode == 0 and r3.returncode == 0
    check(ok, f"random_gguf_{preset}_writes_and_converts", f"{r1.stderr[-300:]} {r2.stderr[-300:]} {r3.stderr[-300:]}")
    if not ok:
        continue
    a, b = tensors(os.path.join(hf, "model.safetensors")), tensors(os.path.join(conv, "model.safetensors"))
    differ = sorted(k for k in a if a[k] != b.get(k))
    check(set(a) == set(b) and not differ, f"random_gguf_{preset}_same_tensors",
          f"missing {sorted(set(a) ^ set(b))[:4]}, differ {differ[:4]}")
    kv = read_gguf(g)[1]
    need = ["general.architecture", f"{arch}.block_count", f"{arch}.embedding_length", f"{arch}.attention.head_count_kv",
            f"{arch}.rope.freq_base", "tokenizer.ggml.model", "tokenizer.ggml.tokens"]
    check(kv.get("general.architecture") == arch and all(k in kv for k in need), f"random_gguf_{preset}_llamacpp_keys",
          f"missing {[k for k in need if k not in kv]}")
done()
