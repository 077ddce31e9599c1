// conns.c: the header deadline and the connection budget (docs/server.md). A slow
// client ("slow loris") that sends a header line every few seconds never trips an idle
// timeout, and many of them from several addresses pass the per-address cap: together
// they held every connection and /health was refused. So:
//   - a connection waiting for a request's headers (a new one, or a kept-alive one
//     between requests) has --header-timeout seconds in all to send them, then it is
//     closed (the watchdog thread below checks twice a second);
//   - such waiting connections may hold all but a reserve of --max-connections: when a
//     new connection would exceed that, the one that has waited longest is closed, so
//     a client that sends its request at once (a health check) always finds a slot;
//   - a connection closed that way has had its socket shut down, but its thread may not
//     have run yet to end it (a loaded machine, a burst of reconnecting slow clients),
//     and until then libmicrohttpd still counts it. So libmicrohttpd's own limit is
//     twice --max-connections (server_hard_limit), and --max-connections is kept here,
//     on the live connections (open and not shut down): one beyond it is shut at once.
// libmicrohttpd calls notify_connection when a connection starts and when it is
// cleaned up, before it closes the socket: under conns_mu a listed socket is open, so
// shutting it down (which ends its connection thread's wait) can hit no other socket.
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "host/serve/internal.h"

struct conn_rec {
    conn_rec *prev, *next;  // the waiting list, oldest first (when waiting)
    int fd;
    int waiting;            // for a request's headers, since `since`
    int cut;                // shut down by us: no longer live
    double since;
};

unsigned server_hard_limit(int max_connections) {
    return 2u * (unsigned)max_connections;
}

// Waiting connections may hold all but this many of --max-connections.
static int reserve_of(int max_connections) {
    int r = max_connections / 8;  // 256: 32
    return max_connections < 2 ? 0 : r < 1 ? 1 : r > 64 ? 64 : r;
}

static void unlist(server *s, conn_rec *c) {
    if (!c->waiting) return;
    if (c->prev) c->prev->next = c->next;
    else s->wait_head = c->next;
    if (c->next) c->next->prev = c->prev;
    else s->wait_tail = c->prev;
    c->prev = c->next = NULL;
    c->waiting = 0;
    s->n_waiting--;
}

static void enlist(server *s, conn_rec *c) {
    c->waiting = 1, c->since = server_now();
    c->prev = s->wait_tail, c->next = NULL;
    if (s->wait_tail) s->wait_tail->next = c;
    else s->wait_head = c;
    s->wait_tail = c;
    s->n_waiting++;
}

// Ends a waiting connection: its thread sees the end of input and closes it.
static void cut(server *s, conn_rec *c, long *counter) {
    unlist(s, c);
    shutdown(c->fd, SHUT_RDWR);
    c->cut = 1;
    s->n_live--;
    (*counter)++;
}

// A new connection: the oldest waiting one makes room for it past the reserve, and it
// is itself shut when the live connections already fill --max-connections.
static void admit(server *s, conn_rec *c) {
    int max = s->o.max_connections;
    enlist(s, c);
    s->n_live++;
    if (s->n_waiting > max - reserve_of(max) && s->wait_head != c) cut(s, s->wait_head, &s->n_evicted);
    if (s->n_live > max) cut(s, c, &s->n_evicted);
}

void server_conn_notify(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    pthread_mutex_lock(&s->conns_mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_rec *c = ci ? calloc(1, sizeof *c) : NULL;
        *ctx = c;
        if (c) {
            c->fd = ci->connect_fd;
            admit(s, c);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *ctx) {
        conn_rec *c = *ctx;
        unlist(s, c);
        if (!c->cut) s->n_live--;
        free(c);
        *ctx = NULL;
    }
    pthread_mutex_unlock(&s->conns_mu);
}

// The connection's record (NULL when its start could not allocate one).
static conn_rec *rec_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void server_conn_headers_in(server *s, struct MHD_Connection *mc) {
    conn_rec *c = rec_of(mc);
    if (!c) return;
    pthread_mutex_lock(&s->conns_mu);
    unlist(s, c);
    pthread_mutex_unlock(&s->conns_mu);
}

void server_conn_request_done(server *s, struct MHD_Connection *mc) {
    conn_rec *c = rec_of(mc);
    if (!c) return;
    pthread_mutex_lock(&s->conns_mu);
    if (!c->waiting) enlist(s, c);  // kept alive: the next request's headers have the deadline anew
    pthread_mutex_unlock(&s->conns_mu);
}

static void *watchdog(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->conns_mu);
    while (!s->conns_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->conns_cv, &s->conns_mu, &ts);
        double now = server_now();
        while (s->wait_head && now - s->wait_head->since >= s->o.header_timeout_s)  // oldest first
            cut(s, s->wait_head, &s->n_header_timeouts);
    }
    pthread_mutex_unlock(&s->conns_mu);
    return NULL;
}

int server_conns_init(server *s) {
    pthread_mutex_init(&s->conns_mu, NULL);
    pthread_cond_init(&s->conns_cv, NULL);
    s->conns_init = 1;
    s->conns_live = pthread_create(&s->conns_th, NULL, watchdog, s) == 0;
    return s->conns_live ? 0 : -1;
}

void server_conns_stop(server *s) {
    if (!s->conns_live) return;
    pthread_mutex_lock(&s->conns_mu);
    s->conns_stop = 1;
    pthread_cond_signal(&s->conns_cv);
    pthread_mutex_unlock(&s->conns_mu);
    pthread_join(s->conns_th, NULL);
    s->conns_live = 0;
}

void server_conns_free(server *s) {
    if (!s->conns_init) return;
    pthread_mutex_destroy(&s->conns_mu);
    pthread_cond_destroy(&s->conns_cv);
    s->conns_init = 0;
}
