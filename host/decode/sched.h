// sched.h: continuous batching. Many sequences (server requests, eval trials, batch and
// compare prompts) decode together on one session: each step feeds the next token of
// every running sequence in one session_forward_batch, so the weights are read once per
// step for all of them, and prompts are prefilled in chunks between steps.
//
// Batching changes no token. A sequence is decoded by the same code as generate()
// (host/decode/gen_step.c: its own seeded stream, penalties, logit bias, entropix,
// stop ids and max_new), its prompt is prefilled in generate()'s chunks (--batch
// positions from position 0), and each batch row is computed exactly as a one-token
// forward (forward_batch's row-exact products). So its tokens, records and metrics are
// those of generate() alone on the same session, bit for bit.
//
// The sequences' keys and values live in one paged pool (model/kv_pool.h): host memory
// on the CPU, device memory on CUDA (the device forward reads each row's cache through
// its block table, with the same kernels and bits as a contiguous cache).
// A sequence is admitted when the pool can hold its worst case (prompt + max_new, at
// most the context): a full pool queues the next sequence, and nothing running ever
// runs out of blocks. Two reuses skip prefill work without changing a bit:
//   - whole prompts: a prompt equal to one prefilled before (n > 1 choices, eval arms and
//     repeats of one item) maps its positions and starts from its saved last logits;
//   - prefixes: the blocks of a prompt's whole --batch chunks are registered under their
//     token ids; a prompt that begins with the same chunks maps them and prefills from
//     the first chunk that differs (only whole chunks: a chunk is computed alike only
//     when it is the same chunk).
// Idle blocks keep their prefixes until the pool needs them (least recently used first).
// On CUDA a copied partial block is a device copy on the session's stream.
#ifndef VARENT_SCHED_H
#define VARENT_SCHED_H

#include <signal.h>
#include <stdio.h>

#include "host/decode/generate.h"
#include "model/kv_pool.h"

typedef struct {
    int parallel;         // sequences decoded together at most (0: as many as the pool holds, up to SCHED_MAX_ROWS)
    long pool_tokens;     // the pool's positions (0: from pool_mb; both 0: SCHED_DEFAULT_POOL_MB)
    long pool_mb;         // the pool's size in MiB (host memory, or device memory on CUDA)
    int no_reuse;         // no prefix or whole-prompt reuse
    const volatile sig_atomic_t *interrupt;  // set: every sequence ends (interrupted) at its next token
} sched_opts;

#define SCHED_MAX_ROWS 64
#define SCHED_DEFAULT_POOL_MB 1024
#define SCHED_BLOCK 16  // positions per pool block (fewer when --batch is not a multiple of 16)

// One sequence to run. Everything it points to must outlive it (until on_done).
typedef struct {
    const int *prompt;         // [n_prompt], copied at submission
    int n_prompt;
    const gen_opts *g;         // sampler, seed, callbacks (called from sched_step); not branch_k,
                               // feed_last or captures (those run with generate())
    const lora_use *lora;      // [n_lora] its adapters; NULL: the session's own (s->lora)
    int n_lora;
    // Called once when it ends: rc 0, or -1 with why (then st may be partial).
    void (*on_done)(void *ud, int rc, const gen_stats *st, const char *why);
    void *ud;
} sched_seq;

typedef struct sched sched;

// Statistics for /metrics and --stats.
typedef struct {
    int running, queued;      // sequences decoding or prefilling; waiting to start
    int pool_blocks, pool_used, block;  // the pool: blocks, mapped ones, positions per block
    long prompt_tokens, reused_tokens;  // prompt positions admitted; found in the caches instead of computed
    long generated;           // tokens generated
    long steps, rows;         // decode batches and their rows (rows / steps: the mean batch)
    int widest;               // the most rows of one batch
    long device_draws;        // rows whose draw the device made (CUDA: only the token came back)
    long evictions;           // idle prefix blocks handed out again
} sched_stats;

int sched_open(sched **out, session *s, const sched_opts *o, verr *err);
void sched_close(sched *q);  // ends what is left (on_done with "the scheduler was closed")
// Queues a sequence; -1 with err when it can never run (a prompt that does not fit
// the context, a worst case larger than the whole pool, an unsupported option).
int sched_submit(sched *q, const sched_seq *r, verr *err);
// Whether a sequence submitted now would start at the next step (free rows and room).
int sched_has_room(const sched *q);
// Sequences queued or running.
int sched_pending(const sched *q);
// One step: admits what fits, prefills up to a chunk of prompt positions, feeds every
// running sequence's next token in one batch and samples. Sequences that end call
// on_done. -1 with err only when the scheduler itself cannot go on (out of memory).
int sched_step(sched *q, verr *err);
void sched_get_stats(const sched *q, sched_stats *st);
// One line of them for --stats: the batches' mean and widest rows, the reuse, the pool.
void sched_report(const sched *q, FILE *f);

// A list of n items run through q, their results taken in input order (batch runs,
// compare, eval: records in the order of the input, whatever order they end in).
//   submit(i, r): fills r for item i (r->on_done and r->ud are the map's); returns 0, 1
//     for an item the caller runs itself at its turn (LEHV branching, captures), -1 with err;
//   take(i, rc, st, why): item i's turn, once it and every item before it ended (st and
//     why as on_done gave them; for an item run by the caller rc is 1 and st NULL).
//     Non-zero stops the map (1: as asked, -1: with err).
// Items are submitted while the scheduler has room and at most `window` past the oldest
// untaken one. Returns 0, 1 when take stopped it, -1 with err. q NULL (no scheduler: a
// tensor-parallel model): every item is the caller's own, taken in order.
typedef struct {
    int (*submit)(void *ud, int i, sched_seq *r, verr *err);
    int (*take)(void *ud, int i, int rc, const gen_stats *st, const char *why, verr *err);
    void *ud;
    int window;  // 0: the scheduler's rows twice over
    // Optional: item i named for messages (a file and line), when the scheduler refuses it.
    void (*where)(void *ud, int i, char *buf, size_t len);
} sched_map_fns;
int sched_map(sched *q, int n, const sched_map_fns *f, verr *err);

#endif
