// tokenize.c: `varent tokenize` and `varent detokenize`.
#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/formats/model_path.h"
#include "host/util/fileio.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Process CPU time: steadier than wall time on a shared machine.
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_all(const char *cmd, FILE *f, const char *what, size_t *len) {
    verr err = { { 0 } };
    char *b = fileio_read_stream(f, what, len, &err);
    if (!b) cli_error(cmd, "%s", err.msg);
    return b;
}

static void print_ids(const int *ids, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    puts("]");
}

static int encode_print(const tokenizer *t, const char *text, size_t len, int special, const char *where) {
    int *ids;
    verr err;
    int n = tokenizer_encode(t, text, len, special, &ids, &err);
    if (n < 0) {
        cli_error("tokenize", "%s: %s", where, err.msg);
        return 1;
    }
    print_ids(ids, n);
    free(ids);
    return 0;
}

// One JSON object with a "text" string per line in, one id array per line out.
static int tokenize_jsonl(const tokenizer *t, int special) {
    size_t len;
    char *all = read_all("tokenize", stdin, "stdin", &len);
    if (!all) return 1;
    int rc = 0, lineno = 0;
    for (char *line = all, *nl; rc == 0 && line < all + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(all + len - line));
        if (!nl) nl = all + len;
        *nl = 0;
        lineno++;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        char where[64];
        snprintf(where, sizeof where, "stdin line %d", lineno);
        if (!cJSON_IsString(text)) {
            cli_error("tokenize", "%s: not a JSON object with a \"text\" string", where);
            rc = 1;
        } else {
            rc = encode_print(t, text->valuestring, strlen(text->valuestring), special, where);
        }
        cJSON_Delete(j);
    }
    free(all);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Load time and encode throughput (median of 5 runs each) for FILE.
static int tokenize_bench(const char *tok_path, const char *file, int special) {
    verr err;
    FILE *f = fileio_fopen_input(file, &err);
    if (!f) {
        cli_error("tokenize", "--bench: %s", err.msg);
        return 1;
    }
    size_t len;
    char *text = read_all("tokenize", f, file, &len);
    fclose(f);
    if (!text) return 1;
    enum { RUNS = 5 };
    double load[RUNS], enc[RUNS], load_cpu[RUNS], enc_cpu[RUNS];
    int n = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s(), c0 = cpu_s();
        tokenizer *t = tokenizer_load(tok_path, &err);
        load[r] = now_s() - t0, load_cpu[r] = cpu_s() - c0;
        int *ids = NULL;
        t0 = now_s(), c0 = cpu_s();
        n = t ? tokenizer_encode(t, text, len, special, &ids, &err) : -1;
        enc[r] = now_s() - t0, enc_cpu[r] = cpu_s() - c0;
        free(ids);
        tokenizer_free(t);
        if (n < 0) {
            cli_error("tokenize", "%s", err.msg);
            free(text);
            return 1;
        }
    }
    qsort(load, RUNS, sizeof *load, cmp_double);
    qsort(enc, RUNS, sizeof *enc, cmp_double);
    qsort(load_cpu, RUNS, sizeof *load_cpu, cmp_double);
    qsort(enc_cpu, RUNS, sizeof *enc_cpu, cmp_double);
    printf("load %.1f ms wall, %.1f ms cpu (median of %d)\n", load[RUNS / 2] * 1e3, load_cpu[RUNS / 2] * 1e3, RUNS);
    printf("encode %zu bytes -> %d ids: %.1f ms wall, %.1f MB/s wall, %.1f MB/s cpu (median of %d, one thread)\n",
           len, n, enc[RUNS / 2] * 1e3, len / enc[RUNS / 2] / 1e6, len / enc_cpu[RUNS / 2] / 1e6, RUNS);
    free(text);
    return 0;
}

// -t used to name the tokenizer here; now it is --threads everywhere, and -m the model.
static const char *const tok_moved[] = { "-t", "-t is --threads everywhere; give the tokenizer with -m DIR|tokenizer.json",
                                         NULL, NULL };
static const cli_opt tok_model_opts[] = {
    { "-m|--model|--tokenizer", "PATH", "model", NULL, "a model directory or its tokenizer.json", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt tokenize_opts[] = {
    { "--special", NULL, "prompt", "on", "special-token text (<|im_start|>) becomes its id", 0 },
    { "--no-special", NULL, "prompt", NULL, "special-token text is plain text", 0 },
    { "--jsonl", NULL, "prompt", NULL, "stdin is JSONL with a \"text\" field per line; one id array per line out", 0 },
    { "--bench", "FILE", "output", NULL, "time loading and encoding FILE (median of 5) instead", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const tokenize_tables[] = { tok_model_opts, tokenize_opts, NULL };
const cli_spec cli_tokenize_spec = {
    "tokenize", "-m PATH [--special|--no-special] [TEXT | --jsonl | --bench FILE]",
    "Text to token ids, as a JSON array: TEXT, or stdin without it.", NULL, tokenize_tables, tok_moved, NULL,
};

static const cli_opt detokenize_opts[] = {
    { "--skip-special", NULL, "output", NULL, "leave special tokens (BOS, EOS, <|im_end|>) out of the text", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const detokenize_tables[] = { tok_model_opts, detokenize_opts, NULL };
const cli_spec cli_detokenize_spec = {
    "detokenize", "-m PATH [--skip-special] [IDS]",
    "Token ids (1,2,3 or [1, 2, 3]; stdin without IDS) to text.", NULL, detokenize_tables, tok_moved, NULL,
};

// -m: a model directory, a tokenizer.json, or a GGUF file (its metadata's tokenizer).
static tokenizer *load(const char *cmd, const char *path) {
    verr err;
    char dir[4096];
    int tmp;
    if (model_path_tokenizer(path, dir, sizeof dir, &tmp, &err)) {
        cli_error(cmd, "%s", err.msg);
        return NULL;
    }
    tokenizer *t = tokenizer_load(dir, &err);
    model_path_tokenizer_done(dir, tmp);
    if (!t) cli_error(cmd, "%s", err.msg);
    return t;
}

int cmd_tokenize(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_tokenize_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *path = args_str(&a, "-m", NULL);
    int jsonl = args_flag(&a, "--jsonl"), special = args_bool(&a, "--special", "--no-special", 1);
    const char *bench = args_str(&a, "--bench", NULL);
    if (args_finish(&a, 1)) return cli_usage_error("tokenize", "%s", a.err);
    const char *text = args_pos(&a, 0);
    if (!path) return cli_usage_error("tokenize", "missing -m PATH (a model directory or tokenizer.json)");
    if (!!jsonl + !!bench + !!text > 1) return cli_usage_error("tokenize", "give one input: TEXT, --jsonl or --bench FILE");
    if (bench) {
        char dir[4096];
        int tmp;
        verr err;
        if (model_path_tokenizer(path, dir, sizeof dir, &tmp, &err)) return cli_error("tokenize", "%s", err.msg);
        int rc = tokenize_bench(dir, bench, special);
        model_path_tokenizer_done(dir, tmp);
        return rc;
    }
    tokenizer *t = load("tokenize", path);
    if (!t) return 1;
    int rc;
    if (jsonl) rc = tokenize_jsonl(t, special);
    else if (text) rc = encode_print(t, text, strlen(text), special, "text");
    else {
        size_t len;
        char *in = read_all("tokenize", stdin, "stdin", &len);
        rc = in ? encode_print(t, in, len, special, "stdin") : 1;
        free(in);
    }
    tokenizer_free(t);
    return rc;
}

// "1,2,3" or "[1, 2, 3]" -> ids; after a message, -2 for a malformed list (a usage error
// when the ids were an argument, usage set) and -1 when out of memory.
static int parse_ids(const char *s, int **out, int usage) {
    int n = 0, cap = 64;
    int *ids = malloc((size_t)cap * sizeof *ids);
    while (ids && *s) {
        if (strchr("[], \t\r\n", *s)) {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) {
            if (usage) cli_usage_error("detokenize", "ids: '%.20s' is not an integer (want e.g. 1,2,3)", s);
            else cli_error("detokenize", "stdin: '%.20s' is not an integer (want ids, e.g. 1,2,3)", s);
            free(ids);
            return -2;
        }
        if (n == cap) {
            int *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) free(ids);
            ids = g;
            if (!ids) break;
        }
        ids[n++] = v < -1 || v > 0x7fffffff ? -1 : (int)v;
        s = end;
    }
    if (!ids) cli_error("detokenize", "out of memory");
    *out = ids;
    return ids ? n : -1;
}

int cmd_detokenize(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_detokenize_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *path = args_str(&a, "-m", NULL);
    int skip = args_flag(&a, "--skip-special");
    if (args_finish(&a, 1)) return cli_usage_error("detokenize", "%s", a.err);
    const char *list = args_pos(&a, 0);
    if (!path) return cli_usage_error("detokenize", "missing -m PATH (a model directory or tokenizer.json)");
    char *in = NULL;
    size_t len;
    if (!list && !(list = in = read_all("detokenize", stdin, "stdin", &len))) return 1;
    int from_arg = in == NULL, *ids = NULL, n = parse_ids(list, &ids, from_arg);
    free(in);
    if (n < 0) return n == -2 && from_arg ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
    verr err;
    tokenizer *t = load("detokenize", path);
    char *text = t ? tokenizer_decode(t, ids, n, skip, &err) : NULL;
    free(ids);
    if (t && !text) cli_error("detokenize", "%s", err.msg);
    tokenizer_free(t);
    if (!text) return 1;
    fputs(text, stdout);
    putchar('\n');
    free(text);
    return 0;
}
