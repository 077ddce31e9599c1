// http.c: the HTTP side of the server: libmicrohttpd with one thread per
// connection, routes, request bodies and limits, error bodies, and handing completion
// requests to the queue (jobs.c). A connection thread may block: a
// non-streamed request waits for its job; a streamed one's content reader waits for
// the next SSE bytes. Both poll the client's socket while they wait, so a client that
// goes away cancels its request and frees the slot. Only a reset (HUP, ERR) or a failed
// write means it has gone: an end of input may be a half-close (`nc -N`), so it is
// answered by a probe (an SSE comment, or an interim 100 Continue) that fails only when
// the client has closed.
#define _GNU_SOURCE  // POLLRDHUP
#include "host/serve/server.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>  // IN6_IS_ADDR_LOOPBACK, ntohl
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "host/decode/chat_prompt.h"
#include "host/serve/internal.h"
#include "host/runtime/tp_mpi.h"
#include "host/util/seed.h"
#include "kernels/ops.h"

extern const char web_index_html[];
extern const unsigned long web_index_html_len;

typedef struct {
    sbuf body;
    int too_large;
    int rejected;  // answered from the headers (server_check_headers); the body is dropped
} conn_req;

// ---- responses --------------------------------------------------------------------

// An origin that --cors allows sees the answer (Vary: the answer depends on Origin).
static void add_cors(server *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!server_cors_origin(s, origin)) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result reply(server *s, struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                             size_t n, int close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    add_cors(s, c, r);
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (close) MHD_add_response_header(r, "Connection", "close");
    if (status == 503 && !atomic_load(&s->quiesced)) MHD_add_response_header(r, "Retry-After", "1");  // a full queue
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_json(server *s, struct MHD_Connection *c, unsigned status, sbuf *b) {
    enum MHD_Result ret = b->oom ? MHD_NO : reply(s, c, status, "application/json", b->p ? b->p : "", b->len, 0);
    sb_free(b);
    return ret;
}

static enum MHD_Result reply_error_x(server *s, struct MHD_Connection *c, unsigned status, const char *msg,
                                     const char *type, const char *param, const char *code, int close) {
    sbuf b = { 0 };
    sb_error(&b, msg, type, param, code);
    if (s->o.verbose) fprintf(stderr, "varent serve: %u %s\n", status, msg);
    enum MHD_Result ret = b.oom ? MHD_NO : reply(s, c, status, "application/json", b.p, b.len, close);
    sb_free(&b);
    return ret;
}

static enum MHD_Result reply_error(server *s, struct MHD_Connection *c, unsigned status, const char *msg,
                                   const char *type, const char *param, const char *code) {
    return reply_error_x(s, c, status, msg, type, param, code, status == 413);
}

static enum MHD_Result bad_request(server *s, struct MHD_Connection *c, const char *msg, const char *param,
                                   const char *code) {
    return reply_error(s, c, 400, msg, "invalid_request_error", param, code);
}

// ---- GET routes -------------------------------------------------------------------

// The base model (module -1) or a --lora-modules adapter, which names its parent as vLLM does.
static void model_obj(server *s, sbuf *b, int module) {
    sb_puts(b, "{\"id\":");
    if (module < 0) sb_put(b, s->model_json.p, s->model_json.len);
    else sb_json_str(b, s->o.lora_names[module], strlen(s->o.lora_names[module]));
    sb_printf(b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"varent\",\"context_length\":%d", s->created,
              s->base->ctx);
    if (module >= 0) {
        sb_puts(b, ",\"parent\":");
        sb_put(b, s->model_json.p, s->model_json.len);
        sb_puts(b, ",\"root\":");
        sb_json_str(b, s->mods[module].dir, strlen(s->mods[module].dir));
    }
    sb_puts(b, "}");
}

static enum MHD_Result get_health(server *s, struct MHD_Connection *c) {
    sbuf b = { 0 };
    pthread_mutex_lock(&s->mu);
    sb_printf(&b, "{\"status\":\"%s\",\"model\":", atomic_load(&s->quiesced) ? "shutting_down" : "ok");
    sb_put(&b, s->model_json.p, s->model_json.len);
    sb_printf(&b, ",\"slots\":%d,\"slots_busy\":%d,\"queued\":%d,\"inflight\":%d,\"requests\":%ld,"
                  "\"cancelled\":%ld,\"rejected\":%ld",
              s->n_slots, s->busy, s->queued, s->inflight, s->n_requests, s->n_cancelled, s->n_rejected);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->conns_mu);
    sb_printf(&b, ",\"header_timeouts\":%ld,\"evicted\":%ld}", s->n_header_timeouts, s->n_evicted);
    pthread_mutex_unlock(&s->conns_mu);
    return reply_json(s, c, 200, &b);
}

static enum MHD_Result get_route(server *s, struct MHD_Connection *c, const char *url) {
    sbuf b = { 0 };
    if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
        return reply(s, c, 200, "text/html; charset=utf-8", web_index_html, web_index_html_len, 0);
    if (!strcmp(url, "/health")) return get_health(s, c);
    if (!strcmp(url, "/metrics")) {  // Prometheus text (engine.c)
        server_metrics(s, &b);
        enum MHD_Result ret = b.oom ? MHD_NO : reply(s, c, 200, "text/plain; version=0.0.4", b.p ? b.p : "", b.len, 0);
        sb_free(&b);
        return ret;
    }
    if (!strcmp(url, "/v1/models")) {
        sb_puts(&b, "{\"object\":\"list\",\"data\":[");
        for (int i = -1; i < s->n_mods; i++) {
            if (i >= 0) sb_puts(&b, ",");
            model_obj(s, &b, i);
        }
        sb_puts(&b, "]}");
        return reply_json(s, c, 200, &b);
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        int module = strcmp(url + 11, s->model_id) ? server_adapter_find(s, url + 11) : -1;
        if (strcmp(url + 11, s->model_id) && module < 0) {
            char msg[800];
            snprintf(msg, sizeof msg, "the model '%.300s' does not exist (this server has '%s')", url + 11, s->model_id);
            return reply_error(s, c, 404, msg, "invalid_request_error", "model", "model_not_found");
        }
        model_obj(s, &b, module);
        return reply_json(s, c, 200, &b);
    }
    if (!strcmp(url, "/v1/profiles")) {
        sb_profiles(&b, s->o.sampler == GEN_ENTROPIX ? "entropix" : "standard", s->o.profile);
        return reply_json(s, c, 200, &b);
    }
    return reply_error(s, c, 404, "no such route (GET /, /health, /metrics, /v1/models, /v1/profiles)", "invalid_request_error",
                       NULL, "not_found");
}

// ---- waiting on a job -------------------------------------------------------------

// 2: the client has gone (reset, or closed both ways); 1: it sent its end of input (a
// half-close, or a close that only a write tells apart); 0: neither.
static int peer_state(int fd) {
    struct pollfd p = { .fd = fd, .events = POLLRDHUP };
    if (fd < 0 || poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 2;
    return (p.revents & POLLRDHUP) ? 1 : 0;
}

#define PROBE_EVERY_S 0.5

// After an end of input (j->mu held): writes something the client ignores, at most every
// PROBE_EVERY_S; a closed client answers it with a reset. 1 when the write failed.
static int probe_peer(server_job *j) {
    double now = server_now();
    if (now - j->probe_at < PROBE_EVERY_S) return 0;
    j->probe_at = now;
    if (j->streaming) return j->probe = 1, 0;  // sse_read sends ":\n\n"
    if (!j->http11) return 0;                    // HTTP/1.0 has no interim answers
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    ssize_t n = send(j->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
}

// Waits (j->mu held) up to 100 ms; returns -1 when the client has gone away.
static int wait_step(server_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    j->waiting = 1;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    j->waiting = 0;
    // when the server stops, every job ends soon (done): wait for its answer (a 503)
    if (atomic_load(&j->cancelled) && !atomic_load(&j->srv->stopping)) return -1;
    if (!j->done && j->out.len == j->out_off) {
        int st = peer_state(j->fd);
        if (st == 2 || (st == 1 && probe_peer(j))) {
            server_job_cancel(j);
            return -1;
        }
    }
    return 0;
}

// Sends at most every SSE_PACE_S while tokens come faster than that: one write and one
// wake-up for several tokens on small models, no delay on models slower than 500 tok/s.
#define SSE_PACE_S 0.002

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    server_job *j = cls;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        size_t avail = j->out.len - j->out_off;
        double early = avail && !j->done && avail < 4096 ? j->last_send + SSE_PACE_S - server_now() : 0;
        if (early > 0) {
            pthread_mutex_unlock(&j->mu);
            struct timespec ts = { 0, (long)(early * 1e9) };
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&j->mu);
            continue;
        }
        if (avail || j->done || j->probe) break;
        if (wait_step(j)) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    j->last_send = server_now();
    if (j->probe && j->out.len == j->out_off && !j->done) {  // an SSE comment: clients skip it
        j->probe = 0;
        pthread_mutex_unlock(&j->mu);
        memcpy(buf, ":\n\n", 3);
        return 3;
    }
    j->probe = 0;
    size_t n = j->out.len - j->out_off;
    if (n > max) n = max;
    if (n) memcpy(buf, j->out.p + j->out_off, n);
    j->out_off += n;
    if (j->out_off == j->out.len) j->out_off = 0, sb_reset(&j->out);
    pthread_mutex_unlock(&j->mu);
    return n ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

static void sse_free(void *cls) {
    server_job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (!j->done) server_job_cancel(j);  // the connection ended first
    pthread_mutex_unlock(&j->mu);
    server_job_release(j);
}

static enum MHD_Result reply_stream(server *s, struct MHD_Connection *c, server_job *j) {
    pthread_mutex_lock(&j->mu);
    j->streaming = 1;
    pthread_mutex_unlock(&j->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, j, sse_free);
    if (!r) {
        server_job_cancel(j);
        server_job_release(j);
        return MHD_NO;
    }
    add_cors(s, c, r);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);  // sse_free runs when the connection is done with it
    return ret;
}

// Waits until the job is done (or, with until_started, a slot has taken it); -1 when the
// client went away.
static int wait_job(server_job *j, int until_started) {
    pthread_mutex_lock(&j->mu);
    int gone = 0;
    while (!j->done && !(until_started && j->started) && !gone) gone = wait_step(j);
    pthread_mutex_unlock(&j->mu);
    return gone;
}

static enum MHD_Result reply_when_done(server *s, struct MHD_Connection *c, server_job *j) {
    int gone = wait_job(j, 0);
    enum MHD_Result ret = MHD_NO;  // a client that went away gets no answer
    if (!gone) ret = reply(s, c, j->failed ? (unsigned)j->failed : 200, "application/json", j->body.p, j->body.len, 0);
    server_job_release(j);
    return ret;
}

// A stream's headers go out when a slot takes the job: one stopped while queued (the
// server is shutting down) gets a 503 instead of a 200 with a broken body.
static enum MHD_Result start_stream(server *s, struct MHD_Connection *c, server_job *j) {
    if (wait_job(j, 1)) {
        server_job_release(j);
        return MHD_NO;
    }
    pthread_mutex_lock(&j->mu);
    int started = j->started;
    pthread_mutex_unlock(&j->mu);
    if (started) return reply_stream(s, c, j);
    server_job_release(j);
    return reply_error(s, c, 503, "the server is shutting down: this request was stopped before it started",
                       "server_error", NULL, "shutting_down");
}

// ---- completions ------------------------------------------------------------------

static const char *kind_code(server_err_kind k) {
    switch (k) {
    case SRV_E_JSON: return "invalid_json";
    case SRV_E_TYPE: return "invalid_type";
    case SRV_E_MISSING: return "missing_required_parameter";
    case SRV_E_UNSUPPORTED: return "unsupported_parameter";
    case SRV_E_UNKNOWN: return "unknown_parameter";
    default: return "invalid_value";
    }
}

// A prompt's ids: text, token ids, or chat messages (rendered with the template, or
// joined by newlines when the model has none). -1 with err.
static int prompt_ids(server *s, const server_request *q, const server_prompt *p, int **ids, verr *err) {
    const session *b = s->base;
    if (p && !p->text) {
        for (int i = 0; i < p->n_ids; i++)
            if (p->ids[i] >= b->m.cfg.vocab_size)
                return verr_set(err, "token id %d is outside the vocabulary (0..%d)", p->ids[i], b->m.cfg.vocab_size - 1);
        *ids = malloc(sizeof(int) * (size_t)p->n_ids);
        if (!*ids) return verr_set(err, "out of memory");
        memcpy(*ids, p->ids, sizeof(int) * (size_t)p->n_ids);
        return p->n_ids;
    }
    if (p) return session_encode_prompt(b, p->text, ids, err);
    int escape = q->escape_special >= 0 ? q->escape_special : s->o.escape_special;
    if (s->has_chat) {
        chat_conv conv = { .fmt = s->chat_fmt, .opts = s->chat_opt, .escape_special = escape };
        int rc = 0;
        for (int i = 0; i < q->n_msgs && rc == 0; i++) rc = chat_conv_add(&conv, q->msgs[i].role, q->msgs[i].content, err);
        int n = rc == 0 ? chat_conv_ids(&conv, b, ids, err) : -1;
        chat_conv_free(&conv);
        return n;
    }
    sbuf t = { 0 };
    for (int i = 0; i < q->n_msgs; i++) {
        if (i) sb_puts(&t, "\n");
        sb_puts(&t, q->msgs[i].content);
    }
    int n = t.oom ? verr_set(err, "out of memory") : session_encode_text(b, t.p ? t.p : "", !escape, ids, err);
    sb_free(&t);
    return n;
}

// Every prompt's ids (chat: the one conversation), each checked against the context;
// 0, or an HTTP status with msg and code. A batch's messages name the prompt ("prompt[2]").
static int job_prompts(server *s, server_job *j, char *msg, size_t len, const char **code) {
    const server_request *q = &j->req;
    int n = q->chat ? 1 : q->n_prompts;
    verr err = { { 0 } };
    if (!(j->prompts = calloc((size_t)n, sizeof *j->prompts))) return snprintf(msg, len, "out of memory"), 500;
    for (; j->n_prompts < n; j->n_prompts++) {
        job_prompt *p = &j->prompts[j->n_prompts];
        char where[48] = "";
        if (!q->chat) snprintf(where, sizeof where, q->n_prompts > 1 ? "prompt[%d]: " : "prompt: ", j->n_prompts);
        p->n_ids = prompt_ids(s, q, q->chat ? NULL : &q->prompts[j->n_prompts], &p->ids, &err);
        if (p->n_ids < 0) return snprintf(msg, len, "%s%s", where, err.msg), 400;
        // A refused prompt is not counted in n_prompts, so its ids are freed here.
        int status = 0;
        if (p->n_ids == 0) {
            snprintf(msg, len, "%sthe prompt is empty (and the model adds no BOS token)", where);
            status = 400;
        } else if (p->n_ids >= s->base->ctx) {
            snprintf(msg, len, "%sthe prompt is %d tokens but the context holds %d (including at least one generated token)",
                     where, p->n_ids, s->base->ctx);
            *code = "context_length_exceeded";
            status = 400;
        }
        if (status) {
            free(p->ids);
            p->ids = NULL;
            return status;
        }
        j->prompt_tokens += p->n_ids;
    }
    return 0;
}

// The --lora-modules adapter a request's "model" selects (-1: the base model), or -2 for
// a name this server refuses. Any name runs the base model, as llama-server does, except
// under --strict-model and on a server with --lora-modules: there "model" chooses what
// runs, and a misspelt adapter must not quietly run the base model.
static int job_module(const server *s, const char *name) {
    if (!name || !strcmp(name, s->model_id)) return -1;
    int module = server_adapter_find(s, name);
    return module >= 0 || !(s->o.strict_model || s->n_mods) ? module : -2;
}

// Checks what needs the model and fills the job; returns 0 or an HTTP status with msg.
int server_prepare_job(server *s, server_job *j, char *msg, size_t len, const char **param, const char **code) {
    server_request *q = &j->req;
    verr err = { { 0 } };
    *param = q->chat ? "messages" : "prompt", *code = "invalid_value";
    int module = job_module(s, q->model);
    if (module == -2) {
        snprintf(msg, len, "the model '%.300s' does not exist (this server has '%s'%s)", q->model, s->model_id,
                 s->n_mods ? " and its --lora-modules: GET /v1/models" : ", and --strict-model");
        return *param = "model", *code = "model_not_found", 404;
    }
    if (server_job_adapters(s, j, module, &err)) return snprintf(msg, len, "%s", err.msg), 500;
    int limit = s->o.max_tokens_limit;
    if (q->max_tokens > limit) {
        snprintf(msg, len, "max_tokens is %d but this server allows at most %d (--max-tokens-limit)", q->max_tokens, limit);
        return *param = "max_tokens", 400;
    }
    j->max_tokens = q->max_tokens >= 0 ? q->max_tokens : q->chat || limit < 16 ? limit : 16;
    if (q->metrics < 0) q->metrics = s->o.metrics;
    int status = job_prompts(s, j, msg, len, code);
    if (status) return status;
    if (logit_bias_check(q->bias, q->n_bias, s->base->m.cfg.vocab_size, &err))
        return snprintf(msg, len, "'logit_bias': %s", err.msg), *param = "logit_bias", 400;
    j->sampler = q->sampler >= 0 ? (gen_sampler)q->sampler : s->o.sampler;
    if (entropix_profile(q->profile[0] ? q->profile : s->o.profile, &j->ex, &err))
        return snprintf(msg, len, "%s", err.msg), *param = "profile", 400;
    j->seed = q->has_seed ? q->seed : seed_from_os();
    return 0;
}

static enum MHD_Result post_completion(server *s, struct MHD_Connection *c, conn_req *r, int chat, int http11) {
    if (r->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (--max-body)", s->o.max_body);
        return reply_error(s, c, 413, msg, "invalid_request_error", NULL, "request_too_large");
    }
    if (atomic_load(&s->quiesced))
        return reply_error(s, c, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
    server_job *j = server_job_new(s);
    if (!j) return MHD_NO;
    verr err = { { 0 } };
    if (server_parse_request(r->body.p ? r->body.p : "", r->body.len, chat, &j->req, &err)) {
        enum MHD_Result ret = bad_request(s, c, err.msg, j->req.param, kind_code(j->req.kind));
        server_job_release(j);
        return ret;
    }
    char msg[1200];
    const char *param, *code;
    int status = server_prepare_job(s, j, msg, sizeof msg, &param, &code);
    if (!status && s->o.tp && !(j->raw = malloc(r->body.len + 1))) status = 500, snprintf(msg, sizeof msg, "out of memory");
    if (!status && s->o.tp) {  // the other ranks parse the same body (server_tp_announce)
        memcpy(j->raw, r->body.p ? r->body.p : "", r->body.len);
        j->raw_len = r->body.len, j->raw_chat = chat;
    }
    if (status) {
        server_job_release(j);
        return reply_error(s, c, (unsigned)status, msg, "invalid_request_error", param, code);
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->http11 = http11;
    int rc = server_job_enqueue(s, j);
    if (rc) {
        server_job_release(j);
        if (rc == -2) return reply_error(s, c, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
        return reply_error(s, c, 503, "too many requests are waiting (--max-queue); try again later", "server_error",
                           NULL, "queue_full");
    }
    return j->req.stream ? start_stream(s, c, j) : reply_when_done(s, c, j);
}

// ---- dispatch ---------------------------------------------------------------------

static int is_completion(const char *url, int *chat) {
    const char *p = !strncmp(url, "/v1/", 4) ? url + 3 : url;
    *chat = !strcmp(p, "/chat/completions");
    return *chat || !strcmp(p, "/completions");
}

// A CORS preflight; an Origin that is not allowed got its 403 from the headers.
static enum MHD_Result preflight(server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Content-Type, Authorization");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    server *s = cls;
    conn_req *r = *con_cls;
    if (r && r->rejected) return *upload_size = 0, MHD_YES;
    if (!r) {  // headers are in; the body (if any) comes in the next calls
        server_conn_headers_in(s, c);  // off the header deadline
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        // the headers came within --header-timeout; the body and the answer get --timeout
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.timeout_s);
        char msg[256];
        const char *code = NULL;
        int status = server_check_headers(s, c, method, version, msg, sizeof msg, &code);
        if (status) {  // answered before the body is read, then the connection is closed
            r->rejected = 1;
            return reply_error_x(s, c, (unsigned)status, msg, "invalid_request_error", NULL, code, 1);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > 16 * (unsigned long long)s->o.max_body)
            r->too_large = 2;  // far too large: answer before reading it, then close
        if (r->too_large != 2) return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_large && r->body.len + *upload_size > s->o.max_body) r->too_large = 1, sb_free(&r->body);
        if (!r->too_large) sb_put(&r->body, upload, *upload_size);
        if (r->body.oom) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    int chat;
    if (!strcmp(method, "OPTIONS")) return preflight(s, c);
    if (is_completion(url, &chat)) {
        if (!strcmp(method, "POST")) return post_completion(s, c, r, chat, !strcmp(version, MHD_HTTP_VERSION_1_1));
    } else if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) {
        return get_route(s, c, url);
    } else if (strcmp(url, "/") && strcmp(url, "/health") && strcmp(url, "/metrics") && strncmp(url, "/v1/models", 10) &&
               strcmp(url, "/v1/profiles")) {
        return reply_error(s, c, 404, "no such route", "invalid_request_error", NULL, "not_found");
    }
    return reply_error(s, c, 405, "method not allowed on this route", "invalid_request_error", NULL,
                       "method_not_allowed");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.header_timeout_s);  // the next request
    server_conn_request_done(s, c);
    conn_req *r = *con_cls;
    if (!r) return;
    sb_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    server *s = cls;
    if (!s->o.verbose) return;
    fprintf(stderr, "varent serve: libmicrohttpd: ");
    vfprintf(stderr, fmt, ap);
}

// ---- lifecycle --------------------------------------------------------------------

int server_setup_model(server *s, verr *err) {
    session *b = s->base;
    if (!b->tok) return verr_set(err, "%s has no tokenizer.json, which the server needs", b->m.dir);
    if (s->o.model_id) {
        snprintf(s->model_id, sizeof s->model_id, "%s", s->o.model_id);
    } else {  // the last component of -m: a directory's name, a GGUF's file name (not its cache's hash)
        char path[sizeof b->m.dir];
        snprintf(path, sizeof path, "%s", s->o.model_path ? s->o.model_path : b->m.dir);
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') path[--n] = 0;
        const char *slash = strrchr(path, '/');
        const char *name = slash && slash[1] ? slash + 1 : path;
        size_t keep = strlen(name) < sizeof s->model_id ? strlen(name) : sizeof s->model_id - 1;  // a long name is cut
        memcpy(s->model_id, name, keep);
        s->model_id[keep] = 0;
    }
    sb_json_str(&s->model_json, s->model_id, strlen(s->model_id));
    s->clarifier = gen_find_clarifier(b);
    if (server_token_texts(s, err)) return -1;
    // The chat format, once: chat_conv_init registers its end-of-turn ids on the base
    // session before the slots copy its stop list.
    chat_conv conv;
    verr cerr;
    if (chat_conv_init(&conv, b, s->o.chat_template, 1, &cerr) == 0) {
        s->has_chat = 1, s->chat_fmt = conv.fmt, s->chat_opt = conv.opts;
        chat_conv_free(&conv);
    } else if (s->o.chat_template) {
        return verr_set(err, "%s", cerr.msg);
    }
    return 0;
}

static int bind_addr(const char *host, int port, struct sockaddr_storage *ss, int *v6, int *loopback, verr *err) {
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return verr_set(err, "--host %s: %s", host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    *loopback = *v6 ? IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr)
                    : (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    freeaddrinfo(res);
    return 0;
}

static server *start(session *base, const server_opts *o, verr *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) return verr_set(err, "out of memory"), NULL;
    s->o = *o, s->base = base, s->created = (long)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    server_tp_init(s);
    int cores = cpu_set_threads(0), total = o->threads > 0 ? o->threads : cores;
    s->threads_per_slot = total / o->parallel > 0 ? total / o->parallel : 1;
    struct sockaddr_storage ss;
    int v6 = 0;
    if (server_conns_init(s)) verr_set(err, "cannot start the connection watchdog thread");
    if (!s->conns_live || server_setup_model(s, err) || server_adapters_load(s, err) ||
        bind_addr(o->host, o->port, &ss, &v6, &s->loopback, err) || server_slots_start(s, err)) {
        server_stop(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                            s, MHD_OPTION_SOCK_ADDR, &ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, server_conn_notify, s,
                            MHD_OPTION_CONNECTION_LIMIT, server_hard_limit(o->max_connections), MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)o->max_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->header_timeout_s,
                            MHD_OPTION_END);
    if (!s->d) {
        verr_set(err, "cannot listen on %s port %d: %s", o->host, o->port, errno ? strerror(errno) : "libmicrohttpd failed");
        server_stop(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    return s;
}

server *server_start(session *base, const server_opts *o, verr *err) {
    server *s = start(base, o, err);
    if (!o->tp) return s;
    // The other ranks wait in server_follow for the outcome here.
    if (tp_agree(o->tp, s != NULL, err->msg, err)) {
        if (s) server_stop(s);
        return NULL;
    }
    s->tp_live = 1;
    return s;
}

int server_port(const server *s) { return s->port; }
int server_n_slots(const server *s) { return s->n_slots; }
const char *server_chat_format(const server *s) { return s->has_chat ? chat_kind_name(s->chat_fmt.kind) : NULL; }

void server_quiesce(server *s) {
    if (atomic_exchange(&s->quiesced, 1) || !s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int server_inflight(server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->inflight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void server_cancel_all(server *s) {
    atomic_store(&s->stopping, 1);  // on_token and the waits see it through the job's server
    pthread_mutex_lock(&s->mu);
    for (server_job *j = s->head; j; j = j->next) server_job_cancel(j);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void server_stop(server *s) {
    if (!s) return;
    server_quiesce(s);
    server_cancel_all(s);
    server_slots_stop(s);  // running jobs end at their next token
    if (s->tp_live && s->o.tp->rank == 0) server_tp_stop(s);
    server_conns_stop(s);
    if (s->d) MHD_stop_daemon(s->d);  // its notifications take conns_mu: destroyed after
    server_adapters_free(s);
    sb_free(&s->model_json), sb_free(&s->tok_text);
    free(s->tok_off);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    server_conns_free(s);
    server_tp_free(s);
    free(s);
}
