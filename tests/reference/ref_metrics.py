"""ref_metrics: the entropix metrics, from one position's logits and the last query's
scaled pre-softmax attention scores of one layer [n_heads, n_keys] (keys = filled
positions only, so no masked entries). All in float64, entropies in bits.

  entropy      H = -sum p log2 p
  varentropy   V = sum p (log2 p + H)^2
  attn_entropy         mean over heads of -sum_j a log2(clip(a, 1e-10, 1))
  attn_varentropy      population variance over heads of those per-head entropies
  agreement            mean over heads and keys of |a_h(j) - mean_h a_h(j)|
  interaction_strength mean over heads and keys of |s_h(j)|
"""
import numpy as np


def log_softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def logit_entropy(logits):
    """(entropy, varentropy) in bits of softmax(logits) along the last axis."""
    lp2 = log_softmax(logits) / np.log(2.0)
    p = np.exp2(lp2)
    H = -(p * lp2).sum(axis=-1)
    V = (p * (lp2 + H[..., None]) ** 2).sum(axis=-1)
    return H, V


def attention_metrics(scores):
    """scores [n_heads, n_keys] -> dict of the four attention metrics."""
    s = np.asarray(scores, dtype=np.float64)
    a = np.exp(log_softmax(s))
    ent = -(a * np.log2(np.clip(a, 1e-10, 1.0))).sum(axis=-1)  # per head
    return {
        "attn_entropy": float(ent.mean()),
        "attn_varentropy": float(ent.var()),  # ddof=0: population variance
        "agreement": float(np.abs(a - a.mean(axis=0, keepdims=True)).mean()),
        "interaction_strength": float(np.abs(s).mean()),
    }


def metrics(logits, scores):
    """All six metrics for one position: logits [vocab], scores [n_heads, n_keys]."""
    H, V = logit_entropy(logits)
    out = {"entropy": float(H), "varentropy": float(V)}
    out.update(attention_metrics(scores))
    return out


def metrics_for(model, ids, layer=None):
    """The metrics of the last position of `ids` through ref_model (a Model or a model
    directory), attention taken at `layer` (default: the last layer)."""
    import ref_model  # here, so the pure metric functions need no model code
    logits, scores = ref_model.forward(model, ids, scores_layer=layer, return_scores=True)
    return metrics(logits[-1], scores)
