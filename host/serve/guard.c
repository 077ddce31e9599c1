// guard.c: checks on a request's headers, before its body is read (http.c calls
// server_check_headers once the headers are in): framing that libmicrohttpd would
// otherwise wait on or accept (unsupported transfer codings, a duplicate
// Content-Length, HTTP/1.1 without Host), and what keeps web pages out of a server on
// localhost: the Host a loopback server answers to (DNS rebinding), the browser Origins
// it serves (--cors), and JSON-only POST bodies (no cross-site "simple" POST).
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

// Whether item (n bytes) is one of the comma-separated entries of list (case-insensitive).
static int in_list(const char *list, const char *item, size_t n) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, " ,");
        size_t m = strcspn(p, ",");
        while (m && p[m - 1] == ' ') m--;
        if (m && m == n && !strncasecmp(p, item, n)) return 1;
        p += m;
        p += strcspn(p, ",");
    }
    return 0;
}

// A Host header's name without the port ("[::1]:8080" -> "[::1]"); 0 when the port
// is not digits.
static int host_name(const char *host, size_t *n) {
    const char *end = host[0] == '[' ? strchr(host, ']') : NULL;
    *n = end ? (size_t)(end + 1 - host) : strcspn(host, ":");
    const char *port = host + *n;
    if (!*port) return 1;
    return port[0] == ':' && port[1] && strspn(port + 1, "0123456789") == strlen(port + 1);
}

static int host_allowed(const server *s, const char *host) {
    size_t n;
    if (!s->loopback) return 1;
    if (!host_name(host, &n)) return 0;
    return in_list("localhost,127.0.0.1,[::1]", host, n) || in_list(s->o.allowed_hosts, host, n);
}

int server_cors_origin(const server *s, const char *origin) {
    return origin && s->o.cors && (in_list(s->o.cors, origin, strlen(origin)) || in_list(s->o.cors, "*", 1));
}

// No Origin (curl, scripts, same-origin GETs), the page's own origin, or one --cors names.
static int origin_allowed(const server *s, const char *origin, const char *host) {
    if (!origin || server_cors_origin(s, origin)) return 1;
    return host && !strncasecmp(origin, "http://", 7) && !strcasecmp(origin + 7, host);
}

// application/json, with or without parameters ("; charset=utf-8").
static int is_json_type(const char *type) {
    size_t n = strcspn(type, " ;");
    return n == 16 && !strncasecmp(type, "application/json", 16);
}

static int check_origin(server *s, struct MHD_Connection *c, const char *method, char *msg, size_t len,
                        const char **code) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (host && !host_allowed(s, host))
        return snprintf(msg, len, "Host '%.200s' is not allowed on a loopback server (localhost, 127.0.0.1, [::1]; "
                                  "add names with --allowed-hosts)", host),
               *code = "host_not_allowed", 403;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin_allowed(s, origin, host))
        return snprintf(msg, len, "Origin '%.200s' is not allowed (the server's own page is; add one with --cors)",
                        origin),
               *code = "origin_not_allowed", 403;
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!strcmp(method, "POST") && type && !is_json_type(type))
        return snprintf(msg, len, "Content-Type '%.200s' is not supported: send application/json", type),
               *code = "unsupported_media_type", 415;
    return 0;
}

int server_check_headers(server *s, struct MHD_Connection *c, const char *method, const char *version, char *msg,
                         size_t len, const char **code) {
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
    return check_origin(s, c, method, msg, len, code);
}
