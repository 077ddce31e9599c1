"""lm-evaluation-harness itself against `varent serve` and against HF transformers (issue 33):
the same local multiple-choice task (written here: 100 questions, 4 choices each) run by
lm-eval's `local-completions` model (tokenizer_backend=huggingface, batch_size 1 and 8)
against varent, and by its `hf` model (float32 on the CPU) as the reference, on
SmolLM2-135M-Instruct. The accuracy must be the same and every choice's loglikelihood equal
within 2e-3 (each is a sum over the choice's tokens), its is_greedy flag too.

Needs the HF venv (tools/hf-venv.sh, then `build/hf-venv/bin/pip install 'lm-eval[api,hf]'`;
VARENT_HF_PYTHON names another python) and weights/SmolLM2-135M-Instruct
(weights/fetch-smollm2.sh); SKIPs without either. Never needs the network: the task's data
is a local JSONL file and HF runs offline.
"""
import glob
import json
import os
import random
import subprocess

import vtest
from vtest import ROOT, check, skip
import servertest

MODEL = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct")
TOL = 2e-3

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
            ("Egypt", "Cairo"), ("Russia", "Moscow"), ("Greece", "Athens"), ("Portugal", "Lisbon"),
            ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Ireland", "Dublin"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"),
            ("China", "Beijing"), ("India", "New Delhi"), ("Cuba", "Havana")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"),
             ("old", "young"), ("light", "dark"), ("open", "closed"), ("early", "late"), ("full", "empty"),
             ("hard", "soft"), ("rich", "poor"), ("wet", "dry"), ("strong", "weak"), ("high", "low"),
             ("long", "short"), ("loud", "quiet"), ("thick", "thin"), ("clean", "dirty"), ("first", "last")]
SOUNDS = [("dog", "barks"), ("cat", "meows"), ("cow", "moos"), ("duck", "quacks"), ("lion", "roars"),
          ("sheep", "bleats"), ("horse", "neighs"), ("pig", "oinks"), ("owl", "hoots"), ("snake", "hisses")]


def task_docs():
    """100 questions, 4 choices each, the answer's place drawn by a fixed generator."""
    rng = random.Random(33)
    docs = []

    def add(question, right, wrong):
        choices = [right] + rng.sample(wrong, 3)
        rng.shuffle(choices)
        docs.append({"question": question, "choices": choices, "answer": choices.index(right)})

    for country, city in CAPITALS:
        add(f"What is the capital of {country}?", city, [c for _, c in CAPITALS if c != city])
    for a, b in OPPOSITES:
        add(f"What is the opposite of \"{a}\"?", b, [y for _, y in OPPOSITES if y != b])
    for animal, sound in SOUNDS:
        add(f"Which sound does a {animal} make? A {animal}", sound, [s for _, s in SOUNDS if s != sound])
    while len(docs) < 100:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        add(f"What is {a} plus {b}?", str(a + b), [str(a + b + d) for d in (-3, -2, -1, 1, 2, 3, 10)])
    return docs


def write_task(work):
    data = os.path.join(work, "varent_mc.jsonl")
    with open(data, "w") as f:
        for d in task_docs():
            f.write(json.dumps(d) + "\n")
    tasks = os.path.join(work, "tasks")
    os.makedirs(tasks, exist_ok=True)
    with open(os.path.join(tasks, "varent_mc.yaml"), "w") as f:
        f.write(f"""task: varent_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""")
    return tasks


def lm_eval(py, tasks, out, model, model_args, batch_size):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=os.path.join(out, "datasets-cache"), TOKENIZERS_PARALLELISM="false")
    cmd = [py, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", "varent_mc",
           "--include_path", tasks, "--batch_size", str(batch_size), "--log_samples", "--output_path", out]
    if model == "hf":
        cmd += ["--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        return None, r.stderr[-1500:]
    res = sorted(glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True))
    samples = sorted(glob.glob(os.path.join(out, "**", "samples_varent_mc_*.jsonl"), recursive=True))
    if not res or not samples:
        return None, f"no results under {out}: {r.stdout[-500:]}"
    acc = json.load(open(res[-1]))["results"]["varent_mc"]["acc,none"]
    per_doc = {}
    for line in open(samples[-1]):
        s = json.loads(line)
        per_doc[s["doc_id"]] = [(float(x[0]), bool(x[1])) for x in s["filtered_resps"]]
    return (acc, per_doc), ""


def compare(name, got, ref):
    (acc, docs), (ref_acc, ref_docs) = got, ref
    worst, flips, n = 0.0, [], 0
    for k, want in ref_docs.items():
        for (ll, greedy), (ref_ll, ref_greedy) in zip(docs.get(k, []), want):
            worst = max(worst, abs(ll - ref_ll))
            n += 1
            if greedy != ref_greedy:
                flips.append(k)
    check(len(docs) == len(ref_docs) == 100 and n == 400, f"{name}_every_choice_scored", f"{len(docs)} docs, {n} choices")
    check(acc == ref_acc, f"{name}_accuracy_equals_hf", f"{acc} vs hf {ref_acc}")
    check(worst <= TOL and not flips, f"{name}_loglikelihoods_equal_hf",
          f"largest difference {worst:.2e} (tolerance {TOL}), is_greedy differs in docs {flips[:5]}")
    print(f"# {name}: acc {acc:.3f} (hf {ref_acc:.3f}), largest loglikelihood difference {worst:.2e}")


def main():
    py = os.environ.get("VARENT_HF_PYTHON") or os.path.join(ROOT, "build", "hf-venv", "bin", "python")
    if not os.path.exists(py) or subprocess.run([py, "-c", "import lm_eval, torch, transformers"],
                                                capture_output=True).returncode != 0:
        skip("lmeval_hf", f"{py} cannot import lm_eval, torch and transformers (tools/hf-venv.sh, then "
                          "build/hf-venv/bin/pip install 'lm-eval[api,hf]')")
        return 0
    if not os.path.exists(os.path.join(MODEL, "model.safetensors")):
        skip("lmeval_hf", f"{MODEL} is absent (weights/fetch-smollm2.sh)")
        return 0
    work = vtest.tmpdir("lmeval-hf")
    tasks = write_task(work)
    ref, why = lm_eval(py, tasks, os.path.join(work, "hf"), "hf",
                       f"pretrained={MODEL},dtype=float32", 8)
    if not check(ref is not None, "lmeval_hf_reference_runs", why):
        return 1
    srv = servertest.Server(MODEL, "--parallel", 1, name="lmeval-hf")
    try:
        for bs in (1, 8):
            args = (f"model=SmolLM2-135M-Instruct,base_url=http://127.0.0.1:{srv.port}/v1/completions,"
                    f"tokenizer_backend=huggingface,tokenizer={MODEL},num_concurrent=1,max_retries=1")
            got, why = lm_eval(py, tasks, os.path.join(work, f"varent-bs{bs}"), "local-completions", args, bs)
            if check(got is not None, f"lmeval_varent_batch_size_{bs}_runs", why):
                compare(f"lmeval_varent_batch_size_{bs}", got, ref)
    finally:
        srv.stop()
    vtest.done()


if __name__ == "__main__":
    raise SystemExit(main())
