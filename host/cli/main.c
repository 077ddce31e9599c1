// main.c: the varent command line. Dispatches to the subcommands in host/cli_*.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/commands.h"
#include "host/cli/help.h"
#include "host/cli/ranks.h"
#include "host/util/interrupt.h"
#include "host/util/progress.h"
#include "host/util/outfile.h"

#ifdef VARENT_CUDA
int cuda_device_count(void);
#endif

typedef struct {
    int (*fn)(int, char **);
    const cli_spec *spec;  // name, summary and options
} command;

static const command commands[] = {
    { cmd_run, &cli_run_spec },           { cmd_chat, &cli_chat_spec },
    { cmd_logits, &cli_logits_spec },     { cmd_info, &cli_info_spec },
    { cmd_bench, &cli_bench_spec },       { cmd_convert, &cli_convert_spec },
    { cmd_tokenize, &cli_tokenize_spec }, { cmd_detokenize, &cli_detokenize_spec },
    { cmd_template, &cli_template_spec }, { cmd_serve, &cli_serve_spec },
    { cmd_ppl, &cli_ppl_spec },           { cmd_compare, &cli_compare_spec },
    { cmd_plot, &cli_plot_spec },         { cmd_agents, &cli_agents_spec },
    { cmd_cvector, &cli_cvector_spec },   { cmd_lora, &cli_lora_spec },
    { cmd_eval, &cli_eval_spec },         { cmd_calibrate, &cli_calibrate_spec },
};
enum { N_COMMANDS = sizeof commands / sizeof *commands };

static void usage(FILE *f) {
    fprintf(f, "usage: varent <command> [options]\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-11s %s\n", commands[i].spec->name, commands[i].spec->summary);
    fprintf(f, "\nvarent CMD --help (or varent help CMD) lists a command's options; varent --version prints the\n"
               "version and compiled backends. Docs: docs/cli.md.\n\nConventions:\n");
    cli_help_conventions(f);
}

static const command *find_command(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].spec->name)) return &commands[i];
    return NULL;
}

// varent help [CMD | --markdown]
static int help(int argc, char **argv) {
    if (argc < 1) return usage(stdout), 0;
    if (!strcmp(argv[0], "--markdown")) {
        const cli_spec *specs[N_COMMANDS];
        for (int i = 0; i < N_COMMANDS; i++) specs[i] = commands[i].spec;
        cli_help_markdown(stdout, specs, N_COMMANDS);
        return 0;
    }
    const command *c = find_command(argv[0]);
    if (!c) return cli_usage_error("help", "unknown command '%s' (varent help lists them)", argv[0]);
    cli_help_print(stdout, c->spec);
    return 0;
}

static void version(void) {
    printf("varent %s\nbackends: cpu", VARENT_VERSION);
#ifdef VARENT_MPI
    printf(" mpi");
#endif
#ifdef VARENT_CUDA
    printf(" cuda");
    int n = cuda_device_count();
    printf("\ncuda devices: %d", n);
#endif
    printf("\n");
    // the OpenMP wait the forward threads run with (omp_short_spin's, or the user's)
    const char *pol = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    if (pol) printf("openmp: OMP_WAIT_POLICY=%s\n", pol);
    if (spin) printf("openmp: GOMP_SPINCOUNT=%s\n", spin);
}

// OpenMP teams spin at every barrier (libgomp: 300000 rounds) before sleeping. When
// another process or another of our own threads (server slots, agent replicas) holds a
// core, a spinning team can fall off a cliff: SmolLM2 decode on two cores, one of them
// busy, measured 3 to 27 tok/s by default and about 33 with a 30 us spin. A spin much
// shorter than the serial gaps between a step's parallel regions costs a futex wake per
// region instead: 10 us cost 30% of an idle decode on a machine whose pause takes 10 ns
// (docs/benchmarks.md). libgomp counts rounds of the pause instruction, whose cost varies
// 10-fold between CPUs, so the spin is set as a time: OMP_SPIN_NS over one pause's
// measured cost. libgomp reads its settings before main runs, so unless the user chose
// a policy, re-exec once with GOMP_SPINCOUNT set; if exec fails, go on.
#define OMP_SPIN_NS 30000.0
#define OMP_SPIN_MIN 1000
#define OMP_SPIN_MAX 30000

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// The spin rounds of OMP_SPIN_NS: the fastest of a few timed runs of pauses (about 0.2 ms
// in all), as libgomp's spin loop issues them.
static long omp_spin_rounds(void) {
#if defined(__x86_64__) || defined(__i386__)
    double best = 0;
    for (int run = 0; run < 5; run++) {
        double t0 = now_ns();
        for (int i = 0; i < 2000; i++) __builtin_ia32_pause();
        double ns = (now_ns() - t0) / 2000;
        if (run == 0 || ns < best) best = ns;
    }
    long n = best > 0 ? (long)(OMP_SPIN_NS / best) : OMP_SPIN_MIN;
    return n < OMP_SPIN_MIN ? OMP_SPIN_MIN : n > OMP_SPIN_MAX ? OMP_SPIN_MAX : n;
#else
    return OMP_SPIN_MIN;
#endif
}

static void omp_short_spin(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    char v[32];
    snprintf(v, sizeof v, "%ld", omp_spin_rounds());
    if (setenv("GOMP_SPINCOUNT", v, 1) != 0) return;
    execv("/proc/self/exe", argv);
}

// Every path of a command ends the progress reports it started: a ticker thread left
// running reads its bar's struct after the frame that held it is gone (issue 32, row 5).
// A command that leaves one is a bug the tests must see, so it aborts loudly.
static int check_progress(const char *name, int rc) {
    int n = progress_open_count();
    if (n == 0) return rc;
    fprintf(stderr, "varent %s: internal error: %d progress report%s left running when the command returned "
            "(exit status %d)\n", name, n, n == 1 ? "" : "s", rc);
    abort();
}

// The output module's notices: waiting for a FIFO's reader, a partial output kept under a
// new name, a stale temporary file removed (host/util/outfile.h).
static void print_notice(const char *msg) { fprintf(stderr, "varent: %s\n", msg); }

int main(int argc, char **argv) {
    omp_short_spin(argv);
    int rc = cli_ranks_start(&argc, &argv);  // under mpirun: join the world first
    if (rc) return rc;
    interrupt_cleanup_install();  // a signal removes the temporary output files first
    outfile_set_notice(print_notice);
    if (argc < 2) return usage(stderr), CLI_EXIT_USAGE;
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return help(argc - 2, argv + 2);
    if (!strcmp(argv[1], "version")) return version(), 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)  // --version anywhere: `varent run --version`
        if (!strcmp(argv[i], "--version")) return version(), 0;
    const command *c = find_command(argv[1]);
    if (c) return cli_ranks_end(check_progress(c->spec->name, c->fn(argc - 2, argv + 2)));
    fprintf(stderr, "varent: unknown command '%s' (varent help lists the commands)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
