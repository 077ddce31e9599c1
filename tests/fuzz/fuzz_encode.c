// fuzz_encode: encode and decode over arbitrary bytes with real tokenizers. The
// tokenizers come from FUZZ_TOKENIZERS, a comma-separated list of tokenizer dirs or
// files; an entry ending in "=roundtrip" must decode its own encoding back to the
// exact input bytes (byte-level BPE without a normalizer, e.g. Llama 3).
// Input: byte 0 picks the tokenizer (bits 0-1), parse_special (bit 2), skip_special
// (bit 3) and the mode (bit 4: the rest is little-endian u16 ids to decode, else
// text to encode). Streaming decode must always equal the one-shot decode.
#include "tests/fuzz/fuzz_util.h"

#include "tokenizer/tokenizer.h"

#define MAX_TOK 4

static tokenizer *toks[MAX_TOK];
static int roundtrip[MAX_TOK], n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *env = getenv("FUZZ_TOKENIZERS");
    if (!env || !*env) {
        fprintf(stderr, "fuzz_encode: set FUZZ_TOKENIZERS=dir[=roundtrip],dir,...\n");
        exit(2);
    }
    char *list = strdup(env), *save = NULL;
    for (char *e = strtok_r(list, ",", &save); e && n_toks < MAX_TOK; e = strtok_r(NULL, ",", &save)) {
        char *eq = strstr(e, "=roundtrip");
        if (eq) *eq = 0;
        verr err = {{0}};
        toks[n_toks] = tokenizer_load(e, &err);
        if (!toks[n_toks]) {
            fprintf(stderr, "fuzz_encode: %s\n", err.msg);
            exit(2);
        }
        roundtrip[n_toks++] = eq != NULL;
    }
    free(list);
    return 0;
}

// Decodes ids both ways; they must agree. Returns the one-shot text (or NULL on a bad id).
static char *decode_both(const tokenizer *t, const int *ids, int n, int skip) {
    verr err = {{0}};
    char *full = tokenizer_decode(t, ids, n, skip, &err);
    tokenizer_stream *st = tokenizer_stream_new(t, skip);
    FUZZ_CHECK(st);
    char *acc = malloc(1);
    size_t len = 0;
    int bad = 0;
    for (int i = 0; i <= n && acc; i++) {
        const char *out;
        int k = i < n ? tokenizer_stream_push(st, ids[i], &out, &err) : tokenizer_stream_flush(st, &out);
        if (k < 0) {
            bad = 1;
            break;
        }
        char *g = realloc(acc, len + (size_t)k + 1);
        FUZZ_CHECK(g);
        acc = g;
        memcpy(acc + len, out, (size_t)k);
        len += (size_t)k;
    }
    tokenizer_stream_free(st);
    FUZZ_CHECK((full == NULL) == bad);  // a bad id fails both ways
    if (full) {  // the C string stops at an embedded NUL; the stream does not
        size_t fl = strlen(full);
        FUZZ_CHECK(fl <= len && memcmp(full, acc, fl) == 0 && (fl == len || acc[fl] == 0));
    }
    free(acc);
    return full;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3, special = data[0] >> 2 & 1, skip = data[0] >> 3 & 1, ids_mode = data[0] >> 4 & 1;
    const tokenizer *t = toks[which % n_toks];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int nv = tokenizer_vocab_size(t);
    if (ids_mode) {
        int n = (int)(len / 2), *ids = malloc(sizeof(int) * (size_t)(n ? n : 1));
        FUZZ_CHECK(ids);
        for (int i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, text + 2 * i, 2);
            // Mostly in range; the top values step just past the vocab and below 0.
            ids[i] = v >= 0xFFF0 ? (v & 1 ? nv + (v & 7) : -1 - (v & 7)) : (int)((uint32_t)v * 37u % (uint32_t)nv);
        }
        free(decode_both(t, ids, n, skip));
        free(ids);
        return 0;
    }
    int *ids = NULL;
    verr err = {{0}};
    int n = tokenizer_encode(t, text, len, special, &ids, &err);
    FUZZ_CHECK(n >= 0);  // any bytes encode (invalid UTF-8 included)
    for (int i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv);
    char *back = decode_both(t, ids, n, skip);
    FUZZ_CHECK(back);
    if (roundtrip[which % n_toks] && !special && !skip && !memchr(text, 0, len))
        FUZZ_CHECK(strlen(back) == len && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    return 0;
}
