// profiles.c: the profile table and overriding constants by name.
// Profiles are data: shared coefficients come from one base row, thresholds from a
// small per-profile description of each quadrant's box.
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/entropix.h"
#include "host/util/fileio.h"

static const char *METRIC_KEYS[M_COUNT] = { "entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement",
                                            "interaction_strength" };

// One bound of a box: quadrant, metric, 1 for a lower bound (metric > v), 0 for upper.
typedef struct {
    signed char q, metric, lower;
    double v;
} bound;

typedef struct {
    const char *name;
    int order[ENTROPIX_N_BOXES];
    bound b[24];
    int n;
} profile_row;

#define LO 1
#define HI 0
static const profile_row PROFILES[] = {
    { "seed", { Q_LELV, Q_LEHV, Q_HELV, Q_HEHV },
      { { Q_LELV, M_ENT, HI, 0.1 }, { Q_LELV, M_VENT, HI, 0.1 },
        { Q_LEHV, M_ENT, HI, 5 }, { Q_LEHV, M_VENT, LO, 5 },
        { Q_HELV, M_ENT, LO, 3 }, { Q_HELV, M_VENT, HI, 0.1 },
        { Q_HEHV, M_ENT, LO, 5 }, { Q_HEHV, M_VENT, LO, 5 } }, 8 },
    { "jax", { Q_LELV, Q_HELV, Q_LEHV, Q_HEHV },
      { { Q_LELV, M_ENT, HI, 0.1 }, { Q_LELV, M_VENT, HI, 0.1 },
        { Q_HELV, M_ENT, LO, 5 }, { Q_HELV, M_VENT, HI, 0.1 },
        { Q_LEHV, M_ENT, HI, 5 }, { Q_LEHV, M_VENT, LO, 5 },
        { Q_HEHV, M_ENT, LO, 3 }, { Q_HEHV, M_VENT, LO, 5 } }, 8 },
    // entropix's 70B "frog" thresholds (low/medium/high): entropy 0.01/0.7/2.1,
    // varentropy 0.05/2.0/5.8, attention entropy 11.915/11.921/11.926, attention
    // varentropy 0.001/0.0045/0.009, agreement 2e-6/4e-6/5e-6, interaction 0.2/0.247/0.264.
    // Calibrated on 4096-slot padded caches (attention entropy ~ log2 4096): kept for comparison.
    { "frog", { Q_LELV, Q_HELV, Q_LEHV, Q_HEHV },
      { { Q_LELV, M_ENT, HI, 0.01 }, { Q_LELV, M_VENT, HI, 0.05 }, { Q_LELV, M_AENT, HI, 11.915 },
        { Q_LELV, M_AVENT, HI, 0.001 }, { Q_LELV, M_AGREE, HI, 2e-6 }, { Q_LELV, M_INTER, HI, 0.2 },
        { Q_HELV, M_ENT, LO, 2.1 }, { Q_HELV, M_VENT, HI, 0.05 }, { Q_HELV, M_AENT, HI, 11.915 },
        { Q_HELV, M_AVENT, HI, 0.001 }, { Q_HELV, M_AGREE, HI, 2e-6 }, { Q_HELV, M_INTER, HI, 0.2 },
        { Q_LEHV, M_ENT, HI, 2.1 }, { Q_LEHV, M_VENT, LO, 5.8 }, { Q_LEHV, M_AENT, HI, 11.915 },
        { Q_LEHV, M_AVENT, LO, 0.009 }, { Q_LEHV, M_AGREE, HI, 2e-6 }, { Q_LEHV, M_INTER, LO, 0.2 },
        { Q_HEHV, M_ENT, LO, 0.7 }, { Q_HEHV, M_VENT, LO, 5.8 }, { Q_HEHV, M_AENT, LO, 11.926 },
        { Q_HEHV, M_AVENT, LO, 0.009 }, { Q_HEHV, M_AGREE, LO, 5e-6 }, { Q_HEHV, M_INTER, LO, 0.264 } }, 24 },
};
#define N_PROFILES ((int)(sizeof PROFILES / sizeof PROFILES[0]))

// Constants every profile shares (entropix's defaults).
static void base_config(entropix_config *c) {
    memset(c, 0, sizeof *c);
    c->temp = 0.666, c->top_p = 0.90, c->top_k = 27, c->min_p = 0.03, c->n_samples = 5;
    c->helv_t_off = 1.3, c->helv_t_coef = 0.2, c->helv_t_max = 1.5;
    c->lehv_t_off = 1.2, c->lehv_t_coef = 0.3, c->lehv_t_max = 1.5, c->lehv_k_coef = 0.5, c->lehv_k_min = 5;
    c->hehv_t_off = 2.0, c->hehv_t_coef = 0.5, c->hehv_t_min = 2.0, c->hehv_p_coef = 0.2, c->hehv_p_min = 0.5;
    c->ad_t_logits = 0.3, c->ad_t_attn = 0.2, c->ad_t_agree = 0.2, c->ad_p_avent = 0.1;
    c->ad_k_inter = 0.3, c->ad_k_agree = 0.2, c->ad_m_unc = 0.5;
    double w[M_COUNT] = { [M_ENT] = 0.1, [M_AENT] = 0.2, [M_VENT] = 0.3, [M_AVENT] = 0.4, [M_AGREE] = 0.5, [M_INTER] = 0.6 };
    memcpy(c->score_w, w, sizeof w);
    for (int q = 0; q < ENTROPIX_N_BOXES; q++)
        for (int i = 0; i < M_COUNT; i++) c->box[q].lo[i] = -INFINITY, c->box[q].hi[i] = INFINITY;
}

const char *entropix_profile_names(void) { return "seed, jax, frog"; }

int entropix_profile(const char *name, entropix_config *c, verr *err) {
    for (int p = 0; p < N_PROFILES; p++) {
        const profile_row *r = &PROFILES[p];
        if (strcmp(r->name, name) != 0) continue;
        base_config(c);
        snprintf(c->name, sizeof c->name, "%s", r->name);
        memcpy(c->order, r->order, sizeof c->order);
        for (int i = 0; i < r->n; i++) {
            const bound *b = &r->b[i];
            if (b->lower) c->box[b->q].lo[b->metric] = b->v;
            else c->box[b->q].hi[b->metric] = b->v;
        }
        return 0;
    }
    return verr_set(err, "unknown entropix profile '%s' (profiles: %s)", name, entropix_profile_names());
}

int entropix_profile_load(const char *name, entropix_config *c, verr *err) {
    for (int p = 0; p < N_PROFILES; p++)
        if (!strcmp(PROFILES[p].name, name)) return entropix_profile(name, c, err);
    size_t n = strlen(name);
    if (!strchr(name, '/') && !(n > 5 && !strcmp(name + n - 5, ".json")))
        return verr_set(err, "unknown profile '%s' (profiles: %s, or a profile file NAME.json)", name,
                        entropix_profile_names());
    entropix_profile("seed", c, NULL);
    if (entropix_load_json(c, name, err)) return -1;
    for (int p = 0; p < N_PROFILES; p++)
        if (!strcmp(PROFILES[p].name, c->name)) {  // no "name" in the file: its base name
            const char *base = strrchr(name, '/');
            snprintf(c->name, sizeof c->name, "%s", base ? base + 1 : name);
        }
    return 0;
}

typedef struct {
    const char *key;
    size_t off;
} scalar_key;

#define K(f) { #f, offsetof(entropix_config, f) }
static const scalar_key SCALARS[] = {
    { "temperature", offsetof(entropix_config, temp) }, K(top_p), K(top_k), K(min_p), K(n_samples),
    K(helv_t_off), K(helv_t_coef), K(helv_t_max), K(lehv_t_off), K(lehv_t_coef), K(lehv_t_max), K(lehv_k_coef),
    K(lehv_k_min), K(hehv_t_off), K(hehv_t_coef), K(hehv_t_min), K(hehv_p_coef), K(hehv_p_min), K(ad_t_logits),
    K(ad_t_attn), K(ad_t_agree), K(ad_p_avent), K(ad_k_inter), K(ad_k_agree), K(ad_m_unc),
};
#undef K

static int parse_order(entropix_config *c, const char *v, verr *err) {
    int order[ENTROPIX_N_BOXES], n = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int q = -1;
        for (int k = 0; k < ENTROPIX_N_BOXES; k++)
            if (!strcmp(t, entropix_quadrant_name((entropix_quadrant)k))) q = k;
        if (q < 0 || n == ENTROPIX_N_BOXES)
            return verr_set(err, "order: '%s' is not a list of LELV, HELV, LEHV, HEHV", v);
        order[n++] = q;
    }
    for (int k = n; k < ENTROPIX_N_BOXES; k++) order[k] = -1;  // unlisted quadrants are off
    memcpy(c->order, order, sizeof order);
    return 0;
}

// "HELV.entropy.min" -> the box bound it names; NULL if it is not a bound key.
static double *bound_ref(entropix_config *c, const char *key) {
    for (int q = 0; q < ENTROPIX_N_BOXES; q++) {
        const char *qn = entropix_quadrant_name((entropix_quadrant)q);
        size_t ql = strlen(qn);
        if (strncmp(key, qn, ql) != 0 || key[ql] != '.') continue;
        for (int i = 0; i < M_COUNT; i++) {
            char lo[64], hi[64];
            snprintf(lo, sizeof lo, "%s.min", METRIC_KEYS[i]), snprintf(hi, sizeof hi, "%s.max", METRIC_KEYS[i]);
            if (!strcmp(key + ql + 1, lo)) return &c->box[q].lo[i];
            if (!strcmp(key + ql + 1, hi)) return &c->box[q].hi[i];
        }
    }
    if (!strncmp(key, "score.", 6))
        for (int i = 0; i < M_COUNT; i++)
            if (!strcmp(key + 6, METRIC_KEYS[i])) return &c->score_w[i];
    return NULL;
}

static double *scalar_ref(entropix_config *c, const char *key) {
    for (size_t i = 0; i < sizeof SCALARS / sizeof SCALARS[0]; i++)
        if (!strcmp(key, SCALARS[i].key)) return (double *)((char *)c + SCALARS[i].off);
    return bound_ref(c, key);
}

int entropix_set(entropix_config *c, const char *key, const char *value, verr *err) {
    if (!strcmp(key, "order")) return parse_order(c, value, err);
    if (!strcmp(key, "profile")) return entropix_profile(value, c, err);
    double *dst = scalar_ref(c, key);
    if (!dst) return verr_set(err, "unknown sampler constant '%s' (see docs/entropix.md)", key);
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end || isnan(v))
        return verr_set(err, "sampler constant %s: '%s' is not a number", key, value);
    *dst = v;
    return 0;
}

// "profile" first, so the other keys override it whatever their order in the file.
static int apply_json(entropix_config *c, const cJSON *root, const char *path, verr *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "profile");
    if (p && (!cJSON_IsString(p) || entropix_profile(p->valuestring, c, err)))
        return p && !cJSON_IsString(p) ? verr_set(err, "%s: \"profile\" must be a string", path) : -1;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!strcmp(it->string, "profile") || !strcmp(it->string, "calibration")) continue;
        if (!strcmp(it->string, "name")) {
            if (!cJSON_IsString(it)) return verr_set(err, "%s: \"name\" must be a string", path);
            snprintf(c->name, sizeof c->name, "%s", it->valuestring);
            continue;
        }
        char num[64];
        const char *v = cJSON_IsString(it) ? it->valuestring : NULL;
        if (cJSON_IsNumber(it)) snprintf(num, sizeof num, "%.17g", it->valuedouble), v = num;
        if (!v) return verr_set(err, "%s: key \"%s\" needs a number or a string", path, it->string);
        if (entropix_set(c, it->string, v, err)) {
            char why[sizeof err->msg];
            memcpy(why, err->msg, sizeof why);
            return verr_set(err, "%s: %.900s", path, why);
        }
    }
    return 0;
}

int entropix_load_json(entropix_config *c, const char *path, verr *err) {
    char *text = fileio_read_all(path, err);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return verr_set(err, "%s: not a JSON object of sampler constants", path);
    }
    int rc = apply_json(c, root, path, err);
    cJSON_Delete(root);
    return rc;
}
