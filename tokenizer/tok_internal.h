// tok_internal.h: the tokenizer's private structures, shared by tokenizer/tok_*.c.
// Pipeline: added-token split -> normalizer -> pre-tokenizer -> BPE model; decode
// runs the decoder chain over the pieces of the ids.
#ifndef VARENT_TOK_INTERNAL_H
#define VARENT_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "host/util/err.h"

// Token ids must be below this: the per-id tables are sized by the largest id, so a
// stray huge id would otherwise reserve gigabytes (the largest real vocabs are ~256K).
#define TOK_MAX_ID (1 << 24)

// ---- hash maps (tok_hash.c) ----
// ---- growable byte buffer ----
typedef struct {
    char *p;
    size_t n, cap;
} tbuf;
int tbuf_put(tbuf *b, const void *s, size_t n);
int tbuf_reserve(tbuf *b, size_t extra);

// String -> int map. Keys are copied into an arena; lookups by (ptr, len).
typedef struct {
    uint64_t *slots;  // [cap] hash tag << 32 | entry index + 1, 0 = empty
    uint32_t cap;     // power of two
    struct strmap_ent { uint32_t off, len; int val; } *ent;  // [n] key offset/length in arena, value
    uint32_t n, ncap;
    tbuf arena;  // the keys, each NUL-terminated
} strmap;

int strmap_init(strmap *m, uint32_t expect);
void strmap_free(strmap *m);
// Inserts or overwrites; returns 0, or -1 on allocation failure.
int strmap_put(strmap *m, const char *k, size_t len, int val);
// Value, or -1 if absent.
int strmap_get(const strmap *m, const char *k, size_t len);
uint64_t tok_hash_bytes(const char *s, size_t len);

// (left id, right id) -> merge rank and merged id.
typedef struct {
    uint64_t *keys;  // [cap] (a << 32 | b) + 1, 0 = empty
    int *rank;       // [cap]
    int *out;        // [cap]
    uint32_t cap, n;
} pairmap;

int pairmap_init(pairmap *m, uint32_t expect);
void pairmap_free(pairmap *m);
// Keeps the first (lowest) rank when a pair repeats.
int pairmap_put(pairmap *m, int a, int b, int rank, int out);
// Returns the slot index or -1 if absent.
static inline int pairmap_find(const pairmap *m, int a, int b) {
    if (!m->cap) return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t i = (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);
    while (m->keys[i]) {
        if (m->keys[i] == k) return (int)i;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

// ---- normalizers (tok_normalize.c) ----
typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE, NORM_SEQUENCE } norm_kind;
typedef struct tok_norm {
    norm_kind kind;
    char *a, *b;         // prepend text; replace pattern / content
    size_t alen, blen;
    struct tok_norm *seq; // [nseq] for Sequence
    int nseq;
} tok_norm;

// ---- pre-tokenizers (tok_pretok.c) ----
typedef enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_DIGITS, PRE_METASPACE, PRE_SEQUENCE } pre_kind;
typedef enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_PREV, SPLIT_NEXT, SPLIT_CONTIGUOUS } split_behavior;
typedef struct tok_pre {
    pre_kind kind;
    void *re;              // pcre2_code_8 * (Split, ByteLevel use_regex)
    split_behavior behavior;
    int invert;
    int add_prefix_space;  // ByteLevel
    int individual_digits; // Digits
    char repl[8];          // Metaspace replacement (UTF-8)
    int prepend;           // Metaspace: 0 never, 1 always, 2 first
    int split;             // Metaspace: split on replacement
    struct tok_pre *seq;
    int nseq;
} tok_pre;

// A list of pieces (spans into caller-owned memory).
typedef struct {
    const char **p;  // [n]
    size_t *len;     // [n]
    int n, cap;
} piece_list;
int piece_list_add(piece_list *l, const char *p, size_t len);

// ---- decoders (tok_decode.c) ----
typedef enum { DEC_BYTELEVEL, DEC_BYTEFALLBACK, DEC_METASPACE, DEC_REPLACE, DEC_FUSE, DEC_STRIP,
               DEC_SEQUENCE } dec_kind;
typedef struct tok_dec {
    dec_kind kind;
    char *a, *b;  // Replace pattern/content; Metaspace replacement in a
    size_t alen, blen;
    int strip_start, strip_stop, prepend; // Strip counts (char in a); Metaspace strips first space
    struct tok_dec *seq;
    int nseq;
} tok_dec;

// ---- added tokens ----
typedef struct {
    char *text;
    size_t len;
    int id;
    int special, lstrip, rstrip, single_word, normalized;
} tok_added;

struct tokenizer {
    const char **pieces;  // [n_vocab] vocab text per id (NULL for unused ids), into arena or added
    char *arena;          // the vocab strings
    unsigned char *special;  // [n_vocab] 1 if an added special token
    int n_vocab;        // max id + 1
    strmap vocab;       // model string (bytes for byte-level) -> id
    pairmap merges;
    int byte_level;     // model strings are raw bytes (ByteLevel pre-tokenizer)
    int byte_fallback;  // <0xNN> tokens for unknown chars
    int byte_ids[256];  // byte -> id (byte-level: the single-byte token; fallback: <0xNN>), -1
    int unk_id, fuse_unk, ignore_merges;
    tok_norm *norm;     // NULL = none
    tok_pre *pre;
    tok_dec *dec;
    tok_added *added;   // [n_added], longest first
    int n_added;
    unsigned char added_first[256];  // bit 0/1: a non-normalized/normalized added token starts with this byte
    int bos_id, eos_id, add_bos;
    char *chat_template;
    uint16_t byte_to_cp[256];  // GPT-2 byte -> code point map
    int16_t cp_to_byte[512];   // inverse, -1 where unmapped
};

// tok_bytemap.c
void tok_bytemap_init(uint16_t byte_to_cp[256], int16_t cp_to_byte[512]);
// UTF-8 length of a code point / decode one code point (returns bytes consumed, 0 on invalid).
int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
int tok_utf8_encode(uint32_t cp, char *out);

// tok_parts.c: JSON -> components
tok_norm *tok_norm_parse(const void *cjson, const char *path, verr *err);
void tok_norm_free(tok_norm *n);
tok_pre *tok_pre_parse(const void *cjson, const char *path, verr *err);
void tok_pre_free(tok_pre *p);
tok_dec *tok_dec_parse(const void *cjson, const char *path, verr *err);
void tok_dec_free(tok_dec *d);
int tok_pre_has_bytelevel(const tok_pre *p);

// tok_normalize.c: normalizes [s, n) into out (replacing out's content).
int tok_normalize(const tok_norm *nm, const char *s, size_t n, tbuf *out, verr *err);

// tok_pretok.c: splits text into pieces. Transformed text lives in arenas held by
// *store (freed by tok_pre_store_free). first: the segment starts the input.
typedef struct {
    tbuf *bufs;
    int n, cap;
} pre_store;
int tok_pretokenize(const tok_pre *p, const char *s, size_t n, int first, pre_store *store,
                    piece_list *out, verr *err);
void tok_pre_store_free(pre_store *s);

// tok_bpe.c: encodes one piece, appending ids. cache may be NULL.
typedef struct bpe_cache bpe_cache;
bpe_cache *bpe_cache_new(void);
void bpe_cache_free(bpe_cache *c);
typedef struct {
    int *p;
    int n, cap;
} id_list;
int id_list_push(id_list *l, int id);
int tok_bpe_piece(const struct tokenizer *t, const char *s, size_t n, bpe_cache *c, id_list *out,
                  verr *err);

// tok_decode.c: appends the decoded bytes of ids to out. first: ids start the sequence.
int tok_decode_ids(const struct tokenizer *t, const int *ids, int n, int skip_special, int first,
                   tbuf *out, verr *err);

#endif
