// batch_resume.c: see batch_resume.h.
#include "host/cli/batch_resume.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/util/fileio.h"

static cJSON *str_or_null(const char *s) { return s ? cJSON_CreateString(s) : cJSON_CreateNull(); }

// A float as the double it is, so that it prints as it reads back.
static void add_num(cJSON *o, const char *name, double v) { cJSON_AddItemToObject(o, name, cJSON_CreateNumber(v)); }

char *batch_settings_json(const char *model_arg, const gen_opts *g, const char *sampler_name, const char *profile,
                          const prompt_style *ps) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char real[PATH_MAX];  // ./m and m are one model
    cJSON_AddItemToObject(o, "model", str_or_null(model_arg && realpath(model_arg, real) ? real : model_arg));
    add_num(o, "max_tokens", g->max_new == 0x7fffffff ? -1 : g->max_new);
    cJSON_AddBoolToObject(o, "ignore_eos", g->ignore_eos);
    add_num(o, "temperature", g->sp.temperature);
    add_num(o, "top_k", g->sp.top_k);
    add_num(o, "top_p", g->sp.top_p);
    add_num(o, "min_p", g->sp.min_p);
    add_num(o, "repeat_penalty", g->pen.repeat);
    add_num(o, "presence_penalty", g->pen.presence);
    add_num(o, "frequency_penalty", g->pen.frequency);
    add_num(o, "repeat_last_n", g->pen.last_n);
    add_num(o, "no_repeat_ngram", g->pen.no_repeat_ngram);
    cJSON *bias = cJSON_AddArrayToObject(o, "logit_bias");
    for (int i = 0; bias && i < g->n_bias; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(g->bias[i].id));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber(g->bias[i].bias));
        cJSON_AddItemToArray(bias, pair);
    }
    cJSON_AddStringToObject(o, "sampler", sampler_name);
    cJSON_AddStringToObject(o, "profile", profile);
    if (g->branch_k > 0) {
        char b[32];
        snprintf(b, sizeof b, "%d:%d", g->branch_k, g->branch_b);
        cJSON_AddStringToObject(o, "branch", b);
    }
    cJSON_AddStringToObject(o, "chat", ps->raw ? "raw" : ps->chat ? "on" : "auto");
    cJSON_AddItemToObject(o, "system", str_or_null(ps->system));
    cJSON_AddItemToObject(o, "chat_template", str_or_null(ps->template_name));
    cJSON_AddBoolToObject(o, "think", ps->think);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

void batch_done_free(batch_done *d) {
    free(d->skip);
    cJSON_free(d->settings);
    memset(d, 0, sizeof *d);
}

// A record's "seed", read from its text: a JSON number holds 53 bits, a seed 64. Inside
// a JSON string every quote is escaped, so `,"seed":` is the record's own member.
static int record_seed(const char *line, uint64_t *seed) {
    const char *p = strstr(line, ",\"seed\":");
    if (!p) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p + 8, &end, 10);
    if (end == p + 8 || errno) return 0;
    *seed = v;
    return 1;
}

// One record (line no, its text line): marks its prompt done; the seed and the settings
// of every record must be the first one's.
static int take_record(const char *line, const prompt_list *pl, batch_done *d, const char *path, int no, verr *err) {
    cJSON *j = cJSON_Parse(line);
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(j, "index");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *settings = cJSON_GetObjectItemCaseSensitive(j, "settings");
    char *set = settings ? cJSON_PrintUnformatted(settings) : NULL;
    uint64_t seed = 0;
    int has_seed = record_seed(line, &seed), rc = 0;
    if (!cJSON_IsNumber(idx) || idx->valuedouble < 0 || idx->valuedouble >= pl->n || !cJSON_IsString(prompt))
        rc = verr_set(err, "%s:%d: not a record of this batch (no index below %d with a prompt); not resuming", path,
                      no, pl->n);
    else if (strcmp(prompt->valuestring, pl->text[idx->valueint]) != 0)
        rc = verr_set(err, "%s:%d: record %d has another prompt than the prompt file; not resuming", path, no,
                      idx->valueint);
    else if (d->n_done > 0 && (has_seed != d->has_seed || seed != d->seed))
        rc = verr_set(err, "%s:%d: record %d has another seed than the records before it; not resuming", path, no,
                      idx->valueint);
    else if (d->n_done > 0 && (!set != !d->settings || (set && strcmp(set, d->settings) != 0)))
        rc = verr_set(err, "%s:%d: record %d has other settings than the records before it; not resuming", path, no,
                      idx->valueint);
    if (rc == 0 && d->n_done == 0) {
        d->has_seed = has_seed, d->seed = seed;
        d->settings = set, set = NULL;
    }
    if (rc == 0 && !d->skip[idx->valueint]) {
        d->skip[idx->valueint] = 1;
        d->n_done += 1;
    }
    cJSON_free(set);
    cJSON_Delete(j);
    return rc;
}

int batch_done_read(const char *path, const prompt_list *pl, batch_done *d, verr *err) {
    memset(d, 0, sizeof *d);
    if (!(d->skip = calloc((size_t)pl->n, 1))) return verr_set(err, "out of memory");
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return 0;
    verr why;
    FILE *f = fileio_fopen_input(path, &why);  // a FIFO or device holds nothing to resume
    if (!f) return verr_set(err, "--resume: %.900s", why.msg);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int no = 1; rc == 0 && getline(&line, &cap, f) > 0; no++) {
        if (!strchr(line, '\n')) break;  // a partial last record: dropped when the file is opened
        rc = take_record(line, pl, d, path, no, err);
    }
    free(line);
    fclose(f);
    return rc;
}

int batch_done_check(const batch_done *d, const char *settings, const char *path, verr *err) {
    if (!d->settings || !strcmp(d->settings, settings)) return 0;
    cJSON *was = cJSON_Parse(d->settings), *now = cJSON_Parse(settings);
    const cJSON *it;
    char what[600] = "";
    cJSON_ArrayForEach(it, now) {
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(was, it->string);
        if (old && cJSON_Compare(old, it, 1)) continue;
        char *a = old ? cJSON_PrintUnformatted(old) : NULL, *b = cJSON_PrintUnformatted(it);
        snprintf(what, sizeof what, "%s: %.200s in the file, %.200s in this run", it->string, a ? a : "(none)",
                 b ? b : "?");
        cJSON_free(a), cJSON_free(b);
        break;
    }
    cJSON_Delete(was), cJSON_Delete(now);
    return verr_set(err, "--resume: %s was written with other settings (%s); resume with the same options, or "
                         "start over with --force", path, what[0] ? what : "settings differ");
}
