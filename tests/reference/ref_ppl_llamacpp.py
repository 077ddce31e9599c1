"""ref_ppl_llamacpp: perplexity under llama.cpp's llama-perplexity protocol with the numpy
reference forward (ref_model), written independently of host/decode/perplexity.c from the
protocol's description:

    n_chunk = len(ids) // ctx            (a shorter tail is dropped; at most `chunks`)
    for each chunk c: window = ids[c*ctx : (c+1)*ctx], its first token replaced by BOS
        when the tokenizer adds BOS; one forward from an empty cache over the window;
        first = ctx // 2; the logits at positions first .. ctx-2 score the window's
        tokens first+1 .. ctx-1 (the second half, each with all of the window before it)

and llama.cpp's error estimate: se(mean NLL) = sqrt((mean(x^2) - mean(x)^2) / (N - 1)),
PPL = exp(mean), se(PPL) = PPL * se(mean). llama-perplexity refuses texts shorter than
2 * ctx tokens.
"""
import math

import numpy as np

import ref_model


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def token_nll(model, ids, ctx, bos=None, chunks=0):
    """[(index into ids, nll)] of every scored token, in order."""
    if len(ids) < 2 * ctx:
        raise ValueError(f"need at least {2 * ctx} tokens for ctx {ctx}, got {len(ids)}")
    n_chunk = len(ids) // ctx
    if chunks > 0:
        n_chunk = min(n_chunk, chunks)
    first, out = ctx // 2, []
    for c in range(n_chunk):
        start = c * ctx
        window = list(ids[start:start + ctx])
        if bos is not None:
            window[0] = bos
        lp = log_softmax(ref_model.forward(model, window))  # row j predicts window[j + 1]
        for j in range(first, ctx - 1):
            out.append((start + j + 1, -float(lp[j, window[j + 1]])))
    return out


def perplexity(model, ids, ctx, bos=None, chunks=0):
    """dict(ppl, ppl_se, nll_mean, nll_se, scored, chunks, indices) for ids under model (dir or Model)."""
    if not isinstance(model, ref_model.Model):
        model = ref_model.Model(model)
    scored = token_nll(model, list(ids), ctx, bos, chunks)
    x = np.array([v for _, v in scored])
    N = len(x)
    mean = float(x.mean())
    se = math.sqrt(max(float((x * x).mean()) - mean * mean, 0.0) / (N - 1))
    ppl = math.exp(mean)
    n_chunk = len(ids) // ctx if chunks <= 0 else min(len(ids) // ctx, chunks)
    return dict(ppl=ppl, ppl_se=ppl * se, nll_mean=mean, nll_se=se, scored=N, chunks=n_chunk,
                indices=[i for i, _ in scored])
