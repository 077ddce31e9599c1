// test_safetensors: the reader on a valid file whose header length is not a multiple of
// 4 (JSON allows trailing spaces), which puts every tensor at an address misaligned for
// its dtype (issue 22, row 7). Each tensor must come back aligned (copied once at open)
// with the bytes of the file; an aligned file copies nothing.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/formats/safetensors.h"
#include "tests/c/check.h"

// Writes a file with an F32 [3], a BF16 [3] and an I32 [2] tensor; the header padded
// with spaces to a length of pad4 modulo 4.
static int write_file(const char *path, int pad4) {
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[12,18]},"
                                      "\"c\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[20,28]}}");
    while (n % 4 != pad4) hdr[n++] = ' ';
    uint8_t data[28];
    for (int i = 0; i < 28; i++) data[i] = (uint8_t)(i * 37 + 11);
    uint64_t len = (uint64_t)n;
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(&len, 8, 1, f) == 1 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n && fwrite(data, 1, 28, f) == 28;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void test_alignment(const char *dir) {
    char path[4096];
    for (int pad4 = 0; pad4 < 4; pad4++) {
        snprintf(path, sizeof path, "%s/align%d.safetensors", dir, pad4);
        char name[64];
        snprintf(name, sizeof name, "st_header_len_mod4_%d_aligned", pad4);
        st_file f;
        verr err = { { 0 } };
        if (write_file(path, pad4) || st_open(&f, path, &err)) {
            CHECK(0, name, "cannot write or open %s: %s", path, err.msg);
            continue;
        }
        int bad = 0, same = 1;
        const uint8_t *data = (const uint8_t *)f.map + f.size - 28;
        static const size_t begin[3] = { 0, 12, 20 };
        for (int i = 0; i < f.n; i++) {
            const st_tensor *t = &f.tensors[i];
            bad += (uintptr_t)t->data % st_dtype_size(t->dtype) != 0;
            same &= !memcmp(t->data, data + begin[t->name[0] - 'a'], t->nbytes);
        }
        CHECK(f.n == 3 && !bad && same, name, "%d tensors, %d misaligned, bytes %s", f.n, bad, same ? "equal" : "differ");
        if (pad4 == 0)
            CHECK(!f.aligned, "st_aligned_file_copies_nothing", "%zu bytes copied", f.aligned_bytes);
        st_close(&f);
        unlink(path);
    }
}

int main(void) {
    const char *dir = getenv("TESTTMP") ? getenv("TESTTMP") : "tests/tmp";
    test_alignment(dir);
    CHECK_DONE();
}
