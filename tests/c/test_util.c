// test_util: host/util helpers that every error path relies on. verr_set may quote the
// message it replaces (callers prefix a file and line to the error they got back:
// verr_set(err, "%s:%d: %s", path, line, err->msg)); formatting straight into the buffer
// it read printed the prefix twice (issue 23: "bad2.txt:2: bad2.txt:2: ...").
// Issue 32: the checked JSON readers (json_in), the one JSON string escaper
// (json_escape), strict decimal indexes (parse_index) and the count of open progress
// bars that the CLI checks when a command returns, each against values written here.
#include <stdint.h>
#include <string.h>

#include "host/util/err.h"
#include "host/util/hugemem.h"
#include "host/util/json_in.h"
#include "host/util/json_out.h"
#include "host/util/parse.h"
#include "host/util/progress.h"
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

// json_in_int: what a JSON text's number may be cast to (-1: refused).
static long long int_of(const char *json, long long lo, long long hi) {
    cJSON *v = cJSON_Parse(json);
    int64_t x = -12345;
    int rc = json_in_int(v, lo, hi, &x);
    cJSON_Delete(v);
    return rc ? -1 : (long long)x;
}

static void json_in_checks(void) {
    CHECK(int_of("7", 0, 10) == 7 && int_of("0", 0, 10) == 0 && int_of("-0", 0, 10) == 0, "json_in_int_plain", "misread");
    CHECK(int_of("1e300", 0, 10) == -1 && int_of("-1e300", -10, 10) == -1, "json_in_int_refuses_1e300", "accepted");
    CHECK(int_of("1.5", 0, 10) == -1 && int_of("11", 0, 10) == -1 && int_of("-1", 0, 10) == -1, "json_in_int_range",
          "a fraction or a value out of range accepted");
    CHECK(int_of("9007199254740992", 0, 9007199254740992LL) == 9007199254740992LL, "json_in_int_2_53", "misread");
    CHECK(int_of("\"3\"", 0, 10) == -1 && int_of("true", 0, 10) == -1, "json_in_int_not_a_number", "accepted");
    cJSON *big = cJSON_Parse("1e39"), *ok = cJSON_Parse("-3.5");
    float f = 0;
    CHECK(json_in_float(big, &f) == -1 && json_in_float(ok, &f) == 0 && f == -3.5f, "json_in_float_range", "%g", f);
    cJSON_Delete(big), cJSON_Delete(ok);
    char path[64];
    CHECK(json_in_find_nul("{\"a\":[\"x\",{\"b\":\"y\\u0000z\"}]}", path, sizeof path) && !strcmp(path, "a[1].b"),
          "json_in_find_nul_path", "'%s'", path);
    CHECK(!json_in_find_nul("{\"a\":\"\\\\u0000\"}", path, sizeof path), "json_in_find_nul_escaped_backslash",
          "an escaped backslash before u0000 is not a NUL");
    verr e;
    cJSON *j = json_in_parse("{\n  \"a\": 1,\n  \"b\": [1,]\n}", "f.json", 1, &e);
    CHECK(!j && strstr(e.msg, "f.json: invalid JSON at line 3, column"), "json_in_parse_line_column", "'%s'", e.msg);
    j = json_in_parse("[1]", "f.json", 1, &e);
    CHECK(!j && strstr(e.msg, "the top level is an array"), "json_in_parse_not_object", "'%s'", e.msg);
    j = json_in_parse("{} x", "f.json", 1, &e);
    CHECK(!j && strstr(e.msg, "line 1, column 4"), "json_in_parse_trailing_text", "'%s'", e.msg);
}

static void to_buf(void *ud, const char *s, size_t n) { strncat(ud, s, n); }

static void json_escape_checks(void) {
    static const struct {
        const char *in, *out;
    } cases[] = {
        { "a\"b\\c", "a\\\"b\\\\c" },
        { "t\n\t\r\x01", "t\\n\\t\\r\\u0001" },
        { "caf\xc3\xa9", "caf\xc3\xa9" },                  // valid UTF-8 as is
        { "x\xc3", "x\\u00c3" },                          // a cut sequence
        { "\xc0\xaf", "\\u00c0\\u00af" },                  // overlong '/'
        { "\xed\xa0\x80", "\\u00ed\\u00a0\\u0080" },       // a UTF-16 surrogate
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char got[64] = "";
        json_escape(cases[i].in, strlen(cases[i].in), to_buf, got);
        CHECK(!strcmp(got, cases[i].out), "json_escape_case", "case %zu: got '%s', want '%s'", i, got, cases[i].out);
    }
}

static void parse_index_checks(void) {
    long v = -1;
    const char *end = parse_index("12.x", 100, &v);
    CHECK(end && *end == '.' && v == 12, "parse_index_digits", "%ld", v);
    CHECK(!parse_index(" 2", 100, &v) && !parse_index("+2", 100, &v) && !parse_index("-2", 100, &v) &&
          !parse_index("", 100, &v), "parse_index_refuses_space_sign_empty", "accepted");
    CHECK(!parse_index("101", 100, &v) && parse_index("100", 100, &v) && v == 100 &&
          !parse_index("99999999999999999999999", 1L << 30, &v), "parse_index_bounded", "%ld", v);
    // a one-digit value over a one-digit max (the bound check truncated -1 / 10 to 0)
    CHECK(!parse_index("5", 4, &v) && !parse_index("9", 0, &v) && parse_index("4", 4, &v) && v == 4 &&
          parse_index("0", 0, &v) && v == 0, "parse_index_bounded_small_max", "%ld", v);
}

// The checker main() runs after every command: a task left open counts (quiet ones too),
// a second end does not count twice.
static void progress_checks(void) {
    int base = progress_open_count();
    progress a, b;
    progress_start(&a, "a", 10, 1);
    progress_start(&b, "b", 10, 0);
    CHECK(progress_open_count() == base + 2, "progress_open_counts_quiet_and_drawn", "%d", progress_open_count());
    progress_finish(&a, NULL);
    progress_stop(&b);
    progress_finish(&b, NULL);  // after stop: nothing more
    progress_stop(&a);
    CHECK(progress_open_count() == base, "progress_end_is_idempotent", "%d", progress_open_count());
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
    json_in_checks();
    json_escape_checks();
    parse_index_checks();
    progress_checks();
    CHECK_DONE();
}
