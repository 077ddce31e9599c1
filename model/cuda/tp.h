// tp.h: tensor parallelism on the device (docs/distributed.md): a forward holding rank
// `rank` of `size`'s shard (f->m->tp) meets the other ranks in NCCL collectives queued
// on its stream. comm NULL: the whole model on this device. A second context on the same
// shard borrows its lead's communicator: lead points at the lead's dev_tp, which holds
// the group's state (comm, broken, why); the buffers are each forward's own.
#ifndef VARENT_CUDA_TP_H
#define VARENT_CUDA_TP_H

#include "model/cuda/core.h"

typedef struct dev_tp {
    void *comm;                // ncclComm_t (a borrower: a copy of the lead's, used only through the lead)
    struct dev_tp *lead;       // NULL: this forward joined the group itself
    int rank, size;
    int *head0, *n_heads;      // [size] every rank's query heads (host)
    int *vocab0, *n_vocab;     // [size] and vocabulary rows
    float *part_logits;        // device [rows, max_vocab]: this rank's vocabulary slice of each row
    float *part_scores;        // device [rows, max_heads, max_ctx]: its heads' attention captures
    float *gather;             // device [size, rows * max(max_vocab, max_heads * max_ctx)]
    double timeout_s;          // a wait on the stream gives up after this long (0: never)
    int broken;                // a collective failed: the group is out of step, every call fails
    char why[512];             // what failed
} dev_tp;

// The dev_tp that holds the group's communicator and state: the lead's for a borrower.
static inline dev_tp *cuda_tp_group(const dev_tp *t) { return t->lead ? t->lead : (dev_tp *)t; }
// 128 bytes: NCCL's unique id (the public CUDA_TP_ID_BYTES).
int cuda_tp_id(unsigned char id[128], verr *err);
// Joins the group of unique id `id` (blocks until every rank has, or timeout_s).
int cuda_tp_join(cuda_core *f, dev_tp *t, const unsigned char id[128], double timeout_s, verr *err);
// Joins lead's group by borrowing its communicator (f shares lead_w, the lead's weights).
int cuda_tp_share(cuda_core *f, dev_tp *t, const dev_tp *lead, const dev_weights *lead_w, verr *err);
// y[n] summed over the ranks, in place, the same bits on every rank (reduce-scatter,
// then all-gather), queued on the stream. y has room for cuda_core_pad more floats.
int cuda_tp_sum(cuda_core *f, dev_tp *t, float *y, size_t n, verr *err);
// The B rows of this rank's vocabulary slice (part_logits, [B, n_vocab] packed) gathered
// into f->logits [B, vocab].
int cuda_tp_logits(cuda_core *f, dev_tp *t, int B, verr *err);
// The B rows of this rank's heads' captures (part_scores: row b at b * n_heads_local *
// max_ctx, [n_heads_local, n_keys] packed) gathered into f->scores (row b at b * n_heads *
// max_ctx, [n_heads, n_keys] packed); lens: the rows' key counts (host).
int cuda_tp_scores(cuda_core *f, dev_tp *t, int B, const cuda_kv_lens *lens, verr *err);
// One attention capture of this rank's heads ([n_heads_local, keys] packed, in a buffer
// of n_heads * max_ctx) replaced in place by every rank's ([n_heads, keys] packed).
int cuda_tp_gather_heads(cuda_core *f, dev_tp *t, float *scores, int keys, verr *err);
// Waits for the stream: under tensor parallelism it polls, checks NCCL's asynchronous
// error and gives up after the timeout (aborting the communicator), so a dead peer is an
// error, not a hang. Without it, cudaStreamSynchronize.
int cuda_tp_wait(cuda_core *f, dev_tp *t, verr *err);
// Leaves the group (ncclCommDestroy; a borrower only stops using the lead's communicator).
void cuda_tp_leave(cuda_core *f, dev_tp *t);
void cuda_tp_free(dev_tp *t);

#endif
