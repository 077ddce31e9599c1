// tp_mpi.c: see tp_mpi.h.
#define _GNU_SOURCE
#include "host/runtime/tp_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tp_mpi_launched(void) {
    // Open MPI, MPICH/Hydra and PMIx-based launchers (Slurm's srun included).
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int tp_agree(tp_comm *c, int ok, const char *msg, verr *err) {
    enum { LEN = 512 };
    char mine[LEN] = { 0 };
    mine[0] = ok ? 1 : 0;
    if (!ok) snprintf(mine + 1, LEN - 1, "%s", msg ? msg : "failed");
    char *all = malloc((size_t)LEN * c->size);
    if (!all) return verr_set(err, "out of memory agreeing across %d ranks", c->size);
    verr why;
    if (c->gather(c, mine, LEN, all, &why)) {
        free(all);
        return verr_set(err, "%.1000s", why.msg);
    }
    int rc = 0;
    for (int r = 0; r < c->size && !rc; r++)
        if (!all[(size_t)r * LEN]) rc = verr_set(err, "rank %d of %d: %.900s", r, c->size, all + (size_t)r * LEN + 1);
    free(all);
    c->failed_together = rc != 0;
    return rc;
}

#ifdef VARENT_MPI
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    tp_comm pub;
    MPI_Comm comm;
    tp_mpi *w;
    float *buf;   // the all-reduce's padded copy
    size_t cap;   // floats in buf
} mpi_comm;

struct tp_mpi {
    int rank, size, err_fd;
    _Atomic long long deadline_ms;  // when the collective in progress gives up; 0: none
    _Atomic long long timeout_ms;
    const char *_Atomic what;       // that collective's name
    _Atomic int stop;
    pthread_t dog;
    int dog_running;
    mpi_comm *world, *group, *across;
};

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

// The watchdog: a rank stuck in a collective past the deadline reports and exits (no
// MPI call from here); mpirun then stops the other ranks.
static void *watchdog(void *arg) {
    tp_mpi *w = arg;
    while (!atomic_load(&w->stop)) {
        long long d = atomic_load(&w->deadline_ms);
        if (d && now_ms() > d) {
            char msg[512];
            int n = snprintf(msg, sizeof msg, "varent: rank %d of %d: %s waited more than %.0f s for the other ranks "
                             "(one died or hangs; --tp-timeout sets the limit); stopping\n", w->rank, w->size,
                             atomic_load(&w->what), atomic_load(&w->timeout_ms) / 1000.0);
            if (write(w->err_fd, msg, (size_t)n) < 0) n = 0;
            _exit(1);
        }
        usleep(200 * 1000);
    }
    return NULL;
}

static void enter(tp_mpi *w, const char *what) {
    long long t = atomic_load(&w->timeout_ms);
    atomic_store(&w->what, what);
    atomic_store(&w->deadline_ms, t > 0 ? now_ms() + t : 0);
}

static void leave(tp_mpi *w) { atomic_store(&w->deadline_ms, 0); }

static int mpi_fail(int rc, const char *call, verr *err) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
    return verr_set(err, "%s failed: %s", call, s);
}

static double secs(void) { return now_ms() / 1000.0; }

// Reduce-scatter then all-gather: each element is summed once, on one rank, so every
// rank ends with the same bits (MPI_Allreduce does not promise that).
static int mpi_sum(tp_comm *pc, float *x, size_t n, verr *err) {
    mpi_comm *c = (mpi_comm *)pc;
    size_t per = (n + (size_t)pc->size - 1) / (size_t)pc->size, all = per * (size_t)pc->size;
    if (per > (size_t)1 << 30) return verr_set(err, "all-reduce of %zu floats is too large", n);
    if (all > c->cap) {
        float *b = realloc(c->buf, sizeof(float) * all);
        if (!b) return verr_set(err, "out of memory for an all-reduce of %zu floats", n);
        c->buf = b, c->cap = all;
    }
    memcpy(c->buf, x, sizeof(float) * n);
    memset(c->buf + n, 0, sizeof(float) * (all - n));
    double t0 = secs();
    enter(c->w, "an all-reduce (MPI_Reduce_scatter_block)");
    int rc = MPI_Reduce_scatter_block(c->buf, x, (int)per, MPI_FLOAT, MPI_SUM, c->comm);
    if (rc == MPI_SUCCESS) {
        enter(c->w, "an all-reduce (MPI_Allgather)");
        rc = MPI_Allgather(x, (int)per, MPI_FLOAT, c->buf, (int)per, MPI_FLOAT, c->comm);
    }
    leave(c->w);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "the all-reduce", err);
    memcpy(x, c->buf, sizeof(float) * n);
    pc->sum_s += secs() - t0, pc->n_sum++, pc->sum_bytes += (double)n * sizeof(float);
    return 0;
}

static int mpi_gather(tp_comm *pc, const void *x, size_t bytes, void *out, verr *err) {
    mpi_comm *c = (mpi_comm *)pc;
    if (bytes > (size_t)1 << 30) return verr_set(err, "gather of %zu bytes is too large", bytes);
    double t0 = secs();
    enter(c->w, "a gather (MPI_Allgather)");
    int rc = MPI_Allgather(x, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, c->comm);
    leave(c->w);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allgather", err);
    pc->gather_s += secs() - t0, pc->n_gather++;
    return 0;
}

static int make_comm(tp_mpi *w, int color, int key, mpi_comm **out, verr *err);

// Non-blocking, polled every millisecond: a blocking MPI collective spins a core.
static int mpi_gather_idle(tp_comm *pc, const void *x, size_t bytes, void *out, verr *err) {
    mpi_comm *c = (mpi_comm *)pc;
    if (bytes > (size_t)1 << 30) return verr_set(err, "gather of %zu bytes is too large", bytes);
    MPI_Request req;
    int rc = MPI_Iallgather(x, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, c->comm, &req), done = 0;
    while (rc == MPI_SUCCESS && !done) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !done) usleep(1000);
    }
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Iallgather", err);
}

static void stop_dog(tp_mpi *w) {
    atomic_store(&w->stop, 1);
    if (w->dog_running) pthread_join(w->dog, NULL);
    w->dog_running = 0;
}

int tp_mpi_init(int *argc, char ***argv, int err_fd, double timeout_s, tp_mpi **out, verr *err) {
    *out = NULL;
    tp_mpi *w = calloc(1, sizeof *w);
    if (!w) return verr_set(err, "out of memory");
    w->err_fd = err_fd;
    const char *r = getenv("OMPI_COMM_WORLD_RANK"), *n = getenv("OMPI_COMM_WORLD_SIZE");
    w->rank = r ? atoi(r) : 0, w->size = n ? atoi(n) : 0;  // for the watchdog's message until MPI says
    atomic_store(&w->timeout_ms, (long long)(timeout_s * 1000));
    // The watchdog runs before MPI_Init_thread: a rank stopped or stuck before it joins
    // would otherwise keep the others inside MPI's start-up for ever.
    if (pthread_create(&w->dog, NULL, watchdog, w) == 0) w->dog_running = 1;
    enter(w, "MPI start-up (MPI_Init_thread)");
    // Serialized: the forward runs on worker threads (a server's slot, a device's
    // thread), one at a time.
    int provided, rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    leave(w);
    if (rc != MPI_SUCCESS || provided < MPI_THREAD_SERIALIZED) {
        stop_dog(w);
        free(w);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", err);
        return verr_set(err, "this MPI library does not support MPI_THREAD_SERIALIZED (it gave level %d)", provided);
    }
    if ((rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(MPI_COMM_WORLD, &w->rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(MPI_COMM_WORLD, &w->size)) != MPI_SUCCESS) {
        stop_dog(w);
        free(w);
        return mpi_fail(rc, "MPI_Comm_rank/size", err);
    }
    if (make_comm(w, 0, w->rank, &w->world, err)) {
        tp_mpi_finalize(w);
        return -1;
    }
    *out = w;
    return 0;
}

tp_comm *tp_mpi_world(tp_mpi *w) { return &w->world->pub; }

int tp_mpi_rank(const tp_mpi *w) { return w->rank; }
int tp_mpi_size(const tp_mpi *w) { return w->size; }

void tp_mpi_set_timeout(tp_mpi *w, double seconds) { atomic_store(&w->timeout_ms, (long long)(seconds * 1000)); }

static int make_comm(tp_mpi *w, int color, int key, mpi_comm **out, verr *err) {
    mpi_comm *c = calloc(1, sizeof *c);
    if (!c) return verr_set(err, "out of memory");
    enter(w, "MPI_Comm_split");
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &c->comm);
    leave(w);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(c->comm, &c->pub.rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c->comm, &c->pub.size);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpi_fail(rc, "MPI_Comm_split", err);
    }
    c->pub.sum = mpi_sum, c->pub.gather = mpi_gather, c->pub.gather_idle = mpi_gather_idle, c->pub.impl = c;
    c->w = w;
    *out = c;
    return 0;
}

static void free_comm(mpi_comm *c) {
    if (!c) return;
    MPI_Comm_free(&c->comm);
    free(c->buf);
    free(c);
}

int tp_mpi_split(tp_mpi *w, int tp, tp_comm **group, tp_comm **across, verr *err) {
    if (tp < 1 || w->size % tp)
        return verr_set(err, "--tp %d does not divide the %d MPI processes of this launch (mpirun -np N with N a "
                        "multiple of --tp)", tp, w->size);
    if (!w->group) {
        if (make_comm(w, w->rank / tp, w->rank, &w->group, err)) return -1;
        if (make_comm(w, w->rank % tp, w->rank, &w->across, err)) return -1;
    } else if (w->group->pub.size != tp) {
        return verr_set(err, "the MPI world is already split into groups of %d, not %d", w->group->pub.size, tp);
    }
    *group = &w->group->pub;
    *across = &w->across->pub;
    return 0;
}

void tp_mpi_abort(tp_mpi *w, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void tp_mpi_finalize(tp_mpi *w) {
    if (!w) return;
    // MPI_Finalize waits for every rank: under the watchdog, so a rank that is stopped or
    // stuck cannot keep the others from exiting.
    enter(w, "MPI shutdown (MPI_Finalize)");
    free_comm(w->world);
    free_comm(w->group);
    free_comm(w->across);
    MPI_Finalize();
    leave(w);
    stop_dog(w);
    free(w);
}

#else  // built without MPI

static int no_mpi(verr *err) {
    return verr_set(err, "this varent was built without MPI: install libopenmpi-dev and openmpi-bin "
                    "(tools/install-deps.sh does) and rebuild (make clean && make)");
}

int tp_mpi_init(int *argc, char ***argv, int err_fd, double timeout_s, tp_mpi **w, verr *err) {
    (void)timeout_s;
    *w = NULL;
    return no_mpi(err);
}
tp_comm *tp_mpi_world(tp_mpi *w) { return NULL; }
int tp_mpi_rank(const tp_mpi *w) { return 0; }
int tp_mpi_size(const tp_mpi *w) { return 1; }
void tp_mpi_set_timeout(tp_mpi *w, double seconds) {}
int tp_mpi_split(tp_mpi *w, int tp, tp_comm **group, tp_comm **across, verr *err) { return no_mpi(err); }
void tp_mpi_abort(tp_mpi *w, int code) { exit(code); }
void tp_mpi_finalize(tp_mpi *w) {}

#endif
