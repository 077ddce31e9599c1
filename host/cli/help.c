// help.c: see help.h. Options print grouped in a fixed order of sections, each in its
// table order; a group no table names in that order follows, in order of appearance.
#include "host/cli/help.h"

#include <string.h>

#include "host/decode/defaults.h"

static const char *const group_order[] = { "model", "prompt", "chat", "sampling", "entropix", "output",
                                           "performance", NULL };

// The groups of spec, in print order (at most 32).
static int groups_of(const cli_spec *spec, const char **out) {
    int n = 0;
    for (int k = 0; group_order[k]; k++) out[n++] = group_order[k];
    for (const cli_opt *const *t = spec->tables; t && *t; t++)
        for (const cli_opt *o = *t; o->names; o++) {
            int seen = 0;
            for (int i = 0; i < n && !seen; i++) seen = !strcmp(out[i], o->group);
            if (!seen && n < 32) out[n++] = o->group;
        }
    return n;
}

// "-c, --ctx, --ctx-size N"
static void names_text(const cli_opt *o, char *buf, size_t len) {
    size_t k = 0;
    buf[0] = 0;
    for (const char *p = o->names; *p && k + 4 < len; p++) {
        if (*p == '|') k += (size_t)snprintf(buf + k, len - k, ", ");
        else buf[k++] = *p, buf[k] = 0;
    }
    if (o->metavar && k < len) snprintf(buf + k, len - k, " %s", o->metavar);
}

static void print_opt(FILE *f, const cli_opt *o) {
    char left[160];
    names_text(o, left, sizeof left);
    if (strlen(left) > 28) fprintf(f, "  %s\n  %-28s  ", left, "");
    else fprintf(f, "  %-28s  ", left);
    fputs(o->help, f);
    if (o->def) fprintf(f, " (default: %s)", o->def);
    if (o->flags & ARG_REPEAT) fputs(" [repeatable]", f);
    fputc('\n', f);
}

static void print_one(FILE *f, const cli_spec *spec) {
    fprintf(f, "usage: varent %s %s\n", spec->name, spec->usage);
    fprintf(f, "\n%s\n", spec->summary);
    if (spec->about) fprintf(f, "\n%s\n", spec->about);
    const char *groups[40];
    int ng = groups_of(spec, groups);
    for (int g = 0; g < ng; g++) {
        int header = 0;
        for (const cli_opt *const *t = spec->tables; t && *t; t++)
            for (const cli_opt *o = *t; o->names; o++) {
                if (strcmp(o->group, groups[g])) continue;
                if (!header++) fprintf(f, "\n%s:\n", groups[g]);
                print_opt(f, o);
            }
    }
}

void cli_help_print(FILE *f, const cli_spec *spec) {
    if (spec->subs) {
        fprintf(f, "%s\n", spec->summary);
        for (const cli_spec *const *s = spec->subs; *s; s++) fputc('\n', f), print_one(f, *s);
    } else {
        print_one(f, spec);
    }
    fprintf(f, "\n  %-28s  %s\n", "-h, --help", "print this help and exit");
    fprintf(f, "\nExit status: 0 done, 1 runtime error, 2 usage error, 130 interrupted (Ctrl-C).\n");
    char anchor[64];
    snprintf(anchor, sizeof anchor, "%s", spec->name);
    for (char *p = anchor; *p; p++)
        if (*p == ' ') *p = '-';
    fprintf(f, "Docs: docs/cli.md#varent-%s (every command: varent help)\n", anchor);
}

static const char conventions[] =
    "- `-h`/`--help` after any command prints its options, grouped, with their defaults; `varent help CMD` "
    "does the same, and `varent help --markdown` writes docs/cli.md.\n"
    "- Options are `-x VALUE`, `--name VALUE` or `--name=VALUE`; `--` ends the options. An option given "
    "twice: the last one wins (options marked *repeatable* add up instead).\n"
    "- A missing value, or a value that is itself an option (`-p -n 5`), is an error that says so; write "
    "`-p=-n` to pass such a value. Numbers are parsed strictly (range, no trailing characters) and every "
    "bad value names its flag.\n"
    "- `-m` is the model everywhere (a model directory; for `tokenize`, `detokenize` and `template` also a "
    "`tokenizer.json` or template file), `-t` the number of threads, `-n` the tokens to generate, `-p` the "
    "prompt, `-f` a text file, `-o` an output file, `-s` the seed.\n"
    "- The prompt of `run` and `agents`: `-p TEXT`, `-p -` (read stdin), `-f FILE`, or stdin when it is "
    "piped and no prompt is given. One trailing newline of stdin or a file is dropped, so "
    "`echo TEXT | varent run -m DIR` and `varent run -m DIR -p TEXT` give the same text.\n"
    "- `--system`, `--chat-template` and `--no-think` imply `--chat` (the prompt becomes a user turn in the "
    "model's chat template).\n"
    "- Sampling defaults, the same for `run`, `chat` and `serve` (for a request that omits a field): "
    "temperature " GEN_STR(GEN_DEFAULT_TEMP) ", top-k " GEN_STR(GEN_DEFAULT_TOP_K) " (off), top-p "
    GEN_STR(GEN_DEFAULT_TOP_P) ", min-p " GEN_STR(GEN_DEFAULT_MIN_P) " (off). `--temp 0` is greedy.\n"
    "- The seed is random (from the operating system) unless `--seed N` is given; `--seed -1` asks for a "
    "random one. The seed used is printed by `--stats` and written in every JSONL record, so any run can "
    "be repeated exactly.\n"
    "- Exit status: 0 done, 1 a runtime error (a file, the model, a write), 2 a usage error (an option or "
    "its value), 130 interrupted by Ctrl-C (what was finished is kept). Messages go to stderr and start "
    "with `varent CMD:`.\n"
    "- Threads: `-t` CPU threads share each step's work (OpenMP). Between a step's parallel regions they "
    "spin for about 30 us before they sleep (`GOMP_SPINCOUNT`, set as a time from the CPU's pause cost; "
    "`varent version` prints it): on an idle machine a shorter spin cost SmolLM2 decode 30%. On a machine "
    "whose cores are busy with other work, `GOMP_SPINCOUNT=1000` or `OMP_WAIT_POLICY=passive` (varent leaves "
    "either as set) gives the cores back sooner (docs/benchmarks.md).\n"
    "- llama.cpp's names work too: `-c/--ctx-size`, `-f/--file`, `-s/--seed`, `-b/--batch-size`, "
    "`-sys/--system-prompt`, `-r/--reverse-prompt`, `--ignore-eos`, `-cnv/-i` (the interactive chat), "
    "`--no-display-prompt`, `-v/--verbose`, `--temperature`, `--n-predict`.\n";

void cli_help_conventions(FILE *f) {
    for (const char *p = conventions; *p; p++)  // the terminal gets them without markdown's backticks
        if (*p != '`') fputc(*p, f);
}

// A markdown table cell: '|' escaped, as the table needs.
static void md_cell(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static void md_one(FILE *f, const cli_spec *spec) {
    fprintf(f, "## varent %s\n\n%s\n\n```\nvarent %s %s\n```\n", spec->name, spec->summary, spec->name, spec->usage);
    if (spec->about) fprintf(f, "\n%s\n", spec->about);
    const char *groups[40];
    int ng = groups_of(spec, groups);
    for (int g = 0; g < ng; g++) {
        int header = 0;
        for (const cli_opt *const *t = spec->tables; t && *t; t++)
            for (const cli_opt *o = *t; o->names; o++) {
                if (strcmp(o->group, groups[g])) continue;
                if (!header++) fprintf(f, "\n**%s**\n\n| option | default | |\n| --- | --- | --- |\n", groups[g]);
                char left[160];
                names_text(o, left, sizeof left);
                fputs("| `", f);
                md_cell(f, left);
                fputs("` | ", f);
                md_cell(f, o->def ? o->def : "");
                fputs(" | ", f);
                md_cell(f, o->help);
                if (o->flags & ARG_REPEAT) fputs(" (repeatable)", f);
                fputs(" |\n", f);
            }
    }
    fputc('\n', f);
}

void cli_help_markdown(FILE *f, const cli_spec *const *specs, int n) {
    fputs("# varent command line\n\n"
          "<!-- Generated by `varent help --markdown` (make cli-docs) from the option tables that the\n"
          "     parser reads; tests/py/test_cli_help.py checks that it is current. Do not edit by hand. -->\n\n"
          "## Conventions\n\n",
          f);
    fputs(conventions, f);
    fputs("\n| command | what it does |\n| --- | --- |\n", f);
    for (int i = 0; i < n; i++) fprintf(f, "| [`%s`](#varent-%s) | %s |\n", specs[i]->name, specs[i]->name, specs[i]->summary);
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        if (!specs[i]->subs) {
            md_one(f, specs[i]);
            continue;
        }
        fprintf(f, "## varent %s\n\n%s\n\n", specs[i]->name, specs[i]->summary);
        for (const cli_spec *const *s = specs[i]->subs; *s; s++) md_one(f, *s);
    }
}
