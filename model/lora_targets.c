// lora_targets.c: see lora_targets.h.
#include "model/lora_targets.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const projections[] = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj" };
#define N_PROJ ((int)(sizeof projections / sizeof *projections))

static int cfg_err(const char *path, const char *key, const char *why, verr *err) {
    return verr_set(err, "%s: '%s' %s", path, key, why);
}

// re.fullmatch: anchored at both ends, the pattern's alternatives tried until one spans it all.
static int re_full(void *re, const char *s) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return 0;
    int rc = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

// The list form: name equals an entry or ends in "." + entry.
static int in_list(const cJSON *list, const char *name) {
    size_t n = strlen(name);
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        size_t k = strlen(e->valuestring);
        if (!strcmp(name, e->valuestring) || (k < n && name[n - k - 1] == '.' && !strcmp(name + n - k, e->valuestring)))
            return 1;
    }
    return 0;
}

// A string (a regular expression, compiled into *re) or a list of strings; absent or null: 0.
static int read_form(const cJSON *v, const char *path, const char *key, void **re, verr *err) {
    *re = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        int code;
        PCRE2_SIZE at;
        *re = pcre2_compile((PCRE2_SPTR)v->valuestring, PCRE2_ZERO_TERMINATED, 0, &code, &at, NULL);
        if (*re) return 0;
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        char why[400];
        snprintf(why, sizeof why, "is the regular expression '%.120s' (PEFT's string form), which does not compile "
                 "at offset %zu: %s", v->valuestring, (size_t)at, (const char *)msg);
        return cfg_err(path, key, why, err);
    }
    if (!cJSON_IsArray(v)) return cfg_err(path, key, "must be a list of module names or a regular expression", err);
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++)
        if (!cJSON_IsString(e)) {
            char why[96];
            snprintf(why, sizeof why, "entry %d is not a string (a module name)", i);
            return cfg_err(path, key, why, err);
        }
    return 0;
}

// The list form names only projections ("q_proj", "self_attn.q_proj", ...): PEFT's
// embedding and lm_head adapters, and names of other architectures, are refused.
static int check_list(const cJSON *list, const char *path, verr *err) {
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const char *last = strrchr(e->valuestring, '.');
        last = last ? last + 1 : e->valuestring;
        int p = 0;
        while (p < N_PROJ && strcmp(last, projections[p])) p++;
        if (p < N_PROJ) continue;
        char why[256];
        snprintf(why, sizeof why, "names '%.80s': only q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and "
                 "down_proj can be adapted (embedding and lm_head adapters are not supported)", e->valuestring);
        return cfg_err(path, "target_modules", why, err);
    }
    return 0;
}

static int read_layers(lora_targets *t, const cJSON *config, const char *path, verr *err) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(config, "layers_to_transform");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(config, "layers_pattern");
    if (l && !cJSON_IsNull(l) && !(cJSON_IsArray(l) && !l->child)) {
        int ok = cJSON_IsNumber(l) || cJSON_IsArray(l);
        const cJSON *e;
        cJSON_ArrayForEach(e, l) ok &= cJSON_IsNumber(e);
        if (!ok) return cfg_err(path, "layers_to_transform", "must be a layer index or a list of them", err);
        t->layers = l;
    }
    if (p && !cJSON_IsNull(p) && !(cJSON_IsString(p) && !p->valuestring[0]) && !(cJSON_IsArray(p) && !p->child)) {
        int ok = cJSON_IsString(p) || cJSON_IsArray(p);
        const cJSON *e;
        cJSON_ArrayForEach(e, p) ok &= cJSON_IsString(e);
        if (!ok) return cfg_err(path, "layers_pattern", "must be a name or a list of names", err);
        t->pattern = p;
        if (!l || cJSON_IsNull(l)) return cfg_err(path, "layers_pattern", "needs layers_to_transform", err);
    }
    return 0;
}

int lora_targets_read(lora_targets *t, const cJSON *config, const char *path, verr *err) {
    memset(t, 0, sizeof *t);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(config, "target_modules");
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(config, "exclude_modules");
    if (cJSON_IsString(tm) && !strcasecmp(tm->valuestring, "all-linear")) {
        t->all = 1;  // PEFT: every linear layer but the output layer
    } else {
        if (read_form(tm, path, "target_modules", &t->target_re, err)) return -1;
        if (cJSON_IsArray(tm) && check_list(tm, path, err)) return lora_targets_free(t), -1;
        t->targets = tm && !cJSON_IsNull(tm) ? tm : NULL;
        t->all = !t->targets;
    }
    if (t->target_re && (re_full(t->target_re, "model.embed_tokens") || re_full(t->target_re, "lm_head"))) {
        lora_targets_free(t);
        return cfg_err(path, "target_modules", "matches the embedding or lm_head: only q/k/v/o/gate/up/down "
                       "projections can be adapted", err);
    }
    if (read_form(ex, path, "exclude_modules", &t->exclude_re, err)) return lora_targets_free(t), -1;
    t->exclude = ex && !cJSON_IsNull(ex) ? ex : NULL;
    static const char *const layer_keys[] = { "layers_to_transform", "layers_pattern" };
    for (int k = 0; k < 2; k++) {  // as PEFT's LoraConfig refuses them
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, layer_keys[k]);
        if (cJSON_IsString(tm) && v && !cJSON_IsNull(v))
            return lora_targets_free(t), cfg_err(path, layer_keys[k], "cannot be used when target_modules is a string "
                                                 "(a regular expression); PEFT refuses it too", err);
    }
    if (read_layers(t, config, path, err)) return lora_targets_free(t), -1;
    return 0;
}

// The layer index PEFT reads from a module name: the first number after "<x>." (or
// after one of layers_pattern's names), -1 when there is none.
static long layer_index(const lora_targets *t, const char *name) {
    for (const char *dot = strchr(name, '.'); dot; dot = strchr(dot + 1, '.')) {
        const char *comp = dot + 1, *end = strchr(comp, '.');
        if (!end || comp[0] < '0' || comp[0] > '9' || strspn(comp, "0123456789") != (size_t)(end - comp)) continue;
        const char *prev = dot;  // the component before the number
        while (prev > name && prev[-1] != '.') prev--;
        size_t plen = (size_t)(dot - prev);
        if (prev == name) continue;  // PEFT's ".*?\.NAME\.(\d+)\." wants a component before NAME
        int ok = !t->pattern;
        if (cJSON_IsString(t->pattern)) ok = strlen(t->pattern->valuestring) == plen && !strncmp(prev, t->pattern->valuestring, plen);
        const cJSON *e;
        if (cJSON_IsArray(t->pattern))
            cJSON_ArrayForEach(e, t->pattern) ok |= strlen(e->valuestring) == plen && !strncmp(prev, e->valuestring, plen);
        if (ok) return strtol(comp, NULL, 10);
    }
    return -1;
}

static int layer_listed(const cJSON *layers, long l) {
    if (cJSON_IsNumber(layers)) return layers->valuedouble == (double)l;
    const cJSON *e;
    cJSON_ArrayForEach(e, layers) if (e->valuedouble == (double)l) return 1;
    return 0;
}

int lora_targets_match(const lora_targets *t, const char *module, const char **why) {
    if (t->exclude && (t->exclude_re ? re_full(t->exclude_re, module) : in_list(t->exclude, module)))
        return *why = "exclude_modules excludes it", 0;
    if (t->all) return 1;
    if (t->target_re) return re_full(t->target_re, module) ? 1 : (*why = "target_modules does not match it", 0);
    if (!in_list(t->targets, module)) return *why = "target_modules does not list it", 0;
    if (t->layers && !layer_listed(t->layers, layer_index(t, module)))
        return *why = "layers_to_transform leaves its layer out", 0;
    return 1;
}

void lora_targets_free(lora_targets *t) {
    pcre2_code_free(t->target_re);
    pcre2_code_free(t->exclude_re);
    memset(t, 0, sizeof *t);
}
