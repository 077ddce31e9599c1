// response.h: the server's response text. A growable byte buffer and the JSON
// pieces the OpenAI shapes are made of (strings, error bodies, per-token metrics and
// logprobs, the model and profile lists). Written by hand rather than through cJSON
// trees: one chunk per token, built without allocations once the buffer has grown.
#ifndef VARENT_SERVER_JSON_H
#define VARENT_SERVER_JSON_H

#include <stddef.h>

#include "host/decode/generate.h"

typedef struct {
    char *p;
    size_t len, cap;
    int oom;  // an append failed; the content is truncated
} sbuf;

void sb_free(sbuf *b);
static inline void sb_reset(sbuf *b) { b->len = 0; }
void sb_put(sbuf *b, const void *s, size_t n);
void sb_puts(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// A JSON string of s[0..n): quotes and escapes; bytes that are not valid UTF-8 become
// \u00XX (their latin-1 reading), so the output is always valid JSON.
void sb_json_str(sbuf *b, const char *s, size_t n);
// A number (%.9g), or null when not finite.
void sb_json_num(sbuf *b, double v);

// {"error":{"message":..,"type":..,"param":..|null,"code":..|null}}
void sb_error(sbuf *b, const char *msg, const char *type, const char *param, const char *code);
// One token's metrics object (keys as in the --metrics-out JSONL of docs/entropix.md).
void sb_metrics(sbuf *b, const gen_record *r, const char *text, size_t n);

// One token's logprob with its top alternatives (ids [k], logprobs [k]); decode gives
// each id's text. chat: {"token","logprob","bytes","top_logprobs":[...]}.
typedef const char *(*sb_decode_fn)(void *ud, int id, size_t *n);
void sb_chat_logprob(sbuf *b, const char *text, size_t n, double lp, const int *ids, const double *lps, int k,
                     sb_decode_fn decode, void *ud);
// completions: {"text": logprob, ...} of the alternatives (OpenAI's top_logprobs entry).
void sb_top_map(sbuf *b, const int *ids, const double *lps, int k, sb_decode_fn decode, void *ud);

// GET /v1/profiles: every profile's base parameters, order and quadrant boxes.
void sb_profiles(sbuf *b, const char *default_sampler, const char *default_profile);

#endif
