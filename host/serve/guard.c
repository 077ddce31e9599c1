// guard.c: checks on a request's headers, before its body is read (http.c calls
// server_check_headers once the headers are in): framing that libmicrohttpd would
// otherwise wait on or accept (unsupported transfer codings, a duplicate
// Content-Length, HTTP/1.1 without Host).
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "host/serve/internal.h"

typedef struct {
    int content_length, host;
} header_counts;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    header_counts *n = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) n->content_length++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) n->host++;
    return MHD_YES;
}

// The first coding in a Transfer-Encoding list that is not chunked or identity, copied
// to bad; 0 when there is none.
static int unsupported_coding(const char *te, char *bad, size_t len) {
    for (const char *p = te; *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ",");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        int ok = (n == 7 && !strncasecmp(p, "chunked", 7)) || (n == 8 && !strncasecmp(p, "identity", 8));
        if (n && !ok) return snprintf(bad, len, "%.*s", (int)(n < 64 ? n : 64), p), 1;
        p += n;
        p += strcspn(p, ",");
    }
    return 0;
}

int server_check_headers(server *s, struct MHD_Connection *c, const char *version, char *msg, size_t len,
                         const char **code) {
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    char bad[80];
    if (te && unsupported_coding(te, bad, sizeof bad)) {
        snprintf(msg, len, "Transfer-Encoding '%s' is not supported (only chunked)", bad);
        return *code = "unsupported_transfer_encoding", 501;
    }
    header_counts n = { 0, 0 };
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &n);
    if (n.content_length > 1)
        return snprintf(msg, len, "the request has %d Content-Length headers", n.content_length),
               *code = "duplicate_content_length", 400;
    if (n.host > 1) return snprintf(msg, len, "the request has %d Host headers", n.host), *code = "bad_host", 400;
    if (!n.host && version && !strcmp(version, MHD_HTTP_VERSION_1_1))
        return snprintf(msg, len, "an HTTP/1.1 request needs a Host header"), *code = "missing_host", 400;
    return 0;
}
