// persist_trace.c: the persistent decode kernel's phase trace (docs/cuda.md "The phase
// trace"). With a path set (cuda_forward_set_persist_trace; VARENT_CUDA_PERSIST_TRACE),
// every persistent step stamps each phase of each block (entry, first counter wait,
// exit: kernels/cuda/persist.cu) into a device buffer, and after the step the buffer is
// copied back and written to the path as a TSV, the last step's replacing the one
// before. One host wait a step: a diagnostic, not a timed configuration.
// tools/persist_trace.py reads the file.
#include "model/forward_cuda.h"

#ifndef VARENT_CUDA
typedef int cuda_persist_trace_unused;  // nothing to build without CUDA
#else

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/internal.h"

int cuda_forward_set_persist_trace(cuda_forward *d, const char *path, verr *err) {
    dev_persist *p = &d->persist;
    if (path && strlen(path) >= sizeof p->trace_path)
        return verr_set(err, "persistent kernel trace path is longer than %zu bytes: %s", sizeof p->trace_path - 1,
                        path);
    if (path && path[0]) {  // written (empty) now: a path that cannot be is an error here, not after a step
        FILE *fp = fopen(path, "w");
        if (!fp) return verr_set(err, "persistent kernel trace: cannot write %s: %s", path, strerror(errno));
        fclose(fp);
    }
    snprintf(p->trace_path, sizeof p->trace_path, "%s", path ? path : "");
    return 0;
}

void cuda_persist_trace_free(dev_persist *p) {
    cuda_free(p->trace);
    free(p->h_trace);
    p->trace = NULL, p->h_trace = NULL, p->trace_len = 0;
}

// The device buffer for the plan at the fit's grid, when a path is set (plan->trace).
int cuda_persist_trace_arm(cuda_forward *d, cuda_persist_plan *plan, verr *err) {
    dev_persist *p = &d->persist;
    plan->trace = NULL;
    if (!p->trace_path[0]) return 0;
    size_t len = cuda_persist_trace_len(plan, p->fit.grid);
    if (len > p->trace_len) {
        cuda_persist_trace_free(p);
        p->h_trace = malloc(len * sizeof *p->h_trace);
        if (!p->h_trace) return verr_set(err, "out of memory for the persistent kernel trace (%zu words)", len);
        if (cuda_malloc((void **)&p->trace, len * sizeof *p->trace, "persistent kernel trace", err)) {
            cuda_persist_trace_free(p);
            return -1;
        }
        p->trace_len = len;
    }
    plan->trace = p->trace;
    return 0;
}

// The layer and kind of phase ph (cuda_persist_trace_len's numbering).
static void phase_name(int ph, int n_layers, int *layer, const char **kind) {
    static const char *kinds[5] = { "qkv", "attention", "o", "gate_up", "down" };
    *layer = -1;
    if (ph == 0) {
        *kind = "embed";
    } else if (ph == 5 * n_layers + 1) {
        *kind = "lm_head";
    } else {
        *layer = (ph - 1) / 5;
        *kind = kinds[(ph - 1) % 5];
    }
}

// The stamps in ns after the step's first entry; a block that did not wait: -1.
static int write_tsv(FILE *fp, const unsigned long long *t, int grid, int phases, int n_layers) {
    const unsigned long long *s = t + grid;  // the stamps, past the blocks' scratch
    unsigned long long t0 = 0;
    for (size_t i = 0; i < (size_t)phases * grid; i++)
        if (s[3 * i] && (!t0 || s[3 * i] < t0)) t0 = s[3 * i];
    fprintf(fp, "# varent persist-trace 1: grid %d, layers %d, phases %d\n", grid, n_layers, phases);
    fprintf(fp, "phase\tlayer\tkind\tblock\tentry_ns\twait_ns\texit_ns\n");
    for (int ph = 0; ph < phases; ph++) {
        int layer;
        const char *kind;
        phase_name(ph, n_layers, &layer, &kind);
        for (int b = 0; b < grid; b++) {
            const unsigned long long *r = s + 3 * ((size_t)ph * grid + b);
            long long w = r[1] ? (long long)(r[1] - t0) : -1;
            fprintf(fp, "%d\t%d\t%s\t%d\t%lld\t%lld\t%lld\n", ph, layer, kind, b, (long long)(r[0] - t0), w,
                    (long long)(r[2] - t0));
        }
    }
    return ferror(fp) ? -1 : 0;
}

// After a traced step: its stamps, copied back (a wait), written to the path.
int cuda_persist_trace_write(cuda_forward *d, const cuda_persist_plan *plan, verr *err) {
    dev_persist *p = &d->persist;
    cuda_core *f = &d->core;
    if (!plan->trace) return 0;
    int grid = p->fit.grid, phases = cuda_persist_trace_phases(plan);
    size_t len = cuda_persist_trace_len(plan, grid);
    CK(cudaMemcpyAsync(p->h_trace, p->trace, len * sizeof *p->h_trace, cudaMemcpyDeviceToHost, f->ctx.stream));
    CK(cudaStreamSynchronize(f->ctx.stream));
    FILE *fp = fopen(p->trace_path, "w");
    if (!fp) return verr_set(err, "persistent kernel trace: cannot write %s: %s", p->trace_path, strerror(errno));
    int bad = write_tsv(fp, p->h_trace, grid, phases, plan->n_layers);
    if (fclose(fp) != 0 || bad)
        return verr_set(err, "persistent kernel trace: writing %s failed: %s", p->trace_path, strerror(errno));
    return 0;
}

#endif
