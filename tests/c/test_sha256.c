// test_sha256: host/util/sha256.c against the FIPS 180-2 example digests, fed whole
// and in every split (the partial-block path), and sha256_file on a file.
#include <stdio.h>
#include <string.h>

#include "host/util/sha256.h"
#include "tests/c/check.h"

static void hex_of(const char *msg, size_t n, size_t split, char out[65]) {
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, msg, split);
    sha256_update(&c, msg + split, n - split);
    sha256_hex(&c, out);
}

int main(void) {
    static const struct { const char *msg, *want; } v[] = {
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    };
    char got[65];
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        size_t n = strlen(v[i].msg);
        int ok = 1;
        for (size_t s = 0; s <= n; s++) {
            hex_of(v[i].msg, n, s, got);
            ok &= strcmp(got, v[i].want) == 0;
        }
        char name[64];
        snprintf(name, sizeof name, "sha256_fips_vector_%zu", i);
        CHECK(ok, name, "got %s want %s", got, v[i].want);
    }
    // One million 'a' in uneven pieces, and the same bytes through a file.
    static char a[1000000];
    memset(a, 'a', sizeof a);
    sha256_ctx c;
    sha256_init(&c);
    for (size_t off = 0, k = 1; off < sizeof a; off += k, k = k * 3 % 997 + 1)
        sha256_update(&c, a + off, off + k > sizeof a ? sizeof a - off : k);
    sha256_hex(&c, got);
    const char *mil = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    CHECK(strcmp(got, mil) == 0, "sha256_million_a", "got %s", got);
    char path[] = "/tmp/varent-sha256-XXXXXX";
    FILE *f = fdopen(mkstemp(path), "wb");
    int wrote = f && fwrite(a, 1, sizeof a, f) == sizeof a;
    if (f) fclose(f);
    verr err = { { 0 } };
    int rc = wrote ? sha256_file(path, got, NULL, NULL, &err) : -1;
    CHECK(rc == 0 && strcmp(got, mil) == 0, "sha256_file", "rc %d %s %s", rc, got, err.msg);
    remove(path);
    rc = sha256_file("/nonexistent/varent.gguf", got, NULL, NULL, &err);
    CHECK(rc == -1 && strstr(err.msg, "/nonexistent/varent.gguf"), "sha256_file_names_missing_file", "%s", err.msg);
    CHECK_DONE();
}
