// request.h: the JSON body of POST /v1/completions and /v1/chat/completions,
// parsed and validated into plain fields. Pure: no model, no I/O, no globals, so the
// fuzz target can call it on arbitrary bytes. What needs the model (tokens, context,
// vocab, max_tokens limit, model name) is checked by the server afterwards.
#ifndef VARENT_SERVER_REQUEST_H
#define VARENT_SERVER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "host/runtime/logit_bias.h"
#include "host/util/err.h"

#define SERVER_MAX_STOP_BYTES 4096 // stop strings per request: any number, this many bytes in all
#define SERVER_MAX_N 16            // choices per prompt
#define SERVER_MAX_PROMPTS 4096    // prompts per completions request
#define SERVER_MAX_CHOICES 4096    // prompts x n per request
#define SERVER_MAX_TOP_LOGPROBS 20 // alternatives per token
#define SERVER_MAX_MESSAGES 4096
#define SERVER_MAX_PROMPT_IDS (1 << 20)
#define SERVER_MAX_LOGIT_BIAS 2048  // entries of logit_bias

// What kind of mistake the body has; the server maps it to the error's "code".
typedef enum {
    SRV_OK = 0,
    SRV_E_JSON,         // not JSON, or not an object
    SRV_E_TYPE,         // a field of the wrong JSON type
    SRV_E_VALUE,        // the right type, out of range or unknown
    SRV_E_MISSING,      // a required field is absent
    SRV_E_UNSUPPORTED,  // valid OpenAI, not supported here (a penalty other than 0)
    SRV_E_UNKNOWN,      // a field this endpoint does not know
} server_err_kind;

typedef struct {
    char *role, *content;  // role: system (also "developer"), user, assistant, tool
} server_msg;

// One prompt of a completions request: text, or token ids.
typedef struct {
    char *text;                    // NULL when given as token ids
    int *ids, n_ids;               // token ids ([n_ids]), checked against the vocab later
} server_prompt;

typedef struct {
    int chat;                      // 1: /v1/chat/completions
    char *model;                   // NULL: not given (the loaded one)
    server_prompt *prompts;        // completions: [n_prompts] (a list of prompts answers each, in order)
    int n_prompts;
    server_msg *msgs;              // chat: [n_msgs]
    int n_msgs;
    int max_tokens;                // -1: not given; 0 only with echo (score the prompt alone)
    int echo;                      // completions: the prompt's text and logprobs come first
    logit_bias *bias;              // logit_bias: [n_bias], ids checked against the vocab later
    int n_bias;
    double temperature, top_p, min_p;  // defaults 1, 1, 0
    int top_k;                     // 0: off
    double presence, frequency;    // OpenAI's penalties, -2..2 (0: off; host/runtime/sampler.h)
    double repeat_penalty;         // llama-server's repeat_penalty (1: off)
    int repeat_last_n;             // the penalties' window, prompt included (-1: all of it)
    int has_seed;
    uint64_t seed;
    char **stop;                   // [n_stop] non-empty strings, SERVER_MAX_STOP_BYTES in all
    int n_stop;
    int stream, include_usage;     // include_usage: stream_options.include_usage
    int n;                         // choices per prompt, 1..SERVER_MAX_N
    int sampler;                   // -1: server default; else a gen_sampler value
    char profile[32];              // "": server default; else a known profile name
    int logprobs;                  // 1: return per-token logprobs
    int top_logprobs;              // alternatives per token, 0..SERVER_MAX_TOP_LOGPROBS
    int metrics;                   // 1: per-token entropix metrics in choices[i].metrics; -1: the server's default
    int escape_special;            // chat: 1 special-token text in messages is plain text, 0 parsed, -1 server default
    // On failure: the field at fault ("" for the body as a whole) and the kind.
    char param[64];
    server_err_kind kind;
} server_request;

// Parses body[0..len) (need not be NUL-terminated). chat selects the endpoint's
// fields. 0 on success; -1 with err (a message naming the field), out->param and
// out->kind set, and nothing left allocated. Call server_request_free either way.
int server_parse_request(const char *body, size_t len, int chat, server_request *out, verr *err);
void server_request_free(server_request *r);

#endif
