// test_cudaemu_nccl.cu: the NCCL stand-in (tests/cudaemu/nccl.cpp) against its
// contract: results equal to a host computation in rank order and bit-identical on
// every rank, stream order, graph capture, ranks as threads and as processes; and
// planted bugs it must catch: collectives whose counts or order differ across ranks, a
// rank that never arrives (timeout), a rank that exits or aborts, a stream of another
// device, host memory as a buffer. Built only against the emulator.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <thread>
#include <vector>

static int failures;

static void check(bool ok, const char *name, const char *why) {
    if (ok) printf("PASS %s\n", name);
    else printf("FAIL %s: %s\n", name, why), failures++;
    fflush(stdout);
}

// A rank: its device, stream and communicator.
struct rank_t {
    int rank = 0, dev = 0;
    cudaStream_t s = nullptr;
    ncclComm_t c = nullptr;
};

static float val(int r, size_t i) { return (float)((i * 2654435761u + (size_t)r * 40503u) % 1000003u) * 1e-3f - 500.f; }

static float *upload(const std::vector<float> &h) {
    float *d = nullptr;
    cudaMalloc((void **)&d, h.size() * sizeof(float) + 4);
    cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}

static std::vector<float> download(rank_t &R, const float *d, size_t n) {
    std::vector<float> h(n);
    cudaStreamSynchronize(R.s);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}

static std::vector<float> rank_input(int r, size_t n) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = val(r, i);
    return h;
}

// Runs fn(rank) for ranks 0..n-1, each on its own thread with its device current and
// its communicator from one unique id.
static void on_threads(int n, const std::function<void(rank_t &)> &fn) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    std::vector<std::thread> th;
    for (int r = 0; r < n; r++)
        th.emplace_back([&, r] {
            rank_t R;
            R.rank = r, R.dev = r % 2;
            cudaSetDevice(R.dev);
            cudaStreamCreateWithFlags(&R.s, cudaStreamNonBlocking);
            if (ncclCommInitRank(&R.c, n, id, r) != ncclSuccess) {
                printf("FAIL ncclCommInitRank rank %d\n", r), failures++;
                return;
            }
            fn(R);
            if (R.c) ncclCommDestroy(R.c);
            cudaStreamDestroy(R.s);
        });
    for (auto &t : th) t.join();
}

// ---- correct use ----------------------------------------------------------------------------
// n floats summed over the ranks, left to right from rank 0, as the stand-in promises.
static std::vector<float> host_sum(int ranks, size_t n) {
    std::vector<float> s = rank_input(0, n);
    for (int r = 1; r < ranks; r++)
        for (size_t i = 0; i < n; i++) s[i] += val(r, i);
    return s;
}

static void test_allreduce(int ranks, size_t n, const char *label) {
    std::vector<std::vector<float>> got(ranks);
    on_threads(ranks, [&](rank_t &R) {
        float *d = upload(rank_input(R.rank, n));
        if (ncclAllReduce(d, d, n, ncclFloat32, ncclSum, R.c, R.s) == ncclSuccess) got[R.rank] = download(R, d, n);
        cudaFree(d);
    });
    std::vector<float> want = host_sum(ranks, n);
    bool ok = true;
    for (int r = 0; r < ranks; r++) ok = ok && got[r].size() == n && !memcmp(got[r].data(), want.data(), n * 4);
    check(ok, label, "all-reduce differs from the rank-order host sum (or between ranks)");
}

// Reduce-scatter then all-gather in place: the all-reduce varent's forward makes.
static void test_rs_ag(void) {
    const int ranks = 2;
    const size_t per = 1000, n = per * ranks;
    std::vector<std::vector<float>> got(ranks);
    on_threads(ranks, [&](rank_t &R) {
        float *d = upload(rank_input(R.rank, n));
        ncclResult_t a = ncclReduceScatter(d, d + R.rank * per, per, ncclFloat32, ncclSum, R.c, R.s);
        ncclResult_t b = ncclAllGather(d + R.rank * per, d, per, ncclFloat32, R.c, R.s);
        if (a == ncclSuccess && b == ncclSuccess) got[R.rank] = download(R, d, n);
        cudaFree(d);
    });
    std::vector<float> want = host_sum(ranks, n);
    check(got[0].size() == n && !memcmp(got[0].data(), want.data(), n * 4) &&
              !memcmp(got[1].data(), want.data(), n * 4),
          "nccl_reduce_scatter_all_gather_in_place", "differs from the host sum");
}

static void test_broadcast(void) {
    std::vector<std::vector<float>> got(2);
    on_threads(2, [&](rank_t &R) {
        float *d = upload(rank_input(R.rank, 300));
        if (ncclBroadcast(d, d, 300, ncclFloat32, 1, R.c, R.s) == ncclSuccess) got[R.rank] = download(R, d, 300);
        cudaFree(d);
    });
    std::vector<float> want = rank_input(1, 300);
    check(got[0] == want && got[1] == want, "nccl_broadcast_from_root_1", "not rank 1's values");
}

// The collective runs when the stream reaches it: it sees the memset queued before it,
// and a result copied to pinned memory is there only after the synchronisation.
static void test_stream_order(void) {
    bool ok[2] = { false, false };
    on_threads(2, [&](rank_t &R) {
        float *d = upload(rank_input(R.rank, 64)), *pin = nullptr;
        cudaHostAlloc((void **)&pin, 64 * sizeof(float), cudaHostAllocDefault);
        pin[0] = -7.f;
        cudaMemsetAsync(d, 0, 64 * sizeof(float), R.s);
        ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, R.c, R.s);
        cudaMemcpyAsync(pin, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, R.s);
        float early = pin[0];
        cudaStreamSynchronize(R.s);
        ok[R.rank] = early == -7.f && pin[0] == 0.f && pin[63] == 0.f;
        cudaFreeHost(pin);
        cudaFree(d);
    });
    check(ok[0] && ok[1], "nccl_stream_ordered", "the collective did not run in stream order");
}

// Captured in a graph, replayed twice against the values of the time.
static void test_graph(void) {
    bool ok[2] = { false, false };
    on_threads(2, [&](rank_t &R) {
        float *d = upload(std::vector<float>(16, 1.f + R.rank)), *o = upload(std::vector<float>(16, 0.f));
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        cudaStreamBeginCapture(R.s, cudaStreamCaptureModeThreadLocal);
        ncclResult_t r = ncclAllReduce(d, o, 16, ncclFloat32, ncclSum, R.c, R.s);
        cudaStreamEndCapture(R.s, &g);
        cudaGraphInstantiate(&ge, g, 0);
        std::vector<float> a = download(R, o, 16);  // not run yet: still zeros
        cudaGraphLaunch(ge, R.s);
        std::vector<float> b = download(R, o, 16);  // 1 + 2
        std::vector<float> ten(16, 10.f * (R.rank + 1));
        cudaMemcpy(d, ten.data(), 16 * sizeof(float), cudaMemcpyHostToDevice);
        cudaGraphLaunch(ge, R.s);
        std::vector<float> c = download(R, o, 16);  // 10 + 20
        ok[R.rank] = r == ncclSuccess && a[0] == 0.f && b[5] == 3.f && c[15] == 30.f;
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaFree(d), cudaFree(o);
    });
    check(ok[0] && ok[1], "nccl_graph_capture_and_replay", "a captured collective did not replay");
}

static void test_init_all(void) {
    ncclComm_t c[2];
    int devs[2] = { 0, 1 }, d0 = -1, d1 = -1, r1 = -1, n = 0;
    ncclResult_t r = ncclCommInitAll(c, 2, devs);
    if (r == ncclSuccess) {
        ncclCommCuDevice(c[0], &d0), ncclCommCuDevice(c[1], &d1), ncclCommUserRank(c[1], &r1), ncclCommCount(c[0], &n);
        ncclCommDestroy(c[0]), ncclCommDestroy(c[1]);
    }
    check(r == ncclSuccess && d0 == 0 && d1 == 1 && r1 == 1 && n == 2, "nccl_comm_init_all", ncclGetErrorString(r));
}

// Non-blocking communicators: in progress until every rank has joined; a rank alone stays
// in progress (its caller times out and aborts), and a collective before the end is refused.
static void test_nonblocking(void) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclResult_t first[2], state[2] = { ncclInProgress, ncclInProgress }, early = ncclSuccess;
    std::vector<float> got;
    std::vector<std::thread> th;
    for (int r = 0; r < 2; r++)
        th.emplace_back([&, r] {
            cudaSetDevice(r);
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.blocking = 0;
            ncclComm_t c = nullptr;
            cudaStream_t s;
            cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
            float *d = upload(rank_input(r, 100));
            first[r] = ncclCommInitRankConfig(&c, 2, id, r, &cfg);
            if (r == 0) early = ncclAllReduce(d, d, 100, ncclFloat32, ncclSum, c, s);  // may come before rank 1
            for (int i = 0; i < 200000 && state[r] == ncclInProgress; i++) {
                ncclCommGetAsyncError(c, &state[r]);
                usleep(50);
            }
            if (ncclAllReduce(d, d, 100, ncclFloat32, ncclSum, c, s) == ncclSuccess && r == 1) {
                rank_t R;
                R.s = s;
                got = download(R, d, 100);
            } else {
                cudaStreamSynchronize(s);
            }
            ncclCommDestroy(c);
            cudaFree(d);
            cudaStreamDestroy(s);
        });
    for (auto &t : th) t.join();
    check(first[0] == ncclInProgress && first[1] == ncclInProgress && state[0] == ncclSuccess &&
              state[1] == ncclSuccess && got == host_sum(2, 100) &&
              (early == ncclInvalidUsage || early == ncclSuccess),
          "nccl_nonblocking_init", "non-blocking init did not complete, or the collective after it was wrong");
    // alone: still in progress after a while, then aborted
    ncclGetUniqueId(&id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r0 = ncclCommInitRankConfig(&c, 2, id, 0, &cfg), st = ncclSuccess;
    usleep(200000);
    ncclCommGetAsyncError(c, &st);
    check(r0 == ncclInProgress && st == ncclInProgress && ncclCommAbort(c) == ncclSuccess,
          "nccl_nonblocking_init_waits_for_every_rank", "a rank alone left the init state");
}

// ---- planted bugs (each in a child process) --------------------------------------------------
// The async error of a collective that must fail, and whether its output is poisoned.
static int expect_async(rank_t &R, float *out, ncclResult_t want) {
    cudaStreamSynchronize(R.s);
    ncclResult_t e = ncclSuccess;
    ncclCommGetAsyncError(R.c, &e);
    float h = 0;
    cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost);
    fprintf(stderr, "rank %d: async %d (%s): %s\n", R.rank, (int)e, ncclGetErrorString(e), ncclGetLastError(R.c));
    return e == want && h != h;  // NaN
}

static int scenario(const char *name) {
    int caught[2] = { 0, 0 };
    if (!strcmp(name, "count_mismatch")) {
        on_threads(2, [&](rank_t &R) {
            float *d = upload(rank_input(R.rank, 64));
            ncclAllReduce(d, d, R.rank ? 48 : 64, ncclFloat32, ncclSum, R.c, R.s);
            caught[R.rank] = expect_async(R, d, ncclInvalidUsage);
        });
    } else if (!strcmp(name, "order_swapped")) {  // rank 1 queues the two collectives the other way round
        on_threads(2, [&](rank_t &R) {
            float *a = upload(rank_input(R.rank, 32)), *b = upload(rank_input(R.rank, 64));
            if (R.rank == 0) {
                ncclAllReduce(a, a, 32, ncclFloat32, ncclSum, R.c, R.s);
                ncclAllGather(b, b, 32, ncclFloat32, R.c, R.s);
            } else {
                ncclAllGather(b, b, 32, ncclFloat32, R.c, R.s);
                ncclAllReduce(a, a, 32, ncclFloat32, ncclSum, R.c, R.s);
            }
            caught[R.rank] = expect_async(R, a, ncclInvalidUsage);
        });
    } else if (!strcmp(name, "absent_rank")) {  // rank 1 never makes the collective
        on_threads(2, [&](rank_t &R) {
            float *d = upload(rank_input(R.rank, 64));
            if (R.rank == 0) {
                ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, R.c, R.s);
                caught[0] = expect_async(R, d, ncclSystemError);
            }
            caught[1] = 1;
        });
    } else if (!strcmp(name, "aborted_peer")) {
        on_threads(2, [&](rank_t &R) {
            float *d = upload(rank_input(R.rank, 64));
            if (R.rank == 1) {
                ncclCommAbort(R.c);
                R.c = nullptr;
                caught[1] = 1;
                return;
            }
            usleep(100000);
            ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, R.c, R.s);
            caught[0] = expect_async(R, d, ncclRemoteError);
        });
    } else if (!strcmp(name, "wrong_stream_device")) {
        on_threads(2, [&](rank_t &R) {
            float *d = upload(rank_input(R.rank, 8));
            cudaStream_t other;
            cudaSetDevice(1 - R.dev);
            cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
            cudaSetDevice(R.dev);
            caught[R.rank] = ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, R.c, other) == ncclInvalidArgument;
            fprintf(stderr, "%s\n", ncclGetLastError(R.c));
            cudaStreamDestroy(other);
        });
    } else if (!strcmp(name, "host_buffer")) {
        on_threads(2, [&](rank_t &R) {
            std::vector<float> h(8, 1.f);
            caught[R.rank] = ncclAllReduce(h.data(), h.data(), 8, ncclFloat32, ncclSum, R.c, R.s) == ncclInvalidArgument;
        });
    } else if (!strcmp(name, "short_buffer")) {  // recvbuff of an all-gather holds one rank's share only
        on_threads(2, [&](rank_t &R) {
            float *d = upload(rank_input(R.rank, 8));
            caught[R.rank] = ncclAllGather(d, d, 8, ncclFloat32, R.c, R.s) == ncclInvalidArgument;
        });
    } else {
        return 1;
    }
    return caught[0] && caught[1] ? 3 : 0;
}

// One rank of a launch of separate processes (NCCL_EMU_ID: the unique id in hex).
// exits: 0 right, 1 wrong, 3 the peer's exit was noticed.
static int process_rank(int rank, const char *idhex, const char *mode) {
    ncclUniqueId id;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) sscanf(idhex + 2 * i, "%2hhx", (unsigned char *)&id.internal[i]);
    rank_t R;
    R.rank = rank, R.dev = rank;
    cudaSetDevice(R.dev);
    cudaStreamCreateWithFlags(&R.s, cudaStreamNonBlocking);
    if (ncclCommInitRank(&R.c, 2, id, rank) != ncclSuccess) return 1;
    const size_t n = 1500000;  // 6 MB: more than one round of the staging slots
    float *d = upload(rank_input(rank, n));
    if (!strcmp(mode, "dies") && rank == 1) _exit(0);
    ncclAllReduce(d, d, n, ncclFloat32, ncclSum, R.c, R.s);
    int rc = 0;
    if (!strcmp(mode, "dies")) {
        rc = expect_async(R, d, ncclRemoteError) ? 3 : 1;
    } else {
        std::vector<float> got = download(R, d, n), want = host_sum(2, n);
        rc = !memcmp(got.data(), want.data(), n * 4) ? 0 : 1;
    }
    ncclCommDestroy(R.c);  // (LeakSanitizer checks the children under make test-asan)
    cudaFree(d);
    cudaStreamDestroy(R.s);
    return rc;
}

static void test_processes(const char *self, const char *mode) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    char hex[2 * NCCL_UNIQUE_ID_BYTES + 1];
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    pid_t pid[2];
    for (int r = 0; r < 2; r++)
        if ((pid[r] = fork()) == 0) {
            char rs[8];
            snprintf(rs, sizeof rs, "%d", r);
            execl(self, self, "--rank", rs, hex, mode, (char *)NULL);
            _exit(127);
        }
    int st[2] = { 0, 0 };
    for (int k = 0; k < 2; k++) {  // in exit order: a rank that died is reaped at once
        int s = 0;
        pid_t p = wait(&s);
        st[p == pid[1]] = s;
    }
    int rc0 = WIFEXITED(st[0]) ? WEXITSTATUS(st[0]) : 99, rc1 = WIFEXITED(st[1]) ? WEXITSTATUS(st[1]) : 99;
    char why[64];
    snprintf(why, sizeof why, "exit %d and %d", rc0, rc1);
    if (!strcmp(mode, "dies")) check(rc0 == 3, "nccl_catches_exited_process_rank", why);
    else check(rc0 == 0 && rc1 == 0, "nccl_all_reduce_across_processes", why);
}

static void expect(const char *self, const char *name) {
    char path[] = "/tmp/cudaemu-nccl-XXXXXX";
    int fd = mkstemp(path);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        setenv("VARENT_EMU_NCCL_TIMEOUT", "1", 1);
        execl(self, self, name, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    char err[2048], label[128];
    ssize_t n = pread(fd, err, sizeof err - 1, 0);
    err[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    snprintf(label, sizeof label, "nccl_catches_%s", name);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 3, label, err);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--rank")) return process_rank(atoi(argv[2]), argv[3], argv[4]);
    if (argc > 1) return scenario(argv[1]);
    test_allreduce(2, 1000, "nccl_all_reduce_2_ranks");
    test_allreduce(4, 777, "nccl_all_reduce_4_ranks");
    test_allreduce(2, 1500000, "nccl_all_reduce_several_rounds");
    test_rs_ag();
    test_broadcast();
    test_stream_order();
    test_graph();
    test_init_all();
    test_nonblocking();
    test_processes(argv[0], "sum");
    test_processes(argv[0], "dies");
    const char *bugs[] = { "count_mismatch", "order_swapped", "absent_rank", "aborted_peer", "wrong_stream_device",
                           "host_buffer", "short_buffer" };
    for (const char *b : bugs) expect(argv[0], b);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
