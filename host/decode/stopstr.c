// stopstr.c: see stopstr.h.
#include "host/decode/stopstr.h"

#include <stdlib.h>
#include <string.h>

void stopstr_init(stopstr *s, const char *const *stop, int n) {
    memset(s, 0, sizeof *s);
    s->stop = stop, s->n = n;
}

// Cuts buf at the earliest stop string that ends at or after byte `from`.
static int find(stopstr *s, size_t from) {
    size_t best = (size_t)-1;
    for (int i = 0; i < s->n; i++) {
        size_t n = strlen(s->stop[i]), start = from >= n ? from - n + 1 : 0;
        for (size_t p = start; p + n <= s->len && p < best; p++)
            if (!memcmp(s->buf + p, s->stop[i], n)) best = p;
    }
    if (best == (size_t)-1) return 0;
    s->len = best;
    return 1;
}

// Bytes that may be emitted: the text less its longest tail that begins a stop string.
static size_t safe_len(const stopstr *s) {
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t n = strlen(s->stop[i]);
        for (size_t k = n - 1; k > hold; k--)
            if (k <= s->len && !memcmp(s->buf + s->len - k, s->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return s->len - hold;
}

int stopstr_push(stopstr *s, const char *text, size_t n, const char **out, size_t *out_n) {
    *out = NULL, *out_n = 0;
    if (s->hit) return 1;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *b = realloc(s->buf, cap);
        if (!b) return -1;
        s->buf = b, s->cap = cap;
    }
    size_t before = s->len;
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    s->hit = find(s, before);
    size_t to = s->hit ? s->len : safe_len(s);
    if (to > s->sent) *out = s->buf + s->sent, *out_n = to - s->sent, s->sent = to;
    return s->hit;
}

void stopstr_flush(stopstr *s, const char **out, size_t *out_n) {
    *out = NULL, *out_n = 0;
    if (s->len > s->sent) *out = s->buf + s->sent, *out_n = s->len - s->sent, s->sent = s->len;
}

void stopstr_free(stopstr *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}
