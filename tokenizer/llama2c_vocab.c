// llama2c_vocab.c: llama2.c tokenizer.bin -> HF tokenizer.json (SentencePiece-style
// BPE with byte fallback). llama2.c merges the adjacent pair whose concatenation has
// the highest score; listing every (left, right) split of each token ordered by the
// token's score descending gives the same result under rank-based BPE.
#include "tokenizer/llama2c_vocab.h"

#include "host/util/fileio.h"
#include "host/util/outfile.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char **piece;   // [n] token text with ' ' replaced by U+2581
    float *score;   // [n]
    unsigned char *first;  // [n] 0 for a repeat of an earlier piece
    int n;
} l2c_vocab;

static void vocab_free(l2c_vocab *v) {
    for (int i = 0; v->piece && i < v->n; i++) free(v->piece[i]);
    free(v->piece);
    free(v->score);
    free(v->first);
}

// ' ' -> "▁" (llama2.c's export replaced the SentencePiece marker by real spaces).
static char *to_metaspace(const unsigned char *s, int len) {
    char *o = malloc((size_t)len * 3 + 1), *q = o;
    if (!o) return NULL;
    for (int i = 0; i < len; i++) {
        if (s[i] == ' ') memcpy(q, "\xe2\x96\x81", 3), q += 3;
        else *q++ = (char)s[i];
    }
    *q = 0;
    return o;
}

static int read_vocab(const char *path, int n, l2c_vocab *v, verr *err) {
    FILE *f = fileio_fopen_input(path, err);
    if (!f) return -1;
    int32_t maxlen;
    v->n = n;
    v->piece = calloc((size_t)n, sizeof *v->piece);
    v->score = calloc((size_t)n, sizeof *v->score);
    v->first = calloc((size_t)n, 1);
    unsigned char *buf = NULL;
    int rc = 0;
    if (!v->piece || !v->score || !v->first) rc = verr_set(err, "%s: out of memory", path);
    else if (fread(&maxlen, 4, 1, f) != 1 || maxlen <= 0 || maxlen > 1 << 20)
        rc = verr_set(err, "%s: bad or missing max_token_length header at offset 0", path);
    else if (!(buf = malloc((size_t)maxlen + 1))) rc = verr_set(err, "%s: out of memory", path);
    for (int i = 0; rc == 0 && i < n; i++) {
        long off = ftell(f);
        int32_t len;
        if (fread(&v->score[i], 4, 1, f) != 1 || fread(&len, 4, 1, f) != 1)
            rc = verr_set(err, "%s: truncated at token %d (offset %ld); expected %d tokens", path, i, off, n);
        else if (len < 0 || len > maxlen)
            rc = verr_set(err, "%s: token %d at offset %ld has length %d (max %d)", path, i, off, len, maxlen);
        else if (fread(buf, 1, (size_t)len, f) != (size_t)len)
            rc = verr_set(err, "%s: truncated inside token %d (offset %ld)", path, i, off);
        else if (!(v->piece[i] = i < 3 ? strdup(i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>")
                                       : to_metaspace(buf, len)))
            rc = verr_set(err, "%s: out of memory", path);
    }
    free(buf);
    fclose(f);
    return rc;
}

typedef struct {
    int tok, left, right;  // merged token and its two parts
    float score;           // of tok
} l2c_merge;

static int cmp_merge(const void *x, const void *y) {
    const l2c_merge *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->tok != b->tok) return a->tok - b->tok;
    return a->left - b->left;
}

static int is_byte_token(const char *p) { return strlen(p) == 6 && !strncmp(p, "<0x", 3) && p[5] == '>'; }

// Exact-match lookup; the vocabularies are small enough for a linear-probe table.
static int find_piece(const l2c_vocab *v, const int *table, int cap, const char *s, size_t len);

static unsigned hash_str(const char *s, size_t len) {
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int find_piece(const l2c_vocab *v, const int *table, int cap, const char *s, size_t len) {
    for (unsigned i = hash_str(s, len) & (unsigned)(cap - 1);; i = (i + 1) & (unsigned)(cap - 1)) {
        int id = table[i];
        if (id < 0) return -1;
        if (strlen(v->piece[id]) == len && !memcmp(v->piece[id], s, len)) return id;
    }
}

static int derive_merges(const l2c_vocab *v, l2c_merge **out, int *nout) {
    int cap = 16;
    while (cap < v->n * 2) cap <<= 1;
    int *table = malloc((size_t)cap * sizeof *table), n = 0, mcap = 256;
    l2c_merge *m = malloc((size_t)mcap * sizeof *m);
    if (!table || !m) goto oom;
    for (int i = 0; i < cap; i++) table[i] = -1;
    for (int id = 0; id < v->n; id++) {
        size_t len = strlen(v->piece[id]);
        unsigned i = hash_str(v->piece[id], len) & (unsigned)(cap - 1);
        while (table[i] >= 0) i = (i + 1) & (unsigned)(cap - 1);
        if (find_piece(v, table, cap, v->piece[id], len) < 0) table[i] = id;  // first id wins
    }
    for (int id = 3; id < v->n; id++) {
        const char *p = v->piece[id];
        size_t len = strlen(p);
        if (is_byte_token(p)) continue;
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)p[k] & 0xC0) == 0x80) continue;  // split on character boundaries
            int l = find_piece(v, table, cap, p, k), r = find_piece(v, table, cap, p + k, len - k);
            if (l < 3 || r < 3 || is_byte_token(v->piece[l]) || is_byte_token(v->piece[r])) continue;
            if (n == mcap) {
                l2c_merge *g = realloc(m, (size_t)(mcap *= 2) * sizeof *m);
                if (!g) goto oom;
                m = g;
            }
            m[n++] = (l2c_merge){id, l, r, v->score[id]};
        }
    }
    qsort(m, (size_t)n, sizeof *m, cmp_merge);
    // Duplicate pieces keep their first id only, as a JSON object cannot repeat keys.
    for (int id = 0; id < v->n; id++) v->first[id] = find_piece(v, table, cap, v->piece[id], strlen(v->piece[id])) == id;
    free(table);
    *out = m, *nout = n;
    return 0;
oom:
    free(table), free(m);
    return -1;
}

static cJSON *obj_type(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *replace_obj(const char *type, const char *from, const char *to) {
    cJSON *o = obj_type(type), *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(pat, "String", from);
    cJSON_AddItemToObject(o, "pattern", pat);
    cJSON_AddStringToObject(o, "content", to);
    return o;
}

// One template item: {"SpecialToken"|"Sequence": {"id": ID, "type_id": TYPE}}.
static cJSON *template_item(const char *kind, const char *id, int type_id) {
    cJSON *o = cJSON_CreateObject(), *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "id", id);
    cJSON_AddNumberToObject(in, "type_id", type_id);
    cJSON_AddItemToObject(o, kind, in);
    return o;
}

// TemplateProcessing that prepends BOS, as the Llama 2 tokenizer.json on the HF hub does:
// HF's tokenizers (transformers 5 reads tokenizer.json alone) add BOS only through it,
// whatever add_bos_token says.
static cJSON *bos_template(const char *bos) {
    cJSON *pp = obj_type("TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(pp, "single"), *pair = cJSON_AddArrayToObject(pp, "pair");
    cJSON_AddItemToArray(single, template_item("SpecialToken", bos, 0));
    cJSON_AddItemToArray(single, template_item("Sequence", "A", 0));
    cJSON_AddItemToArray(pair, template_item("SpecialToken", bos, 0));
    cJSON_AddItemToArray(pair, template_item("Sequence", "A", 0));
    cJSON_AddItemToArray(pair, template_item("SpecialToken", bos, 1));
    cJSON_AddItemToArray(pair, template_item("Sequence", "B", 1));
    cJSON *st = cJSON_AddObjectToObject(pp, "special_tokens"), *tok = cJSON_AddObjectToObject(st, bos);
    cJSON_AddStringToObject(tok, "id", bos);
    cJSON_AddItemToObject(tok, "ids", cJSON_CreateIntArray((const int[]){ 1 }, 1));
    cJSON_AddItemToObject(tok, "tokens", cJSON_CreateStringArray(&bos, 1));
    return pp;
}

static cJSON *build_json(const l2c_vocab *v, const l2c_merge *m, int nm) {
    cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddStringToObject(root, "version", "1.0");
    for (int i = 0; i < 3 && i < v->n; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddStringToObject(a, "content", v->piece[i]);
        cJSON_AddBoolToObject(a, "single_word", 0), cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0), cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON *norm = obj_type("Sequence"), *nl = cJSON_AddArrayToObject(norm, "normalizers");
    cJSON *pre = obj_type("Prepend");
    cJSON_AddStringToObject(pre, "prepend", "\xe2\x96\x81");
    cJSON_AddItemToArray(nl, pre);
    cJSON_AddItemToArray(nl, replace_obj("Replace", " ", "\xe2\x96\x81"));
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON_AddNullToObject(root, "pre_tokenizer");
    cJSON_AddItemToObject(root, "post_processor", bos_template(v->piece[1]));  // llama2.c's BOS is id 1
    cJSON *dec = obj_type("Sequence"), *dl = cJSON_AddArrayToObject(dec, "decoders");
    cJSON_AddItemToArray(dl, replace_obj("Replace", "\xe2\x96\x81", " "));
    cJSON_AddItemToArray(dl, obj_type("ByteFallback"));
    cJSON_AddItemToArray(dl, obj_type("Fuse"));
    cJSON *strip = obj_type("Strip");
    cJSON_AddStringToObject(strip, "content", " ");
    cJSON_AddNumberToObject(strip, "start", 1), cJSON_AddNumberToObject(strip, "stop", 0);
    cJSON_AddItemToArray(dl, strip);
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON *model = obj_type("BPE"), *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    cJSON_AddStringToObject(model, "unk_token", v->piece[0]);
    cJSON_AddBoolToObject(model, "fuse_unk", 1), cJSON_AddBoolToObject(model, "byte_fallback", 1);
    for (int i = 0; i < v->n; i++)
        if (v->first[i]) cJSON_AddNumberToObject(vocab, v->piece[i], i);
    for (int i = 0; i < nm; i++) {
        const char *pair[2] = {v->piece[m[i].left], v->piece[m[i].right]};
        cJSON_AddItemToArray(merges, cJSON_CreateStringArray(pair, 2));
    }
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    return root;
}

static const char config_json[] =
    "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n  \"bos_token\": \"<s>\",\n"
    "  \"eos_token\": \"</s>\",\n  \"unk_token\": \"<unk>\",\n  \"tokenizer_class\": \"LlamaTokenizer\"\n}\n";

const char *llama2c_vocab_config_json(void) { return config_json; }

int llama2c_vocab_build_json(const char *tok_bin_path, int vocab_size, char **json, verr *err) {
    *json = NULL;
    if (vocab_size < 3) return verr_set(err, "%s: vocab_size %d is too small", tok_bin_path, vocab_size);
    l2c_vocab v = {0};
    l2c_merge *m = NULL;
    int nm = 0, rc = read_vocab(tok_bin_path, vocab_size, &v, err);
    if (rc == 0 && derive_merges(&v, &m, &nm) < 0) rc = verr_set(err, "%s: out of memory", tok_bin_path);
    cJSON *root = rc == 0 ? build_json(&v, m, nm) : NULL;
    if (rc == 0 && !(*json = root ? cJSON_Print(root) : NULL))
        rc = verr_set(err, "%s: out of memory building tokenizer.json", tok_bin_path);
    cJSON_Delete(root);
    free(m);
    vocab_free(&v);
    return rc;
}

int llama2c_vocab_to_tokenizer_json(const char *tok_bin_path, int vocab_size, const char *out_dir, verr *err) {
    char *text;
    if (llama2c_vocab_build_json(tok_bin_path, vocab_size, &text, err)) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    int rc = outfile_write_all(path, text, strlen(text), err);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    if (rc == 0) rc = outfile_write_all(path, config_json, strlen(config_json), err);
    free(text);
    return rc;
}
