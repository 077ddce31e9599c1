// tok_decode.c: the decoder chain (ByteLevel, ByteFallback, Metaspace, Replace, Fuse,
// Strip, Sequence) over the pieces of a run of ids. Output is raw bytes: invalid
// UTF-8 produced by byte tokens is passed through, not replaced.
#define _GNU_SOURCE  // memmem
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    tbuf *s;  // [n] one string per token
    int n;
    int fused;  // a Fuse/ByteLevel step made s[0] stand for the whole sequence
} toks;

static void toks_free(toks *t) {
    for (int i = 0; i < t->n; i++) free(t->s[i].p);
    free(t->s);
}

static int fuse(toks *t) {
    for (int i = 1; i < t->n; i++) {
        if (tbuf_put(&t->s[0], t->s[i].p, t->s[i].n) < 0) return -1;
        free(t->s[i].p);
    }
    if (t->n > 1) t->n = 1;
    t->fused = 1;
    return 0;
}

static int replace_in(tbuf *b, const char *pat, size_t plen, const char *rep, size_t rlen) {
    if (!b->n || !memmem(b->p, b->n, pat, plen)) return 0;
    tbuf o = {0};
    size_t i = 0;
    while (i < b->n) {
        const char *hit = memmem(b->p + i, b->n - i, pat, plen);
        size_t stop = hit ? (size_t)(hit - b->p) : b->n;
        if (tbuf_put(&o, b->p + i, stop - i) < 0 || (hit && tbuf_put(&o, rep, rlen) < 0)) {
            free(o.p);
            return -1;
        }
        i = hit ? stop + plen : b->n;
    }
    free(b->p);
    *b = o;
    return 0;
}

// ByteLevel: each character back to its byte; a token with a character outside the
// map (an added token) keeps its UTF-8 as is.
static int bytelevel(const struct tokenizer *t, tbuf *b) {
    size_t o = 0, i = 0;
    char *tmp = malloc(b->n + 1);
    if (!tmp) return -1;
    while (i < b->n) {
        uint32_t cp;
        int l = tok_utf8_decode((const unsigned char *)b->p + i, b->n - i, &cp);
        if (!l || cp >= 512 || t->cp_to_byte[cp] < 0) {
            free(tmp);
            return 0;
        }
        tmp[o++] = (char)t->cp_to_byte[cp];
        i += (size_t)l;
    }
    memcpy(b->p, tmp, o);
    b->n = o;
    b->p[o] = 0;
    free(tmp);
    return 0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void bytefallback(tbuf *b) {
    if (b->n == 6 && !memcmp(b->p, "<0x", 3) && b->p[5] == '>' && hexval(b->p[3]) >= 0 && hexval(b->p[4]) >= 0) {
        b->p[0] = (char)(hexval(b->p[3]) * 16 + hexval(b->p[4]));
        b->n = 1;
        b->p[1] = 0;
    }
}

static void strip(const tok_dec *d, tbuf *b, int do_start, int do_stop) {
    size_t cl = d->alen, lead = 0;
    for (int k = 0; do_start && k < d->strip_start && lead + cl <= b->n && !memcmp(b->p + lead, d->a, cl); k++) lead += cl;
    size_t end = b->n;
    for (int k = 0; do_stop && k < d->strip_stop && end >= lead + cl && !memcmp(b->p + end - cl, d->a, cl); k++) end -= cl;
    memmove(b->p, b->p + lead, end - lead);
    b->n = end - lead;
    b->p[b->n] = 0;
}

static int dec_apply(const struct tokenizer *t, const tok_dec *d, toks *ts, int first) {
    switch (d->kind) {
    case DEC_SEQUENCE:
        for (int i = 0; i < d->nseq; i++)
            if (dec_apply(t, &d->seq[i], ts, first) < 0) return -1;
        return 0;
    case DEC_FUSE: return fuse(ts);
    case DEC_BYTELEVEL:
        for (int i = 0; i < ts->n; i++)
            if (bytelevel(t, &ts->s[i]) < 0) return -1;
        return fuse(ts);
    case DEC_BYTEFALLBACK:
        for (int i = 0; i < ts->n; i++) bytefallback(&ts->s[i]);
        return 0;
    case DEC_REPLACE:
        for (int i = 0; i < ts->n; i++)
            if (replace_in(&ts->s[i], d->a, d->alen, d->b, d->blen) < 0) return -1;
        return 0;
    case DEC_METASPACE:
        for (int i = 0; i < ts->n; i++) {
            if (replace_in(&ts->s[i], d->a, d->alen, " ", 1) < 0) return -1;
            tbuf *b = &ts->s[i];
            if (d->prepend && i == 0 && first && b->n && b->p[0] == ' ') {
                memmove(b->p, b->p + 1, b->n);
                b->n--;
            }
        }
        return 0;
    case DEC_STRIP:
        // After a Fuse the single string is the whole sequence: strip its start only
        // at the sequence start. The end strip is applied to full decodes only.
        for (int i = 0; i < ts->n; i++) strip(d, &ts->s[i], ts->fused ? first : 1, !ts->fused || first == 2);
        return 0;
    }
    return -1;
}

int tok_decode_ids(const struct tokenizer *t, const int *ids, int n, int skip_special, int first,
                   tbuf *out, verr *err) {
    toks ts = {calloc(n ? (size_t)n : 1, sizeof(tbuf)), 0, 0};
    if (!ts.s) return verr_set(err, "tokenizer: out of memory");
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->pieces[id]) {
            toks_free(&ts);
            return verr_set(err, "token id %d at position %d is out of range (vocab size %d)", id, i, t->n_vocab);
        }
        if (skip_special && t->special[id]) continue;
        if (tbuf_put(&ts.s[ts.n++], t->pieces[id], strlen(t->pieces[id])) < 0) goto oom;
    }
    if (t->dec && ts.n && dec_apply(t, t->dec, &ts, first) < 0) goto oom;
    for (int i = 0; i < ts.n; i++) {
        if (!t->dec && (i > 0 || !first) && tbuf_put(out, " ", 1) < 0) goto oom;
        if (tbuf_put(out, ts.s[i].p, ts.s[i].n) < 0) goto oom;
    }
    toks_free(&ts);
    return 0;
oom:
    toks_free(&ts);
    return verr_set(err, "tokenizer: out of memory while decoding");
}
