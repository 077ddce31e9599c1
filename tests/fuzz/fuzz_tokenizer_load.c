// fuzz_tokenizer_load: tokenizer.json loading (tokenizer/tok_load.c, tok_json.c,
// tok_parts.c). The input is written as tokenizer.json; the part after a
// "\n#tokenizer_config.json#\n" line, when present, becomes tokenizer_config.json.
// A tokenizer that loads is then exercised: a few encodes, every id decoded.
#include "tests/fuzz/fuzz_util.h"

#include "tokenizer/tokenizer.h"

#define CFG_SEP "\n#tokenizer_config.json#\n"

static void exercise(tokenizer *t) {
    static const char *texts[] = {"", "Hello world!", " a  b\n\n\tc <|im_end|>", "\xe6\x97\xa5\xff\xc3", "12345 don't"};
    int nv = tokenizer_vocab_size(t);
    FUZZ_CHECK(nv > 0);
    verr err = {{0}};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        for (int special = 0; special < 2; special++) {
            int *ids = NULL, n = tokenizer_encode(t, texts[i], strlen(texts[i]), special, &ids, &err);
            for (int k = 0; k < n; k++) FUZZ_CHECK(ids[k] >= 0 && ids[k] < nv);
            char *s = n >= 0 ? tokenizer_decode(t, ids, n, special, &err) : NULL;
            free(s);
            free(ids);
        }
    }
    int lim = nv < 4096 ? nv : 4096;
    tokenizer_stream *st = tokenizer_stream_new(t, 0);
    FUZZ_CHECK(st);
    for (int id = 0; id < lim; id++) {
        const char *out;
        char *s = tokenizer_decode(t, &id, 1, 0, &err);
        free(s);
        (void)tokenizer_stream_push(st, id, &out, &err);
        const char *p = tokenizer_piece(t, id);
        if (p) FUZZ_CHECK(tokenizer_token_id(t, p) >= 0);
        (void)tokenizer_is_special(t, id);
    }
    const char *out;
    (void)tokenizer_stream_flush(st, &out);
    tokenizer_stream_free(st);
    int bos = tokenizer_bos_id(t), eos = tokenizer_eos_id(t);
    FUZZ_CHECK(bos >= -1 && bos < nv && eos >= -1 && eos < nv);
    (void)tokenizer_add_bos(t);
    (void)tokenizer_chat_template(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cfg;
    size_t cfg_len, n = fuzz_split(data, size, CFG_SEP, &cfg, &cfg_len);
    const char *path = fuzz_file("tokenizer.json", data, n);
    if (cfg) fuzz_file("tokenizer_config.json", cfg, cfg_len);
    else fuzz_remove("tokenizer_config.json");
    verr err = {{0}};
    tokenizer *t = tokenizer_load(path, &err);
    if (!t) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    exercise(t);
    tokenizer_free(t);
    return 0;
}
