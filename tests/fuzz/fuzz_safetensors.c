// fuzz_safetensors: the safetensors header parser (host/formats/safetensors.h). An input
// starting with '{' is a model.safetensors.index.json next to a valid shard; any
// other input is a model.safetensors. Every tensor handed out must lie inside the
// data region of its file.
#include "tests/fuzz/fuzz_util.h"

#include "host/formats/safetensors.h"

// A valid one-tensor shard the index inputs can name ("shard.safetensors").
static void write_shard(void) {
    static int done;
    if (done) return;
    static const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint8_t buf[8 + sizeof hdr - 1 + 8] = {0};
    uint64_t n = sizeof hdr - 1;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, hdr, n);
    fuzz_file("shard.safetensors", buf, sizeof buf);
    done = 1;
}

static void check_file(const st_file *f) {
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    const uint8_t *lo = (const uint8_t *)f->map + 8 + hlen, *hi = (const uint8_t *)f->map + f->size;
    for (int i = 0; i < f->n; i++) {
        const st_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data, *a = f->aligned;
        if (a && d >= a && d < a + f->aligned_bytes)  // a misaligned tensor's copy
            FUZZ_CHECK(t->nbytes <= (size_t)(a + f->aligned_bytes - d));
        else
            FUZZ_CHECK(d >= lo && t->nbytes <= (size_t)(hi - d));
        FUZZ_CHECK(!t->nbytes || (uintptr_t)d % st_dtype_size(t->dtype) == 0);  // aligned for its dtype
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8 && t->dtype < ST_NDTYPES);
        FUZZ_CHECK(st_find(f, t->name) == t);
        if (t->nbytes) {
            volatile uint8_t x = ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)x;
        }
    }
    (void)st_meta(f, "format");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_shard();
    int index = size > 0 && data[0] == '{';
    fuzz_remove(index ? "model.safetensors" : "model.safetensors.index.json");
    fuzz_file(index ? "model.safetensors.index.json" : "model.safetensors", data, size);
    st_set s;
    verr err = {{0}};
    if (st_set_open(&s, fuzz_dir(), &err) != 0) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    for (int i = 0; i < s.n; i++) check_file(&s.files[i]);
    int64_t shape[2] = {2, 0};
    if (!st_set_get(&s, "w", 1u << ST_F32, 1, shape, &err)) FUZZ_CHECK(err.msg[0]);
    st_set_close(&s);
    return 0;
}
