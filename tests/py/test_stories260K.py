"""stories260K end to end: `varent convert llama2c` then greedy generation from BOS must
reproduce llama2.c's published greedy text (tests/data/stories260K/greedy.txt, copied
from llama2.c's stories260K.md) byte for byte."""
import os

from vtest import TESTDATA, check, done, stories_dir, varent

expected = open(os.path.join(TESTDATA, "stories260K", "greedy.txt")).read()

for dtype in ("f32",):
    model = stories_dir(dtype)
    # llama2.c's run.c with 256 steps prints 256 tokens after BOS.
    r = varent("run", "-m", model, "--temp", "0", "-n", "256")
    check(r.returncode == 0, f"greedy_{dtype}_exit", r.stderr)
    got = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    check(got == expected, f"greedy_{dtype}_matches_llama2c",
          f"differs at char {first}: got {got[first:first+40]!r} want {expected[first:first+40]!r}")

model = stories_dir("f32")
# Token ids and the text prompt path give the same greedy continuation.
a = varent("run", "-m", model, "--temp", "0", "-n", "40", "--ids", "1")
b = varent("run", "-m", model, "--temp", "0", "-n", "40")
check(a.returncode == 0 and a.stdout == b.stdout, "bos_ids_equals_default_prompt", f"{a.stdout!r} vs {b.stdout!r}")

# Seeded sampling is reproducible, and the seed matters.
s1 = varent("run", "-m", model, "--temp", "1", "--top-p", "0.9", "--seed", "42", "-n", "60")
s2 = varent("run", "-m", model, "--temp", "1", "--top-p", "0.9", "--seed", "42", "-n", "60")
s3 = varent("run", "-m", model, "--temp", "1", "--top-p", "0.9", "--seed", "43", "-n", "60")
check(s1.returncode == 0 and s1.stdout == s2.stdout, "same_seed_same_text", f"{s1.stdout!r} vs {s2.stdout!r}")
check(s1.stdout != s3.stdout, "different_seed_different_text", s1.stdout)

# bf16 conversion runs and stays close: its greedy text starts like the f32 one.
bf = varent("run", "-m", stories_dir("bf16"), "--temp", "0", "-n", "20")
check(bf.returncode == 0 and bf.stdout[:12] == expected[:12], "bf16_greedy_runs", bf.stdout + bf.stderr)

# --stats goes to stderr only; stdout stays the generated text.
st = varent("run", "-m", model, "--temp", "0", "-n", "256", "--stats")
check(st.stdout.rstrip("\n") == expected and "decode" in st.stderr and "tok/s" in st.stderr, "stats_on_stderr", st.stderr)
done()
