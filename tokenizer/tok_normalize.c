// tok_normalize.c: runs the normalizer chain on one stretch of text.
#define _GNU_SOURCE  // memmem
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

// NFC. Text utf8proc rejects (invalid UTF-8) passes through unchanged, so the
// byte-level model can still encode its raw bytes.
static int norm_nfc(const char *s, size_t n, tbuf *out) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return tbuf_put(out, s, n);  // ASCII is already NFC
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return tbuf_put(out, s, n);
    int rc = tbuf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

static int norm_replace(const tok_norm *nm, const char *s, size_t n, tbuf *out) {
    size_t i = 0;
    while (i < n) {
        const char *hit = nm->alen <= n - i ? memmem(s + i, n - i, nm->a, nm->alen) : NULL;
        if (!hit) return tbuf_put(out, s + i, n - i);
        if (tbuf_put(out, s + i, (size_t)(hit - (s + i))) < 0 || tbuf_put(out, nm->b, nm->blen) < 0) return -1;
        i = (size_t)(hit - s) + nm->alen;
    }
    return 0;
}

static int norm_one(const tok_norm *nm, const char *s, size_t n, tbuf *out) {
    out->n = 0;
    switch (nm->kind) {
    case NORM_NFC: return norm_nfc(s, n, out);
    case NORM_PREPEND:
        if (n && tbuf_put(out, nm->a, nm->alen) < 0) return -1;
        return tbuf_put(out, s, n);
    case NORM_REPLACE: return norm_replace(nm, s, n, out);
    case NORM_SEQUENCE: {
        tbuf a = {0}, b = {0};
        if (tbuf_put(&a, s, n) < 0) return -1;
        for (int i = 0; i < nm->nseq; i++) {
            if (norm_one(&nm->seq[i], a.p, a.n, &b) < 0) {
                free(a.p);
                free(b.p);
                return -1;
            }
            tbuf t = a;
            a = b;
            b = t;
        }
        out->n = 0;
        int rc = tbuf_put(out, a.p, a.n);
        free(a.p);
        free(b.p);
        return rc;
    }
    }
    return -1;
}

int tok_normalize(const tok_norm *nm, const char *s, size_t n, tbuf *out, verr *err) {
    if (norm_one(nm, s, n, out) < 0) return verr_set(err, "tokenizer: out of memory while normalizing");
    return 0;
}
