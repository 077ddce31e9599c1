// sched_internal.h: the scheduler's state, shared by sched.c (queue, admission, steps)
// and sched_reuse.c (whole-prompt entries and prefix blocks). Not a public interface.
#ifndef VARENT_SCHED_INTERNAL_H
#define VARENT_SCHED_INTERNAL_H

#include "host/decode/gen_step.h"
#include "host/decode/sched.h"

enum { SEQ_QUEUED, SEQ_PREFILL, SEQ_DECODE };

typedef struct seq {
    sched_seq r;
    int *prompt;         // [r.n_prompt] the scheduler's copy
    int state;
    int fed;             // prompt positions in kv
    int pending;         // the token the next batch feeds (-1: none)
    kv_cache kv;         // paged: the pool's blocks (host or device)
    int open;            // kv is open
    int worst;           // blocks its worst case maps
    int reserve;         // of them, not mapped yet: the pool keeps that many idle for it
    gen_ctx c;
    int ctx_ok;          // c initialised
    gen_stats st;
    uint64_t salt;       // its adapters, folded into its prefix keys
    double t_prefill, t_decode;
    struct seq *next;    // the queue
} seq;

// A prompt prefilled before: its positions (whole blocks shared, the last partial block
// a copy of its own) and the logits and metrics of its last position.
typedef struct {
    int used;
    uint64_t hash, salt;
    int *ids, n;
    kv_cache kv;
    float *logits;       // [vocab]
    token_metrics m;
    int layer;           // the capture layer m was computed with (-1: no metrics)
    long stamp;          // last use, for least-recently-used eviction
} sched_entry;

#define SCHED_ENTRIES 16

struct sched {
    session *s;
    sched_opts o;
    int max_rows;
    int pooled;              // the pool below holds the sequences' caches (always, once open)
    kv_pool pool;
    int reserved;            // the sum of the admitted sequences' reserves
    seq *head, *tail;        // the queue
    int n_queued;
    seq **run;               // [max_rows] admitted, in admission order
    int n_run;
    int layer;               // the capture layer of the metrics (-1: none yet)
    int chunk;               // prefill chunk: the session's --batch (fw.max_T)
    float *logits;           // [max_rows, vocab] a batch's rows
    token_metrics *m;        // [max_rows]
    kv_view *views;          // [max_rows]
    int *ids;                // [max_rows]
    seq **rows;              // [max_rows] the sequence of each row
    sample_cfg *cfg;         // [max_rows] the rows' draws, when the device makes them
    sample_out *drawn;       // [max_rows] their results
    metrics_ws ws;
    batch_ws bw;
    sched_entry entries[SCHED_ENTRIES];
    long clock;              // entry stamps
    const lora_use *lora_u;  // the adapters the session applies now ([lora_n])
    int lora_n;
    sched_stats st;
};

// sched_reuse.c
// Before a sequence's first prefill chunk: maps a whole earlier prompt (then *row and *m
// are its last logits and metrics and the sequence needs no prefill; returns 2) or the
// blocks of its longest registered whole chunks (returns 1 when any), else 0.
int sched_reuse_find(sched *q, seq *x, const float **row, token_metrics *m);
// After a sequence's last prefill chunk (its logits in the session, its metrics m or
// NULL): registers its whole chunks' blocks and keeps the prompt as an entry when the
// pool can spare a block.
void sched_reuse_keep(sched *q, seq *x, const token_metrics *m);
// Drops the least recently used entry; 0 when there was none.
int sched_reuse_evict(sched *q);
void sched_reuse_free(sched *q);
// Blocks sequence x maps now; its reserve follows (the pool accounting).
void sched_update_reserve(sched *q, seq *x);

#endif
