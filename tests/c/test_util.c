// test_util: host/util helpers that every error path relies on. verr_set may quote the
// message it replaces (callers prefix a file and line to the error they got back:
// verr_set(err, "%s:%d: %s", path, line, err->msg)); formatting straight into the buffer
// it read printed the prefix twice (issue 23: "bad2.txt:2: bad2.txt:2: ...").
#include <stdint.h>
#include <string.h>

#include "host/util/err.h"
#include "host/util/hugemem.h"
#include "tests/c/check.h"

// huge_alloc: 2 MiB-aligned and whole from 2 MiB up (THP maps aligned ranges only),
// 64-byte aligned below; every byte writable; huge_free takes both back.
static void huge_checks(void) {
    size_t sizes[] = { 1, 100, ((size_t)2 << 20) - 1, (size_t)2 << 20, ((size_t)5 << 20) + 12345 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = huge_alloc(n);
        size_t align = n >= ((size_t)2 << 20) ? (size_t)2 << 20 : 64;
        CHECK(p && (uintptr_t)p % align == 0, "huge_alloc_aligned", "n=%zu: %p not %zu-aligned", n, (void *)p, align);
        if (!p) continue;
        memset(p, 0xa5, n);
        CHECK(p[0] == 0xa5 && p[n - 1] == 0xa5, "huge_alloc_writable", "n=%zu", n);
        long long huge = huge_resident(p, n);  // smaps readable on Linux; THP itself may be off
        CHECK(huge >= 0, "huge_resident_reads_smaps", "n=%zu: %lld", n, huge);
        huge_free(p, n);
    }
    huge_free(NULL, 123);
}

int main(void) {
    verr e;
    verr_set(&e, "invalid UTF-8 at byte %d", 4);
    verr_set(&e, "%s:%d: %s", "bad2.txt", 2, e.msg);
    CHECK(!strcmp(e.msg, "bad2.txt:2: invalid UTF-8 at byte 4"), "verr_set_prefixes_its_own_message_once", "'%s'",
          e.msg);
    verr_set(&e, "%s", e.msg);  // quoting itself whole: unchanged
    CHECK(!strcmp(e.msg, "bad2.txt:2: invalid UTF-8 at byte 4"), "verr_set_quotes_itself_unchanged", "'%s'", e.msg);
    char longer[2000];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    verr_set(&e, "%s", longer);  // truncated to the buffer, terminated
    CHECK(strlen(e.msg) == sizeof e.msg - 1, "verr_set_truncates", "%zu", strlen(e.msg));
    CHECK(verr_set(NULL, "ignored") == -1, "verr_set_null_returns_minus_1", "not -1");
    huge_checks();
    CHECK_DONE();
}
