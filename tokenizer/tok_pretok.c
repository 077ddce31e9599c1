// tok_pretok.c: the pre-tokenizers. Each step maps a list of pieces to a finer list;
// steps that change the text (prefix space, Metaspace) write into arenas in pre_store.
// ByteLevel's byte->unicode mapping is not applied: the vocab is keyed by raw bytes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"

#include <utf8proc.h>

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

void tok_pre_store_free(pre_store *s) {
    for (int i = 0; i < s->n; i++) free(s->bufs[i].p);
    free(s->bufs);
    memset(s, 0, sizeof *s);
}

// A fresh arena with room for cap bytes; it must not grow past that while pieces
// point into it.
static tbuf *store_new(pre_store *s, size_t cap) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        tbuf *b = realloc(s->bufs, (size_t)nc * sizeof *b);
        if (!b) return NULL;
        s->bufs = b;
        s->cap = nc;
    }
    tbuf *b = &s->bufs[s->n];
    memset(b, 0, sizeof *b);
    if (tbuf_reserve(b, cap) < 0) return NULL;
    s->n++;
    return b;
}

typedef struct {
    size_t start, end;
    int match;
} region;

// Emits the regions of one piece according to the Split behavior.
static int emit_regions(const tok_pre *p, const char *s, const region *r, int nr, piece_list *out) {
    size_t pend_start = 0, pend_len = 0;  // MergedWithNext carry / Contiguous run
    int have_pend = 0;
    for (int i = 0; i < nr; i++) {
        size_t a = r[i].start, len = r[i].end - r[i].start;
        int m = r[i].match ^ p->invert;
        switch (p->behavior) {
        case SPLIT_ISOLATED:
            if (piece_list_add(out, s + a, len) < 0) return -1;
            break;
        case SPLIT_REMOVED:
            if (!m && piece_list_add(out, s + a, len) < 0) return -1;
            break;
        case SPLIT_PREV:
            if (m && out->n > 0 && i > 0) out->len[out->n - 1] += len;
            else if (piece_list_add(out, s + a, len) < 0) return -1;
            break;
        case SPLIT_NEXT:
            if (have_pend) {
                a = pend_start;
                len += pend_len;
                have_pend = 0;
            }
            if (m && i + 1 < nr) {
                pend_start = a, pend_len = len, have_pend = 1;
            } else if (piece_list_add(out, s + a, len) < 0) return -1;
            break;
        case SPLIT_CONTIGUOUS:
            if (m && i > 0 && r[i - 1].match ^ p->invert && out->n > 0) out->len[out->n - 1] += len;
            else if (piece_list_add(out, s + a, len) < 0) return -1;
            break;
        }
    }
    return 0;
}

static int split_regex(const tok_pre *p, void *re, const char *s, size_t n, pcre2_match_data *md,
                       piece_list *out, region **rbuf, int *rcap) {
    int nr = 0;
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {  // empty match: step one byte past it
            pos = ov[0] + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (nr + 2 > *rcap) {
            int nc = *rcap ? *rcap * 2 : 256;
            region *r = realloc(*rbuf, (size_t)nc * sizeof *r);
            if (!r) return -1;
            *rbuf = r;
            *rcap = nc;
        }
        if (ov[0] > last) (*rbuf)[nr++] = (region){last, ov[0], 0};
        (*rbuf)[nr++] = (region){ov[0], ov[1], 1};
        last = pos = ov[1];
    }
    if (last < n) {
        if (nr + 1 > *rcap) {
            region *r = realloc(*rbuf, (size_t)(*rcap + 1) * sizeof *r);
            if (!r) return -1;
            *rbuf = r;
            *rcap += 1;
        }
        (*rbuf)[nr++] = (region){last, n, 0};
    }
    return emit_regions(p, s, *rbuf, nr, out);
}

// Length of the UTF-8 character at s (1 for an invalid byte) and whether it is numeric:
// HF's Digits uses Rust's char::is_numeric, the general categories Nd, Nl and No.
static size_t numeric_char(const char *s, size_t n, int *num) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (k <= 0) {
        *num = 0;
        return 1;
    }
    utf8proc_category_t cat = utf8proc_category(c);
    *num = cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
    return (size_t)k;
}

static int split_digits(const tok_pre *p, const char *s, size_t n, piece_list *out) {
    size_t i = 0;
    while (i < n) {
        int dig, next;
        size_t j = i + numeric_char(s + i, n - i, &dig);
        if (!dig || !p->individual_digits)
            for (size_t k; j < n && (k = numeric_char(s + j, n - j, &next)) && next == dig;) j += k;
        if (piece_list_add(out, s + i, j - i) < 0) return -1;
        i = j;
    }
    return 0;
}

static size_t total_len(const piece_list *in) {
    size_t t = 0;
    for (int i = 0; i < in->n; i++) t += in->len[i];
    return t;
}

// ByteLevel add_prefix_space: " " before every piece that lacks one.
static int prefix_space(const piece_list *in, pre_store *st, piece_list *out) {
    tbuf *b = store_new(st, total_len(in) + (size_t)in->n);
    if (!b) return -1;
    for (int i = 0; i < in->n; i++) {
        size_t at = b->n;
        if ((!in->len[i] || in->p[i][0] != ' ') && tbuf_put(b, " ", 1) < 0) return -1;
        if (tbuf_put(b, in->p[i], in->len[i]) < 0 || piece_list_add(out, b->p + at, b->n - at) < 0) return -1;
    }
    return 0;
}

// Metaspace: spaces become the replacement, which is prepended per prepend_scheme;
// with split, each piece breaks before every replacement character.
static int metaspace(const tok_pre *p, const piece_list *in, int first, pre_store *st, piece_list *out) {
    size_t rl = strlen(p->repl);
    tbuf *b = store_new(st, total_len(in) * rl + (size_t)in->n * rl);
    if (!b) return -1;
    for (int i = 0; i < in->n; i++) {
        size_t at = b->n;
        const char *s = in->p[i];
        size_t n = in->len[i];
        int starts = n >= rl && !memcmp(s, p->repl, rl);
        int starts_space = n && s[0] == ' ';
        if (!starts && !starts_space && (p->prepend == 1 || (p->prepend == 2 && first && i == 0)))
            if (tbuf_put(b, p->repl, rl) < 0) return -1;
        for (size_t k = 0; k < n; k++)
            if ((s[k] == ' ' ? tbuf_put(b, p->repl, rl) : tbuf_put(b, s + k, 1)) < 0) return -1;
        const char *q = b->p + at;
        size_t m = b->n - at, last = 0;
        for (size_t k = rl; p->split && k + rl <= m; k++) {
            if (!memcmp(q + k, p->repl, rl)) {
                if (piece_list_add(out, q + last, k - last) < 0) return -1;
                last = k;
            }
        }
        if (m > last && piece_list_add(out, q + last, m - last) < 0) return -1;
    }
    return 0;
}

typedef struct {
    pcre2_match_data *md;
    region *r;
    int rcap;
} split_ctx;

static int pre_apply(const tok_pre *p, const piece_list *in, int first, pre_store *st, split_ctx *cx,
                     piece_list *out) {
    out->n = 0;
    if (p->kind == PRE_SEQUENCE) {
        piece_list a = {0}, b = {0};
        int rc = 0;
        for (int i = 0; i < in->n && rc == 0; i++) rc = piece_list_add(&a, in->p[i], in->len[i]);
        for (int k = 0; k < p->nseq && rc == 0; k++) {
            rc = pre_apply(&p->seq[k], &a, first, st, cx, &b);
            piece_list t = a;
            a = b;
            b = t;
        }
        for (int i = 0; i < a.n && rc == 0; i++) rc = piece_list_add(out, a.p[i], a.len[i]);
        free(a.p), free(a.len), free(b.p), free(b.len);
        return rc;
    }
    if (p->kind == PRE_METASPACE) return metaspace(p, in, first, st, out);
    piece_list tmp = {0};
    const piece_list *src = in;
    if (p->kind == PRE_BYTELEVEL && p->add_prefix_space) {
        if (prefix_space(in, st, &tmp) < 0) return -1;
        src = &tmp;
    }
    int rc = 0;
    for (int i = 0; i < src->n && rc == 0; i++) {
        if (p->kind == PRE_DIGITS) rc = split_digits(p, src->p[i], src->len[i], out);
        else if (p->re) {
            tok_pre iso = *p;
            if (p->kind == PRE_BYTELEVEL) iso.behavior = SPLIT_ISOLATED, iso.invert = 0;
            rc = split_regex(&iso, p->re, src->p[i], src->len[i], cx->md, out, &cx->r, &cx->rcap);
        } else rc = piece_list_add(out, src->p[i], src->len[i]);
    }
    free(tmp.p);
    free(tmp.len);
    return rc;
}

int tok_pretokenize(const tok_pre *p, const char *s, size_t n, int first, pre_store *store,
                    piece_list *out, verr *err) {
    out->n = 0;
    if (!p) {
        if (n && piece_list_add(out, s, n) < 0) return verr_set(err, "tokenizer: out of memory");
        return 0;
    }
    split_ctx cx = {pcre2_match_data_create(1, NULL), NULL, 0};
    piece_list in = {0};
    int rc = cx.md ? piece_list_add(&in, s, n) : -1;
    if (rc == 0) rc = pre_apply(p, &in, first, store, &cx, out);
    free(in.p), free(in.len), free(cx.r);
    if (cx.md) pcre2_match_data_free(cx.md);
    if (rc < 0) return verr_set(err, "tokenizer: out of memory while pre-tokenizing");
    // Drop empty pieces so the model never sees them.
    int k = 0;
    for (int i = 0; i < out->n; i++)
        if (out->len[i]) out->p[k] = out->p[i], out->len[k++] = out->len[i];
    out->n = k;
    return 0;
}
