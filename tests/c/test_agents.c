// test_agents.c: the library pieces of `varent agents` that need no model: the
// --devices and --agents parsers, the default agents, and the device thread pool
// (every selected device runs a job exactly once, on its own thread, and the caller
// waits for all of them).
#include <pthread.h>
#include <string.h>

#include "host/agents/loop.h"
#include "host/runtime/devices.h"
#include "tests/c/check.h"

static void test_devices_parse(void) {
    device_spec d[DEVICES_MAX];
    verr err;
    int n = devices_parse("cpu", d, &err);
    CHECK(n == 1 && !strcmp(d[0].name, "cpu"), "devices_cpu", "n %d", n);
    n = devices_parse("cpu,cpu", d, &err);
    CHECK(n == 2 && !strcmp(d[1].name, "cpu"), "devices_cpu_cpu", "n %d", n);
    n = devices_parse("0,1", d, &err);
    CHECK(n == 2 && !strcmp(d[0].name, "cuda:0") && !strcmp(d[1].name, "cuda:1"), "devices_indices", "n %d", n);
    n = devices_parse("cuda,cuda:3,cpu", d, &err);
    CHECK(n == 3 && !strcmp(d[0].name, "cuda") && !strcmp(d[1].name, "cuda:3") && !strcmp(d[2].name, "cpu"),
          "devices_mixed", "n %d", n);
    const char *bad[] = { "", ",", "cpu,", "gpu", "cuda:", "cuda:x", "1a", "cpu,,cpu", "cuda:12345", NULL };
    for (int i = 0; bad[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "devices_rejects_'%s'", bad[i]);
        err.msg[0] = 0;
        n = devices_parse(bad[i], d, &err);
        CHECK(n == -1 && strstr(err.msg, "--devices"), name, "n %d, err '%s'", n, err.msg);
    }
    char many[128] = "cpu";
    for (int i = 1; i <= DEVICES_MAX; i++) strcat(many, ",cpu");
    CHECK(devices_parse(many, d, &err) == -1 && strstr(err.msg, "more than"), "devices_too_many", "%s", err.msg);
}

static void test_agents_parse(void) {
    sampler_params a[AGENTS_MAX], base = { 1, 0, 0.9f, 0.05f };
    verr err;
    int n = agents_parse("0.3:10,1.5:0", a, base, &err);
    CHECK(n == 2 && a[0].temperature == 0.3f && a[0].top_k == 10 && a[1].top_k == 0 && a[1].top_p == 0.9f &&
              a[1].min_p == 0.05f,
          "agents_parse_two", "n %d", n);
    const char *bad[] = { "", "0.5", "a:b", "0.5:", ":5", "0.5:-1", "-1:5", "0.5:5,", "0.5:5;1:1", "1:2:3", NULL };
    for (int i = 0; bad[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "agents_rejects_'%s'", bad[i]);
        CHECK(agents_parse(bad[i], a, base, &err) == -1 && strstr(err.msg, "--agents"), name, "err '%s'", err.msg);
    }
    n = agents_default(a, base);
    CHECK(n == 8 && a[0].temperature == 0.3f && a[0].top_k == 10 && a[7].temperature == 1.5f && a[7].top_k == 100,
          "agents_default_range", "%g:%d .. %g:%d", a[0].temperature, a[0].top_k, a[7].temperature, a[7].top_k);
    int up = 1;
    for (int i = 1; i < 8; i++) up = up && a[i].temperature > a[i - 1].temperature && a[i].top_k > a[i - 1].top_k;
    CHECK(up, "agents_default_spread", "not increasing");
}

typedef struct {
    pthread_mutex_t mu;
    int runs[DEVICES_MAX];
    pthread_t who[DEVICES_MAX];
} pool_probe;

static void probe(void *ud, int dev) {
    pool_probe *p = ud;
    pthread_mutex_lock(&p->mu);
    p->runs[dev]++;
    p->who[dev] = pthread_self();
    pthread_mutex_unlock(&p->mu);
}

static void test_pool(void) {
    verr err;
    for (int n = 1; n <= 4; n += 3) {
        dev_pool *pool;
        if (dev_pool_start(&pool, n, &err)) {
            CHECK(0, "pool_start", "%s", err.msg);
            return;
        }
        pool_probe p = { .mu = PTHREAD_MUTEX_INITIALIZER };
        for (int rep = 0; rep < 200; rep++) dev_pool_run(pool, (1u << n) - 1, probe, &p);
        int ok = 1;
        for (int d = 0; d < n; d++) ok = ok && p.runs[d] == 200;
        char name[64];
        snprintf(name, sizeof name, "pool_%d_every_device_each_job", n);
        CHECK(ok, name, "runs %d %d", p.runs[0], p.runs[n - 1]);
        int distinct = 1;
        for (int d = 0; d < n; d++)
            for (int e = d + 1; e < n; e++) distinct = distinct && !pthread_equal(p.who[d], p.who[e]);
        if (n > 1) {
            snprintf(name, sizeof name, "pool_%d_one_thread_per_device", n);
            CHECK(distinct && !pthread_equal(p.who[0], pthread_self()), name, "threads shared");
            memset(p.runs, 0, sizeof p.runs);
            for (int rep = 0; rep < 100; rep++) dev_pool_run(pool, 1u << (rep % n), probe, &p);
            ok = 1;
            for (int d = 0; d < n; d++) ok = ok && p.runs[d] == 100 / n + (d < 100 % n);
            snprintf(name, sizeof name, "pool_%d_masked_jobs", n);
            CHECK(ok, name, "runs %d %d %d %d", p.runs[0], p.runs[1], p.runs[2], p.runs[3]);
        } else {
            CHECK(pthread_equal(p.who[0], pthread_self()), "pool_1_runs_inline", "ran on another thread");
        }
        dev_pool_stop(pool);
    }
}

int main(void) {
    test_devices_parse();
    test_agents_parse();
    test_pool();
    CHECK_DONE();
}
