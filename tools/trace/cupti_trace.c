// cupti_trace.c: the GPU window's tracer (docs/cuda.md, "A GPU window"). An injection
// library: run any CUDA program with
//     CUDA_INJECTION64_PATH=/path/libvarent_trace.so VARENT_TRACE_OUT=trace.tsv PROGRAM ...
// and the CUDA driver loads it at start-up and calls InitializeInjection, which asks
// CUPTI for an activity record of every kernel, copy and memset the device runs and of
// every runtime API call of the host. The program itself is unchanged, so the same
// library traces the current build and the A/B baseline. At exit the records are in
// VARENT_TRACE_OUT, one per line, tab-separated (tools/trace_report.py reads them):
//     # varent-trace 1
//     K start end corr graph node stream name      a kernel (ns; graph 0: not from a graph)
//     M start end corr graph node stream memcpy-KIND-BYTES
//     S start end corr graph node stream memset-BYTES
//     A start end corr 0 0 thread name               a runtime API call of the host
//     D count                                        records CUPTI dropped
// A kernel launched by a graph carries the correlation id of its cudaGraphLaunch. The
// same source builds against NVIDIA's CUPTI (make trace-lib) and the emulated device's
// (tests/cudaemu/include/cupti.h), where `make test` runs it.
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

#define TRACE_BUF_BYTES (8u << 20)

// The one trace of this process (an injection library has no caller to hand state to).
static struct {
    pthread_mutex_t m;
    FILE *out;
    const char *path;
} trace = { PTHREAD_MUTEX_INITIALIZER, NULL, NULL };

static void trace_fail(const char *what, CUptiResult r) {
    const char *s = "?";
    cuptiGetResultString(r, &s);
    fprintf(stderr, "varent-trace: %s failed: %s (%s:%d)\n", what, s, __FILE__, __LINE__);
}

#define CUPTI_CHECK(call)                        \
    do {                                         \
        CUptiResult r_ = (call);                 \
        if (r_ != CUPTI_SUCCESS) {               \
            trace_fail(#call, r_);               \
            return -1;                           \
        }                                        \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUF_BYTES);
    *size = *buffer ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

static const char *copy_kind(uint8_t k) {
    switch (k) {
    case 1: return "HtoD";
    case 2: return "DtoH";
    case 8: return "DtoD";
    default: return "other";
    }
}

// One record as a line. Callers hold trace.m.
static void write_record(FILE *f, const CUpti_Activity *rec) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(f, "K\t%" PRIu64 "\t%" PRIu64 "\t%u\t%u\t%" PRIu64 "\t%u\t%s\n", k->start, k->end, k->correlationId,
                k->graphId, k->graphNodeId, k->streamId, k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)rec;
        fprintf(f, "M\t%" PRIu64 "\t%" PRIu64 "\t%u\t%u\t%" PRIu64 "\t%u\tmemcpy-%s-%" PRIu64 "\n", c->start, c->end,
                c->correlationId, c->graphId, c->graphNodeId, c->streamId, copy_kind(c->copyKind), c->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)rec;
        fprintf(f, "S\t%" PRIu64 "\t%" PRIu64 "\t%u\t%u\t%" PRIu64 "\t%u\tmemset-%" PRIu64 "\n", s->start, s->end,
                s->correlationId, s->graphId, s->graphNodeId, s->streamId, s->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
        const char *name = "?";
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
        fprintf(f, "A\t%" PRIu64 "\t%" PRIu64 "\t%u\t0\t0\t%u\t%s\n", a->start, a->end, a->correlationId, a->threadId,
                name);
        break;
    }
    default: break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)size;
    pthread_mutex_lock(&trace.m);
    if (trace.out) {
        CUpti_Activity *rec = NULL;
        while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) write_record(trace.out, rec);
        size_t dropped = 0;
        if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
            fprintf(trace.out, "D\t%zu\n", dropped);
    }
    pthread_mutex_unlock(&trace.m);
    free(buffer);
}

// At exit: the records still in CUPTI's buffers, then the file.
static void trace_finish(void) {
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&trace.m);
    if (trace.out && fclose(trace.out) != 0) perror(trace.path);
    trace.out = NULL;
    pthread_mutex_unlock(&trace.m);
}

static int trace_start(void) {
    trace.path = getenv("VARENT_TRACE_OUT");
    if (!trace.path || !*trace.path) {
        fprintf(stderr, "varent-trace: VARENT_TRACE_OUT is not set: nothing is traced\n");
        return -1;
    }
    trace.out = fopen(trace.path, "w");
    if (!trace.out) {
        perror(trace.path);
        return -1;
    }
    fprintf(trace.out, "# varent-trace 1\n");
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    atexit(trace_finish);
    return 0;
}

// Called by the CUDA driver (or the emulated device) when it loads this library.
__attribute__((visibility("default"))) int InitializeInjection(void) {
    if (trace_start() == 0) return 1;
    if (trace.out) fclose(trace.out);
    trace.out = NULL;
    return 0;
}
