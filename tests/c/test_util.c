// test_util: host/util helpers that every error path relies on. verr_set may quote the
// message it replaces (callers prefix a file and line to the error they got back:
// verr_set(err, "%s:%d: %s", path, line, err->msg)); formatting straight into the buffer
// it read printed the prefix twice (issue 23: "bad2.txt:2: bad2.txt:2: ...").
#include <string.h>

#include "host/util/err.h"
#include "tests/c/check.h"

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
    CHECK_DONE();
}
