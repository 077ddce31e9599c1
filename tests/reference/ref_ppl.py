"""ref_ppl: perplexity of a token sequence with the numpy reference forward (ref_model),
written independently of host/decode/perplexity.c, as the Hugging Face guide "Perplexity of
fixed-length models" computes it:

    for begin in range(0, n, stride):
        end = min(begin + ctx, n); trg = end - prev_end
        window = ids[begin:end]; labels = window with all but the last trg masked
        loss over the window's labels (position j predicts j + 1)
        prev_end = end; stop when end == n

and the llama.cpp error estimate: se(mean NLL) = sqrt((mean(x^2) - mean(x)^2) / (N - 1)),
PPL = exp(mean), se(PPL) = PPL * se(mean).
"""
import math

import numpy as np

import ref_model


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def token_nll(model, ids, ctx, stride):
    """[(index, nll)] of every scored token, in order."""
    n, prev_end, out = len(ids), 0, []
    for begin in range(0, n, stride):
        end = min(begin + ctx, n)
        trg = end - prev_end
        window = ids[begin:end]
        lp = log_softmax(ref_model.forward(model, window))  # [T, vocab]
        # label j (absolute begin + j) is predicted by row j - 1; only the last trg labels count
        for j in range(max(1, len(window) - trg), len(window)):
            out.append((begin + j, -float(lp[j - 1, window[j]])))
        prev_end = end
        if end == n:
            break
    return out


def perplexity(model, ids, ctx, stride):
    """dict(ppl, ppl_se, nll_mean, nll_se, scored, windows) for ids under model (dir or Model)."""
    if not isinstance(model, ref_model.Model):
        model = ref_model.Model(model)
    scored = token_nll(model, list(ids), ctx, stride)
    x = np.array([v for _, v in scored])
    N = len(x)
    mean = float(x.mean())
    se = math.sqrt(max(float((x * x).mean()) - mean * mean, 0.0) / (N - 1))
    ppl = math.exp(mean)
    windows = 0
    for begin in range(0, len(ids), stride):
        windows += 1
        if begin + ctx >= len(ids):
            break
    return dict(ppl=ppl, ppl_se=ppl * se, nll_mean=mean, nll_se=se, scored=N, windows=windows,
                indices=[i for i, _ in scored])


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="numpy reference perplexity of token ids")
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--stride", type=int, required=True)
    a = ap.parse_args()
    r = perplexity(a.model_dir, [int(t) for t in a.ids.split(",")], a.ctx, a.stride)
    print({k: v for k, v in r.items() if k != "indices"})
