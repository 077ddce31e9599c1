// main.c: the varent command line. Dispatches to the subcommands in host/cli_*.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/cli/commands.h"
#include "host/util/interrupt.h"

#ifdef VARENT_CUDA
int cuda_device_count(void);
#endif

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    { "run", cmd_run, "generate text from a prompt or token ids" },
    { "chat", cmd_chat, "interactive multi-turn chat with the model's template" },
    { "logits", cmd_logits, "write the last position's logits as float32" },
    { "info", cmd_info, "print a model's config, parameters and bytes per token" },
    { "bench", cmd_bench, "measure prefill and decode speed" },
    { "convert", cmd_convert, "convert llama2c or gguf checkpoints to a HF model dir" },
    { "tokenize", cmd_tokenize, "text to token ids" },
    { "detokenize", cmd_detokenize, "token ids to text" },
    { "template", cmd_template, "render a chat template" },
    { "serve", cmd_serve, "OpenAI-compatible HTTP server with a live entropy page" },
    { "ppl", cmd_ppl, "perplexity of a text file, with its standard error" },
    { "compare", cmd_compare, "run prompts under several samplers, side by side" },
    { "plot", cmd_plot, "plot entropy/varentropy of a metrics or agents log (SVG/PNG)" },
    { "agents", cmd_agents, "decoding agents: lowest-entropy proposal, critic with rollback" },
    { "cvector", cmd_cvector, "a control vector (llama.cpp GGUF) from positive/negative prompts" },
    { "lora", cmd_lora, "lora merge BASE ADAPTER OUT: fold a PEFT LoRA adapter into a model" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: varent <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nvarent --version prints the version and compiled backends.\n");
}

static void version(void) {
    printf("varent %s\nbackends: cpu", VARENT_VERSION);
#ifdef VARENT_CUDA
    printf(" cuda");
    int n = cuda_device_count();
    printf("\ncuda devices: %d", n);
#endif
    printf("\n");
}

// OpenMP teams spin at every barrier (libgomp: 300000 rounds) before sleeping. When
// another process or another of our own threads (server slots, agent replicas) holds a
// core, a spinning team can fall off a cliff: SmolLM2 decode on two cores, one of them
// busy, measured 3 to 27 tok/s by default, about 33 with a 1000-round spin and 43
// passive; on an idle machine 1000 rounds costs nothing (82 tok/s) where passive costs
// 17% (see docs/benchmarks.md). libgomp reads its settings before main runs, so unless
// the user chose a policy, re-exec once with GOMP_SPINCOUNT=1000; if exec fails, go on.
static void omp_short_spin(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    omp_short_spin(argv);
    interrupt_cleanup_install();  // a signal removes the temporary output files first
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        version();
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "varent: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
