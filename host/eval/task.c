// task.c: see task.h.
#include "host/eval/task.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "host/eval/match.h"
#include "host/util/fileio.h"
#include "host/util/json_in.h"
#include "host/util/json_out.h"

static const char *MATCH_NAMES[] = { "exact", "number", "regex", "contains" };
#define N_MATCH ((int)(sizeof MATCH_NAMES / sizeof *MATCH_NAMES))

const char *eval_match_name(eval_match m) { return m >= 0 && (int)m < N_MATCH ? MATCH_NAMES[m] : "?"; }

typedef struct {
    const char *where;
    int line;
    verr *err;
} at;

static int bad(const at *a, const char *what, const char *field) {
    return verr_set(a->err, "%s:%d: %s%s%s", a->where, a->line, field ? field : "", field ? ": " : "", what);
}


// A string field: NULL (and 0) when absent, -1 when present but not a string.
static int opt_string(const at *a, const cJSON *o, const char *key, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad(a, "must be a string", key);
    if (!(*out = strdup(v->valuestring))) return bad(a, "out of memory", key);
    return 0;
}

// A non-empty array of strings into a malloc'd array.
static int string_array(const at *a, const cJSON *v, const char *key, char ***out, int *n, int max) {
    if (!cJSON_IsArray(v)) return bad(a, "must be an array of strings", key);
    int k = cJSON_GetArraySize(v);
    if (k == 0) return bad(a, "is empty", key);
    if (max > 0 && k > max) return verr_set(a->err, "%s:%d: %s: at most %d entries", a->where, a->line, key, max);
    char **s = calloc((size_t)k, sizeof *s);
    if (!s) return bad(a, "out of memory", key);
    *out = s, *n = k;
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e))
            return verr_set(a->err, "%s:%d: %s[%d]: must be a string", a->where, a->line, key, i);
        if (!(s[i] = strdup(e->valuestring))) return bad(a, "out of memory", key);
    }
    return 0;
}

static int read_messages(const at *a, const cJSON *v, eval_item *it) {
    if (!cJSON_IsArray(v)) return bad(a, "must be an array of {\"role\", \"content\"} objects", "messages");
    int k = cJSON_GetArraySize(v), i = 0;
    if (k == 0) return bad(a, "is empty", "messages");
    it->roles = calloc((size_t)k, sizeof(char *));
    it->contents = calloc((size_t)k, sizeof(char *));
    if (!it->roles || !it->contents) return bad(a, "out of memory", "messages");
    it->n_msgs = k;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(r) || !cJSON_IsString(c))
            return verr_set(a->err, "%s:%d: messages[%d]: needs string fields \"role\" and \"content\"", a->where,
                            a->line, i);
        if (strcmp(r->valuestring, "system") && strcmp(r->valuestring, "user") && strcmp(r->valuestring, "assistant"))
            return verr_set(a->err, "%s:%d: messages[%d]: role '%s' is not system, user or assistant", a->where,
                            a->line, i, r->valuestring);
        if (!(it->roles[i] = strdup(r->valuestring)) || !(it->contents[i] = strdup(c->valuestring)))
            return bad(a, "out of memory", "messages");
    }
    return 0;
}

static int read_match(const at *a, const cJSON *o, eval_item *it) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "match"), *p = cJSON_GetObjectItemCaseSensitive(o, "pick");
    const cJSON *nc = cJSON_GetObjectItemCaseSensitive(o, "nocase");
    it->match = MATCH_EXACT;
    if (m) {
        if (!cJSON_IsString(m)) return bad(a, "must be a string (exact, number, regex or contains)", "match");
        int k = 0;
        while (k < N_MATCH && strcmp(m->valuestring, MATCH_NAMES[k])) k++;
        if (k == N_MATCH)
            return verr_set(a->err, "%s:%d: match: unknown rule '%s' (use exact, number, regex or contains)", a->where,
                            a->line, m->valuestring);
        it->match = (eval_match)k;
    }
    it->pick_last = 1;
    if (p) {
        if (!cJSON_IsString(p) || (strcmp(p->valuestring, "first") && strcmp(p->valuestring, "last")))
            return bad(a, "must be \"first\" or \"last\"", "pick");
        if (it->match != MATCH_NUMBER) return bad(a, "applies only to match \"number\"", "pick");
        it->pick_last = !strcmp(p->valuestring, "last");
    }
    if (nc && !cJSON_IsBool(nc)) return bad(a, "must be true or false", "nocase");
    it->nocase = nc && cJSON_IsTrue(nc);
    return 0;
}

static int read_choices(const at *a, const cJSON *o, eval_item *it) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "gold");
    if (string_array(a, cJSON_GetObjectItemCaseSensitive(o, "choices"), "choices", &it->choices, &it->n_choices, 0))
        return -1;
    for (int i = 0; i < it->n_choices; i++)  // an empty continuation would score 0, above every real one
        if (!it->choices[i][0]) return verr_set(a->err, "%s:%d: choices[%d]: is empty", a->where, a->line, i);
    if (!g) return bad(a, "an item with choices needs \"gold\", the index of the right choice", NULL);
    if (json_in_int32(g, 0, it->n_choices - 1, &it->gold))
        return verr_set(a->err, "%s:%d: gold: must be an index into choices (0..%d)", a->where, a->line,
                        it->n_choices - 1);
    for (const char *k = "match\0pick\0nocase\0stop\0"; *k; k += strlen(k) + 1)
        if (cJSON_GetObjectItemCaseSensitive(o, k))
            return verr_set(a->err, "%s:%d: %s: applies to items with an answer, not choices", a->where, a->line, k);
    return 0;
}

static int known_keys(const at *a, const cJSON *o) {
    static const char *const keys[] = { "task", "id", "prompt", "messages", "answer", "match", "pick",
                                        "nocase", "choices", "gold", "stop" };
    for (const cJSON *e = o->child; e; e = e->next) {
        size_t k = 0;
        while (k < sizeof keys / sizeof *keys && strcmp(e->string, keys[k])) k++;
        if (k == sizeof keys / sizeof *keys)
            return verr_set(a->err, "%s:%d: unknown field \"%s\" (fields: task, id, prompt, messages, answer, match, "
                                    "pick, nocase, choices, gold, stop)", a->where, a->line, e->string);
    }
    return 0;
}

static int read_body(const at *a, const cJSON *o, eval_item *it, const char *task) {
    if (known_keys(a, o) || opt_string(a, o, "task", &it->task) || opt_string(a, o, "id", &it->id) ||
        opt_string(a, o, "prompt", &it->prompt))
        return -1;
    if (!it->task && !(it->task = strdup(task))) return bad(a, "out of memory", NULL);
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (it->prompt && msgs) return bad(a, "give either \"prompt\" or \"messages\", not both", NULL);
    if (!it->prompt && !msgs) return bad(a, "missing \"prompt\" (or \"messages\")", NULL);
    if (msgs && read_messages(a, msgs, it)) return -1;
    const cJSON *ans = cJSON_GetObjectItemCaseSensitive(o, "answer"), *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    if (ans && ch) return bad(a, "give either \"answer\" or \"choices\", not both", NULL);
    if (!ans && !ch) return bad(a, "missing \"answer\" (or \"choices\" with \"gold\")", NULL);
    if (ch) return read_choices(a, o, it);
    if (opt_string(a, o, "answer", &it->answer) || read_match(a, o, it)) return -1;
    double v;
    if (it->match == MATCH_NUMBER && eval_number_value(it->answer, &v))
        return bad(a, "is not a number, as match \"number\" needs", "answer");
    if (it->match == MATCH_REGEX && eval_regex_check(it->answer, it->nocase, a->err))
        return verr_set(a->err, "%s:%d: %s", a->where, a->line, a->err->msg);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stop");
    char **stop = NULL;
    int n_stop = 0, rc = st ? string_array(a, st, "stop", &stop, &n_stop, EVAL_MAX_STOP) : 0;
    for (int i = 0; stop && i < n_stop; i++) it->stop[i] = stop[i];  // eval_item_free frees them
    it->n_stop = stop ? n_stop : 0;
    free(stop);
    if (rc) return -1;
    for (int i = 0; i < it->n_stop; i++)
        if (!it->stop[i][0]) return bad(a, "an empty stop string", "stop");
    return 0;
}

int eval_item_parse(eval_item *it, const char *json, const char *where, int line, const char *task, verr *err) {
    memset(it, 0, sizeof *it);
    it->line = line;
    at a = { where, line, err };
    cJSON *o = cJSON_Parse(json);
    if (!o || !cJSON_IsObject(o)) {
        int parsed = o != NULL;
        cJSON_Delete(o);
        return bad(&a, parsed ? "not a JSON object (one item per line)" : "not valid JSON (one object per line)", NULL);
    }
    char nul[64];
    if (json_in_find_nul(json, nul, sizeof nul)) {  // cJSON's C strings would end there, silently
        cJSON_Delete(o);
        return bad(&a, "holds a NUL character (\\u0000), which would cut the text short", nul);
    }
    int rc = read_body(&a, o, it, task);
    cJSON_Delete(o);
    if (rc) eval_item_free(it);
    return rc;
}

int eval_set_add(eval_set *s, eval_item *it, verr *err) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        eval_item *p = realloc(s->it, sizeof *p * (size_t)cap);
        if (!p) return verr_set(err, "out of memory");
        s->it = p, s->cap = cap;
    }
    s->it[s->n++] = *it;
    return 0;
}

// "dir/add2.jsonl" -> "add2".
static void base_name(const char *path, char *out, size_t n) {
    const char *b = strrchr(path, '/');
    snprintf(out, n, "%s", b ? b + 1 : path);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
}

int eval_set_read(eval_set *s, const char *path, verr *err) {
    char *text = fileio_read_all(path, err);
    if (!text) return -1;
    char task[256];
    base_name(path, task, sizeof task);
    int rc = 0, line = 0, n0 = s->n;
    for (char *p = text, *next; rc == 0 && p && *p; p = next) {
        next = strchr(p, '\n');
        if (next) *next++ = 0;
        line++;
        size_t k = strlen(p);
        if (k && p[k - 1] == '\r') p[--k] = 0;
        if (strspn(p, " \t") == k) continue;
        eval_item it;
        rc = eval_item_parse(&it, p, path, line, task, err);
        if (rc == 0 && eval_set_add(s, &it, err)) eval_item_free(&it), rc = -1;
    }
    free(text);
    if (rc == 0 && s->n == n0) rc = verr_set(err, "%s: no items (one JSON object per line)", path);
    return rc;
}

static void free_strs(char **s, int n) {
    for (int i = 0; s && i < n; i++) free(s[i]);
    free(s);
}

void eval_item_free(eval_item *it) {
    free(it->task), free(it->id), free(it->prompt), free(it->answer);
    free_strs(it->roles, it->n_msgs), free_strs(it->contents, it->n_msgs), free_strs(it->choices, it->n_choices);
    for (int i = 0; i < it->n_stop; i++) free(it->stop[i]);
    memset(it, 0, sizeof *it);
}

void eval_set_free(eval_set *s) {
    for (int i = 0; i < s->n; i++) eval_item_free(&s->it[i]);
    free(s->it);
    memset(s, 0, sizeof *s);
}

static void write_strs(FILE *f, char *const *s, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fputs(i ? "," : "", f), json_out_str(f, s[i]);
    fputc(']', f);
}

void eval_item_write(FILE *f, const eval_item *it) {
    fputs("{\"task\":", f), json_out_str(f, it->task);
    if (it->id) fputs(",\"id\":", f), json_out_str(f, it->id);
    if (it->prompt) fputs(",\"prompt\":", f), json_out_str(f, it->prompt);
    if (it->n_msgs) {
        fputs(",\"messages\":[", f);
        for (int i = 0; i < it->n_msgs; i++) {
            fputs(i ? ",{\"role\":" : "{\"role\":", f), json_out_str(f, it->roles[i]);
            fputs(",\"content\":", f), json_out_str(f, it->contents[i]), fputc('}', f);
        }
        fputc(']', f);
    }
    if (it->n_choices) {
        fputs(",\"choices\":", f), write_strs(f, it->choices, it->n_choices);
        fprintf(f, ",\"gold\":%d}", it->gold);
        return;
    }
    fputs(",\"answer\":", f), json_out_str(f, it->answer);
    fprintf(f, ",\"match\":\"%s\"", eval_match_name(it->match));
    if (it->match == MATCH_NUMBER) fprintf(f, ",\"pick\":\"%s\"", it->pick_last ? "last" : "first");
    if (it->nocase) fputs(",\"nocase\":true", f);
    if (it->n_stop) fputs(",\"stop\":", f), write_strs(f, it->stop, it->n_stop);
    fputc('}', f);
}
