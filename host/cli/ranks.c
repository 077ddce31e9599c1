// ranks.c: see ranks.h.
#include "host/cli/ranks.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/cli/common.h"
#include "host/runtime/devices.h"
#include "host/util/fileio.h"
#include "host/util/outfile.h"

// CLI state: the launch's world, this rank's communicators, whether the command may
// split the world into several groups (agents).
static tp_mpi *world;
static tp_comm *group, *across;
static int replicas_ok;

void cli_ranks_replicas(void) { replicas_ok = 1; }

// --tp-timeout's value before the options are parsed (they are parsed after MPI_Init):
// the limit on MPI's start-up too. A bad value is reported later, by the parser.
static double early_timeout(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--tp-timeout") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--tp-timeout=", 13)) v = argv[i] + 13;
        char *end;
        double t = v ? strtod(v, &end) : -1;
        if (v && end != v && !*end && t >= 0 && t <= 1e9) return t;
    }
    return 300;
}

int cli_ranks_start(int *argc, char ***argv) {
    if (!tp_mpi_launched()) return 0;
    int err_fd = dup(2);
    verr err;
    if (tp_mpi_init(argc, argv, err_fd >= 0 ? err_fd : 2, early_timeout(*argc, *argv), &world, &err)) {
        fprintf(stderr, "varent: %s\n", err.msg);
        return 1;
    }
    if (tp_mpi_rank(world) == 0) return 0;
    outfile_discard_all();
    const char *v = getenv("VARENT_VERBOSE_RANKS");
    if (v && strcmp(v, "0") != 0) return 0;
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
        fflush(stdout), fflush(stderr);
        dup2(null, 1), dup2(null, 2);
        close(null);
    }
    return 0;
}

int cli_ranks_end(int rc) {
    if (!world) return rc;
    // Every rank ends alike: options are read alike, and agreed failures (a load, a
    // checkpoint mismatch) are known to all.
    if (rc == 0 || rc == CLI_EXIT_USAGE || (group && group->failed_together)) {
        tp_mpi_finalize(world);
        world = NULL;
        return rc;
    }
    fflush(stdout), fflush(stderr);
    tp_mpi_abort(world, rc);
    return rc;
}

tp_mpi *cli_ranks_world(void) { return world; }

tp_comm *cli_ranks_across(void) { return across; }

uint64_t cli_ranks_same(uint64_t x) {
    if (!world || tp_mpi_size(world) < 2) return x;
    tp_comm *c = tp_mpi_world(world);
    uint64_t *all = calloc((size_t)c->size, sizeof *all);
    verr err;
    if (!all || c->gather(c, &x, sizeof x, all, &err)) {
        fprintf(stderr, "varent: agreeing on the seed: %s\n", all ? err.msg : "out of memory");
        tp_mpi_abort(world, 1);
    }
    uint64_t r0 = all[0];
    free(all);
    return r0;
}

// Threads per rank by default: the CPUs shared by the ranks on this node.
static int default_threads(void) {
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int n = local ? atoi(local) : 1, cpus = cli_cpu_count();
    return n > 1 ? (cpus / n > 0 ? cpus / n : 1) : 0;
}

// --devices: the GPUs of a one-process tensor-parallel group (without it, --tp N on
// --device cuda outside an MPI launch takes GPUs 0..N-1).
static void local_devices(args *a, session_opts *o) {
    static char first_n[DEVICES_MAX * 4];  // CLI state: the default list
    const char *list = args_str(a, "--devices", NULL);
    if (list && o->tp <= 1) {
        args_bad(a, "--devices %s: give --tp N to split the model over these GPUs (one GPU: --device cuda:N)", list);
        return;
    }
    if (world) {
        if (list) args_bad(a, "--devices under an MPI launch: each rank takes one GPU (--device cuda or cuda:K)");
        return;
    }
    if (!list && o->tp > 1 && o->device && !strncmp(o->device, "cuda", 4)) {
        size_t used = 0;
        for (int i = 0; i < o->tp && i < DEVICES_MAX; i++)
            used += (size_t)snprintf(first_n + used, sizeof first_n - used, "%s%d", i ? "," : "", i);
        list = first_n;
    }
    o->tp_devices = o->tp > 1 ? list : NULL;
}

void cli_ranks_session(args *a, session_opts *o) {
    int size = world ? tp_mpi_size(world) : 1;
    int tp = (int)args_int_range(a, "--tp", replicas_ok ? 1 : size, 1, 4096);
    double timeout = args_float_range(a, "--tp-timeout", 300, 0, 1e9);
    o->tp = tp;
    o->tp_timeout = timeout;
    if (!replicas_ok) local_devices(a, o);
    if (!world) return;  // --tp > 1 then fails in session_open, saying how to launch it
    tp_mpi_set_timeout(world, timeout);
    if (!o->threads) o->threads = default_threads();
    if (!replicas_ok && tp != size) {
        args_bad(a, "--tp %d under an MPI launch of %d processes: this command runs one tensor-parallel group of "
                 "every rank (pass --tp %d, or mpirun -np %d)", tp, size, size, tp);
        return;
    }
    verr err;
    if (tp_mpi_split(world, tp, &group, &across, &err)) {
        args_bad(a, "%s", err.msg);
        return;
    }
    o->tp_comm = tp > 1 ? group : NULL;
}

int cli_ranks_share(char **text, long *len, int *status) {
    if (!world || tp_mpi_size(world) < 2) return 0;
    tp_comm *c = tp_mpi_world(world);
    long head[3] = { *text ? *len : -1, status ? *status : 0, 0 }, *heads = calloc((size_t)c->size, sizeof head);
    verr err;
    if (!heads || c->gather(c, head, sizeof head, heads, &err)) goto fail;
    long n = heads[0];
    if (status) *status = (int)heads[1];
    free(heads);
    heads = NULL;
    if (n < 0) {  // rank 0 has none
        free(*text);
        *text = NULL;
        return 0;
    }
    char *mine = calloc(1, (size_t)n + 1), *all = calloc((size_t)c->size, (size_t)n + 1);
    if (!mine || !all) {
        free(mine), free(all);
        goto fail;
    }
    if (c->rank == 0) memcpy(mine, *text, (size_t)n);
    int rc = c->gather(c, mine, (size_t)n + 1, all, &err);
    free(mine);
    if (rc) {
        free(all);
        goto fail;
    }
    free(*text);
    *text = all;  // rank 0's block first, NUL-terminated
    *len = n;
    return 0;
fail:
    free(heads);
    fprintf(stderr, "varent: sharing stdin with the other ranks failed\n");
    tp_mpi_abort(world, 1);
    return -1;
}

char *cli_ranks_read(char *(*rd)(const char *arg, verr *err), const char *arg, verr *err) {
    if (!world || tp_mpi_size(world) < 2) return rd(arg, err);
    char *text = tp_mpi_rank(world) == 0 ? rd(arg, err) : NULL;
    int failed = tp_mpi_rank(world) == 0 && !text;
    if (failed) text = strdup(err->msg);
    long len = text ? (long)strlen(text) : 0;
    if (cli_ranks_share(&text, &len, &failed)) return NULL;
    if (failed) {  // rank 0's message on every rank
        verr_set(err, "%s", text ? text : "reading stdin failed");
        free(text);
        return NULL;
    }
    return text;
}

char *cli_read_all(const char *path, verr *err) {
    return strcmp(path, "-") ? fileio_read_all(path, err) : cli_ranks_read(fileio_read_all, path, err);
}
