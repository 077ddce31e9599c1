// test_tokenizer.c: the tokenizer against published vectors (transformers.js ids for
// Llama 3 / Qwen3, llama.cpp's vocab tests), round trips, streaming decode
// and special tokens.
// Converter, malformed-input and speed-hazard tests live in test_tokenizer_misc.c.
#include "tests/c/check.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <utf8proc.h>

static const char *testdata, *testtmp;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

// Decompresses tests/data/tokenizers/NAME into $TESTTMP/tok-NAME/; returns the dir.
static const char *unpack(const char *name, char *dir, size_t cap) {
    char cmd[8192];
    snprintf(dir, cap, "%s/tok-%s", testtmp, name);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && xz -dc '%s/tokenizers/%s/tokenizer.json.xz' > '%s/tokenizer.json' && "
             "cp '%s/tokenizers/%s/tokenizer_config.json' '%s/'",
             dir, testdata, name, dir, testdata, name, dir);
    return system(cmd) == 0 ? dir : NULL;
}

static int utf8_valid(const char *s, int n) {
    utf8proc_int32_t cp;
    for (int i = 0; i < n;) {
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, n - i, &cp);
        if (l <= 0) return 0;
        i += (int)l;
    }
    return 1;
}

// Push ids one at a time: the chunks must be valid UTF-8 and add up to full decode.
static int stream_matches(const tokenizer *t, const int *ids, int n, const char *full) {
    tokenizer_stream *s = tokenizer_stream_new(t, 0);
    size_t cap = strlen(full) + 64, len = 0;
    char *acc = calloc(1, cap);
    int ok = s && acc;
    verr err;
    for (int i = 0; ok && i <= n; i++) {
        const char *out;
        int k = i < n ? tokenizer_stream_push(s, ids[i], &out, &err) : tokenizer_stream_flush(s, &out);
        if (k < 0 || len + (size_t)k >= cap || (i < n && !utf8_valid(out, k))) ok = 0;
        else memcpy(acc + len, out, (size_t)k), len += (size_t)k;
    }
    ok = ok && len == strlen(full) && memcmp(acc, full, len) == 0;
    tokenizer_stream_free(s);
    free(acc);
    return ok;
}

static int ids_equal(const int *a, int na, const cJSON *arr) {
    if (na != cJSON_GetArraySize(arr)) return 0;
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, arr) if (e->valueint != a[i++]) return 0;
    return 1;
}

static void test_vectors(const tokenizer *t, const char *name, int nfc) {
    char path[1024], cmd[1200], label[128];
    snprintf(path, sizeof path, "%s/vec-%s.jsonl", testtmp, name);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/tokenizers/vectors/%s.jsonl.xz' > '%s'", testdata, name, path);
    char *buf = system(cmd) == 0 ? slurp(path, NULL) : NULL;
    int cases = 0, bad = 0, bad_rt = 0, bad_stream = 0;
    char first_bad[600] = "";
    for (char *line = buf, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) nl = line + strlen(line) - 1;
        else *nl = 0;
        cJSON *j = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItem(j, "text"), *want = cJSON_GetObjectItem(j, "ids");
        if (!cJSON_IsString(text)) { cJSON_Delete(j); continue; }
        cases++;
        int *ids = NULL;
        verr err;
        int n = tokenizer_encode(t, text->valuestring, strlen(text->valuestring), 1, &ids, &err);
        if (n < 0 || !ids_equal(ids, n, want)) {
            if (!bad++) snprintf(first_bad, sizeof first_bad, "id %d: %.200s (got %d ids)",
                                 cJSON_GetObjectItem(j, "id")->valueint, line, n);
        }
        char *dec = n >= 0 ? tokenizer_decode(t, ids, n, 0, &err) : NULL;
        char *ref = nfc ? (char *)utf8proc_NFC((const utf8proc_uint8_t *)text->valuestring) : strdup(text->valuestring);
        if (!dec || !ref || strcmp(dec, ref)) bad_rt++;
        if (dec && !stream_matches(t, ids, n, dec)) bad_stream++;
        free(dec), free(ref), free(ids);
        cJSON_Delete(j);
    }
    free(buf);
    snprintf(label, sizeof label, "%s_vectors_%d_cases", name, cases);
    CHECK(cases >= 1000 && bad == 0, label, "%d of %d mismatch; first %s", bad, cases, first_bad);
    snprintf(label, sizeof label, "%s_roundtrip", name);
    CHECK(cases && bad_rt == 0, label, "%d of %d round trips differ", bad_rt, cases);
    snprintf(label, sizeof label, "%s_stream_decode", name);
    CHECK(cases && bad_stream == 0, label, "%d of %d streams differ from full decode", bad_stream, cases);
}

// llama.cpp's vocab tests: cases split by "\n__ggml_vocab_test__\n", one line of ids each.
static void test_llamacpp(const tokenizer *t, const char *vocab) {
    char p[1024], label[128];
    snprintf(p, sizeof p, "%s/tokenizers/vectors/ggml-vocab-%s.gguf.inp", testdata, vocab);
    char *inp = slurp(p, NULL);
    snprintf(p, sizeof p, "%s/tokenizers/vectors/ggml-vocab-%s.gguf.out", testdata, vocab);
    char *out = slurp(p, NULL);
    const char *sep = "\n__ggml_vocab_test__\n";
    int cases = 0, bad = 0;
    char why[300] = "missing data";
    char *ci = inp, *co = out;
    while (ci && co && *ci) {
        char *e = strstr(ci, sep), *eo = strchr(co, '\n');
        if (!e || !eo) break;
        *e = 0, *eo = 0;
        int *ids = NULL, want[4096], nw = 0;
        for (char *q = co; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int)v;
            q = end;
        }
        verr err;
        int n = tokenizer_encode(t, ci, strlen(ci), 1, &ids, &err);
        int same = n == nw && (n == 0 || memcmp(ids, want, (size_t)n * sizeof(int)) == 0);
        if (!same && !bad++) snprintf(why, sizeof why, "case %d \"%.80s\": got %d ids, want %d", cases, ci, n, nw);
        free(ids);
        cases++;
        ci = e + strlen(sep), co = eo + 1;
    }
    snprintf(label, sizeof label, "llamacpp_%s_%d_cases", vocab, cases);
    CHECK(cases > 10 && bad == 0, label, "%d mismatches; first %s", bad, why);
    free(inp), free(out);
}

static void test_model(const char *name, int nfc, const char *llamacpp) {
    char dir[1024];
    verr err = {{0}};
    if (!unpack(name, dir, sizeof dir)) {
        CHECK(0, name, "cannot unpack test data");
        return;
    }
    double t0 = now_ms();
    tokenizer *t = tokenizer_load(dir, &err);
    printf("# %s: load %.1f ms\n", name, now_ms() - t0);
    char label[128];
    snprintf(label, sizeof label, "%s_load", name);
    CHECK(t != NULL, label, "%s", err.msg);
    if (!t) return;
    test_vectors(t, name, nfc);
    test_llamacpp(t, llamacpp);
    int *ids = (int *)1;
    snprintf(label, sizeof label, "%s_empty_text", name);
    CHECK(tokenizer_encode(t, "", 0, 1, &ids, &err) == 0, label, "empty text gave ids");
    free(ids);
    int bad_id = tokenizer_vocab_size(t);
    char *s = tokenizer_decode(t, &bad_id, 1, 0, &err);
    snprintf(label, sizeof label, "%s_decode_out_of_range", name);
    CHECK(!s && strstr(err.msg, "out of range"), label, "decode of id %d did not fail", bad_id);
    free(s);
    tokenizer_free(t);
}

// Special tokens: parsed with parse_special=1, plain text with 0.
static void test_special(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tok-qwen3", testtmp);
    verr err;
    tokenizer *t = tokenizer_load(dir, &err);
    if (!t) return;
    const char *txt = "<|im_start|>user\nhi<|im_end|>";
    int *ids = NULL;
    int n = tokenizer_encode(t, txt, strlen(txt), 1, &ids, &err);
    // ids from the Qwen3 vocab: <|im_start|>=151644, "user"=872, "\n"=198, "hi"=6023, <|im_end|>=151645
    int want[] = {151644, 872, 198, 6023, 151645};
    CHECK(n == 5 && !memcmp(ids, want, sizeof want), "qwen3_special_tokens", "got %d ids", n);
    free(ids);
    n = tokenizer_encode(t, txt, strlen(txt), 0, &ids, &err);
    int has = 0;
    for (int i = 0; i < n; i++) has |= ids[i] >= 151643;
    CHECK(n > 5 && !has, "qwen3_no_parse_special", "special ids appeared with parse_special=0");
    free(ids);
    CHECK(tokenizer_eos_id(t) == 151645 && tokenizer_bos_id(t) == -1 && !tokenizer_add_bos(t) &&
          tokenizer_chat_template(t) && tokenizer_is_special(t, 151644),
          "qwen3_config", "eos %d bos %d", tokenizer_eos_id(t), tokenizer_bos_id(t));
    tokenizer_free(t);
}

int main(void) {
    testdata = getenv("TESTDATA") ? getenv("TESTDATA") : "tests/data";
    testtmp = getenv("TESTTMP") ? getenv("TESTTMP") : "tests/tmp";
    mkdir(testtmp, 0755);
    test_model("llama3", 0, "llama-bpe");
    test_model("qwen3", 1, "qwen2");
    test_special();
    CHECK_DONE();
}
