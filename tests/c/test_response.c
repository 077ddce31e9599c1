// test_response: the server's response buffer (host/serve/response.c) on empty pieces.
// A first generated token that is EOS appends an empty text, sb_put(b, NULL, 0): that
// must append nothing and leave a terminated buffer, never pass NULL to memcpy (undefined
// behaviour, which aborted the sanitizer build's server; issue 22, row 6). Run under
// make test-asan, where UBSan's nonnull check catches the old code.
#include <string.h>

#include "host/serve/response.h"
#include "tests/c/check.h"

int main(void) {
    sbuf b = { 0 };
    sb_put(&b, NULL, 0);
    CHECK(b.p && b.len == 0 && b.p[0] == 0 && !b.oom, "sb_put_empty_null_on_fresh_buffer", "p %p len %zu",
          (void *)b.p, b.len);
    sb_puts(&b, "ab");
    sb_put(&b, NULL, 0);
    sb_puts(&b, "");
    CHECK(b.len == 2 && !strcmp(b.p, "ab"), "sb_put_empty_null_appends_nothing", "'%s' (%zu)", b.p, b.len);
    sb_reset(&b);
    sb_json_str(&b, NULL, 0);
    CHECK(!strcmp(b.p, "\"\""), "sb_json_str_empty_null", "'%s'", b.p);
    sb_free(&b);
    sbuf e = { 0 };
    sb_json_str(&e, "", 0);
    CHECK(e.p && !strcmp(e.p, "\"\""), "sb_json_str_empty", "'%s'", e.p ? e.p : "(null)");
    sb_free(&e);
    CHECK_DONE();
}
