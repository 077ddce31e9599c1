// tokenizer.c: encode pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE),
// decode, streaming decode and the small accessors of tokenizer.h.
#include "tokenizer/tokenizer.h"
#include "tokenizer/tok_internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static int is_word_byte(unsigned char c) { return isalnum(c) || c == '_' || c >= 0x80; }
static int is_space_byte(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Leftmost-longest added token in [s+from, s+n) among those with the given
// normalized flag (special ones only when parse_special). On a hit sets the match
// span (including lstrip/rstrip whitespace) and returns its index, else -1.
static int find_added(const tokenizer *t, const char *s, size_t n, size_t from, int normalized,
                      int parse_special, size_t *ms, size_t *me) {
    unsigned char want = (unsigned char)(normalized ? 2 : 1);
    for (size_t i = from; i < n; i++) {
        if (!(t->added_first[(unsigned char)s[i]] & want)) continue;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != normalized || (a->special && !parse_special)) continue;
            if (a->text[0] != s[i] || a->len > n - i || memcmp(s + i, a->text, a->len)) continue;
            size_t b = i, e = i + a->len;
            if (a->single_word && ((b > 0 && is_word_byte((unsigned char)s[b - 1])) ||
                                   (e < n && is_word_byte((unsigned char)s[e]))))
                continue;
            if (a->lstrip)
                while (b > from && is_space_byte((unsigned char)s[b - 1])) b--;
            if (a->rstrip)
                while (e < n && is_space_byte((unsigned char)s[e])) e++;
            *ms = b, *me = e;
            return k;
        }
    }
    return -1;
}

typedef struct {
    id_list ids;
    bpe_cache *cache;
    tbuf norm;
} enc_ctx;

// Pre-tokenizes and BPE-encodes one stretch of (normalized) text.
static int encode_plain(const tokenizer *t, enc_ctx *cx, const char *s, size_t n, int first, verr *err) {
    pre_store st = {0};
    piece_list pl = {0};
    int rc = tok_pretokenize(t->pre, s, n, first, &st, &pl, err);
    for (int i = 0; rc == 0 && i < pl.n; i++) rc = tok_bpe_piece(t, pl.p[i], pl.len[i], cx->cache, &cx->ids, err);
    free(pl.p), free(pl.len);
    tok_pre_store_free(&st);
    return rc;
}

// A stretch between non-normalized added tokens: normalize, then split on the
// normalized added tokens, then encode.
static int encode_segment(const tokenizer *t, enc_ctx *cx, const char *s, size_t n, int first,
                          int parse_special, verr *err) {
    if (!n) return 0;
    tbuf nb = {0};
    if (t->norm) {
        if (tok_normalize(t->norm, s, n, &nb, err) < 0) {
            free(nb.p);  // what the normalizer wrote before it stopped
            return -1;
        }
        s = nb.p, n = nb.n;
    }
    size_t pos = 0, ms, me;
    int rc = 0, k;
    while (rc == 0 && (k = find_added(t, s, n, pos, 1, parse_special, &ms, &me)) >= 0) {
        rc = encode_plain(t, cx, s + pos, ms - pos, first && pos == 0, err);
        if (rc == 0 && id_list_push(&cx->ids, t->added[k].id) < 0) rc = verr_set(err, "tokenizer: out of memory");
        pos = me;
    }
    if (rc == 0) rc = encode_plain(t, cx, s + pos, n - pos, first && pos == 0, err);
    free(nb.p);
    return rc;
}

// Whether [b, e) overlaps one of the n plain spans (start/end pairs).
static int overlaps(const size_t *spans, int n, size_t b, size_t e) {
    for (int i = 0; i < n; i++)
        if (b < spans[2 * i + 1] && spans[2 * i] < e) return 1;
    return 0;
}

// Where added token k's own text starts in its match [ms, me) (which may include the
// whitespace its lstrip/rstrip take).
static size_t token_start(const tokenizer *t, int k, const char *s, size_t ms, size_t me) {
    const tok_added *a = &t->added[k];
    for (size_t i = ms; i + a->len <= me; i++)
        if (!memcmp(s + i, a->text, a->len)) return i;
    return ms;
}

static int encode_impl(const tokenizer *t, const char *text, size_t len, int parse_special, const size_t *plain,
                       int n_plain, int **ids, verr *err) {
    enc_ctx cx = {{0}, bpe_cache_new(), {0}};
    *ids = NULL;
    if (!cx.cache || id_list_push(&cx.ids, 0) < 0) {
        bpe_cache_free(cx.cache);
        free(cx.ids.p);
        return verr_set(err, "tokenizer: out of memory");
    }
    cx.ids.n = 0;
    size_t pos = 0, from = 0, ms, me;
    int rc = 0, k;
    while (rc == 0 && (k = find_added(t, text, len, from, 0, parse_special, &ms, &me)) >= 0) {
        size_t at = token_start(t, k, text, ms, me);
        if (t->added[k].special && overlaps(plain, n_plain, at, at + t->added[k].len)) {
            from = ms + 1;  // special text inside a plain span: not a token, look further
            continue;
        }
        int seg_special = parse_special && !overlaps(plain, n_plain, pos, ms);
        rc = encode_segment(t, &cx, text + pos, ms - pos, pos == 0, seg_special, err);
        if (rc == 0 && id_list_push(&cx.ids, t->added[k].id) < 0) rc = verr_set(err, "tokenizer: out of memory");
        pos = from = me;
    }
    if (rc == 0)
        rc = encode_segment(t, &cx, text + pos, len - pos, pos == 0, parse_special && !overlaps(plain, n_plain, pos, len),
                            err);
    bpe_cache_free(cx.cache);
    if (rc < 0) {
        free(cx.ids.p);
        return -1;
    }
    *ids = cx.ids.p;
    return cx.ids.n;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special, int **ids,
                     verr *err) {
    return encode_impl(t, text, len, parse_special, NULL, 0, ids, err);
}

int tokenizer_encode_spans(const tokenizer *t, const char *text, size_t len, const size_t *plain, int n_plain,
                           int **ids, verr *err) {
    return encode_impl(t, text, len, 1, plain, n_plain, ids, err);
}

char *tokenizer_decode(const tokenizer *t, const int *ids, int n, int skip_special, verr *err) {
    tbuf out = {0};
    if (tbuf_put(&out, "", 0) < 0) {
        verr_set(err, "tokenizer: out of memory");
        return NULL;
    }
    if (tok_decode_ids(t, ids, n, skip_special, 2, &out, err) < 0) {
        free(out.p);
        return NULL;
    }
    return out.p;
}

struct tokenizer_stream {
    const tokenizer *t;
    int skip_special;
    int started;   // a token has produced output position 0
    tbuf pending;  // decoded bytes not yet handed out
    tbuf out;
};

tokenizer_stream *tokenizer_stream_new(const tokenizer *t, int skip_special) {
    tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    return s;
}

void tokenizer_stream_continue(tokenizer_stream *s) { s->started = 1; }

void tokenizer_stream_free(tokenizer_stream *s) {
    if (!s) return;
    free(s->pending.p);
    free(s->out.p);
    free(s);
}

// Length of the prefix of b that does not end inside an unfinished UTF-8 character.
static size_t complete_prefix(const unsigned char *b, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = b[n - back];
        if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
        int need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
        return (size_t)need > back ? n - back : n;
    }
    return n;
}

static int stream_emit(tokenizer_stream *s, size_t upto, const char **out) {
    s->out.n = 0;
    if (tbuf_put(&s->out, s->pending.p, upto) < 0) return -1;
    memmove(s->pending.p, s->pending.p + upto, s->pending.n - upto);
    s->pending.n -= upto;
    *out = s->out.p;
    return (int)upto;
}

int tokenizer_stream_push(tokenizer_stream *s, int id, const char **out, verr *err) {
    *out = "";
    if (id >= 0 && id < s->t->n_vocab && s->skip_special && s->t->special[id]) return 0;
    if (tok_decode_ids(s->t, &id, 1, s->skip_special, s->started ? 0 : 1, &s->pending, err) < 0) return -1;
    s->started = 1;
    size_t upto = complete_prefix((const unsigned char *)s->pending.p, s->pending.n);
    if (stream_emit(s, upto, out) < 0) return verr_set(err, "tokenizer: out of memory");
    return (int)upto;
}

int tokenizer_stream_flush(tokenizer_stream *s, const char **out) {
    *out = "";
    if (!s->pending.n) return 0;
    return stream_emit(s, s->pending.n, out);
}

int tokenizer_vocab_size(const tokenizer *t) { return t->n_vocab; }

const char *tokenizer_piece(const tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab ? t->pieces[id] : NULL;
}

int tokenizer_is_special(const tokenizer *t, int id) {
    return id >= 0 && id < t->n_vocab && t->special[id];
}

int tokenizer_bos_id(const tokenizer *t) { return t->bos_id; }
int tokenizer_add_bos(const tokenizer *t) { return t->add_bos; }
int tokenizer_eos_id(const tokenizer *t) { return t->eos_id; }
const char *tokenizer_chat_template(const tokenizer *t) { return t->chat_template; }
