// session.c: see session.h.
#include "host/runtime/session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/runtime/session_cuda.h"
#include "host/runtime/tp_mpi.h"
#include "model/forward_cuda.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// *cuda_dev: the CUDA device index, or -1 for the CPU.
static int check_device(const char *dev, int *cuda_dev, verr *err) {
    *cuda_dev = -1;
    if (!dev || !strcmp(dev, "cpu")) return 0;
    if (strncmp(dev, "cuda", 4) != 0 || (dev[4] && dev[4] != ':'))
        return verr_set(err, "unknown device '%s' (use cpu or cuda[:N])", dev);
    return session_cuda_parse(dev, cuda_dev, err);
}

static int open_tokenizer(session *s, const char *dir, verr *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) != 0) return 0;  // ids-only model dirs are fine
    s->tok = tokenizer_load(dir, err);
    return s->tok ? 0 : -1;
}

// The interventions, checked against the loaded model (fw.hooks is set once fw exists;
// the CUDA forward reads the same hooks: model/forward_cuda_hooks.c).
static int open_steer(session *s, const steer_spec *sp, verr *err) {
    if (!steer_spec_active(sp)) return 0;
    if (!(s->steer = malloc(sizeof *s->steer))) return verr_set(err, "out of memory");
    if (steer_open(s->steer, sp, &s->m, err)) {
        free(s->steer);
        s->steer = NULL;
        return -1;
    }
    return 0;
}

// --lora / --lora-scaled: each adapter checked against the model, then applied.
static int open_adapters(session *s, const session_opts *o, verr *err) {
    if (o->n_lora <= 0) return 0;
    s->adapters = calloc((size_t)o->n_lora, sizeof *s->adapters);
    s->lora = calloc((size_t)o->n_lora, sizeof *s->lora);
    if (!s->adapters || !s->lora) return verr_set(err, "out of memory");
    for (int i = 0; i < o->n_lora; i++) {
        if (lora_load(&s->adapters[i], &s->m, o->lora[i].dir, err)) return -1;
        s->lora[i] = (lora_use){ &s->adapters[i], o->lora[i].scale };
        s->n_adapters = i + 1;
        if (lora_check_scale(&s->adapters[i], o->lora[i].scale, err)) return -1;
    }
    return session_set_lora(s, s->lora, s->n_adapters, err);
}

int session_set_lora(session *s, const lora_use *u, int n, verr *err) {
    if (s->tpl) return session_tpl_set_lora(s, u, n, err);  // every rank's forward
    if (s->cu) return cuda_forward_set_lora(s->cu, u, n, err);  // the CPU forward's scratch is not needed
    return forward_set_lora(&s->fw, u, n, err);
}

int session_open(session *s, const session_opts *o, verr *err) {
    memset(s, 0, sizeof *s);
    double t0 = now_s();
    int cuda_dev;
    model_path mp;
    int failed = check_device(o->device, &cuda_dev, err) || model_path_resolve(o->model_dir, o->progress, &mp, err) ||
                 model_load(&s->m, mp.dir, err);
    int local = o->tp > 1 && !o->tp_comm && o->tp_devices;  // one process, several GPUs
    if (local && !failed && session_tpl_shard(s, o, &cuda_dev, err)) {
        session_close(s);
        return -1;
    }
    if (!failed && o->tp > 1 && !local) cuda_dev = session_tp_device(o, cuda_dev, session_cuda_devices());
    if (o->tp > 1 && !local && session_tp_shard(s, o, failed, cuda_dev, err)) {  // every rank of the group returns here alike
        if (o->tp_comm) o->tp_comm->failed_together = 1;
        if (!failed) model_free(&s->m);
        return -1;
    }
    if (failed) return -1;
    const model_config *c = &s->m.cfg;
    s->ctx = o->ctx > 0 ? o->ctx : (c->max_pos < 4096 ? c->max_pos : 4096);
    if (o->ctx > c->max_pos) {
        int max_pos = c->max_pos;  // c points into the model model_free clears
        session_tpl_close(s);
        model_free(&s->m);
        return verr_set(err, "%s %d exceeds the model's max_position_embeddings (%d)", o->ctx_name ? o->ctx_name : "--ctx",
                        o->ctx, max_pos);
    }
    if (o->threads > 0) cpu_set_threads(o->threads);
    s->decode_persistent = o->decode_persistent;
    s->lookahead = o->lookahead;
    int batch = o->max_batch > 0 ? o->max_batch : 256;
    err->msg[0] = 0;
    failed = open_steer(s, &o->steer, err) || (cuda_dev < 0 && !o->weights_mmap && model_place(&s->m, err)) ||
             forward_init(&s->fw, &s->m, batch < s->ctx ? batch : s->ctx, s->ctx, err) ||
             (cuda_dev >= 0 ? session_cuda_open(s, cuda_dev, NULL, err)
                            : kv_cache_init_typed(&s->kv, c->n_layers, s->ctx, model_kv_dim(&s->m), o->kv_bf16, err)) ||
             sampler_init(&s->smp, c->vocab_size) != 0 || open_tokenizer(s, mp.dir, err) ||
             open_adapters(s, o, err) || (o->tp > 1 && !local && forward_set_comm(&s->fw, o->tp_comm, err));
    if (failed && !err->msg[0]) verr_set(err, "out of memory");
    if (o->tp > 1 && !local && tp_agree(o->tp_comm, !failed, err->msg, err)) failed = 1;  // no rank goes on alone
    if (!failed && o->tp > 1 && s->cu && !local && session_tp_join_cuda(s, o, err)) failed = 1;  // the NCCL group
    if (!failed && local && session_tpl_open(s, o, err)) failed = 1;
    if (failed) {
        session_close(s);
        return -1;
    }
    s->fw.hooks = s->steer ? &s->steer->hooks : NULL;
    s->load_s = now_s() - t0;
    return 0;
}

int session_open_shared(session *s, const session *base, int ctx, verr *err) {
    memset(s, 0, sizeof *s);
    s->m = base->m;  // shallow: the weights stay base's
    s->tok = base->tok;
    s->borrowed = 1;
    s->ctx = ctx > 0 ? ctx : base->ctx;
    memcpy(s->stop, base->stop, sizeof s->stop);
    s->n_stop = base->n_stop;
    s->lookahead = base->lookahead;
    s->adapters = base->adapters, s->lora = base->lora, s->n_adapters = base->n_adapters;
    if (ctx > base->m.cfg.max_pos) {
        session_close(s);
        return verr_set(err, "context %d exceeds the model's max_position_embeddings (%d)", ctx, base->m.cfg.max_pos);
    }
    const model_config *c = &s->m.cfg;
    // On a tensor-parallel shard the context joins base's group (docs/distributed.md): on
    // the CPU base's MPI communicator, on CUDA base's NCCL communicator (session_cuda_open),
    // in one process base's other ranks too.
    if (forward_init(&s->fw, &s->m, base->fw.max_T < s->ctx ? base->fw.max_T : s->ctx, s->ctx, err) ||
        (base->cu ? session_cuda_open(s, cuda_forward_device(base->cu), base, err)
                  : kv_cache_init_typed(&s->kv, c->n_layers, s->ctx, model_kv_dim(&s->m), base->kv.bf16, err)) ||
        (!base->cu && base->fw.comm && forward_set_comm(&s->fw, base->fw.comm, err)) ||
        (base->tpl && session_tpl_open_shared(s, base, err)) ||
        sampler_init(&s->smp, c->vocab_size) != 0 || session_set_lora(s, s->lora, s->n_adapters, err)) {
        if (!err->msg[0]) verr_set(err, "out of memory");
        session_close(s);
        return -1;
    }
    s->steer = base->steer;
    s->fw.hooks = base->steer ? &base->steer->hooks : NULL;
    return 0;
}

void session_close(session *s) {
    session_tpl_leave(s);   // a one-process group's NCCL communicators, all at once
    session_cuda_close(s);  // gives fw its host buffers back, frees the device KV cache (and its peers)
    session_tpl_close(s);   // the other ranks of a one-process group
    forward_free(&s->fw);
    kv_cache_free(&s->kv);
    sampler_free(&s->smp);
    if (!s->borrowed) {
        if (s->steer) steer_free(s->steer);
        free(s->steer);
        if (s->tok) tokenizer_free(s->tok);
        for (int i = 0; i < s->n_adapters; i++) lora_free(&s->adapters[i]);
        free(s->adapters), free(s->lora);
        model_free(&s->m);
    }
    memset(s, 0, sizeof *s);
}

int session_turn_begin(session *s, verr *err) { return s->turn ? s->turn->begin(s->turn->ud, err) : 0; }

void session_turn_end(session *s) {
    if (s->turn) s->turn->end(s->turn->ud);
}

static int forward_once(session *s, kv_view *kv, const int *ids, int T, verr *err) {
    if (s->tpl) return session_tpl_forward(s, kv, ids, T, err);
    if (s->cu) return cuda_forward_run(s->cu, &s->fw, kv, ids, T, err);
    return forward(&s->fw, kv, ids, T, err);
}

int session_forward(session *s, kv_view *kv, const int *ids, int T, verr *err) {
    if (session_turn_begin(s, err)) return -1;
    int rc = forward_once(s, kv, ids, T, err);
    session_turn_end(s);
    return rc;
}

int session_forward_all(session *s, kv_view *kv, const int *ids, int T, float *out, verr *err) {
    if (!s->cu) {
        if (session_turn_begin(s, err)) return -1;
        int rc = forward_all(&s->fw, kv, ids, T, out, err);
        session_turn_end(s);
        return rc;
    }
    size_t vocab = (size_t)s->m.cfg.vocab_size;
    for (int t = 0; t < T; t++) {
        if (session_forward(s, kv, ids + t, 1, err)) return -1;
        memcpy(out + (size_t)t * vocab, s->fw.logits, vocab * sizeof(float));
    }
    return 0;
}

const float *session_logits(session *s, verr *err) {
    if (s->cu && cuda_forward_logits(s->cu, &s->fw, err)) return NULL;
    return s->fw.logits;
}

int session_metrics(const session *s, metrics_ws *ws, token_metrics *m) {
    const forward_state *fw = &s->fw;
    const model_config *c = &s->m.cfg;
    if (fw->dev_stats) {  // CUDA: a few floats the forward copied back
        metrics_from_stats(m, fw->logit_stats, fw->attn_stats);
        return 0;
    }
    // The CPU forward (and a CUDA step without a capture layer, whose scores never came back)
    int keys = fw->attn_layer >= 0 && !s->cu ? fw->attn_keys : 0;
    if (metrics_logits(ws, fw->logits, c->vocab_size, m)) return -1;
    return metrics_attention(ws, fw->attn_scores, c->n_heads, keys, m);
}

int session_add_stop(session *s, int id) {
    if (session_is_stop(s, id)) return 0;
    if (s->n_stop == (int)(sizeof s->stop / sizeof *s->stop)) return -1;
    s->stop[s->n_stop++] = id;
    return 0;
}

int session_is_stop(const session *s, int id) {
    for (int i = 0; i < s->m.cfg.n_eos; i++)
        if (s->m.cfg.eos_ids[i] == id) return 1;
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop[i] == id) return 1;
    return s->tok && tokenizer_eos_id(s->tok) == id;
}

int session_encode_prompt(const session *s, const char *text, int **ids, verr *err) {
    return session_encode_text(s, text, 1, ids, err);
}

int session_encode_text(const session *s, const char *text, int parse_special, int **ids, verr *err) {
    if (!s->tok) return verr_set(err, "%s has no tokenizer.json: pass token ids with --ids", s->m.dir);
    int *body = NULL;
    int n = tokenizer_encode(s->tok, text, strlen(text), parse_special, &body, err);
    if (n < 0) return -1;
    int bos = tokenizer_add_bos(s->tok) ? tokenizer_bos_id(s->tok) : -1;
    int *out = malloc(sizeof(int) * (size_t)(n + 1));
    if (!out) {
        free(body);
        return verr_set(err, "out of memory");
    }
    int k = 0;
    if (bos >= 0) out[k++] = bos;
    memcpy(out + k, body, sizeof(int) * (size_t)n);
    free(body);
    *ids = out;
    return n + k;
}

int parse_id_list(const char *str, int **ids, verr *err) {
    size_t cap = 1;
    for (const char *p = str; *p; p++) cap += *p == ',';
    int *out = malloc(cap * sizeof *out), n = 0;
    if (!out) return verr_set(err, "out of memory");
    const char *p = str;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff || (*end && *end != ',')) {
            free(out);
            return verr_set(err, "--ids: '%s' is not a comma-separated list of token ids (at offset %ld)", str,
                            (long)(p - str));
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        free(out);
        return verr_set(err, "--ids: empty list");
    }
    *ids = out;
    return n;
}
