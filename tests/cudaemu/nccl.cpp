// nccl.cpp (emulated device): the NCCL stand-in (include/nccl.h). The ranks of a
// communicator meet in one POSIX shared-memory segment named by the unique id, mapped
// by every rank (threads of one process or separate processes alike). A collective is
// a stream op; when its stream runs it, it goes through rounds of at most SLOT bytes
// per rank:
//   1. the rank writes its descriptor (kind, type, op, count, root) and its share of the
//      input into its staging slot, then publishes arrive = k (the round number);
//   2. it waits until every rank has arrived at round k (a peer that exited, aborted or
//      stays away past the timeout fails the collective), checks that every rank
//      describes the same collective, and computes its output from the slots in rank
//      order (sums left to right from rank 0, so every rank gets the same bits);
//   3. it publishes done = k and waits until every rank is done, so no slot is
//      overwritten while a peer still reads it.
// A failed collective poisons its output with NaN bytes and sets the communicator's
// asynchronous error; later collectives on it fail at once.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "include/nccl.h"
#include "internal.h"

namespace {

constexpr int MAXR = 16;
constexpr size_t SLOT = (size_t)4 << 20;  // staging bytes per rank and round
constexpr uint32_t ID_MAGIC = 0x6e63636c;  // "nccl"

enum kind { K_ALLREDUCE = 1, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST };
const char *kind_name(int k) {
    static const char *n[] = { "?", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast" };
    return k >= 1 && k <= 4 ? n[k] : "?";
}

struct desc {
    int kind, dtype, redop, root;
    uint64_t count;
};

struct rank_area {
    std::atomic<uint64_t> arrive, done;
    std::atomic<int> present;
    int pid;
    desc d;
    char pad[64];
};

struct segment {
    std::atomic<int> nranks;   // set by the first rank to join
    std::atomic<int> joined;
    std::atomic<int> aborted;  // rank + 1 of a rank that called ncclCommAbort
    rank_area r[MAXR];
    char data[MAXR][SLOT];
};

struct id_layout {
    uint32_t magic;
    char name[64];
};

double timeout_s() {
    const char *v = getenv("VARENT_EMU_NCCL_TIMEOUT");
    double t = v && *v ? atof(v) : 60.0;
    return t > 0 ? t : 60.0;
}

// A process that has exited (a zombie until its parent reaps it counts as exited).
bool gone(int pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

size_t type_size(int t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

thread_local int group_depth = 0;
thread_local std::vector<ncclComm_t> group_joins;  // ncclCommInitRank calls waiting for ncclGroupEnd

}  // namespace

struct ncclComm {
    segment *seg = nullptr;
    int rank = 0, nranks = 0, device = 0;
    uint64_t round = 0;
    std::atomic<int> async{ ncclSuccess };
    std::mutex mu;
    std::string last;  // the last error's message
    std::string name;  // the segment's name, unlinked once every rank has joined
};

namespace {

ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (c) {
        std::lock_guard<std::mutex> lk(c->mu);
        c->last = buf;
    }
    if (getenv("VARENT_EMU_NCCL_VERBOSE")) fprintf(stderr, "cudaemu: nccl: %s\n", buf);
    return r;
}

// An error found while a collective runs: it sticks to the communicator.
void fail_async(ncclComm_t c, ncclResult_t r, const char *msg) {
    int ok = ncclSuccess;
    if (c->async.compare_exchange_strong(ok, r)) fail(c, r, "%s", msg);
}

// Waits until every rank's counter (arrive or done) reaches k. False on a timeout, an
// abort or a peer that exited, with the async error set.
bool wait_all(ncclComm_t c, std::atomic<uint64_t> rank_area::*ctr, uint64_t k, const char *what) {
    double t0 = now_s(), limit = timeout_s();
    for (long spin = 0;; spin++) {
        int missing = -1;
        for (int r = 0; r < c->nranks && missing < 0; r++)
            if ((c->seg->r[r].*ctr).load(std::memory_order_acquire) < k) missing = r;
        if (missing < 0) return true;
        char msg[256];
        int ab = c->seg->aborted.load();
        if (ab) {
            snprintf(msg, sizeof msg, "rank %d: %s: rank %d aborted the communicator", c->rank, what, ab - 1);
            fail_async(c, ncclRemoteError, msg);
            return false;
        }
        int pid = c->seg->r[missing].pid;
        if (spin % 1000 == 999 && pid != (int)getpid() && gone(pid)) {
            snprintf(msg, sizeof msg, "rank %d: %s: rank %d (pid %d) has exited", c->rank, what, missing, pid);
            fail_async(c, ncclRemoteError, msg);
            return false;
        }
        if (now_s() - t0 > limit) {
            snprintf(msg, sizeof msg, "rank %d: %s: rank %d did not arrive within %.1f s (VARENT_EMU_NCCL_TIMEOUT)",
                     c->rank, what, missing, limit);
            fail_async(c, ncclSystemError, msg);
            return false;
        }
        if (spin < 200) sched_yield();
        else usleep(spin < 2000 ? 20 : 200);
    }
}

void add(void *acc, const void *x, size_t n, int t) {
    switch (t) {
    case ncclFloat32: for (size_t i = 0; i < n; i++) ((float *)acc)[i] += ((const float *)x)[i]; break;
    case ncclFloat64: for (size_t i = 0; i < n; i++) ((double *)acc)[i] += ((const double *)x)[i]; break;
    case ncclInt32: for (size_t i = 0; i < n; i++) ((int32_t *)acc)[i] += ((const int32_t *)x)[i]; break;
    case ncclUint32: for (size_t i = 0; i < n; i++) ((uint32_t *)acc)[i] += ((const uint32_t *)x)[i]; break;
    case ncclInt64: for (size_t i = 0; i < n; i++) ((int64_t *)acc)[i] += ((const int64_t *)x)[i]; break;
    case ncclUint64: for (size_t i = 0; i < n; i++) ((uint64_t *)acc)[i] += ((const uint64_t *)x)[i]; break;
    default: break;
    }
}

// out[n] = slot 0 + slot 1 + ... at element offset off of each slot, in rank order.
void sum_slots(ncclComm_t c, void *out, size_t off, size_t n, int t) {
    size_t es = type_size(t);
    memmove(out, c->seg->data[0] + off * es, n * es);
    for (int r = 1; r < c->nranks; r++) add(out, c->seg->data[r] + off * es, n, t);
}

struct coll {
    desc d;
    const char *in;
    char *out;
};

// One round: stage `bytes` of `in`, meet, let `compute` read the slots, meet again.
template <class F>
bool round_trip(ncclComm_t c, const desc &d, const char *in, size_t bytes, F compute) {
    uint64_t k = ++c->round;
    rank_area &me = c->seg->r[c->rank];
    me.d = d;
    if (bytes) memcpy(c->seg->data[c->rank], in, bytes);
    me.arrive.store(k, std::memory_order_release);
    if (!wait_all(c, &rank_area::arrive, k, kind_name(d.kind))) return false;
    for (int r = 0; r < c->nranks; r++) {
        const desc &o = c->seg->r[r].d;
        if (o.kind != d.kind || o.count != d.count || o.dtype != d.dtype || o.redop != d.redop || o.root != d.root) {
            char msg[400];
            snprintf(msg, sizeof msg, "collectives do not match: rank %d called %s(count %llu, type %d, op %d, root %d), "
                     "rank %d %s(count %llu, type %d, op %d, root %d) (ranks must make the same collectives in the "
                     "same order)", c->rank, kind_name(d.kind), (unsigned long long)d.count, d.dtype, d.redop, d.root,
                     r, kind_name(o.kind), (unsigned long long)o.count, o.dtype, o.redop, o.root);
            fail_async(c, ncclInvalidUsage, msg);
            me.done.store(k, std::memory_order_release);
            return false;
        }
    }
    compute();
    me.done.store(k, std::memory_order_release);
    return wait_all(c, &rank_area::done, k, kind_name(d.kind));
}

size_t out_bytes(const ncclComm_t c, const desc &d) {
    size_t es = type_size(d.dtype);
    if (d.kind == K_ALLGATHER) return d.count * es * (size_t)c->nranks;
    return d.count * es;
}

// The collective, when its stream reaches it.
void run(ncclComm_t c, coll x) {
    const desc &d = x.d;
    size_t es = type_size(d.dtype), n = (size_t)c->nranks;
    bool ok = c->async.load() == ncclSuccess;
    if (d.kind == K_ALLREDUCE || d.kind == K_BROADCAST) {
        for (size_t i = 0, per = SLOT / es; ok && i < d.count; i += per) {
            size_t m = d.count - i < per ? d.count - i : per;
            bool send = d.kind == K_ALLREDUCE || c->rank == d.root;
            ok = round_trip(c, d, x.in + i * es, send ? m * es : 0, [&] {
                if (d.kind == K_ALLREDUCE) sum_slots(c, x.out + i * es, 0, m, d.dtype);
                else memmove(x.out + i * es, c->seg->data[d.root], m * es);
            });
        }
    } else if (d.kind == K_REDUCESCATTER) {  // count: elements per rank's block
        for (size_t i = 0, per = SLOT / (es * n); ok && i < d.count; i += per) {
            size_t m = d.count - i < per ? d.count - i : per;
            std::vector<char> stage(n * m * es);  // block b's [i, i + m) at b * m
            for (size_t b = 0; b < n; b++) memcpy(stage.data() + b * m * es, x.in + (b * d.count + i) * es, m * es);
            ok = round_trip(c, d, stage.data(), stage.size(),
                            [&] { sum_slots(c, x.out + i * es, (size_t)c->rank * m, m, d.dtype); });
        }
    } else {  // allgather
        for (size_t i = 0, per = SLOT / es; ok && i < d.count; i += per) {
            size_t m = d.count - i < per ? d.count - i : per;
            ok = round_trip(c, d, x.in + i * es, m * es, [&] {
                for (size_t r = 0; r < n; r++) memmove(x.out + (r * d.count + i) * es, c->seg->data[r], m * es);
            });
        }
    }
    if (!ok) memset(x.out, 0xff, out_bytes(c, d));  // NaN: a failed collective's output is garbage
}

// Argument checks at the call (NCCL's ncclInvalidArgument), then the op is queued.
ncclResult_t enqueue(ncclComm_t c, coll x, size_t in_bytes, cudaStream_t stream) {
    if (!c || !c->seg) return fail(nullptr, ncclInvalidArgument, "collective on a NULL or destroyed communicator");
    if (c->async.load() == ncclInProgress)
        return fail(c, ncclInvalidUsage, "%s on a communicator still initializing (poll ncclCommGetAsyncError until "
                    "ncclSuccess first)", kind_name(x.d.kind));
    const desc &d = x.d;
    if (!type_size(d.dtype)) return fail(c, ncclInvalidArgument, "%s: unknown data type %d", kind_name(d.kind), d.dtype);
    if (d.kind != K_ALLGATHER && d.kind != K_BROADCAST && d.redop != ncclSum)
        return fail(c, ncclInvalidArgument, "%s: the stand-in implements ncclSum only", kind_name(d.kind));
    if ((d.kind == K_ALLREDUCE || d.kind == K_REDUCESCATTER) && d.dtype != ncclFloat32 && d.dtype != ncclFloat64 &&
        d.dtype != ncclInt32 && d.dtype != ncclUint32 && d.dtype != ncclInt64 && d.dtype != ncclUint64)
        return fail(c, ncclInvalidArgument, "%s: the stand-in sums 32- and 64-bit types only", kind_name(d.kind));
    if (d.kind == K_BROADCAST && (d.root < 0 || d.root >= c->nranks))
        return fail(c, ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", d.root, c->nranks);
    int sdev = emu::stream_device(stream);
    if (sdev != c->device)
        return fail(c, ncclInvalidArgument, "%s: the stream is on device %d, the communicator (rank %d) on device %d",
                    kind_name(d.kind), sdev, c->rank, c->device);
    struct { const void *p; size_t n; const char *name; } bufs[2] = { { x.in, in_bytes, "sendbuff" },
                                                                     { x.out, out_bytes(c, d), "recvbuff" } };
    for (auto &b : bufs) {
        const char *start;
        size_t bytes;
        int dev;
        if (b.n == 0) continue;
        if (!emu::device_range(b.p, &start, &bytes, &dev))
            return fail(c, ncclInvalidArgument, "%s: %s %p is not device memory", kind_name(d.kind), b.name, b.p);
        if (dev != c->device || (const char *)b.p + b.n > start + bytes)
            return fail(c, ncclInvalidArgument, "%s: %s holds %zu bytes from %p on device %d; the call needs %zu on "
                        "device %d", kind_name(d.kind), b.name, (size_t)(start + bytes - (const char *)b.p), b.p, dev,
                        b.n, c->device);
    }
    emu::api_scope api(emu::API_NCCL);
    emu::stream_enqueue(stream, emu::op{ kind_name(d.kind), 0, [c, x] { run(c, x); } });
    return ncclSuccess;
}

std::string seg_name(const ncclUniqueId &id) {
    id_layout l;
    memcpy(&l, id.internal, sizeof l);
    l.name[sizeof l.name - 1] = 0;
    return l.name;
}

// Maps the segment and takes rank `rank`; the wait for the other ranks is separate
// (join_wait) so ncclCommInitAll and groups can join every rank first.
ncclResult_t join(ncclComm_t *out, int nranks, const ncclUniqueId &id, int rank) {
    *out = nullptr;
    id_layout l;
    memcpy(&l, id.internal, sizeof l);
    if (l.magic != ID_MAGIC) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: not a unique id from ncclGetUniqueId");
    if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks)
        return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: rank %d of %d (the stand-in has at most %d)", rank,
                    nranks, MAXR);
    std::string name = seg_name(id);
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0) return fail(nullptr, ncclSystemError, "shm_open %s: %s", name.c_str(), strerror(errno));
    if (ftruncate(fd, sizeof(segment)) != 0) {
        close(fd);
        return fail(nullptr, ncclSystemError, "ftruncate %s: %s", name.c_str(), strerror(errno));
    }
    void *p = mmap(nullptr, sizeof(segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return fail(nullptr, ncclSystemError, "mmap %s: %s", name.c_str(), strerror(errno));
    ncclComm_t c = new ncclComm();
    c->seg = (segment *)p, c->rank = rank, c->nranks = nranks, c->name = name;
    cudaGetDevice(&c->device);
    int expect = 0;
    if (!c->seg->nranks.compare_exchange_strong(expect, nranks) && expect != nranks) {
        ncclCommDestroy(c);
        return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: rank %d says %d ranks, another rank said %d", rank,
                    nranks, expect);
    }
    int was = 0;
    if (!c->seg->r[rank].present.compare_exchange_strong(was, 1)) {
        ncclCommDestroy(c);
        return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: rank %d joined twice", rank);
    }
    c->seg->r[rank].pid = (int)getpid();
    c->seg->joined.fetch_add(1);
    *out = c;
    return ncclSuccess;
}

ncclResult_t join_wait(ncclComm_t c) {
    double t0 = now_s(), limit = timeout_s();
    while (c->seg->joined.load() < c->nranks) {
        if (now_s() - t0 > limit)
            return fail(c, ncclSystemError, "ncclCommInitRank: rank %d: only %d of %d ranks joined within %.1f s", c->rank,
                        c->seg->joined.load(), c->nranks, limit);
        usleep(200);
    }
    shm_unlink(c->name.c_str());  // every rank has it mapped now (ENOENT after the first)
    return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *uid) {
    if (!uid) return ncclInvalidArgument;
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return fail(nullptr, ncclSystemError, "getrandom failed");
    id_layout l = {};
    l.magic = ID_MAGIC;
    int n = snprintf(l.name, sizeof l.name, "/varent-emu-nccl-");
    for (int i = 0; i < 16; i++) n += snprintf(l.name + n, sizeof l.name - (size_t)n, "%02x", r[i]);
    memset(uid->internal, 0, sizeof uid->internal);
    memcpy(uid->internal, &l, sizeof l);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return ncclInvalidArgument;
    ncclResult_t r = join(comm, nranks, id, rank);
    if (r != ncclSuccess) return r;
    if (group_depth > 0) {  // NCCL defers the wait to ncclGroupEnd
        group_joins.push_back(*comm);
        return ncclSuccess;
    }
    r = join_wait(*comm);
    if (r != ncclSuccess) {
        ncclCommDestroy(*comm);
        *comm = nullptr;
    }
    return r;
}

// Non-blocking (config->blocking == 0): joins and returns ncclInProgress; the state turns
// to ncclSuccess in ncclCommGetAsyncError once every rank has joined (the caller decides
// how long to wait, and aborts).
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    if (!config || config->magic != 0xcafebeef) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: "
                                                            "the config was not set from NCCL_CONFIG_INITIALIZER");
    if (config->blocking != 0) return ncclCommInitRank(comm, nranks, id, rank);
    if (!comm) return ncclInvalidArgument;
    ncclResult_t r = join(comm, nranks, id, rank);
    if (r != ncclSuccess) return r;
    (*comm)->async.store(ncclInProgress);
    return ncclInProgress;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (!comms || ndev < 1) return ncclInvalidArgument;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    int saved = 0;
    cudaGetDevice(&saved);
    for (int i = 0; r == ncclSuccess && i < ndev; i++) {
        if (cudaSetDevice(devlist ? devlist[i] : i) != cudaSuccess) r = ncclUnhandledCudaError;
        else r = join(&comms[i], ndev, id, i);
    }
    cudaSetDevice(saved);
    if (r == ncclSuccess) r = join_wait(comms[0]);
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    if (c->seg && c->seg->joined.load() < c->nranks) shm_unlink(c->name.c_str());  // a group that never formed
    if (c->seg) munmap(c->seg, sizeof(segment));
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    if (c->seg) c->seg->aborted.store(c->rank + 1);
    return ncclCommDestroy(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
    if (!c || !e) return ncclInvalidArgument;
    int busy = ncclInProgress;
    if (c->async.load() == ncclInProgress && c->seg->joined.load() >= c->nranks &&
        c->async.compare_exchange_strong(busy, ncclSuccess))
        shm_unlink(c->name.c_str());  // a non-blocking init completes: every rank has joined
    *e = (ncclResult_t)c->async.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *n) { return c && n ? (*n = c->nranks, ncclSuccess) : ncclInvalidArgument; }
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) { return c && r ? (*r = c->rank, ncclSuccess) : ncclInvalidArgument; }
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *d) { return c && d ? (*d = c->device, ncclSuccess) : ncclInvalidArgument; }

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

// NCCL's own last message is global; the stand-in keeps one per communicator.
const char *ncclGetLastError(ncclComm_t c) {
    static thread_local std::string copy;
    if (!c) return "";
    std::lock_guard<std::mutex> lk(c->mu);
    copy = c->last;
    return copy.c_str();
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    for (ncclComm_t c : group_joins)
        if (r == ncclSuccess) r = join_wait(c);
    group_joins.clear();
    return r;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
    coll x = { { K_ALLREDUCE, t, op, 0, count }, (const char *)s, (char *)r };
    return enqueue(c, x, count * type_size(t), st);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t st) {
    coll x = { { K_REDUCESCATTER, t, op, 0, recvcount }, (const char *)s, (char *)r };
    return enqueue(c, x, recvcount * type_size(t) * (size_t)(c ? c->nranks : 0), st);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t st) {
    coll x = { { K_ALLGATHER, t, 0, 0, sendcount }, (const char *)s, (char *)r };
    return enqueue(c, x, sendcount * type_size(t), st);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) {
    coll x = { { K_BROADCAST, t, 0, root, count }, (const char *)s, (char *)r };
    size_t in = c && c->rank == root ? count * type_size(t) : 0;  // only the root's sendbuff is read
    return enqueue(c, x, in, st);
}

}  // extern "C"
