// response.c: see response.h.
#include "host/serve/response.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/util/json_out.h"

static int sb_grow(sbuf *b, size_t need) {
    if (b->oom) return -1;
    if (b->len + need + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + need + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return b->oom = 1, -1;
    b->p = p, b->cap = cap;
    return 0;
}

void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

// n == 0 appends nothing and may come with s == NULL (an empty piece: a first token that
// is EOS), which memcpy must never see; the buffer is still allocated and terminated.
void sb_put(sbuf *b, const void *s, size_t n) {
    if (sb_grow(b, n)) return;
    if (n > 0) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    if (sb_grow(b, 64)) return;  // most pieces fit: format once
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= b->cap - b->len) {
        if (sb_grow(b, (size_t)n)) return;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

// Length of the valid UTF-8 sequence at s (n bytes left), or 0 when invalid.
static void to_sbuf(void *ud, const char *s, size_t n) { sb_put(ud, s, n); }

void sb_json_str(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    json_escape(s, n, to_sbuf, b);
    sb_put(b, "\"", 1);
}

void sb_json_num(sbuf *b, double v) {
    if (isfinite(v)) sb_printf(b, "%.9g", v);
    else sb_puts(b, "null");
}

static void str_or_null(sbuf *b, const char *s) {
    if (s) sb_json_str(b, s, strlen(s));
    else sb_puts(b, "null");
}

void sb_error(sbuf *b, const char *msg, const char *type, const char *param, const char *code) {
    sb_puts(b, "{\"error\":{\"message\":");
    str_or_null(b, msg);
    sb_puts(b, ",\"type\":");
    str_or_null(b, type);
    sb_puts(b, ",\"param\":");
    str_or_null(b, param && *param ? param : NULL);
    sb_puts(b, ",\"code\":");
    str_or_null(b, code);
    sb_puts(b, "}}");
}

void sb_metrics(sbuf *b, const gen_record *r, const char *text, size_t n) {
    const token_metrics *m = &r->m;
    sb_printf(b, "{\"token\":%d,\"pos\":%d,\"text\":", r->token, r->pos);
    sb_json_str(b, text, n);
    const double v[] = { m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement,
                         m->interaction_strength };
    const char *keys[] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                           "interaction_strength" };
    for (int i = 0; i < 6; i++) {
        sb_printf(b, ",\"%s\":", keys[i]);
        sb_json_num(b, v[i]);
    }
    sb_printf(b, ",\"quadrant\":\"%s\",\"temperature\":", entropix_quadrant_name(r->q));
    sb_json_num(b, r->sp.temperature);
    sb_printf(b, ",\"top_k\":%d,\"top_p\":", r->sp.top_k);
    sb_json_num(b, r->sp.top_p);
    sb_puts(b, ",\"min_p\":");
    sb_json_num(b, r->sp.min_p);
    if (r->q == Q_ADAPTIVE && r->score != 0) {
        sb_puts(b, ",\"score\":");
        sb_json_num(b, r->score);
    }
    sb_puts(b, "}");
}

static void bytes_array(sbuf *b, const char *s, size_t n) {
    sb_puts(b, "[");
    for (size_t i = 0; i < n; i++) sb_printf(b, i ? ",%u" : "%u", (unsigned char)s[i]);
    sb_puts(b, "]");
}

static void chat_entry(sbuf *b, const char *text, size_t n, double lp) {
    sb_puts(b, "{\"token\":");
    sb_json_str(b, text, n);
    sb_puts(b, ",\"logprob\":");
    sb_json_num(b, lp);
    sb_puts(b, ",\"bytes\":");
    bytes_array(b, text, n);
}

void sb_chat_logprob(sbuf *b, const char *text, size_t n, double lp, const int *ids, const double *lps, int k,
                     sb_decode_fn decode, void *ud) {
    chat_entry(b, text, n, lp);
    sb_puts(b, ",\"top_logprobs\":[");
    for (int i = 0; i < k; i++) {
        size_t tn;
        const char *t = decode(ud, ids[i], &tn);
        if (i) sb_puts(b, ",");
        chat_entry(b, t, tn, lps[i]);
        sb_puts(b, "}");
    }
    sb_puts(b, "]}");
}

void sb_top_map(sbuf *b, const int *ids, const double *lps, int k, sb_decode_fn decode, void *ud) {
    sb_puts(b, "{");
    for (int i = 0; i < k; i++) {
        size_t tn;
        const char *t = decode(ud, ids[i], &tn);
        if (i) sb_puts(b, ",");
        sb_json_str(b, t, tn);
        sb_puts(b, ":");
        sb_json_num(b, lps[i]);
    }
    sb_puts(b, "}");
}

static void bound(sbuf *b, double v) {
    if (isinf(v)) sb_puts(b, "null");
    else sb_json_num(b, v);
}

static void profile_obj(sbuf *b, const entropix_config *c) {
    static const char *keys[M_COUNT] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                                         "interaction_strength" };
    sb_puts(b, "{\"name\":");
    sb_json_str(b, c->name, strlen(c->name));
    sb_printf(b, ",\"temperature\":%.9g,\"top_p\":%.9g,\"top_k\":%.9g,\"min_p\":%.9g,\"order\":[", c->temp, c->top_p,
              c->top_k, c->min_p);
    for (int i = 0, first = 1; i < ENTROPIX_N_BOXES; i++)
        if (c->order[i] >= 0 && c->order[i] < ENTROPIX_N_BOXES)
            sb_printf(b, "%s\"%s\"", first ? "" : ",", entropix_quadrant_name((entropix_quadrant)c->order[i])), first = 0;
    sb_puts(b, "],\"quadrants\":{");
    for (int q = 0; q < ENTROPIX_N_BOXES; q++) {
        sb_printf(b, "%s\"%s\":{", q ? "," : "", entropix_quadrant_name((entropix_quadrant)q));
        for (int i = 0; i < M_COUNT; i++) {
            sb_printf(b, "%s\"%s\":{\"min\":", i ? "," : "", keys[i]);
            bound(b, c->box[q].lo[i]);
            sb_puts(b, ",\"max\":");
            bound(b, c->box[q].hi[i]);
            sb_puts(b, "}");
        }
        sb_puts(b, "}");
    }
    sb_puts(b, "}}");
}

void sb_profiles(sbuf *b, const char *default_sampler, const char *default_profile) {
    sb_puts(b, "{\"object\":\"list\",\"default_sampler\":");
    sb_json_str(b, default_sampler, strlen(default_sampler));
    sb_puts(b, ",\"default_profile\":");
    sb_json_str(b, default_profile, strlen(default_profile));
    sb_puts(b, ",\"data\":[");
    // entropix_profile_names() is "a, b, c".
    const char *names = entropix_profile_names();
    int first = 1;
    while (*names) {
        size_t n = strcspn(names, ", ");
        char name[32];
        entropix_config c;
        if (n > 0 && n < sizeof name) {
            memcpy(name, names, n), name[n] = 0;
            if (entropix_profile(name, &c, NULL) == 0) {
                if (!first) sb_puts(b, ",");
                profile_obj(b, &c), first = 0;
            }
        }
        names += n;
        names += strspn(names, ", ");
    }
    sb_puts(b, "]}");
}
