// results.c: reading `varent eval -o` trial records back (host/eval/summary.h).
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/eval/summary.h"
#include "host/util/fileio.h"
#include "host/util/json_in.h"

// The index of (task, item) in r->set, added when new.
static int item_index(eval_results *r, const char *task, int item, verr *err) {
    for (int i = 0; i < r->set.n; i++)
        if (r->set.it[i].gold == item && !strcmp(r->set.it[i].task, task)) return i;
    eval_item it = { 0 };
    it.gold = item;  // the item number within its run (the record's "item")
    if (!(it.task = strdup(task)) || eval_set_add(&r->set, &it, err)) return free(it.task), -1;
    return r->set.n - 1;
}

static int arm_index(eval_results *r, const char *name, verr *err) {
    for (int a = 0; a < r->n_arms; a++)
        if (!strcmp(r->arms[a].name, name)) return a;
    if (r->n_arms == EVAL_MAX_ARMS) return verr_set(err, "more than %d arms", EVAL_MAX_ARMS);
    memset(&r->arms[r->n_arms], 0, sizeof r->arms[0]);
    snprintf(r->arms[r->n_arms].name, sizeof r->arms[0].name, "%s", name);
    return r->n_arms++;
}

static double opt_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int read_record(eval_results *r, const cJSON *o, verr *err) {
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(o, "task"), *arm = cJSON_GetObjectItemCaseSensitive(o, "arm");
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(o, "item"), *rep = cJSON_GetObjectItemCaseSensitive(o, "repeat");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "correct");
    if (!cJSON_IsString(task) || !cJSON_IsString(arm) || !cJSON_IsNumber(item) || !cJSON_IsNumber(rep) || !cJSON_IsBool(ok))
        return verr_set(err, "a trial record needs \"task\", \"arm\" (strings), \"item\", \"repeat\" (numbers) and "
                             "\"correct\" (true/false)");
    int it_no, rep_no;
    if (json_in_int32(item, 0, INT_MAX - 1, &it_no) || json_in_int32(rep, 0, 999, &rep_no))
        return verr_set(err, "bad \"item\" or \"repeat\" (integers, the repeat below 1000)");
    struct eval_rec x = { item_index(r, task->valuestring, it_no, err), rep_no, arm_index(r, arm->valuestring, err),
                          { 0 } };
    if (x.item < 0 || x.arm < 0) return -1;
    int64_t tokens = 0, compute = 0;  // absent: 0
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *cp = cJSON_GetObjectItemCaseSensitive(o, "compute");
    if ((tk && json_in_int(tk, 0, INT_MAX, &tokens)) || (cp && json_in_int(cp, 0, (int64_t)1 << 53, &compute)))
        return verr_set(err, "bad \"tokens\" or \"compute\" (non-negative integers)");
    x.o = (eval_outcome){ 1, cJSON_IsTrue(ok), (int)tokens, (long)compute, opt_num(o, "wall_s"), opt_num(o, "entropy"),
                          opt_num(o, "varentropy") };
    if (!isfinite(x.o.wall_s)) x.o.wall_s = 0;
    if (r->n_rec == r->cap_rec) {
        long cap = r->cap_rec ? 2 * r->cap_rec : 256;
        struct eval_rec *p = realloc(r->rec, sizeof *p * (size_t)cap);
        if (!p) return verr_set(err, "out of memory");
        r->rec = p, r->cap_rec = cap;
    }
    r->rec[r->n_rec++] = x;
    if (x.rep + 1 > r->repeats) r->repeats = x.rep + 1;
    return 0;
}

int eval_results_read(eval_results *r, const char *path, verr *err) {
    char *text = fileio_read_all(path, err);
    if (!text) return -1;
    int rc = 0, line = 0;
    long before = r->n_rec;
    for (char *p = text, *next; rc == 0 && p && *p; p = next) {
        next = strchr(p, '\n');
        if (next) *next++ = 0;
        line++;
        if (strspn(p, " \t\r") == strlen(p)) continue;
        cJSON *o = cJSON_Parse(p);
        if (!cJSON_IsObject(o)) rc = verr_set(err, "%s:%d: not a JSON object", path, line);
        else if (read_record(r, o, err)) rc = verr_set(err, "%s:%d: %.900s", path, line, err->msg);
        cJSON_Delete(o);
    }
    free(text);
    if (rc == 0 && r->n_rec == before) rc = verr_set(err, "%s: no trial records", path);
    return rc;
}

int eval_results_finish(eval_results *r, verr *err) {
    free(r->res);
    r->res = calloc((size_t)r->set.n * r->repeats * r->n_arms + 1, sizeof *r->res);
    if (!r->res) return verr_set(err, "out of memory");
    for (long k = 0; k < r->n_rec; k++) {
        const struct eval_rec *x = &r->rec[k];
        eval_outcome *o = &r->res[((long)x->item * r->repeats + x->rep) * r->n_arms + x->arm];
        if (o->done)
            return verr_set(err, "task %s item %d repeat %d arm %s is recorded twice", r->set.it[x->item].task,
                            r->set.it[x->item].gold, x->rep, r->arms[x->arm].name);
        *o = x->o;
    }
    return 0;
}

void eval_results_free(eval_results *r) {
    eval_set_free(&r->set);
    free(r->res), free(r->rec);
    memset(r, 0, sizeof *r);
}
