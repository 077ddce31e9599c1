"""lm-evaluation-harness itself against `varent serve` and against HF transformers (issue 33):
the same local tasks (written here) run by lm-eval's `local-completions` model
(tokenizer_backend=huggingface, batch_size 1 and 8) against varent, and by its `hf` model
(float32 on the CPU) as the reference, on SmolLM2-135M-Instruct. Each covers one of lm-eval's
request types:
- varent_mc (loglikelihood): 100 questions, 4 choices each. The accuracy must be the same and
  every choice's loglikelihood equal within 2e-3 (each is a sum over the choice's tokens), its
  is_greedy flag too.
- varent_gen (generate_until, greedy, stop strings and EOS): 20 prompts; every generated text
  must be the same as HF's.
- varent_ppl (loglikelihood_rolling, a perplexity task as wikitext is): 6 paragraphs; each
  document's loglikelihood equal within 2e-3 and the word perplexity within 1e-4 relative.

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
PPL_RTOL = 1e-4
TASKS = "varent_mc,varent_gen,varent_ppl"

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


GEN_PROMPTS = ["What is the capital of France?", "Name a fruit that is yellow.", "What colour is the sky?",
               "Write one sentence about the sea.", "How many legs does a spider have?",
               "What do bees make?", "Give a synonym for \"happy\".", "What is 7 times 6?",
               "Who wrote Romeo and Juliet?", "What is the boiling point of water in Celsius?",
               "Describe a cat in five words.", "What is the largest planet?", "Say hello in Spanish.",
               "Which animal says moo?", "What is the opposite of \"up\"?", "List three colours.",
               "What day comes after Monday?", "What is H2O?", "Name a musical instrument.",
               "Why do leaves fall in autumn?"]

# Plain prose for the perplexity task, written here; each paragraph is one document.
PPL_DOCS = [
    "The river rises in the hills north of the town and runs south for about forty miles before it "
    "reaches the sea. In spring it floods the low meadows, and the farmers move their cattle to higher "
    "ground until the water falls again.",
    "A good loaf needs only flour, water, salt and yeast, but it also needs time. The dough is mixed, "
    "left to rise, folded, shaped and left to rise once more. Baked in a hot oven, it comes out with a "
    "dark crust and a soft, open crumb.",
    "The library opened in 1887 with three thousand books, most of them given by a retired sea captain. "
    "Today it holds more than two hundred thousand volumes, a collection of old maps, and the captain's "
    "own logbooks from his voyages to China.",
    "When the first frost came, the children ran out to look at the garden. Every leaf was edged with "
    "white, the pond had a thin skin of ice, and the spider webs on the fence shone like strings of "
    "glass beads in the low morning sun.",
    "Computers store numbers in binary, as strings of ones and zeros. A single binary digit is called a "
    "bit, and eight bits make a byte. Text, pictures and sound are all kept as numbers in the end, and "
    "programs decide what those numbers mean.",
    "The match was level at one goal each until the last minute, when the young striker turned past two "
    "defenders and shot low into the corner. The crowd rose to its feet, and the coach, who had said "
    "nothing all afternoon, finally smiled.",
]


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


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def task_yaml(name, data, body):
    return f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
{body}"""


def write_tasks(work):
    """The three tasks' data and YAML under work/tasks; returns that folder."""
    tasks = os.path.join(work, "tasks")
    os.makedirs(tasks, exist_ok=True)
    bodies = {
        "varent_mc": (task_docs(), """output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""),
        "varent_gen": ([{"question": q, "answer": ""} for q in GEN_PROMPTS], """output_type: generate_until
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  do_sample: false
  max_gen_toks: 40
metric_list:
  - metric: exact_match
"""),
        "varent_ppl": ([{"text": t} for t in PPL_DOCS], """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""),
    }
    for name, (rows, body) in bodies.items():
        data = os.path.join(tasks, name + ".jsonl")
        write_jsonl(data, rows)
        with open(os.path.join(tasks, name + ".yaml"), "w") as f:
            f.write(task_yaml(name, data, body))
    return tasks


def samples(out, task):
    """{doc_id: filtered_resps} of one task's samples file under out."""
    found = sorted(glob.glob(os.path.join(out, "**", f"samples_{task}_*.jsonl"), recursive=True))
    if not found:
        return None
    per_doc = {}
    for line in open(found[-1]):
        s = json.loads(line)
        per_doc[s["doc_id"]] = s["filtered_resps"]
    return per_doc


def lm_eval(py, tasks, out, model, model_args, batch_size):
    """Runs the three tasks; (results dict, {task: {doc_id: filtered_resps}}) or (None, why)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=os.path.join(out, "datasets-cache"), TOKENIZERS_PARALLELISM="false")
    cmd = [py, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", TASKS,
           "--include_path", tasks, "--batch_size", str(batch_size), "--log_samples", "--output_path", out]
    if model == "hf":
        cmd += ["--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        return None, r.stderr[-1500:]
    res = sorted(glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True))
    per_task = {t: samples(out, t) for t in TASKS.split(",")}
    if not res or None in per_task.values():
        return None, f"no results or samples under {out}: {r.stdout[-500:]}"
    return (json.load(open(res[-1]))["results"], per_task), ""


def compare_mc(name, got, ref):
    (res, docs), (ref_res, ref_docs) = got, ref
    acc, ref_acc = res["varent_mc"]["acc,none"], ref_res["varent_mc"]["acc,none"]
    docs, ref_docs = docs["varent_mc"], ref_docs["varent_mc"]
    worst, flips, n = 0.0, [], 0
    for k, want in ref_docs.items():
        for (ll, greedy), (ref_ll, ref_greedy) in zip(docs.get(k, []), want):
            worst = max(worst, abs(float(ll) - float(ref_ll)))
            n += 1
            if bool(greedy) != bool(ref_greedy):
                flips.append(k)
    check(len(docs) == len(ref_docs) == 100 and n == 400, f"{name}_every_choice_scored", f"{len(docs)} docs, {n} choices")
    check(acc == ref_acc, f"{name}_accuracy_equals_hf", f"{acc} vs hf {ref_acc}")
    check(worst <= TOL and not flips, f"{name}_loglikelihoods_equal_hf",
          f"largest difference {worst:.2e} (tolerance {TOL}), is_greedy differs in docs {flips[:5]}")
    print(f"# {name}: acc {acc:.3f} (hf {ref_acc:.3f}), largest loglikelihood difference {worst:.2e}, "
          f"is_greedy differs on {len(flips)} of {n} choices")


def compare_gen(name, got, ref):
    docs, ref_docs = got[1]["varent_gen"], ref[1]["varent_gen"]
    differ = [k for k, want in ref_docs.items() if docs.get(k) != want]
    check(len(docs) == len(ref_docs) == len(GEN_PROMPTS) and not differ, f"{name}_generations_equal_hf",
          f"{len(differ)} of {len(ref_docs)} differ; first: doc {differ[:1]}: "
          f"{docs.get(differ[0]) if differ else ''!r} vs hf {ref_docs[differ[0]] if differ else ''!r}")
    print(f"# {name}: {len(ref_docs) - len(differ)} of {len(ref_docs)} generations identical to hf")


def compare_ppl(name, got, ref):
    (res, docs), (ref_res, ref_docs) = got, ref
    docs, ref_docs = docs["varent_ppl"], ref_docs["varent_ppl"]
    worst = max(abs(float(docs[k][0]) - float(v[0])) if k in docs else float("inf") for k, v in ref_docs.items())
    ppl, ref_ppl = res["varent_ppl"]["word_perplexity,none"], ref_res["varent_ppl"]["word_perplexity,none"]
    check(len(docs) == len(ref_docs) == len(PPL_DOCS) and worst <= TOL, f"{name}_rolling_loglikelihoods_equal_hf",
          f"largest difference {worst:.2e} (tolerance {TOL})")
    check(abs(ppl - ref_ppl) <= PPL_RTOL * ref_ppl, f"{name}_word_perplexity_equals_hf",
          f"{ppl} vs hf {ref_ppl} (relative tolerance {PPL_RTOL})")
    print(f"# {name}: word perplexity {ppl:.4f} (hf {ref_ppl:.4f}), "
          f"largest document loglikelihood difference {worst:.2e}")


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
    tasks = write_tasks(work)
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
                for compare in (compare_mc, compare_gen, compare_ppl):
                    compare(f"lmeval_varent_batch_size_{bs}", got, ref)
    finally:
        srv.stop()
    vtest.done()


if __name__ == "__main__":
    raise SystemExit(main())
