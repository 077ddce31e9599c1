// tp.h: tensor parallelism (Megatron style) for the forward pass. A group of N ranks
// holds one model between them:
//   - q/k/v and gate/up are split by output rows (whole query heads, with the KV heads
//     they read; intermediate columns), wo and down by input columns, so each rank's
//     attention and MLP outputs are partial sums: one all-reduce after wo and one after
//     down per layer;
//   - the KV cache holds only the rank's KV heads;
//   - the lm_head is split by vocabulary rows and the logits are gathered whole, so the
//     sampler and the entropix metrics see the full distribution on every rank; the
//     attention capture is gathered over all heads the same way.
// The all-reduce gives every rank the same bits (tp_comm.sum's contract), so every rank
// draws the same token from the same logits with the same seed, and the ranks run the
// same host code in lock step (docs/distributed.md).
#ifndef VARENT_TP_H
#define VARENT_TP_H

#include <stddef.h>

#include "host/util/err.h"
#include "model/config.h"

// A communicator for one tensor-parallel group (host/runtime/tp_mpi.c over MPI). Every
// call is collective: all ranks of the group make it, with the same sizes.
typedef struct tp_comm tp_comm;
struct tp_comm {
    int rank, size;
    // x[n] summed over the group, in place; every rank receives the same bits.
    int (*sum)(tp_comm *c, float *x, size_t n, verr *err);
    // out[size * bytes] = every rank's x[bytes], in rank order.
    int (*gather)(tp_comm *c, const void *x, size_t bytes, void *out, verr *err);
    // The same, for a wait that may last (a server's ranks waiting for the next request):
    // no timeout, and the waiting ranks sleep between polls instead of spinning.
    int (*gather_idle)(tp_comm *c, const void *x, size_t bytes, void *out, verr *err);
    void *impl;
    // Time inside the collectives (waiting for the other ranks included), and counts.
    double sum_s, gather_s;
    long n_sum, n_gather;
    double sum_bytes;
    int failed_together;  // the last tp_agree failed, on every rank alike (a clean exit is safe)
};

// What one rank holds. Ranges are [first, first + count).
typedef struct {
    int rank, size;          // size 1: the whole model
    int head0, n_heads;      // query heads
    int kv_head0, n_kv_heads;
    int ffn0, n_ffn;         // intermediate (gate/up rows, down columns)
    int vocab0, n_vocab;     // lm_head rows
    int max_heads, max_vocab;  // the most any rank holds (gathers pad to these)
} tp_shard;

// The whole model as one rank.
void tp_shard_whole(const model_config *c, tp_shard *s);
// Rank r of n's share. Query heads go out in whole KV groups when n divides into the
// KV heads unevenly or evenly (n <= n_kv_heads: each rank its KV heads and their query
// heads), or with each KV head repeated on n / n_kv_heads ranks that split its group
// (n > n_kv_heads, when both divide). Other shapes are refused, naming the numbers.
int tp_shard_plan(const model_config *c, int rank, int n, tp_shard *s, verr *err);

#endif
