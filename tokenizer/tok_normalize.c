// tok_normalize.c: runs the normalizer chain on one stretch of text.
#define _GNU_SOURCE  // memmem
#include "tokenizer/tok_internal.h"

#include <stdint.h>
#include <stdio.h>
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

// Every stage is bounded (docs/robustness.md, "Bounds"): the normalized text of an
// n-byte stretch is at most TOK_NORM_GROWTH * n + TOK_NORM_SLACK bytes, checked inside
// Replace and Prepend before the buffer grows and after every stage, so a chain of
// Replace (" " -> 1000 spaces, 8 times) stops with an error instead of growing the text
// exponentially. No real normalizer comes near it (NFC at most triples, Metaspace's
// " " -> "▁" triples).
#define TOK_NORM_GROWTH 16
#define TOK_NORM_SLACK 4096

typedef struct {
    size_t limit;         // bytes
    const tok_norm *bad;  // the stage that went over
    int index;            // its index in its Sequence; -1: not in one
} norm_ctx;

enum { NORM_OOM = -1, NORM_TOO_LONG = -2 };

static int put_bounded(norm_ctx *cx, const tok_norm *nm, tbuf *out, const void *p, size_t n) {
    if (n > cx->limit || out->n > cx->limit - n) {
        cx->bad = nm;
        return NORM_TOO_LONG;
    }
    return tbuf_put(out, p, n) < 0 ? NORM_OOM : 0;
}

static int norm_replace(norm_ctx *cx, const tok_norm *nm, const char *s, size_t n, tbuf *out) {
    size_t i = 0;
    while (i < n) {
        const char *hit = nm->alen <= n - i ? memmem(s + i, n - i, nm->a, nm->alen) : NULL;
        if (!hit) return put_bounded(cx, nm, out, s + i, n - i);
        int rc = put_bounded(cx, nm, out, s + i, (size_t)(hit - (s + i)));
        if (rc == 0) rc = put_bounded(cx, nm, out, nm->b, nm->blen);
        if (rc) return rc;
        i = (size_t)(hit - s) + nm->alen;
    }
    return 0;
}

static int norm_one(norm_ctx *cx, const tok_norm *nm, const char *s, size_t n, tbuf *out);

static int norm_sequence(norm_ctx *cx, const tok_norm *nm, const char *s, size_t n, tbuf *out) {
    tbuf a = {0}, b = {0};
    int rc = tbuf_put(&a, s, n) < 0 ? NORM_OOM : 0;
    for (int i = 0; rc == 0 && i < nm->nseq; i++) {
        rc = norm_one(cx, &nm->seq[i], a.p, a.n, &b);
        if (rc == NORM_TOO_LONG && cx->bad == &nm->seq[i]) cx->index = i;
        tbuf t = a;
        a = b;
        b = t;
    }
    out->n = 0;
    if (rc == 0) rc = tbuf_put(out, a.p, a.n) < 0 ? NORM_OOM : 0;
    free(a.p);
    free(b.p);
    return rc;
}

static int norm_one(norm_ctx *cx, const tok_norm *nm, const char *s, size_t n, tbuf *out) {
    out->n = 0;
    int rc = NORM_OOM;
    switch (nm->kind) {
    case NORM_NFC: rc = norm_nfc(s, n, out) < 0 ? NORM_OOM : 0; break;
    case NORM_PREPEND:
        rc = n ? put_bounded(cx, nm, out, nm->a, nm->alen) : 0;
        if (rc == 0) rc = put_bounded(cx, nm, out, s, n);
        break;
    case NORM_REPLACE: rc = norm_replace(cx, nm, s, n, out); break;
    case NORM_SEQUENCE: return norm_sequence(cx, nm, s, n, out);
    }
    if (rc == 0 && out->n > cx->limit) {
        cx->bad = nm;
        rc = NORM_TOO_LONG;
    }
    return rc;
}

static const char *norm_name(norm_kind k) {
    return k == NORM_NFC ? "NFC" : k == NORM_PREPEND ? "Prepend" : k == NORM_REPLACE ? "Replace" : "Sequence";
}

static int too_long(const norm_ctx *cx, size_t n, verr *err) {
    char where[32] = "";
    if (cx->index >= 0) snprintf(where, sizeof where, "'s normalizers[%d]", cx->index);
    const tok_norm *b = cx->bad;
    char what[160] = "";
    if (b->kind == NORM_REPLACE)
        snprintf(what, sizeof what, " \"%.20s\" -> %zu bytes", b->a, b->blen);
    else if (b->kind == NORM_PREPEND)
        snprintf(what, sizeof what, " of %zu bytes", b->alen);
    return verr_set(err, "tokenizer: the normalizer%s (%s%s) would make a %zu-byte text longer than the limit of %zu bytes "
                    "(%d x the input + %d; a normalizer that grows text without bound)", where, norm_name(b->kind), what,
                    n, cx->limit, TOK_NORM_GROWTH, TOK_NORM_SLACK);
}

int tok_normalize(const tok_norm *nm, const char *s, size_t n, tbuf *out, verr *err) {
    size_t cap = (SIZE_MAX - TOK_NORM_SLACK) / TOK_NORM_GROWTH;
    norm_ctx cx = { (n < cap ? n : cap) * TOK_NORM_GROWTH + TOK_NORM_SLACK, NULL, -1 };
    int rc = norm_one(&cx, nm, s, n, out);
    if (rc == NORM_TOO_LONG) return too_long(&cx, n, err);
    if (rc < 0) return verr_set(err, "tokenizer: out of memory while normalizing");
    return 0;
}
