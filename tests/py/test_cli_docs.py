"""The README and docs match what ships and the default model (issue 23 item 7): every
examples/ file they name exists, the README's example commands that use them run (on
stories260K, so without a download), and the README's tokenizer example shows
SmolLM2-135M-Instruct's ids: read from its tokenizer.json vocabulary (independent of
varent's tokenizer) and from `varent tokenize`, when weights/ has the model."""
import csv
import glob
import json
import lzma
import os
import re
import shutil

from vtest import ROOT, TESTDATA, check, done, skip, stories_dir, tmpdir, varent

work = tmpdir("cli-docs")
readme = open(os.path.join(ROOT, "README.md")).read()
docs = {p: open(p).read() for p in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md"))}

named = set()
for path, text in docs.items():
    named.update(re.findall(r"\bexamples/([\w.-]+\.\w+)", text))
check(len(named) >= 5, "docs_name_example_files", str(sorted(named)))
for f in sorted(named):
    check(os.path.isfile(os.path.join(ROOT, "examples", f)), f"example_file_{f}_exists")

ex = os.path.join(ROOT, "examples")
base = stories_dir("f32")
prompts = [line for line in open(os.path.join(ex, "prompts.txt")).read().split("\n") if line.strip()]
out = os.path.join(work, "results.jsonl")
r = varent("run", "-m", base, "--prompts", os.path.join(ex, "prompts.txt"), "-o", out, "-n", 8, "-q")
recs = [json.loads(x) for x in open(out)] if r.returncode == 0 else []
check([x["prompt"] for x in recs] == prompts, "example_prompts_txt_runs", r.stderr[-300:])
rows = [row["prompt"] for row in csv.DictReader(open(os.path.join(ex, "prompts.csv"), newline=""))]
r = varent("run", "-m", base, "--prompt-csv", os.path.join(ex, "prompts.csv"), "-n", 4, "-q")
recs = [json.loads(x) for x in r.stdout.splitlines()] if r.returncode == 0 else []
check(len(rows) >= 3 and [x["prompt"] for x in recs] == rows, "example_prompts_csv_runs", r.stderr[-300:])
r = varent("ppl", "-m", base, "-f", os.path.join(ex, "paragraph.txt"), "--json", "-q")
check(r.returncode == 0 and json.loads(r.stdout)["ppl"] > 1, "example_paragraph_ppl_runs", r.stderr[-300:])
check(not open(os.path.join(ex, "paragraph.txt")).read().endswith("\n"), "example_paragraph_as_documented",
      "docs/research.md's 72 tokens are the paragraph without a trailing newline")
msgs = json.load(open(os.path.join(ex, "chat.json")))
r = varent("template", "--chat-template", "chatml", "--messages", os.path.join(ex, "chat.json"))
check(r.returncode == 0 and all(m["content"] in r.stdout for m in msgs), "example_chat_json_renders", r.stderr)
happy = [x for x in open(os.path.join(ex, "happy.txt")).read().split("\n") if x.strip()]
sad = [x for x in open(os.path.join(ex, "sad.txt")).read().split("\n") if x.strip()]
check(len(happy) == len(sad) >= 5, "example_happy_sad_pairs", f"{len(happy)} vs {len(sad)}")
cv = os.path.join(work, "happy.gguf")
r = varent("cvector", "-m", base, "--positive", os.path.join(ex, "happy.txt"), "--negative", os.path.join(ex, "sad.txt"),
           "-o", cv)
check(r.returncode == 0 and os.path.getsize(cv) > 0, "example_cvector_runs", r.stderr[-300:])

# The README's tokenizer lines: `tokenize -m $M "TEXT"  # [ids]` and `detokenize -m $M ids`.
m = re.search(r'tokenize -m \$M "([^"]+)"\s+# \[([\d,]+)\]', readme)
check(m is not None, "readme_has_tokenize_example")
d = re.search(r"detokenize -m \$M ([\d,]+)\s+# (.+)", readme)
check(d is not None and m and d.group(1) == m.group(2) and d.group(2).strip() == m.group(1), "readme_detokenize_matches")
smol = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct")
if m and os.path.exists(os.path.join(smol, "tokenizer.json")):
    text, ids = m.group(1), [int(x) for x in m.group(2).split(",")]
    vocab = json.load(open(os.path.join(smol, "tokenizer.json")))["model"]["vocab"]
    # byte-level BPE: a space is "Ġ"; each word of this example is one token
    words = text.split(" ")
    want = [vocab.get(("Ġ" if i else "") + w) for i, w in enumerate(words)]
    check(want == ids, "readme_tokenize_ids_are_smollm2s_vocab", f"{want} vs {ids}")
    r = varent("tokenize", "-m", smol, text)
    check(r.returncode == 0 and json.loads(r.stdout) == ids, "readme_tokenize_example_runs", r.stdout + r.stderr)
else:
    skip("readme_tokenize_ids_are_smollm2s_vocab", "weights/SmolLM2-135M-Instruct not downloaded")
# and they are not another model's (the Llama 3 ids the README showed before)
l3 = os.path.join(TESTDATA, "tokenizers", "llama3", "tokenizer.json.xz")
llama3 = json.load(lzma.open(l3))["model"]["vocab"] if os.path.exists(l3) else None
if m and llama3:
    other = [llama3.get(("Ġ" if i else "") + w) for i, w in enumerate(m.group(1).split(" "))]
    check(other != [int(x) for x in m.group(2).split(",")], "readme_tokenize_ids_are_not_llama3s", str(other))
shutil.rmtree(work, ignore_errors=True)
done()
