// session.h: everything one generation needs, opened from a model directory:
// the model, the forward scratch, the KV cache, the tokenizer (when the directory
// has one) and the sampler.
#ifndef VARENT_SESSION_H
#define VARENT_SESSION_H

#include "host/kv_cache.h"
#include "host/sampler.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *model_dir;
    int ctx;          // 0: min(max_position_embeddings, 4096)
    int threads;      // 0: all cores
    const char *device;  // "cpu" (default) or "cuda[:N]"
    int max_batch;    // prefill chunk size (0: 256)
} session_opts;

typedef struct {
    model m;
    forward_state fw;
    kv_cache kv;
    tokenizer *tok;   // NULL when the model dir has no tokenizer.json
    sampler smp;
    int ctx;
    double load_s;    // seconds spent loading
    int stop[16];     // extra stop ids (chat end-of-turn tokens)
    int n_stop;
    int borrowed;     // model and tokenizer belong to another session (session_open_shared)
    struct cuda_forward *cu;  // CUDA backend state (host/session_cuda.c); NULL on the CPU
} session;

int session_open(session *s, const session_opts *o, verr *err);
// A second context on base's model: its own forward scratch, KV cache (ctx positions,
// 0: base's) and sampler, borrowing base's weights and tokenizer, which must outlive it.
// Used for the critic, server slots and agent replicas on one device.
int session_open_shared(session *s, const session *base, int ctx, verr *err);
void session_close(session *s);
// The forward pass on the session's backend: appends T tokens to the sequence in kv
// and leaves the last token's logits in s->fw.logits (host memory on every backend),
// plus the attention capture when s->fw.attn_layer >= 0. Use this, not forward().
int session_forward(session *s, kv_view *kv, const int *ids, int T, verr *err);
// session_forward that also writes every new position's logits to out [T, vocab], host
// memory (perplexity, scoring). The CUDA backend feeds one token at a time for now.
int session_forward_all(session *s, kv_view *kv, const int *ids, int T, float *out, verr *err);
// Ids that end generation: config eos ids plus the tokenizer's eos.
int session_is_stop(const session *s, int id);
// Adds an id that ends generation; -1 when the table is full.
int session_add_stop(session *s, int id);
// Text to prompt ids, with BOS when the tokenizer config says so. *ids is malloc'd.
int session_encode_prompt(const session *s, const char *text, int **ids, verr *err);

// Parses "1,2,3" into a malloc'd array; returns the count or -1 with err.
int parse_id_list(const char *s, int **ids, verr *err);

#endif
