// plot_log.c: see plot_log.h.
#include "host/report/plot_log.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/entropix.h"
#include "host/util/fileio.h"

void plot_log_free(plot_log *l) {
    for (int i = 0; i < l->n; i++) free(l->tok[i].text);
    free(l->tok), free(l->ev);
    memset(l, 0, sizeof *l);
}

static int grow(void **p, int *cap, int n, size_t size) {
    if (n < *cap) return 0;
    int c = *cap ? 2 * *cap : 256;
    void *q = realloc(*p, size * (size_t)c);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

typedef struct {
    const char *path;
    int line;
    verr *err;
} where;

static int bad(const where *w, const char *what) { return verr_set(w->err, "%s:%d: %s", w->path, w->line, what); }

// A required number field of o.
static int num(const where *w, const cJSON *o, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return verr_set(w->err, "%s:%d: field \"%s\" is missing or not a number", w->path, w->line, key);
    *out = v->valuedouble;
    return 0;
}

static double opt_num(const cJSON *o, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static int quadrant_of(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "quadrant");
    if (!cJSON_IsString(v)) return -1;
    for (int q = 0; q < Q_COUNT; q++)
        if (!strcmp(v->valuestring, entropix_quadrant_name((entropix_quadrant)q))) return q;
    return -1;
}

static int add_token(plot_log *l, const where *w, const cJSON *o, int pos, int token, double h, double v, int q,
                     int n_tok) {
    if (grow((void **)&l->tok, &l->cap, l->n, sizeof *l->tok)) return verr_set(w->err, "out of memory");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
    char *text = strdup(cJSON_IsString(t) ? t->valuestring : "");
    if (!text) return verr_set(w->err, "out of memory");
    l->tok[l->n++] = (plot_token){ pos, token, text, h, v, q, n_tok, 0, w->line };
    l->n_varentropy += isfinite(v);
    return 0;
}

// A --metrics-out line.
static int metrics_line(plot_log *l, const where *w, const cJSON *o) {
    double h = 0, v = 0, pos = 0;
    if (num(w, o, "entropy", &h) || num(w, o, "varentropy", &v) || num(w, o, "pos", &pos)) return -1;
    return add_token(l, w, o, (int)pos, (int)opt_num(o, "token", -1), h, v, quadrant_of(o), 1);
}

// An agents "step": the chosen agent's proposal carries the entropy.
static int step_event(plot_log *l, const where *w, const cJSON *o) {
    double chosen = 0, pos = 0, token = 0;
    if (num(w, o, "chosen_agent", &chosen) || num(w, o, "pos", &pos) || num(w, o, "token", &token)) return -1;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(o, "proposals"), *p, *pick = NULL;
    if (!cJSON_IsArray(props)) return bad(w, "step event: field \"proposals\" is missing or not an array");
    cJSON_ArrayForEach(p, props) if (opt_num(p, "agent", -1) == chosen) pick = p;
    if (!pick) return bad(w, "step event: no proposal of the chosen_agent");
    double h = 0;
    if (num(w, pick, "entropy", &h)) return -1;
    double v = opt_num(o, "varentropy", opt_num(pick, "varentropy", NAN));
    int q = quadrant_of(o) >= 0 ? quadrant_of(o) : quadrant_of(pick);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    int n_tok = cJSON_IsArray(toks) && cJSON_GetArraySize(toks) > 0 ? cJSON_GetArraySize(toks) : 1;
    l->agents = 1;
    return add_token(l, w, pick, (int)pos, (int)token, h, v, q, n_tok);
}

static int add_event(plot_log *l, const where *w, plot_event e) {
    if (grow((void **)&l->ev, &l->cap_ev, l->n_ev, sizeof *l->ev)) return verr_set(w->err, "out of memory");
    e.at = l->n;
    l->ev[l->n_ev++] = e;
    return 0;
}

// Flags the last steps still standing that hold the `removed` tokens.
static int rollback_event(plot_log *l, const where *w, const cJSON *o) {
    double removed = 0, from = 0, to = 0;
    if (num(w, o, "tokens_removed", &removed) || num(w, o, "from_pos", &from) || num(w, o, "to_pos", &to)) return -1;
    if (removed < 0) return bad(w, "rollback event: negative tokens_removed");
    int left = (int)removed;
    for (int i = l->n - 1; i >= 0 && left > 0; i--)
        if (!l->tok[i].discarded) l->tok[i].discarded = 1, left -= l->tok[i].n_tok;
    return add_event(l, w, (plot_event){ .kind = EV_ROLLBACK, .from_pos = (int)from, .to_pos = (int)to, .removed = (int)removed });
}

static int critic_event(plot_log *l, const where *w, const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "verdict"), *a = cJSON_GetObjectItemCaseSensitive(o, "action");
    if (!cJSON_IsString(v)) return bad(w, "critic event: field \"verdict\" is missing or not a string");
    plot_event e = { .kind = EV_CRITIC, .bad = !strcmp(v->valuestring, "BAD") };
    snprintf(e.action, sizeof e.action, "%s", cJSON_IsString(a) ? a->valuestring : "");
    return add_event(l, w, e);
}

static int parse_line(plot_log *l, const where *w, const char *text) {
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return bad(w, "not a JSON object");
    }
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
    int rc = 0;
    if (!ev) rc = metrics_line(l, w, o);
    else if (!cJSON_IsString(ev)) rc = bad(w, "field \"event\" is not a string");
    else if (!strcmp(ev->valuestring, "step")) rc = step_event(l, w, o);
    else if (!strcmp(ev->valuestring, "rollback")) rc = rollback_event(l, w, o);
    else if (!strcmp(ev->valuestring, "critic")) rc = critic_event(l, w, o);
    cJSON_Delete(o);
    return rc;
}

int plot_log_read(plot_log *l, const char *path, verr *err) {
    memset(l, 0, sizeof *l);
    char *buf = fileio_read_all(path, err);
    if (!buf) return -1;
    where w = { path, 0, err };
    int rc = 0;
    for (char *p = buf; rc == 0 && *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        w.line++;
        if (strspn(p, " \t\r") != strlen(p)) rc = parse_line(l, &w, p);
        p = nl ? nl + 1 : p + strlen(p);
    }
    free(buf);
    if (rc == 0 && l->n == 0)
        rc = verr_set(err, "%s: no tokens to plot (expected --metrics-out lines or agents \"step\" events)", path);
    if (rc) plot_log_free(l);
    return rc;
}
