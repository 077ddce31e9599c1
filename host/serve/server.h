// server.h: the OpenAI-compatible HTTP server behind `varent serve` (libmicrohttpd,
// one thread per connection). Completion requests go to a FIFO queue served by the
// scheduler (engine.c: --parallel sequences decoded together), or, under tensor
// parallelism or with captures, by --parallel slots, each a session context on the one
// loaded model (session_open_shared).
// Routes, shapes and limits: docs/server.md.
#ifndef VARENT_SERVER_H
#define VARENT_SERVER_H

#include <stddef.h>

#include "host/decode/generate.h"
#include "host/runtime/probe.h"

typedef struct {
    const char *host;           // bind address (default 127.0.0.1)
    int port;                   // 0: any free port (server_port tells which)
    int parallel;               // sequences decoded together (the slots without the scheduler), >= 1
    int threads;                // forward threads in all (0: all cores), split between slots
    int max_tokens_limit;       // a request asking for more gets a 400
    size_t max_body;            // bytes; a larger body gets a 413
    int max_queue;              // waiting requests beyond this get a 503 with Retry-After
    int max_connections;
    int timeout_s;              // idle connection timeout once a request's headers are in (0: none)
    int header_timeout_s;       // a deadline for a request's headers, from the connection's start or the
                                // previous request's end (>= 1; host/serve/conns.c)
    int max_per_ip;             // open connections from one client address
    const char *model_id;       // --alias: the id in /v1/models (NULL: model_path's file or directory name)
    const char *model_path;     // the -m value (a directory or a GGUF file); NULL: the loaded directory
    int strict_model;           // a request's "model" must be the id or a --lora-modules name (else a 404);
                                // 0: any other name runs the base model, as llama-server does
    int metrics;                // requests that do not say get per-token metrics (choices[i].metrics)
    gen_sampler sampler;        // defaults when a request names none
    const char *profile;
    const char *chat_template;  // NULL: the model's; none recognised: messages joined by newlines
    int token_delay_ms;         // sleep per generated token (demos and tests)
    const char *allowed_hosts;  // comma-separated Host names a loopback server also answers to
    const char *cors;           // comma-separated browser Origins allowed besides the page's own ("*": any)
    int escape_special;         // chat messages' special-token text is plain text (request may override)
    int verbose;                // one stderr line per request
    const lora_spec *lora_modules;  // --lora-modules NAME=DIR: [n_lora_modules] adapters a request
    const char *const *lora_names;  // selects by "model": NAME (host/serve/adapters.c)
    int n_lora_modules;
    // serve under mpirun (docs/distributed.md): the tensor-parallel group. Rank 0 serves
    // HTTP with one slot and hands each request to the other ranks, which run it in step
    // (server_follow). NULL: one process.
    tp_comm *tp;
    const probe_spec *probe;    // --attn-layers, --logit-lens: members of each token's metrics object
                                // (every slot's forwards, host/runtime/probe.h); NULL: none.
                                // Its acts_path and attn_path are directories: a file per
                                // choice (host/serve/capture.h)
    int dump_max_files;         // choices captured to those files at most
    long kv_pool_mb, kv_pool_tokens;  // the scheduler's KV pool (0, 0: --parallel whole contexts)
    int no_prefix_cache;        // no reuse of earlier prompts' positions
} server_opts;

typedef struct server server;

// Starts listening. base: an open session with a tokenizer, which must outlive the
// server; slot 0 uses it, the others get their own contexts. Returns NULL with err.
server *server_start(session *base, const server_opts *o, verr *err);
int server_port(const server *s);
int server_n_slots(const server *s);
// Whether the model has a recognised chat template (else the newline fallback).
const char *server_chat_format(const server *s);
// Stops accepting connections; in-flight requests go on, new requests on open
// connections get a 503.
void server_quiesce(server *s);
// Requests accepted and not yet fully answered.
int server_inflight(server *s);
// Cancels every running and queued request.
void server_cancel_all(server *s);
// Stops everything, joins the threads and frees (base stays open).
void server_stop(server *s);
// The ranks other than 0 of o->tp: the server without HTTP, running every request
// rank 0 hands over until rank 0 stops (host/serve/follow.c). 0, or -1 with err.
int server_follow(session *base, const server_opts *o, verr *err);

#endif
