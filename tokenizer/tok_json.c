// tok_json.c: a fast scanner for tokenizer.json. model.vocab and model.merges (the
// bulk of an 11 MB file) are read straight into flat arrays; every other value is
// small and is handed to cJSON, so the rest of the loader keeps using cJSON trees.
#include "tokenizer/tok_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s, *p, *end;
    const char *path;
    verr *err;
} scan;

static int fail(scan *sc, const char *what) {
    return verr_set(sc->err, "%s: invalid JSON at byte offset %zu: %s (truncated or corrupt file?)", sc->path,
                    (size_t)(sc->p - sc->s), what);
}

static void ws(scan *sc) {
    while (sc->p < sc->end && (*sc->p == ' ' || *sc->p == '\n' || *sc->p == '\r' || *sc->p == '\t')) sc->p++;
}

static int expect(scan *sc, char c) {
    ws(sc);
    if (sc->p >= sc->end || *sc->p != c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        return fail(sc, what);
    }
    sc->p++;
    return 0;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

// Reads a string literal, unescaped and NUL-terminated, into the arena; *off is
// its offset.
static int read_string(scan *sc, tbuf *arena, uint32_t *off, size_t *len) {
    if (expect(sc, '"') < 0) return -1;
    *off = (uint32_t)arena->n;
    for (;;) {
        const char *q = sc->p;
        while (q < sc->end && *q != '"' && *q != '\\') q++;
        if (q >= sc->end) return fail(sc, "unterminated string");
        if (tbuf_put(arena, sc->p, (size_t)(q - sc->p)) < 0) return verr_set(sc->err, "%s: out of memory", sc->path);
        sc->p = q + 1;
        if (*q == '"') break;
        if (sc->p >= sc->end) return fail(sc, "unterminated escape");
        char c = *sc->p++, o[4];
        int n = 1;
        switch (c) {
        case 'n': o[0] = '\n'; break;
        case 't': o[0] = '\t'; break;
        case 'r': o[0] = '\r'; break;
        case 'b': o[0] = '\b'; break;
        case 'f': o[0] = '\f'; break;
        case '"': case '\\': case '/': o[0] = c; break;
        case 'u': {
            unsigned cp, lo;
            if (sc->end - sc->p < 4 || hex4(sc->p, &cp) < 0) return fail(sc, "bad \\u escape");
            sc->p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && sc->end - sc->p >= 6 && sc->p[0] == '\\' && sc->p[1] == 'u' &&
                hex4(sc->p + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                sc->p += 6;
            }
            n = tok_utf8_encode(cp, o);
            break;
        }
        default: return fail(sc, "bad escape");
        }
        if (tbuf_put(arena, o, (size_t)n) < 0) return verr_set(sc->err, "%s: out of memory", sc->path);
    }
    *len = arena->n - *off;
    if (tbuf_put(arena, "", 1) < 0) return verr_set(sc->err, "%s: out of memory", sc->path);  // the NUL
    return 0;
}

// Skips one JSON value, checking only bracket balance and string syntax.
static int skip_value(scan *sc) {
    int depth = 0;
    ws(sc);
    do {
        if (sc->p >= sc->end) return fail(sc, "unexpected end of file");
        char c = *sc->p++;
        if (c == '"') {
            while (sc->p < sc->end && *sc->p != '"') sc->p += *sc->p == '\\' ? 2 : 1;
            if (sc->p >= sc->end) return fail(sc, "unterminated string");
            sc->p++;
        } else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (--depth < 0) return fail(sc, "unbalanced bracket");
        } else if (depth == 0) {  // number or literal
            while (sc->p < sc->end && !strchr(",}] \t\r\n", *sc->p)) sc->p++;
        }
    } while (depth > 0);
    return 0;
}

// Parses one value with cJSON and attaches it to obj under key.
static int attach(scan *sc, cJSON *obj, const char *key) {
    ws(sc);
    const char *start = sc->p;
    if (skip_value(sc) < 0) return -1;
    cJSON *v = cJSON_ParseWithLength(start, (size_t)(sc->p - start));
    if (!v) {
        sc->p = start;
        return fail(sc, "malformed value");
    }
    cJSON_AddItemToObject(obj, key, v);
    return 0;
}

// Grows two parallel arrays of 4-byte elements together.
static int grow2(void **a, void **b, int *cap, int n) {
    if (n < *cap) return 0;
    int nc = *cap ? *cap * 2 : 1024;
    void *ga = realloc(*a, (size_t)nc * 4);
    if (!ga) return -1;
    *a = ga;
    void *gb = realloc(*b, (size_t)nc * 4);
    if (!gb) return -1;
    *b = gb;
    *cap = nc;
    return 0;
}

// A vocab id outside 0..TOK_MAX_ID-1: the JSON is fine, the id is not (the per-id
// tables are sized by the largest id).
static int bad_vocab_id(scan *sc, const char *token, const char *num_end) {
    int n = (int)(num_end - sc->p);
    return verr_set(sc->err, "%s: byte offset %zu: model.vocab[\"%.64s\"] = %.*s is not a token id: ids are 0..%d "
                    "(below 2^24 = %d, the largest vocabulary varent supports)", sc->path, (size_t)(sc->p - sc->s),
                    token, n > 40 ? 40 : n, sc->p, TOK_MAX_ID - 1, TOK_MAX_ID);
}

static int read_vocab(scan *sc, tok_json_model *m) {
    int cap = 0;
    if (expect(sc, '{') < 0) return -1;
    ws(sc);
    if (sc->p < sc->end && *sc->p == '}') return sc->p++, 0;
    for (;;) {
        uint32_t off;
        size_t len;
        if (read_string(sc, &m->arena, &off, &len) < 0 || expect(sc, ':') < 0) return -1;
        ws(sc);
        char *e;
        long id = strtol(sc->p, &e, 10);
        if (e == sc->p) return fail(sc, "model.vocab value is not a number");
        if (id < 0 || id >= TOK_MAX_ID) return bad_vocab_id(sc, m->arena.p + off, e);
        sc->p = e;
        if (grow2((void **)&m->voff, (void **)&m->vid, &cap, m->nv) < 0)
            return verr_set(sc->err, "%s: out of memory", sc->path);
        m->voff[m->nv] = off, m->vid[m->nv++] = (int)id;
        ws(sc);
        if (sc->p < sc->end && *sc->p == ',') sc->p++;
        else return expect(sc, '}');
    }
}

static int read_merges(scan *sc, tok_json_model *m) {
    int cap = 0;
    if (expect(sc, '[') < 0) return -1;
    ws(sc);
    if (sc->p < sc->end && *sc->p == ']') return sc->p++, 0;
    for (;;) {
        uint32_t a, b = UINT32_MAX;
        size_t la, lb;
        ws(sc);
        if (sc->p < sc->end && *sc->p == '[') {  // ["a", "b"]
            sc->p++;
            if (read_string(sc, &m->arena, &a, &la) < 0 || expect(sc, ',') < 0 ||
                read_string(sc, &m->arena, &b, &lb) < 0 || expect(sc, ']') < 0)
                return -1;
        } else if (read_string(sc, &m->arena, &a, &la) < 0) return -1;
        if (grow2((void **)&m->ma, (void **)&m->mb, &cap, m->nm) < 0)
            return verr_set(sc->err, "%s: out of memory", sc->path);
        m->ma[m->nm] = a, m->mb[m->nm++] = b;
        ws(sc);
        if (sc->p < sc->end && *sc->p == ',') sc->p++;
        else return expect(sc, ']');
    }
}

// Iterates "key": value pairs of an object, calling one(sc, key, ctx) per pair.
static int each_pair(scan *sc, tbuf *keys, int (*one)(scan *, const char *, void *), void *ctx) {
    if (expect(sc, '{') < 0) return -1;
    ws(sc);
    if (sc->p < sc->end && *sc->p == '}') return sc->p++, 0;
    for (;;) {
        uint32_t off;
        size_t len;
        keys->n = 0;
        if (read_string(sc, keys, &off, &len) < 0 || expect(sc, ':') < 0) return -1;
        if (one(sc, keys->p + off, ctx) < 0) return -1;
        ws(sc);
        if (sc->p < sc->end && *sc->p == ',') sc->p++;
        else return expect(sc, '}');
    }
}

typedef struct {
    cJSON *obj;
    tok_json_model *m;
    tbuf keys;
} pair_ctx;

static int model_pair(scan *sc, const char *key, void *ctx) {
    pair_ctx *c = ctx;
    if (!strcmp(key, "vocab")) {
        ws(sc);
        if (sc->p < sc->end && *sc->p == '{') return c->m->has_vocab = 1, read_vocab(sc, c->m);
    } else if (!strcmp(key, "merges")) {
        ws(sc);
        if (sc->p < sc->end && *sc->p == '[') return c->m->has_merges = 1, read_merges(sc, c->m);
    }
    return attach(sc, c->obj, key);
}

static int root_pair(scan *sc, const char *key, void *ctx) {
    pair_ctx *c = ctx;
    ws(sc);
    if (!strcmp(key, "model") && sc->p < sc->end && *sc->p == '{') {
        pair_ctx mc = {cJSON_CreateObject(), c->m, {0}};
        if (!mc.obj) return verr_set(sc->err, "%s: out of memory", sc->path);
        cJSON_AddItemToObject(c->obj, "model", mc.obj);
        int rc = each_pair(sc, &mc.keys, model_pair, &mc);
        free(mc.keys.p);
        return rc;
    }
    return attach(sc, c->obj, key);
}

cJSON *tok_json_parse(const char *buf, size_t len, tok_json_model *m, const char *path, verr *err) {
    scan sc = {buf, buf, buf + len, path, err};
    memset(m, 0, sizeof *m);
    pair_ctx c = {cJSON_CreateObject(), m, {0}};
    if (!c.obj) {
        verr_set(err, "%s: out of memory", path);
        return NULL;
    }
    int rc = each_pair(&sc, &c.keys, root_pair, &c);
    free(c.keys.p);
    if (rc == 0) {
        ws(&sc);
        if (sc.p != sc.end) rc = fail(&sc, "trailing data after the top-level object");
    }
    if (rc < 0) {
        cJSON_Delete(c.obj);
        tok_json_model_free(m);
        return NULL;
    }
    return c.obj;
}

void tok_json_model_free(tok_json_model *m) {
    free(m->arena.p);
    free(m->voff);
    free(m->vid);
    free(m->ma);
    free(m->mb);
    memset(m, 0, sizeof *m);
}
