// tok_load.c: reads tokenizer.json (+ tokenizer_config.json) into a tokenizer.
#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_json.h"
#include "tokenizer/tokenizer.h"
#include "host/util/fileio.h"
#include "host/util/json_in.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// Whole file into a NUL-terminated buffer; NULL (with err) if it cannot be read.
static char *read_file(const char *path, size_t *len, verr *err) {
    FILE *f = fileio_fopen_input(path, err);  // regular files only: a FIFO never blocks
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        *len = (size_t)n;
        fclose(f);
        return buf;
    }
    free(buf);
    fclose(f);
    verr_set(err, "%s: read failed", path);
    return NULL;
}

static cJSON *parse_json(const char *path, verr *err) {
    size_t len = 0;
    char *buf = read_file(path, &len, err);
    if (!buf) return NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) verr_set(err, "%s: invalid JSON at byte offset %zu of %zu (truncated or corrupt file?)", path,
                     end ? (size_t)(end - buf) : 0, len);
    free(buf);
    return j;
}

// Converts a byte-level vocab string ("Ġthe") to the raw bytes it stands for.
// Returns 0 if some character is outside the GPT-2 map (then out is left as is).
static int bytelevel_key(const tokenizer *t, const char *s, size_t n, tbuf *out) {
    out->n = 0;
    if (tbuf_reserve(out, n) < 0) return -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!l || cp >= 512 || t->cp_to_byte[cp] < 0) return 0;
        out->p[out->n++] = (char)t->cp_to_byte[cp];
        i += (size_t)l;
    }
    return 1;
}

// Id of a vocab string in the model's key space (bytes for byte-level), or -1.
static int model_id(const tokenizer *t, const char *s, size_t n, tbuf *tmp) {
    if (t->byte_level && bytelevel_key(t, s, n, tmp) == 1) return strmap_get(&t->vocab, tmp->p, tmp->n);
    return strmap_get(&t->vocab, s, n);
}

static int load_vocab(tokenizer *t, const tok_json_model *jm, const char *path, verr *err) {
    tbuf key = {0};
    if (strmap_init(&t->vocab, (uint32_t)jm->nv) < 0) return verr_set(err, "%s: out of memory", path);
    for (int i = 0; i < jm->nv; i++) {
        const char *s = t->arena + jm->voff[i];
        size_t n = strlen(s);
        int id = jm->vid[i];
        t->pieces[id] = s;
        int r = t->byte_level ? bytelevel_key(t, s, n, &key) : 0;
        if (r < 0 || (r == 1 ? strmap_put(&t->vocab, key.p, key.n, id) : strmap_put(&t->vocab, s, n, id)) < 0) {
            free(key.p);
            return verr_set(err, "%s: out of memory loading the vocab", path);
        }
    }
    free(key.p);
    return 0;
}

static int load_merges(tokenizer *t, const tok_json_model *jm, const char *path, verr *err) {
    tbuf tmp = {0}, cat = {0};
    if (pairmap_init(&t->merges, (uint32_t)jm->nm) < 0) return verr_set(err, "%s: out of memory", path);
    for (int rank = 0; rank < jm->nm; rank++) {
        const char *a = t->arena + jm->ma[rank], *b;
        size_t al, bl;
        if (jm->mb[rank] == UINT32_MAX) {  // "a b"
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                verr_set(err, "%s: model.merges[%d] \"%.60s\" is not two tokens separated by one space", path, rank, a);
                goto fail;
            }
            al = (size_t)(sp - a), b = sp + 1;
        } else {
            al = strlen(a), b = t->arena + jm->mb[rank];
        }
        bl = strlen(b);
        cat.n = 0;
        if (tbuf_put(&cat, a, al) < 0 || tbuf_put(&cat, b, bl) < 0) goto oom;
        int ia = model_id(t, a, al, &tmp), ib = model_id(t, b, bl, &tmp), io = model_id(t, cat.p, cat.n, &tmp);
        if (ia < 0 || ib < 0 || io < 0) {
            verr_set(err, "%s: model.merges[%d] (\"%.*s\" + \"%.40s\") uses a token missing from the vocab",
                     path, rank, (int)(al < 40 ? al : 40), a, b);
            goto fail;
        }
        if (pairmap_put(&t->merges, ia, ib, rank, io) < 0) goto oom;
    }
    free(tmp.p), free(cat.p);
    return 0;
oom:
    verr_set(err, "%s: out of memory loading merges", path);
fail:
    free(tmp.p), free(cat.p);
    return -1;
}

static int jbool(const cJSON *o, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k)); }

static int cmp_added(const void *x, const void *y) {
    const tok_added *a = x, *b = y;
    return a->len < b->len ? 1 : a->len > b->len ? -1 : 0;
}

static int load_added(tokenizer *t, const cJSON *arr, const char *path, verr *err) {
    int cnt = cJSON_GetArraySize(arr);
    if (!(t->added = calloc(cnt ? (size_t)cnt : 1, sizeof *t->added))) return verr_set(err, "%s: out of memory", path);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        int idv;
        if (json_in_int32(id, 0, TOK_MAX_ID - 1, &idv) || !cJSON_IsString(c) || !*c->valuestring)
            return verr_set(err, "%s: added_tokens[%d] needs an integer \"id\" and non-empty \"content\"", path, i);
        tok_added *a = &t->added[t->n_added++];
        if (!(a->text = strdup(c->valuestring))) return verr_set(err, "%s: out of memory", path);
        a->len = strlen(a->text);
        a->id = idv;
        a->special = jbool(e, "special"), a->lstrip = jbool(e, "lstrip"), a->rstrip = jbool(e, "rstrip");
        a->single_word = jbool(e, "single_word"), a->normalized = jbool(e, "normalized");
        if (a->id >= t->n_vocab) return verr_set(err, "%s: added_tokens[%d] id %d out of range", path, i, a->id);
        t->pieces[a->id] = a->text;
        t->special[a->id] = (unsigned char)a->special;
        t->added_first[(unsigned char)a->text[0]] |= (unsigned char)(a->normalized ? 2 : 1);
        i++;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    return 0;
}

static int load_model(tokenizer *t, const cJSON *root, tok_json_model *jm, const char *path, verr *err) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) return verr_set(err, "%s: missing \"model\" object", path);
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE"))
        return verr_set(err, "%s: unsupported model.type \"%s\" (only BPE)", path, type->valuestring);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *e;
    if (!jm->has_vocab) return verr_set(err, "%s: model.vocab is missing or not an object (is model.type BPE?)", path);
    if (cJSON_GetObjectItemCaseSensitive(model, "merges")) return verr_set(err, "%s: model.merges is not an array", path);
    if (added && !cJSON_IsArray(added)) return verr_set(err, "%s: added_tokens is not an array", path);
    int max = -1;
    for (int i = 0; i < jm->nv; i++) max = jm->vid[i] > max ? jm->vid[i] : max;
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsNumber(id) && id->valuedouble >= TOK_MAX_ID)
            return verr_set(err, "%s: added_tokens id %.0f is too large (max %d)", path, id->valuedouble, TOK_MAX_ID - 1);
        if (cJSON_IsNumber(id) && id->valueint > max) max = id->valueint;
    }
    t->n_vocab = max + 1;
    if (t->n_vocab <= 0) return verr_set(err, "%s: empty vocab", path);
    t->arena = jm->arena.p;  // the tokenizer keeps the strings; pieces point into them
    jm->arena.p = NULL;
    t->pieces = calloc((size_t)t->n_vocab, sizeof *t->pieces);
    t->special = calloc((size_t)t->n_vocab, 1);
    if (!t->pieces || !t->special) return verr_set(err, "%s: out of memory", path);
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    if (load_vocab(t, jm, path, err) < 0 || load_merges(t, jm, path, err) < 0) return -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = cJSON_IsString(unk) ? strmap_get(&t->vocab, unk->valuestring, strlen(unk->valuestring)) : -1;
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        char c = (char)b;
        t->byte_ids[b] = t->byte_level ? strmap_get(&t->vocab, &c, 1) : strmap_get(&t->vocab, hex, 6);
    }
    return added ? load_added(t, added, path, err) : 0;
}

// Components may be null; any other non-object is an error.
static int load_parts(tokenizer *t, const cJSON *root, const char *path, verr *err) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (cJSON_IsObject(n) && !(t->norm = tok_norm_parse(n, path, err))) return -1;
    if (cJSON_IsObject(p) && !(t->pre = tok_pre_parse(p, path, err))) return -1;
    if (cJSON_IsObject(d) && !(t->dec = tok_dec_parse(d, path, err))) return -1;
    t->byte_level = tok_pre_has_bytelevel(t->pre);
    return 0;
}

// First SpecialToken of a TemplateProcessing "single" template (searching Sequence).
static const char *template_bos(const cJSON *pp) {
    if (!cJSON_IsObject(pp)) return NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    if (!cJSON_IsString(type)) return NULL;
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            const char *s = template_bos(e);
            if (s) return s;
        }
        return NULL;
    }
    if (strcmp(type->valuestring, "TemplateProcessing")) return NULL;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 0), "SpecialToken");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "id");
    return cJSON_IsString(id) ? id->valuestring : NULL;
}

// bos_token/eos_token: a string or an AddedToken object with "content".
static int config_token(const tokenizer *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? tokenizer_token_id(t, v->valuestring) : -1;
}

static int load_config(tokenizer *t, const cJSON *root, const char *cfg_path, verr *err) {
    const char *tb = template_bos(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    t->bos_id = tb ? tokenizer_token_id(t, tb) : -1;
    t->add_bos = t->bos_id >= 0;
    t->eos_id = -1;
    struct stat sb;
    if (stat(cfg_path, &sb) != 0) return 0;  // optional; present but unreadable or invalid is an error
    cJSON *cfg = parse_json(cfg_path, err);
    if (!cfg) return -1;
    int bos = config_token(t, cfg, "bos_token");
    if (bos >= 0) t->bos_id = bos;
    t->eos_id = config_token(t, cfg, "eos_token");
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab) && t->bos_id >= 0;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
    if (cJSON_IsArray(ct)) {  // [{name, template}]: prefer "default"
        const cJSON *pick = NULL;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (!pick || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))) pick = e;
        }
        ct = cJSON_GetObjectItemCaseSensitive(pick, "template");
    }
    int rc = 0;
    if (cJSON_IsString(ct) && !(t->chat_template = strdup(ct->valuestring)))
        rc = verr_set(err, "%s: out of memory", cfg_path);
    cJSON_Delete(cfg);
    return rc;
}

// Splits path into the tokenizer.json and tokenizer_config.json paths.
static int resolve_paths(const char *path, char *json, char *cfg, size_t cap, verr *err) {
    struct stat st;
    if (stat(path, &st) != 0) return verr_set(err, "%s: no such tokenizer file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(json, cap, "%s/tokenizer.json", path);
        snprintf(cfg, cap, "%s/tokenizer_config.json", path);
        return 0;
    }
    snprintf(json, cap, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(cfg, cap, "%.*s/tokenizer_config.json", (int)(slash - path), path);
    else snprintf(cfg, cap, "tokenizer_config.json");
    return 0;
}

// buf: the tokenizer.json text, named json in messages; cfg: tokenizer_config.json's
// path, or NULL for none.
static tokenizer *load_text(const char *buf, size_t len, const char *json, const char *cfg, verr *err) {
    tok_json_model jm;
    cJSON *root = tok_json_parse(buf, len, &jm, json, err);
    if (!root) return NULL;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        tok_json_model_free(&jm);
        verr_set(err, "%s: out of memory", json);
        return NULL;
    }
    tok_bytemap_init(t->byte_to_cp, t->cp_to_byte);
    int rc = cJSON_IsObject(root) ? 0 : verr_set(err, "%s: top level is not a JSON object", json);
    if (rc == 0) rc = load_parts(t, root, json, err);
    if (rc == 0) rc = load_model(t, root, &jm, json, err);
    if (rc == 0 && cfg) rc = load_config(t, root, cfg, err);
    cJSON_Delete(root);
    tok_json_model_free(&jm);
    if (rc < 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

tokenizer *tokenizer_load(const char *path, verr *err) {
    char json[4096], cfg[4096];
    if (resolve_paths(path, json, cfg, sizeof json, err) < 0) return NULL;
    size_t len;
    char *buf = read_file(json, &len, err);
    if (!buf) return NULL;
    tokenizer *t = load_text(buf, len, json, cfg, err);
    free(buf);
    return t;
}

tokenizer *tokenizer_load_text(const char *text, size_t len, const char *name, verr *err) {
    return load_text(text, len, name, NULL, err);
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->pieces);
    free(t->arena);
    free(t->special);
    strmap_free(&t->vocab);
    pairmap_free(&t->merges);
    tok_norm_free(t->norm);
    tok_pre_free(t->pre);
    tok_dec_free(t->dec);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added);
    free(t->chat_template);
    free(t);
}

int tokenizer_token_id(const tokenizer *t, const char *piece) {
    size_t n = strlen(piece);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].text, piece, n)) return t->added[i].id;
    tbuf tmp = {0};
    int id = model_id(t, piece, n, &tmp);
    free(tmp.p);
    return id;
}
