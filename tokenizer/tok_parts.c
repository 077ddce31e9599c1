// tok_parts.c: builds the normalizer, pre-tokenizer and decoder trees from the
// tokenizer.json objects. Unknown types are errors, never silently ignored.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"

#include "host/util/json_in.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static char *dupn(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    if (len) *len = n;
    return d;
}

// A Replace/Split "pattern": {"String": s} or {"Regex": r}; sets *is_regex.
static const char *pattern_of(const cJSON *o, int *is_regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s = jstr(p, "String");
    *is_regex = 0;
    if (s) return s;
    *is_regex = 1;
    return jstr(p, "Regex");
}

// ---------------- normalizers ----------------
static int norm_fill(tok_norm *n, const cJSON *o, const char *path, verr *err);

static int norm_seq(tok_norm *n, const cJSON *arr, const char *path, verr *err) {
    n->kind = NORM_SEQUENCE;
    int cnt = cJSON_GetArraySize(arr);
    n->seq = calloc(cnt ? (size_t)cnt : 1, sizeof *n->seq);
    if (!n->seq) return verr_set(err, "%s: out of memory", path);
    for (int i = 0; i < cnt; i++) {
        n->nseq = i + 1;
        if (norm_fill(&n->seq[i], cJSON_GetArrayItem(arr, i), path, err) < 0) return -1;
    }
    return 0;
}

static int norm_fill(tok_norm *n, const cJSON *o, const char *path, verr *err) {
    const char *type = jstr(o, "type");
    if (!type) return verr_set(err, "%s: normalizer without a \"type\"", path);
    if (!strcmp(type, "NFC")) {
        n->kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(o, "prepend");
        if (!p) return verr_set(err, "%s: normalizer Prepend needs \"prepend\"", path);
        n->kind = NORM_PREPEND;
        if (!(n->a = dupn(p, &n->alen))) return verr_set(err, "%s: out of memory", path);
    } else if (!strcmp(type, "Replace")) {
        int re;
        const char *pat = pattern_of(o, &re), *content = jstr(o, "content");
        if (!pat || re || !content)
            return verr_set(err, "%s: normalizer Replace needs a String pattern and \"content\"", path);
        n->kind = NORM_REPLACE;
        if (!(n->a = dupn(pat, &n->alen)) || !(n->b = dupn(content, &n->blen)))
            return verr_set(err, "%s: out of memory", path);
        if (!n->alen) return verr_set(err, "%s: normalizer Replace has an empty pattern", path);
    } else if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        if (!cJSON_IsArray(arr)) return verr_set(err, "%s: normalizer Sequence needs \"normalizers\"", path);
        return norm_seq(n, arr, path, err);
    } else {
        return verr_set(err, "%s: unsupported normalizer type \"%s\" (supported: NFC, Prepend, "
                        "Replace, Sequence)", path, type);
    }
    return 0;
}

tok_norm *tok_norm_parse(const void *json, const char *path, verr *err) {
    tok_norm *n = calloc(1, sizeof *n);
    if (!n) {
        verr_set(err, "%s: out of memory", path);
        return NULL;
    }
    if (norm_fill(n, json, path, err) < 0) {
        tok_norm_free(n);
        return NULL;
    }
    return n;
}

static void norm_clear(tok_norm *n) {
    free(n->a);
    free(n->b);
    for (int i = 0; i < n->nseq; i++) norm_clear(&n->seq[i]);
    free(n->seq);
}

void tok_norm_free(tok_norm *n) {
    if (!n) return;
    norm_clear(n);
    free(n);
}

// ---------------- pre-tokenizers ----------------
// GPT-2's pattern, used by ByteLevel when use_regex is true.
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void *regex_compile(const char *pat, int literal, const char *path, verr *err) {
    int ec;
    PCRE2_SIZE eoff;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opt, &ec, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        verr_set(err, "%s: pre_tokenizer regex rejected at offset %zu: %s (pattern \"%.80s\")", path,
                 (size_t)eoff, (char *)msg, pat);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    return re;
}

static int pre_fill(tok_pre *p, const cJSON *o, const char *path, verr *err);

static int pre_split(tok_pre *p, const cJSON *o, const char *path, verr *err) {
    int re;
    const char *pat = pattern_of(o, &re), *beh = jstr(o, "behavior");
    if (!pat) return verr_set(err, "%s: pre_tokenizer Split needs a \"pattern\"", path);
    p->kind = PRE_SPLIT;
    p->invert = jbool(o, "invert", 0);
    if (!beh || !strcmp(beh, "Isolated")) p->behavior = SPLIT_ISOLATED;
    else if (!strcmp(beh, "Removed")) p->behavior = SPLIT_REMOVED;
    else if (!strcmp(beh, "MergedWithPrevious")) p->behavior = SPLIT_PREV;
    else if (!strcmp(beh, "MergedWithNext")) p->behavior = SPLIT_NEXT;
    else if (!strcmp(beh, "Contiguous")) p->behavior = SPLIT_CONTIGUOUS;
    else return verr_set(err, "%s: pre_tokenizer Split has unknown behavior \"%s\"", path, beh);
    p->re = regex_compile(pat, !re, path, err);
    return p->re ? 0 : -1;
}

static int prepend_scheme(const cJSON *o) {
    const char *s = jstr(o, "prepend_scheme");
    if (s) return !strcmp(s, "always") ? 1 : !strcmp(s, "first") ? 2 : 0;
    return jbool(o, "add_prefix_space", 1);
}

static int pre_fill(tok_pre *p, const cJSON *o, const char *path, verr *err) {
    const char *type = jstr(o, "type");
    if (!type) return verr_set(err, "%s: pre_tokenizer without a \"type\"", path);
    if (!strcmp(type, "Split")) return pre_split(p, o, path, err);
    if (!strcmp(type, "ByteLevel")) {
        p->kind = PRE_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", 1);
        if (jbool(o, "use_regex", 1) && !(p->re = regex_compile(gpt2_pattern, 0, path, err))) return -1;
    } else if (!strcmp(type, "Digits")) {
        p->kind = PRE_DIGITS;
        p->individual_digits = jbool(o, "individual_digits", 0);
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(o, "replacement");
        p->kind = PRE_METASPACE;
        snprintf(p->repl, sizeof p->repl, "%s", r ? r : "\xe2\x96\x81");
        p->prepend = prepend_scheme(o);
        p->split = jbool(o, "split", 1);
    } else if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        if (!cJSON_IsArray(arr)) return verr_set(err, "%s: pre_tokenizer Sequence needs \"pretokenizers\"", path);
        int cnt = cJSON_GetArraySize(arr);
        p->kind = PRE_SEQUENCE;
        if (!(p->seq = calloc(cnt ? (size_t)cnt : 1, sizeof *p->seq))) return verr_set(err, "%s: out of memory", path);
        for (int i = 0; i < cnt; i++) {
            p->nseq = i + 1;
            if (pre_fill(&p->seq[i], cJSON_GetArrayItem(arr, i), path, err) < 0) return -1;
        }
    } else {
        return verr_set(err, "%s: unsupported pre_tokenizer type \"%s\" (supported: Split, ByteLevel, "
                        "Digits, Metaspace, Sequence)", path, type);
    }
    return 0;
}

tok_pre *tok_pre_parse(const void *json, const char *path, verr *err) {
    tok_pre *p = calloc(1, sizeof *p);
    if (!p) {
        verr_set(err, "%s: out of memory", path);
        return NULL;
    }
    if (pre_fill(p, json, path, err) < 0) {
        tok_pre_free(p);
        return NULL;
    }
    return p;
}

static void pre_clear(tok_pre *p) {
    if (p->re) pcre2_code_free(p->re);
    for (int i = 0; i < p->nseq; i++) pre_clear(&p->seq[i]);
    free(p->seq);
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    pre_clear(p);
    free(p);
}

int tok_pre_has_bytelevel(const tok_pre *p) {
    if (!p) return 0;
    if (p->kind == PRE_BYTELEVEL) return 1;
    for (int i = 0; i < p->nseq; i++)
        if (tok_pre_has_bytelevel(&p->seq[i])) return 1;
    return 0;
}

// ---------------- decoders ----------------
static int dec_fill(tok_dec *d, const cJSON *o, const char *path, verr *err) {
    const char *type = jstr(o, "type");
    if (!type) return verr_set(err, "%s: decoder without a \"type\"", path);
    if (!strcmp(type, "ByteLevel")) d->kind = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = DEC_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(o, "replacement");
        d->kind = DEC_METASPACE;
        if (!(d->a = dupn(r ? r : "\xe2\x96\x81", &d->alen))) return verr_set(err, "%s: out of memory", path);
        d->prepend = prepend_scheme(o) != 0;
    } else if (!strcmp(type, "Replace")) {
        int re;
        const char *pat = pattern_of(o, &re), *content = jstr(o, "content");
        if (!pat || re || !content || !*pat)
            return verr_set(err, "%s: decoder Replace needs a non-empty String pattern and \"content\"", path);
        d->kind = DEC_REPLACE;
        if (!(d->a = dupn(pat, &d->alen)) || !(d->b = dupn(content, &d->blen)))
            return verr_set(err, "%s: out of memory", path);
    } else if (!strcmp(type, "Strip")) {
        const char *c = jstr(o, "content");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "start");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "stop");
        d->kind = DEC_STRIP;
        if (!(d->a = dupn(c ? c : " ", &d->alen))) return verr_set(err, "%s: out of memory", path);
        d->strip_start = d->strip_stop = 0;
        if ((st && json_in_int32(st, 0, 1 << 20, &d->strip_start)) || (sp && json_in_int32(sp, 0, 1 << 20, &d->strip_stop)))
            return verr_set(err, "%s: decoder Strip: \"start\" and \"stop\" must be counts (integers 0..%d)", path,
                            1 << 20);
    } else if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        if (!cJSON_IsArray(arr)) return verr_set(err, "%s: decoder Sequence needs \"decoders\"", path);
        int cnt = cJSON_GetArraySize(arr);
        d->kind = DEC_SEQUENCE;
        if (!(d->seq = calloc(cnt ? (size_t)cnt : 1, sizeof *d->seq))) return verr_set(err, "%s: out of memory", path);
        for (int i = 0; i < cnt; i++) {
            d->nseq = i + 1;
            if (dec_fill(&d->seq[i], cJSON_GetArrayItem(arr, i), path, err) < 0) return -1;
        }
    } else {
        return verr_set(err, "%s: unsupported decoder type \"%s\" (supported: ByteLevel, ByteFallback, "
                        "Metaspace, Replace, Fuse, Strip, Sequence)", path, type);
    }
    return 0;
}

tok_dec *tok_dec_parse(const void *json, const char *path, verr *err) {
    tok_dec *d = calloc(1, sizeof *d);
    if (!d) {
        verr_set(err, "%s: out of memory", path);
        return NULL;
    }
    if (dec_fill(d, json, path, err) < 0) {
        tok_dec_free(d);
        return NULL;
    }
    return d;
}

static void dec_clear(tok_dec *d) {
    free(d->a);
    free(d->b);
    for (int i = 0; i < d->nseq; i++) dec_clear(&d->seq[i]);
    free(d->seq);
}

void tok_dec_free(tok_dec *d) {
    if (!d) return;
    dec_clear(d);
    free(d);
}
