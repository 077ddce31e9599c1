// fuzz_gguf: the GGUF reader (host/formats/gguf.c) and, for files it accepts, the whole
// `varent convert gguf` path (host/formats/convert_gguf.c: hyper-parameters, the tokenizer
// built from metadata, dequantization, the safetensors writer). Every accessor must
// stay inside the mapping: values are checked against the file bounds.
#include "tests/fuzz/fuzz_util.h"

#include "host/formats/convert.h"
#include "host/formats/gguf.h"

static void check_file(const gguf_file *g) {
    const uint8_t *lo = g->map, *hi = g->map + g->size;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        FUZZ_CHECK(kv->key && kv->type < GGUF_NTYPES && gguf_find(g, kv->key));
        int64_t iv;
        double fv;
        const char *sv;
        verr err = {{0}};
        (void)gguf_get_int(g, kv->key, &iv, &err);
        (void)gguf_get_float(g, kv->key, &fv, &err);
        if (gguf_get_str(g, kv->key, &sv, &err) == 1) FUZZ_CHECK(sv);
        if (kv->type != GGUF_ARRAY) continue;
        FUZZ_CHECK(kv->arr_data >= lo && kv->arr_data <= hi);
        if (kv->arr_type == GGUF_STRING) {
            for (uint64_t k = 0; k < kv->arr_n; k++)
                FUZZ_CHECK((const uint8_t *)kv->arr_strs[k].p >= lo && kv->arr_strs[k].len <= (uint64_t)(hi - (const uint8_t *)kv->arr_strs[k].p));
        } else if (kv->arr_type != GGUF_ARRAY) {
            uint64_t n = kv->arr_n < 4096 ? kv->arr_n : 4096;
            for (uint64_t k = 0; k < n; k++) (void)gguf_arr_int(kv, k);
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        FUZZ_CHECK(t->name && t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
        FUZZ_CHECK(gguf_find_tensor(g, t->name));
        if (t->data) FUZZ_CHECK(t->data >= lo && t->nbytes <= (uint64_t)(hi - t->data));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file("in.gguf", data, size);
    verr err = {{0}};
    gguf_file *g = gguf_open(path, &err);
    if (!g) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    check_file(g);
    gguf_close(g);
    char out[512];
    snprintf(out, sizeof out, "%s/out", fuzz_dir());
    convert_summary sum;
    verr cerr = {{0}};
    (void)convert_gguf(path, out, 1, NULL, &sum, &cerr);
    static const char *outs[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                 "model.safetensors"};
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", out, outs[i]);
        unlink(p);
    }
    rmdir(out);
    return 0;
}
