// tokenize.c: `varent tokenize` and `varent detokenize`.
#include "host/cli/args.h"
#include "host/cli/commands.h"
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

static char *read_all(FILE *f, const char *what, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n - 1, f);
        if (ferror(f)) {
            fprintf(stderr, "error: reading %s failed\n", what);
            free(b);
            return NULL;
        }
        if (feof(f)) break;
        char *g = n + 1 >= cap ? realloc(b, cap *= 2) : b;
        if (!g) free(b);
        b = g;
    }
    if (!b) {
        fprintf(stderr, "error: out of memory reading %s\n", what);
        return NULL;
    }
    b[n] = 0;
    *len = n;
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
        fprintf(stderr, "error: %s: %s\n", where, err.msg);
        return 1;
    }
    print_ids(ids, n);
    free(ids);
    return 0;
}

// One JSON object with a "text" string per line in, one id array per line out.
static int tokenize_jsonl(const tokenizer *t, int special) {
    size_t len;
    char *all = read_all(stdin, "stdin", &len);
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
            fprintf(stderr, "error: %s: not a JSON object with a \"text\" string\n", where);
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
        fprintf(stderr, "error: bench input %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *text = read_all(f, file, &len);
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
            fprintf(stderr, "error: %s\n", err.msg);
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

int cmd_tokenize(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    const char *path = args_str(&a, "-t|--tokenizer", NULL);
    int jsonl = args_flag(&a, "--jsonl"), no_special = args_flag(&a, "--no-special");
    int special = args_flag(&a, "--special");
    const char *bench = args_str(&a, "--bench", NULL);
    const char *text = args_pos(&a, 0);
    if (args_finish(&a, 1) < 0 || !path || (special && no_special)) {
        fprintf(stderr, "error: %s\nusage: varent tokenize -t TOKENIZER [--special|--no-special] "
                "[TEXT | --jsonl | --bench FILE]\n", a.err[0] ? a.err : "need -t TOKENIZER (tokenizer.json or model dir)");
        return 1;
    }
    special = !no_special;
    if (bench) return tokenize_bench(path, bench, special);
    verr err;
    tokenizer *t = tokenizer_load(path, &err);
    if (!t) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int rc;
    if (jsonl) rc = tokenize_jsonl(t, special);
    else if (text) rc = encode_print(t, text, strlen(text), special, "text");
    else {
        size_t len;
        char *in = read_all(stdin, "stdin", &len);
        rc = in ? encode_print(t, in, len, special, "stdin") : 1;
        free(in);
    }
    tokenizer_free(t);
    return rc;
}

// "1,2,3" or "[1, 2, 3]" -> ids.
static int parse_ids(const char *s, int **out) {
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
            fprintf(stderr, "error: ids: '%.20s' is not an integer (want e.g. 1,2,3)\n", s);
            free(ids);
            return -1;
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
    if (!ids) fprintf(stderr, "error: out of memory\n");
    *out = ids;
    return ids ? n : -1;
}

int cmd_detokenize(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    const char *path = args_str(&a, "-t|--tokenizer", NULL);
    int skip = args_flag(&a, "--skip-special");
    const char *list = args_pos(&a, 0);
    if (args_finish(&a, 1) < 0 || !path) {
        fprintf(stderr, "error: %s\nusage: varent detokenize -t TOKENIZER [--skip-special] [IDS, e.g. 1,2,3; "
                "default: stdin]\n", a.err[0] ? a.err : "need -t TOKENIZER");
        return 1;
    }
    char *in = NULL;
    size_t len;
    if (!list && !(list = in = read_all(stdin, "stdin", &len))) return 1;
    int *ids = NULL, n = parse_ids(list, &ids);
    free(in);
    if (n < 0) return 1;
    verr err;
    tokenizer *t = tokenizer_load(path, &err);
    char *text = t ? tokenizer_decode(t, ids, n, skip, &err) : NULL;
    free(ids);
    tokenizer_free(t);
    if (!text) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    fputs(text, stdout);
    putchar('\n');
    free(text);
    return 0;
}
