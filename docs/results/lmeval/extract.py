"""extract.py RUN_DIR DEST: copies one test_lmeval_hf.py run's lm-eval output into docs/results/lmeval: each model's
results JSON and its generate_until and loglikelihood_rolling samples as lm-eval wrote them,
and the 400 multiple-choice loglikelihoods side by side (choices.tsv)."""
import glob, json, os, shutil, sys
run, dest = sys.argv[1], sys.argv[2]
os.makedirs(dest, exist_ok=True)
names = {"hf": "hf", "varent-bs1": "varent-bs1", "varent-bs8": "varent-bs8"}
mc = {}
for d, name in names.items():
    out = os.path.join(run, d)
    res = sorted(glob.glob(out + "/**/results_*.json", recursive=True))[-1]
    shutil.copy(res, os.path.join(dest, f"{name}-results.json"))
    for t in ("varent_gen", "varent_ppl"):
        s = sorted(glob.glob(out + f"/**/samples_{t}_*.jsonl", recursive=True))[-1]
        shutil.copy(s, os.path.join(dest, f"{name}-samples_{t}.jsonl"))
    s = sorted(glob.glob(out + "/**/samples_varent_mc_*.jsonl", recursive=True))[-1]
    mc[name] = {}
    for line in open(s):
        r = json.loads(line)
        mc[name][r["doc_id"]] = (r["target"], r["filtered_resps"])
with open(os.path.join(dest, "choices.tsv"), "w") as f:
    f.write("doc\tchoice\tanswer\t" + "\t".join(f"{n}_loglikelihood\t{n}_is_greedy" for n in names.values()) + "\n")
    for doc in sorted(mc["hf"]):
        for c in range(len(mc["hf"][doc][1])):
            cols = []
            for n in names.values():
                ll, g = mc[n][doc][1][c]
                cols += [f"{float(ll):.6f}", str(bool(g) if not isinstance(g, str) else g == "True")]
            f.write(f"{doc}\t{c}\t{mc['hf'][doc][0]}\t" + "\t".join(cols) + "\n")
