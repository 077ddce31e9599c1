// internal.h: what the HTTP side (http.c) and the generation side
// (jobs.c: queue, slots, per-token output) share. Not a public interface.
#ifndef VARENT_SERVER_INTERNAL_H
#define VARENT_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "host/serve/server.h"
#include "host/serve/response.h"
#include "host/serve/request.h"
#include "tokenizer/chat.h"

typedef struct server_job server_job;
typedef struct conn_rec conn_rec;  // conns.c: a connection, while it waits for a request's headers

typedef struct {
    server *srv;
    session s;      // slot 0 borrows the base session (copied by value, never closed here)
    int owned;      // s was opened with session_open_shared
    probe *probe;   // server_opts.probe on s; NULL: none
    pthread_t th;
    int started;
    session_turn turn;      // tensor parallelism with slots: s.turn (follow.c)
    server_job *job;        // the other ranks: the job handed to this slot, under srv->tp_mu
} server_slot;

// One prompt of a job: its token ids and, with echo and logprobs, each prompt token's
// logprob ([n_ids], entry 0 unused: it has no context) and top alternatives ([n_ids * k]),
// scored once for all of its choices.
typedef struct {
    int *ids, n_ids;
    double *echo_lp, *echo_top_lp;
    int *echo_top, echo_scored;
} job_prompt;

// One completion request, shared by its connection thread and the slot that runs it.
// Its choices run prompt by prompt: choice index p * n + i is prompt p's i-th.
struct server_job {
    server *srv;
    server_request req;
    job_prompt *prompts;      // [n_prompts]: a chat request's one, or each completions prompt
    int n_prompts;
    int prompt_tokens;        // over all prompts (usage)
    int max_tokens;
    gen_sampler sampler;
    entropix_config ex;       // the profile (also classifies quadrants under standard)
    uint64_t seed;            // each prompt's choice i uses seed + i
    char id[48];
    long created;             // unix time
    int fd;                   // the client's socket, polled for hangup while waiting
    int http11;               // the request was HTTP/1.1 (a 100 Continue may probe the client)
    int probe;                // under mu: streamed: send an SSE comment to learn whether the client is there
    double probe_at;          // under mu: when the client was last probed
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sbuf out;                 // streamed: SSE bytes not yet taken by the connection
    size_t out_off;
    sbuf body;                // not streamed: the response JSON
    sbuf chunk_head;          // streamed: "data: {"id":..,"choices":[" of every chunk
    int done;                 // under mu
    int failed;               // under mu: the answer's status when not 200 (500, or 503 when shutdown stopped it)
    int started;              // under mu: a slot took it (not cancelled while queued)
    int streaming;            // under mu: the stream's headers are queued (probe with SSE comments)
    int waiting;              // under mu: the connection waits on cv for output
    double last_send;         // streamed: when the connection last took output
    atomic_int cancelled;     // the client went away, or the server is stopping
    int refs;                 // under srv->mu: the connection and, once queued, the slot
    double t_new, t_start, prefill_s, decode_s;
    double token_s;           // time in the server's per-token callbacks (text, metrics, SSE)
    int completion_tokens;    // generated tokens of every choice, a stop token (EOS) included
    lora_use *lora;           // the adapters this request runs with ([n_lora]: the base's, then its module)
    int n_lora;
    char *raw;                // tensor parallelism, rank 0: the request body, for the other ranks
    size_t raw_len;
    int raw_chat;             // it came to /v1/chat/completions
    int slot;                 // the slot that runs it (server_run_job)
    server_job *next;
};

struct server {
    server_opts o;
    session *base;
    server_slot *slots;
    int n_slots;
    struct MHD_Daemon *d;
    int port;
    int loopback;             // bound to 127.0.0.0/8 or ::1: Host is checked (guard.c)
    pthread_mutex_t mu;       // queue and counters
    pthread_cond_t cv;
    server_job *head, *tail;
    int queued, busy, inflight;
    long n_requests, n_cancelled, n_rejected;
    int dumped;               // under mu: choices captured to files (--dump-max-files; capture.c)
    atomic_int stopping, quiesced;
    char model_id[256];
    sbuf model_json;          // model_id as a JSON string
    int has_chat;             // a chat template was recognised
    chat_format chat_fmt;
    chat_opts chat_opt;
    int clarifier;            // entropix's HELV token
    sbuf tok_text;            // every id's text in context (server_token_texts), packed
    unsigned *tok_off;        // [vocab + 1] offsets into tok_text
    int threads_per_slot;
    lora_adapter *mods;       // --lora-modules, [n_mods] (names in o.lora_names)
    int n_mods;
    long created;
    int tp_live;              // tensor parallelism: every rank started; rank 0 tells them when it stops
    // tensor parallelism with --parallel > 1 (follow.c): the slots take turns at the collectives
    int tp_turns;             // turns are on
    pthread_mutex_t tp_mu;    // rank 0: held through a turn; the other ranks: guards what follows
    pthread_cond_t tp_cv;
    int tp_turn;              // the other ranks: the slot whose turn it is (-1: none)
    int tp_stop;              // the other ranks: rank 0 stopped
    // conns.c: the connections waiting for a request's headers (the header deadline and
    // the connection budget), under conns_mu
    pthread_mutex_t conns_mu;
    pthread_cond_t conns_cv;
    pthread_t conns_th;
    int conns_init, conns_live, conns_stop;
    conn_rec *wait_head, *wait_tail;  // oldest first
    int n_waiting;
    int n_live;               // open and not shut down by conns.c: at most --max-connections
    long n_header_timeouts;   // closed at the header deadline
    long n_evicted;           // closed to keep the reserve of --max-connections
    struct server_engine *engine;  // the scheduler's thread, in place of the slots (engine.c); NULL: slots
};

// conns.c: libmicrohttpd's connection notifications (MHD_OPTION_NOTIFY_CONNECTION); a
// request's headers are in (on_request's first call); a request is over (its
// NOTIFY_COMPLETED: a kept-alive connection waits for the next headers).
// libmicrohttpd's connection limit: room for connections shut down whose threads are ending.
unsigned server_hard_limit(int max_connections);
void server_conn_notify(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_ConnectionNotificationCode code);
void server_conn_headers_in(server *s, struct MHD_Connection *mc);
void server_conn_request_done(server *s, struct MHD_Connection *mc);
// The watchdog thread that enforces the deadline: 0, or -1 when it cannot start.
int server_conns_init(server *s);
void server_conns_stop(server *s);
void server_conns_free(server *s);  // after libmicrohttpd stopped

// jobs.c
// The queue's first job (counted busy), or NULL: with wait, when the server stops and
// the queue is empty; without, at once when the queue is empty.
server_job *server_queue_pop(server *s, int wait);
// One request in parts, for the engine (engine.c): start (its stream's headers go), each
// choice's begin (its options in c->g, run by someone else; set_lora: apply the request's
// adapters to s) and end (its text and output from rc and c->st, appended to choices when
// not streamed; the tokens generated, or -1), then finish (the answer: ran choices were
// started, failed and cut as run_job tracks them).
typedef struct server_choice server_choice;
void server_job_start(server_job *j, int slot);
int server_choice_begin(server_job *j, int index, session *s, probe *pr, int set_lora, server_choice **c, verr *err);
gen_opts *server_choice_opts(server_choice *c);
gen_stats *server_choice_stats(server_choice *c);
int server_choice_end(server_choice *c, int rc, sbuf *choices, int *cut, verr *err);
void server_job_finish(server_job *j, sbuf *choices, int ran, int failed, int cut, verr *err);
int server_slots_start(server *s, verr *err);
int server_token_texts(server *s, verr *err);
void server_slots_stop(server *s);
server_job *server_job_new(server *s);      // refs 1 (the connection), counted in inflight
int server_job_enqueue(server *s, server_job *j);  // -1 when the queue is full, -2 when stopping
void server_job_release(server_job *j);
void server_job_cancel(server_job *j);
double server_now(void);
// Runs a job on a slot (the slot threads; server_follow on the other ranks).
void server_run_job(server_slot *sl, server_job *j);
// A slot that borrows the base session, without a thread (server_follow).
int server_slot_inline(server *s, verr *err);

// http.c: the checks that need the model, and the job's ids, sampler and seed; 0, or an
// HTTP status with msg, the parameter and an error code.
int server_prepare_job(server *s, server_job *j, char *msg, size_t len, const char **param, const char **code);
// The model's names, chat format and token texts (server_start's first step).
int server_setup_model(server *s, verr *err);

// follow.c: tensor parallelism. Rank 0 announces each job before running it (and a stop
// when it ends); every rank then agrees, at each choice and each token, on rank 0's
// decision to go on, so all make the same forward passes.
// With --parallel > 1 the slots take turns: rank 0 tells the other ranks which slot makes
// its next collectives (a forward call, an agreement), and their slot of that index makes
// the same ones then, so every communicator sees the same calls in the same order.
int server_tp_announce(server *s, server_job *j, verr *err);
void server_tp_stop(server *s);
// Rank 0's value of mine, on every rank (a turn of j's slot).
int server_tp_agree(server_job *j, int mine);
// The turns' state (server_start, server_follow) and its end (server_stop).
void server_tp_init(server *s);
void server_tp_free(server *s);
// A slot's session turns (none without tensor parallelism or with one slot).
void server_tp_slot(server_slot *sl);
// The other ranks' slot threads: the jobs the dispatcher hands them.
void *server_tp_slot_main(void *arg);

// engine.c: the server on the scheduler (host/decode/sched.h): one thread decodes every
// running choice of every request together on the base session. Usable unless tensor
// parallelism or captures need the slots.
struct server_engine;
int server_engine_usable(const server *s);
int server_engine_start(server *s, verr *err);
void server_engine_stop(server *s);  // after stopping is set; a no-op without an engine
// GET /metrics: Prometheus text (running and queued sequences, KV pool, prefix reuse, tokens).
void server_metrics(server *s, sbuf *b);

// adapters.c: the named LoRA adapters (--lora-modules).
int server_adapters_load(server *s, verr *err);
void server_adapters_free(server *s);
// The module called name, or -1.
int server_adapter_find(const server *s, const char *name);
// j->lora: the base session's adapters plus module (-1: none).
int server_job_adapters(server *s, server_job *j, int module, verr *err);

// guard.c: checks on a request's headers before its body is read; 0, or an HTTP
// status with msg and an error code.
struct MHD_Connection;
int server_check_headers(server *s, struct MHD_Connection *c, const char *method, const char *version, char *msg,
                         size_t len, const char **code);
// Whether origin (may be NULL) is one --cors allows: its answers get
// Access-Control-Allow-Origin.
int server_cors_origin(const server *s, const char *origin);

#endif
