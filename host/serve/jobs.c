// jobs.c: the request queue, the slots that serve it and the per-token output
// (text with stop strings, logprobs, metrics; SSE chunks or one JSON body).
// Each slot is a thread with its own session context; requests are taken in arrival
// order (FIFO), one request's choices run one after another on the same slot.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/decode/perplexity.h"
#include "host/serve/internal.h"
#include "host/serve/capture.h"
#include "kernels/ops.h"

double server_now(void) { return gen_now(); }

// ---- queue ----------------------------------------------------------------------

server_job *server_job_new(server *s) {
    server_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->srv = s, j->refs = 1, j->fd = -1, j->t_new = server_now(), j->created = (long)time(NULL);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    s->inflight++;
    s->n_requests++;
    snprintf(j->id, sizeof j->id, "%lx%06lx", (unsigned long)j->created, (unsigned long)s->n_requests & 0xffffff);
    pthread_mutex_unlock(&s->mu);
    return j;
}

void server_job_release(server_job *j) {
    server *s = j->srv;
    pthread_mutex_lock(&s->mu);
    int last = --j->refs == 0;
    if (last) {
        s->inflight--;
        if (atomic_load(&j->cancelled)) s->n_cancelled++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (!last) return;
    server_request_free(&j->req);
    free(j->raw);
    for (int i = 0; i < j->n_prompts; i++) {
        job_prompt *p = &j->prompts[i];
        free(p->ids), free(p->echo_lp), free(p->echo_top_lp), free(p->echo_top);
    }
    free(j->prompts), free(j->lora);
    sb_free(&j->out), sb_free(&j->body), sb_free(&j->chunk_head);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void server_job_cancel(server_job *j) { atomic_store(&j->cancelled, 1); }

int server_job_enqueue(server *s, server_job *j) {
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->stopping)) {  // the slots may have exited: nothing would run it
        pthread_mutex_unlock(&s->mu);
        return -2;
    }
    if (s->queued >= s->o.max_queue + (s->n_slots - s->busy)) {  // waiting beyond the free slots
        s->n_rejected++;
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    j->refs++;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->queued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

server_job *server_queue_pop(server *s, int wait) {
    pthread_mutex_lock(&s->mu);
    while (wait && !s->head && !atomic_load(&s->stopping)) pthread_cond_wait(&s->cv, &s->mu);
    server_job *j = s->head;  // when stopping, queued jobs are still taken (they are cancelled: quick)
    if (j) {
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->queued--, s->busy++;
    }
    pthread_mutex_unlock(&s->mu);
    return j;
}

// ---- one choice -----------------------------------------------------------------

struct server_choice {
    server_job *j;
    session *s;
    job_prompt *p;    // its prompt
    int index;        // in the response: p's number times n, plus its own
    tokenizer_stream *ts;
    sbuf text;        // the completion text so far (cut at a stop string)
    size_t sent;      // bytes of text already streamed
    sbuf mx;          // metrics objects, comma-separated (streaming: not yet sent)
    int n_mx;
    sbuf lp[4];       // logprobs; chat: content entries; completions: tokens, token_logprobs, top_logprobs, text_offset
    int n_lp;
    sbuf ev;          // the SSE event being built
    probe *probe;     // the slot's (or cap's): --attn-layers and --logit-lens members of each metrics object
    serve_cap cap;    // --dump-acts/--dump-attn DIR: this choice's files (capture.h)
    int stop_hit, role_sent, has_lz;
    size_t echo_len;  // bytes of text that echo the prompt (stop strings look past them)
    gen_opts g;       // its generation (run here, or by the engine: engine.c)
    gen_stats st;
};
typedef server_choice choice;

// ---- token texts ------------------------------------------------------------------

// Every id's text as it reads after another token: decode(x, id) less decode(x) for a
// plain token x, so SentencePiece pieces keep their leading space (decoded alone,
// " the" would lose it). Built once at startup, read-only after: no per-token decode.
int server_token_texts(server *s, verr *err) {
    const tokenizer *t = s->base->tok;
    int vocab = s->base->m.cfg.vocab_size, *ids = NULL, x;
    int n = tokenizer_encode(t, "a", 1, 0, &ids, err);
    if (n <= 0) return free(ids), verr_set(err, "the tokenizer cannot encode \"a\"");
    x = ids[n - 1];
    free(ids);
    s->tok_off = malloc(sizeof(unsigned) * ((size_t)vocab + 1));
    if (!s->tok_off) return verr_set(err, "out of memory");
    verr e;
    char *xs = tokenizer_decode(t, &x, 1, 0, &e);
    size_t xn = xs ? strlen(xs) : 0;
    for (int id = 0; id < vocab; id++) {
        s->tok_off[id] = (unsigned)s->tok_text.len;
        int pair[2] = { x, id };
        char *both = xs && id < tokenizer_vocab_size(t) ? tokenizer_decode(t, pair, 2, 0, &e) : NULL;
        if (both && !strncmp(both, xs, xn)) {
            sb_puts(&s->tok_text, both + xn);
        } else if (id < tokenizer_vocab_size(t)) {
            char *alone = tokenizer_decode(t, &id, 1, 0, &e);
            if (alone) sb_puts(&s->tok_text, alone);
            free(alone);
        }
        free(both);
    }
    s->tok_off[vocab] = (unsigned)s->tok_text.len;
    free(xs);
    return s->tok_text.oom || s->tok_text.len > 0xffffffffu ? verr_set(err, "out of memory") : 0;
}

static const char *decode_one(void *ud, int id, size_t *n) {
    const server *s = ((choice *)ud)->j->srv;
    *n = s->tok_off[id + 1] - s->tok_off[id];
    return s->tok_text.p + s->tok_off[id];
}

static double log_sum_exp(const float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

// The k largest logits, largest first (ties: lower id); returns how many.
static int top_ids(const float *x, int n, int k, int *ids) {
    int m = 0;
    if (k <= 0) return 0;
    for (int i = 0; i < n; i++) {
        if (m == k && x[i] <= x[ids[m - 1]]) continue;
        int p = m < k ? m++ : k - 1;
        while (p > 0 && x[ids[p - 1]] < x[i]) ids[p] = ids[p - 1], p--;
        ids[p] = i;
    }
    return m;
}

static void sep(sbuf *b, int first) {
    if (!first) sb_put(b, ",", 1);
}

// Logprobs of the chosen token and the alternatives, from the raw logits of this step
// (generate calls on_record before the next forward overwrites s->fw.logits).
static void record_logprobs(choice *c, const gen_record *r, const char *t, size_t tn) {
    const float *lg = r->logits ? r->logits : c->s->fw.logits;  // the engine's batch row, or the slot's forward
    int vocab = c->s->m.cfg.vocab_size, ids[SERVER_MAX_TOP_LOGPROBS];
    double lz = c->has_lz ? r->m.log_z : log_sum_exp(lg, vocab), lp = lg[r->token] - lz;
    double lps[SERVER_MAX_TOP_LOGPROBS];
    int k = top_ids(lg, vocab, c->j->req.top_logprobs, ids);
    for (int i = 0; i < k; i++) lps[i] = lg[ids[i]] - lz;
    int first = c->n_lp++ == 0;
    if (c->j->req.chat) {
        sep(&c->lp[0], first);
        sb_chat_logprob(&c->lp[0], t, tn, lp, ids, lps, k, decode_one, c);
        return;
    }
    for (int i = 0; i < 4; i++) sep(&c->lp[i], first);
    sb_json_str(&c->lp[0], t, tn);
    sb_json_num(&c->lp[1], lp);
    sb_top_map(&c->lp[2], ids, lps, k, decode_one, c);
    sb_printf(&c->lp[3], "%zu", c->text.len);
}

// ---- echo: the prompt before the completion -----------------------------------------

typedef struct {
    job_prompt *p;
    int vocab, k;
} echo_rows;

static int echo_row(void *ud, int i, const float *lg) {
    echo_rows *e = ud;
    job_prompt *p = e->p;
    int k = e->k, *top = p->echo_top + (size_t)i * k;
    double lz = log_sum_exp(lg, e->vocab);
    p->echo_lp[i] = lg[p->ids[i]] - lz;
    int got = top_ids(lg, e->vocab, k, top);
    for (int t = 0; t < k; t++) p->echo_top_lp[(size_t)i * k + t] = t < got ? lg[top[t]] - lz : NAN;
    return 0;
}

// Every prompt token's logprob and alternatives, from one teacher-forced pass over the
// prompt on the slot's session (its first choice's; later choices reuse them).
static int echo_score(session *s, server_job *j, job_prompt *p, verr *err) {
    if (p->echo_scored) return 0;
    size_t n = (size_t)p->n_ids, k = (size_t)j->req.top_logprobs;
    p->echo_lp = malloc(sizeof(double) * n);
    p->echo_top = malloc(sizeof(int) * (n * k + 1));
    p->echo_top_lp = malloc(sizeof(double) * (n * k + 1));
    if (!p->echo_lp || !p->echo_top || !p->echo_top_lp) return verr_set(err, "out of memory");
    echo_rows e = { p, s->m.cfg.vocab_size, (int)k };
    if (p->n_ids > 1 && ppl_score_rows(s, p->ids, p->n_ids, 1, echo_row, &e, err)) return -1;
    p->echo_scored = 1;
    return 0;
}

// The prompt's text first (decoded by the completion's own stream, so text that spans
// the boundary reads right) and, with logprobs, one entry per prompt token: the first
// has none (null), as in OpenAI's echo.
static int echo_prompt(choice *c, verr *err) {
    server_job *j = c->j;
    job_prompt *p = c->p;
    if (j->req.logprobs && echo_score(c->s, j, p, err)) return -1;
    for (int i = 0; i < p->n_ids; i++) {
        const char *piece;
        verr e;
        size_t at = c->text.len, tn;
        int n = tokenizer_stream_push(c->ts, p->ids[i], &piece, &e);
        if (n > 0) sb_put(&c->text, piece, (size_t)n);
        if (!j->req.logprobs) continue;
        int first = c->n_lp++ == 0, k = j->req.top_logprobs;
        for (int q = 0; q < 4; q++) sep(&c->lp[q], first);
        const char *t = decode_one(c, p->ids[i], &tn);
        sb_json_str(&c->lp[0], t, tn);
        if (i == 0) {
            sb_puts(&c->lp[1], "null"), sb_puts(&c->lp[2], "null");
        } else {
            sb_json_num(&c->lp[1], p->echo_lp[i]);
            sb_top_map(&c->lp[2], p->echo_top + (size_t)i * k, p->echo_top_lp + (size_t)i * k, k, decode_one, c);
        }
        sb_printf(&c->lp[3], "%zu", at);
    }
    c->echo_len = c->text.len;
    return 0;
}

// The probe's members (",\"attn_layers\":[...]") inside the metrics object just written.
static void probe_members(choice *c) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return;
    probe_json(c->probe, f);
    if (fclose(f) == 0 && n && c->mx.len && c->mx.p[c->mx.len - 1] == '}') {
        c->mx.len--;
        sb_put(&c->mx, buf, n);
        sb_put(&c->mx, "}", 1);
    }
    free(buf);
}

// Per generated token, and for the stop token (EOS, end of turn) that ends a choice: it
// is in the logprobs and metrics with empty text, as OpenAI and vLLM list it, so an echo
// request's arrays always hold the prompt's tokens and then the generated ones.
static int on_record(void *ud, const gen_record *r) {
    choice *c = ud;
    const server_request *q = &c->j->req;
    if (!q->metrics && !q->logprobs) return 0;
    double t0 = server_now();
    size_t tn = 0;
    const char *t = session_is_stop(c->s, r->token) ? "" : decode_one(c, r->token, &tn);
    if (q->metrics) {
        sep(&c->mx, c->n_mx++ == 0);
        sb_metrics(&c->mx, r, t, tn);
        if (c->probe) probe_members(c);
    }
    if (q->logprobs) record_logprobs(c, r, t, tn);
    c->j->token_s += server_now() - t0;
    return 0;
}

// Cuts the text at the earliest stop string that ends in the bytes from `from` on.
static int find_stop(choice *c, size_t from) {
    const server_request *q = &c->j->req;
    size_t best = (size_t)-1;
    for (int i = 0; i < q->n_stop; i++) {
        size_t n = strlen(q->stop[i]), start = from >= n ? from - n + 1 : 0;
        if (start < c->echo_len) start = c->echo_len;
        if (c->text.len < n) continue;
        for (size_t p = start; p + n <= c->text.len && p < best; p++)
            if (!memcmp(c->text.p + p, q->stop[i], n)) best = p;
    }
    if (best == (size_t)-1) return 0;
    c->text.len = best;
    return 1;
}

// Bytes that may be streamed: the text less any tail that could begin a stop string.
static size_t safe_len(const choice *c) {
    const server_request *q = &c->j->req;
    size_t hold = 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t n = strlen(q->stop[i]);
        for (size_t k = n - 1; k > hold; k--)
            if (k <= c->text.len && !memcmp(c->text.p + c->text.len - k, q->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return c->text.len - hold;
}

static void put_logprobs(sbuf *b, choice *c) {
    if (!c->j->req.logprobs) return sb_puts(b, "null");
    if (c->j->req.chat) {
        sb_puts(b, "{\"content\":[");
        sb_put(b, c->lp[0].p, c->lp[0].len);
        sb_puts(b, "]}");
        return;
    }
    static const char *keys[4] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
    for (int i = 0; i < 4; i++) {
        sb_printf(b, "%s\"%s\":[", i ? "," : "{", keys[i]);
        sb_put(b, c->lp[i].p, c->lp[i].len);
        sb_puts(b, "]");
    }
    sb_puts(b, "}");
}

static void put_text(sbuf *b, choice *c, size_t from, size_t to, const char *finish) {
    if (!c->j->req.chat) {
        sb_puts(b, "\"text\":");
        sb_json_str(b, c->text.p + from, to - from);
    } else if (c->j->req.stream) {
        sb_puts(b, finish ? "\"delta\":{" : c->role_sent ? "\"delta\":{\"content\":" : "\"delta\":{\"role\":\"assistant\",\"content\":");
        if (!finish) sb_json_str(b, c->text.p + from, to - from);
        sb_puts(b, "}");
        c->role_sent = 1;
    } else {
        sb_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
        sb_json_str(b, c->text.p + from, to - from);
        sb_puts(b, "}");
    }
}

// The choice object: text [from, to), logprobs and metrics so far, finish_reason.
static void put_choice(sbuf *b, choice *c, size_t from, size_t to, const char *finish) {
    sb_printf(b, "{\"index\":%d,", c->index);
    put_text(b, c, from, to, finish);
    sb_puts(b, ",\"logprobs\":");
    put_logprobs(b, c);
    if (finish) sb_printf(b, ",\"finish_reason\":\"%s\"", finish);
    else sb_puts(b, ",\"finish_reason\":null");
    if (finish && c->cap.note[0]) sb_puts(b, c->cap.note);
    if (c->j->req.metrics) {
        sb_puts(b, ",\"metrics\":[");
        sb_put(b, c->mx.p, c->mx.len);
        sb_puts(b, "]");
    }
    sb_puts(b, "}");
}

static void put_head(sbuf *b, server_job *j, int chunk) {
    const char *obj = j->req.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    sb_printf(b, "{\"id\":\"%s%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", j->req.chat ? "chatcmpl-" : "cmpl-",
              j->id, obj, j->created);
    sb_put(b, j->srv->model_json.p, j->srv->model_json.len);
    sb_printf(b, ",\"seed\":%llu", (unsigned long long)j->seed);  // the request's, or the one drawn for it
}

static void push_out(server_job *j, const char *s, size_t n) {
    pthread_mutex_lock(&j->mu);
    sb_put(&j->out, s, n);
    if (j->waiting) pthread_cond_broadcast(&j->cv);  // no wake-up call while the reader paces
    pthread_mutex_unlock(&j->mu);
}

// One SSE event with the text [sent, to) and what is pending; resets the pending parts.
static void stream_event(choice *c, size_t to, const char *finish) {
    sbuf *b = &c->ev;
    sb_reset(b);
    if (!c->j->chunk_head.len) {  // the same for every chunk of the request: built once
        sb_puts(&c->j->chunk_head, "data: ");
        put_head(&c->j->chunk_head, c->j, 1);
        sb_puts(&c->j->chunk_head, ",\"choices\":[");
    }
    sb_put(b, c->j->chunk_head.p, c->j->chunk_head.len);
    put_choice(b, c, c->sent, to, finish);
    sb_puts(b, "]}\n\n");
    push_out(c->j, b->p, b->len);
    c->sent = to;
    sb_reset(&c->mx), c->n_mx = 0;
    for (int i = 0; i < 4; i++) sb_reset(&c->lp[i]);
    c->n_lp = 0;
}

static void nap_ms(server_job *j, int ms) {
    for (; ms > 0 && !atomic_load(&j->cancelled); ms -= 10) {
        struct timespec ts = { 0, (ms < 10 ? ms : 10) * 1000000L };
        nanosleep(&ts, NULL);
    }
}

static int on_token(void *ud, int id) {
    choice *c = ud;
    server_job *j = c->j;
    const char *piece;
    verr err;
    double t0 = server_now();
    size_t before = c->text.len;
    serve_cap_push(&c->cap, id);
    int n = tokenizer_stream_push(c->ts, id, &piece, &err);
    if (n > 0) sb_put(&c->text, piece, (size_t)n);
    if (j->req.n_stop && find_stop(c, before)) return c->stop_hit = 1;
    if (j->req.stream) {
        size_t to = j->req.n_stop ? safe_len(c) : c->text.len;
        if (to > c->sent) stream_event(c, to, NULL);
    }
    j->token_s += server_now() - t0;
    if (j->srv->o.token_delay_ms > 0 && !j->srv->engine) nap_ms(j, j->srv->o.token_delay_ms);  // the engine: per step
    int stop = atomic_load(&j->cancelled) || atomic_load(&j->srv->stopping);
    return j->srv->o.tp ? server_tp_agree(j, stop) : stop;
}

static void choice_free(choice *c) {
    if (c->ts) tokenizer_stream_free(c->ts);
    sb_free(&c->text), sb_free(&c->mx), sb_free(&c->ev);
    for (int i = 0; i < 4; i++) sb_free(&c->lp[i]);
}

// Why a choice ended: a stop string or EOS, its length, or the server stopping it
// (shutdown past --drain-timeout) before either.
static const char *finish_reason(const choice *c, const gen_stats *st, int *cut) {
    if (c->stop_hit || st->hit_eos) return "stop";
    *cut = st->n_gen < c->j->max_tokens && atomic_load(&c->j->srv->stopping);
    return *cut ? "error" : "length";
}

int server_choice_begin(server_job *j, int index, session *s, probe *pr, int set_lora, server_choice **out,
                        verr *err) {
    choice *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return verr_set(err, "out of memory");
    job_prompt *p = &j->prompts[index / j->req.n];
    *c = (choice){ .j = j, .s = s, .p = p, .index = index, .ts = tokenizer_stream_new(s->tok, 1), .probe = pr };
    c->has_lz = j->req.metrics || j->sampler == GEN_ENTROPIX;
    if (!c->ts) return verr_set(err, "out of memory");
    if (set_lora && session_set_lora(s, j->lora, j->n_lora, err)) return -1;  // this request's adapters
    if (j->req.echo) {
        if (echo_prompt(c, err)) return -1;
        if (j->req.stream) stream_event(c, c->text.len, NULL);
    } else if (!j->req.chat) {  // a completion continues the prompt: keep its first token's leading space
        const char *t;
        verr e;
        tokenizer_stream_push(c->ts, p->ids[p->n_ids - 1], &t, &e);
        tokenizer_stream_flush(c->ts, &t);
    }
    gen_opts *g = &c->g;
    // each prompt's choice i draws with seed + i: a batch gives what its prompts give alone
    *g = (gen_opts){ .max_new = j->max_tokens, .seed = j->seed + (uint64_t)(index % j->req.n), .sampler = j->sampler,
                     .ex = &j->ex };
    g->bias = j->req.bias, g->n_bias = j->req.n_bias;
    g->sp = (sampler_params){ (float)j->req.temperature, j->req.top_k, (float)j->req.top_p, (float)j->req.min_p };
    g->pen = (sampler_penalties){ .repeat = (float)j->req.repeat_penalty, .presence = (float)j->req.presence,
                                  .frequency = (float)j->req.frequency, .last_n = j->req.repeat_last_n };
    g->clarifier = j->srv->clarifier, g->want_metrics = j->req.metrics;
    g->on_token = on_token, g->ud = c, g->on_record = on_record, g->record_ud = c, g->record_stop = 1;
    g->need_logits = c->j->req.logprobs;  // record_logprobs reads the step's logits
    int rc = g->max_new > 0 ? serve_cap_open(j->srv, j, index, s, &c->cap, err) : 0;  // after the prompt's scoring
    if (c->cap.active) c->probe = c->cap.pr, g->feed_last = c->cap.reserved;  // the files cover every position
    return rc;
}

gen_opts *server_choice_opts(server_choice *c) { return &c->g; }
gen_stats *server_choice_stats(server_choice *c) { return &c->st; }

int server_choice_end(server_choice *c, int rc, sbuf *choices, int *cut, verr *err) {
    server_job *j = c->j;
    if (!c->ts) rc = -1;  // begin failed
    j->prefill_s += c->st.prefill_s, j->decode_s += c->st.decode_s;
    if (rc == 0) {
        const char *tail;
        int k = c->stop_hit ? 0 : tokenizer_stream_flush(c->ts, &tail);
        size_t before = c->text.len;
        if (k > 0) sb_put(&c->text, tail, (size_t)k);
        if (k > 0 && j->req.n_stop) c->stop_hit = find_stop(c, before);
        const char *finish = finish_reason(c, &c->st, cut);
        serve_cap_close(j->srv, &c->cap, !*cut && !atomic_load(&j->cancelled), c->p->ids, c->p->n_ids);
        if (j->req.stream) {
            if (c->text.len > c->sent || c->n_mx || c->n_lp) stream_event(c, c->text.len, NULL);
            stream_event(c, c->text.len, finish);
        } else {
            put_choice(choices, c, 0, c->text.len, finish);
        }
        if (c->text.oom || c->mx.oom || choices->oom) rc = verr_set(err, "out of memory building the response");
    } else {
        serve_cap_close(j->srv, &c->cap, 0, NULL, 0);
    }
    int n = c->st.n_gen + c->st.hit_eos;  // the stop token counts, as OpenAI and vLLM count it
    choice_free(c);
    free(c);
    return rc ? -1 : n;
}

// Runs choice `index` on the slot; appends its JSON to `choices` (non-streamed) or
// streams it. Returns the tokens generated, or -1 with err; *cut when the server stopped it.
static int run_choice(server_slot *sl, server_job *j, int index, sbuf *choices, int *cut, verr *err) {
    session *s = &sl->s;
    choice *c;
    int rc = server_choice_begin(j, index, s, sl->probe, 1, &c, err);
    if (!c) return -1;
    kv_cache_truncate(&s->kv, 0);
    job_prompt *p = c->p;
    if (rc == 0 && c->g.max_new > 0) rc = generate(s, p->ids, p->n_ids, &c->g, &c->st, err);  // max_tokens 0: echo alone
    if (index && !j->req.stream) sb_puts(choices, ",");
    return server_choice_end(c, rc, choices, cut, err);
}

// ---- one request ----------------------------------------------------------------

static void put_usage(sbuf *b, server_job *j) {
    int n = j->completion_tokens, d = n - j->req.n * j->n_prompts;  // each choice's first token comes from its prefill
    sb_printf(b, ",\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", j->prompt_tokens,
              n, j->prompt_tokens + n);
    sb_printf(b, ",\"timings\":{\"queued_s\":%.6f,\"prefill_s\":%.6f,\"decode_s\":%.6f,\"decode_tokens_per_s\":%.3f,"
                 "\"server_token_s\":%.6f}",
              j->t_start - j->t_new, j->prefill_s, j->decode_s, d > 0 && j->decode_s > 0 ? d / j->decode_s : 0.0,
              j->token_s);
}

// The stream's end: an error event when code is set, else usage if asked; then [DONE].
static void finish_stream(server_job *j, const char *code, const char *msg) {
    sbuf b = { 0 };
    if (code) {
        sb_puts(&b, "data: ");
        sb_error(&b, msg, "server_error", NULL, code);
        sb_puts(&b, "\n\n");
    } else if (j->req.include_usage) {
        sb_puts(&b, "data: ");
        put_head(&b, j, 1);
        sb_puts(&b, ",\"choices\":[]");
        put_usage(&b, j);
        sb_puts(&b, "}\n\n");
    }
    sb_puts(&b, "data: [DONE]\n\n");
    push_out(j, b.p, b.len);
    sb_free(&b);
}

static const char shutdown_msg[] = "the server is shutting down: this request was stopped before it finished";

// The job's answer once its choices have run: the stream's end or the JSON body.
static void finish_job(server_job *j, sbuf *choices, int cut, int *failed, verr *err) {
    if (j->req.stream) {
        if (cut) finish_stream(j, "shutting_down", shutdown_msg);
        else if (!atomic_load(&j->cancelled)) finish_stream(j, *failed ? "generation_failed" : NULL, err->msg);
        return;
    }
    if (cut) {  // not streamed: a 503, never a 200 that looks complete
        sb_free(&j->body);
        sb_error(&j->body, shutdown_msg, "server_error", NULL, "shutting_down");
        *failed = 503;
        return;
    }
    if (!*failed) {
        sb_reset(&j->body);
        put_head(&j->body, j, 0);
        sb_puts(&j->body, ",\"choices\":[");
        sb_put(&j->body, choices->p, choices->len);
        sb_puts(&j->body, "]");
        put_usage(&j->body, j);
        sb_puts(&j->body, "}");
        if (j->body.oom) *failed = 1, snprintf(err->msg, sizeof err->msg, "out of memory building the response");
    }
    if (*failed) {
        *failed = 500;
        sb_free(&j->body);
        sb_error(&j->body, err->msg, "server_error", NULL, "generation_failed");
    }
}

// Whether choice i runs: not after a cancel or a cut (rank 0's view on every rank).
static int next_choice(server_job *j, int i, int cut) {
    int total = j->req.n * j->n_prompts;
    int go = i < total && !atomic_load(&j->cancelled) && !cut;
    if (!j->srv->o.tp) return go;
    go = server_tp_agree(j, go);
    if (!go && i < total) atomic_store(&j->cancelled, 1);  // the other ranks learn rank 0's cancel
    return go;
}

void server_job_start(server_job *j, int slot) {
    j->t_start = server_now();
    j->slot = slot;
    pthread_mutex_lock(&j->mu);
    j->started = !atomic_load(&j->cancelled);  // a streamed job's connection sends its headers now
    if (j->waiting) pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void server_job_finish(server_job *j, sbuf *choices, int ran, int failed, int cut, verr *err) {
    // choices not run because the server stops (or none: cancelled while queued) are cut too
    cut = cut || (!failed && atomic_load(&j->srv->stopping) && (!j->started || ran < j->req.n * j->n_prompts));
    finish_job(j, choices, cut, &failed, err);
    if (j->srv->o.verbose)
        fprintf(stderr, "varent serve: %s: prompt %d tokens, %d generated, prefill %.3f s, decode %.3f s%s%s\n", j->id,
                j->prompt_tokens, j->completion_tokens, j->prefill_s, j->decode_s, failed == 500 ? ", failed: " : "",
                failed == 500 ? err->msg : cut ? ", stopped by shutdown" : atomic_load(&j->cancelled) ? ", cancelled" : "");
    pthread_mutex_lock(&j->mu);
    j->done = 1, j->failed = failed;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void server_run_job(server_slot *sl, server_job *j) {
    server_job_start(j, (int)(sl - j->srv->slots));
    sbuf choices = { 0 };
    verr err = { { 0 } };
    int failed = 0, cut = 0, i = 0;
    if (j->srv->o.tp && j->raw && server_tp_announce(j->srv, j, &err)) failed = 1;
    for (; !failed && next_choice(j, i, cut); i++) {
        int n = run_choice(sl, j, i, &choices, &cut, &err);
        if (n < 0) {
            failed = 1;
            break;
        }
        j->completion_tokens += n;
    }
    server_job_finish(j, &choices, i, failed, cut, &err);
    sb_free(&choices);
}

// ---- slots ----------------------------------------------------------------------

static void *slot_main(void *arg) {
    server_slot *sl = arg;
    server *s = sl->srv;
    cpu_set_threads(s->threads_per_slot);  // OpenMP's thread count is per calling thread
    for (server_job *j; (j = server_queue_pop(s, 1));) {
        server_run_job(sl, j);
        pthread_mutex_lock(&s->mu);
        s->busy--;
        pthread_mutex_unlock(&s->mu);
        server_job_release(j);
    }
    return NULL;
}

int server_slots_start(server *s, verr *err) {
    if (server_engine_usable(s)) return server_engine_start(s, err);  // one scheduler for every request (engine.c)
    s->slots = calloc((size_t)s->o.parallel, sizeof *s->slots);
    if (!s->slots) return verr_set(err, "out of memory");
    for (int i = 0; i < s->o.parallel; i++) {
        server_slot *sl = &s->slots[i];
        sl->srv = s;
        if (i == 0) sl->s = *s->base;
        else if (session_open_shared(&sl->s, s->base, 0, err)) return -1;
        sl->owned = i > 0;
        s->n_slots = i + 1;
        if (probe_spec_active(s->o.probe) && !serve_cap_dumps(&s->o) && probe_open(&sl->probe, s->o.probe, &sl->s, err))
            return -1;  // dumping, each choice opens its own (capture.c)
        server_tp_slot(sl);
    }
    int follower = s->o.tp && s->o.tp->rank > 0;  // rank 0's jobs, handed over by server_follow
    for (int i = 0; i < s->n_slots; i++) {
        if (pthread_create(&s->slots[i].th, NULL, follower ? server_tp_slot_main : slot_main, &s->slots[i]) != 0)
            return verr_set(err, "cannot start slot thread %d", i);
        s->slots[i].started = 1;
    }
    return 0;
}

int server_slot_inline(server *s, verr *err) {
    if (!(s->slots = calloc(1, sizeof *s->slots))) return verr_set(err, "out of memory");
    s->slots[0].srv = s;
    s->slots[0].s = *s->base;
    s->n_slots = 1;
    // the captures' collectives (the logit lens gathers the vocabulary) need every rank
    if (probe_spec_active(s->o.probe) && !serve_cap_dumps(&s->o))
        return probe_open(&s->slots[0].probe, s->o.probe, &s->slots[0].s, err);
    return 0;
}

void server_slots_stop(server *s) {
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stopping, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    server_engine_stop(s);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].started) pthread_join(s->slots[i].th, NULL);
    for (int i = 0; i < s->n_slots; i++) {
        verr e;
        probe_close(s->slots[i].probe, 0, NULL, 0, &e);  // statistics only: no files
        if (s->slots[i].owned) session_close(&s->slots[i].s);
    }
    free(s->slots);
    s->slots = NULL, s->n_slots = 0;
}
