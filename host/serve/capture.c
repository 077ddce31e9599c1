// capture.c: see capture.h.
#include "host/serve/capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

// The part of a file name no other server (nor a planted link) can predict: the response
// ids of two servers started in the same second are the same.
static unsigned long long random_part(void) {
    unsigned long long r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {  // no entropy yet: time and address
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((unsigned long long)ts.tv_nsec << 32) ^ (unsigned long long)ts.tv_sec ^ (unsigned long long)(uintptr_t)&r ^
            (unsigned long long)getpid() << 16;
    }
    return r;
}

int serve_cap_dumps(const server_opts *o) { return o->probe && (o->probe->acts_path || o->probe->attn_path); }

// Takes one of --dump-max-files under the server's lock: 1, or 0 when they are used up.
static int reserve(server *s, int delta) {
    pthread_mutex_lock(&s->mu);
    int ok = delta < 0 || s->dumped < s->o.dump_max_files;
    if (ok) s->dumped += delta;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

int serve_cap_open(server *s, const server_job *j, int index, session *ss, serve_cap *c, verr *err) {
    memset(c, 0, sizeof *c);
    const probe_spec *sp = s->o.probe;
    if (!serve_cap_dumps(&s->o)) return 0;
    c->active = 1;
    probe_spec ps = *sp;
    if (!(c->reserved = reserve(s, 1))) {
        ps.acts_path = ps.attn_path = NULL;  // over the limit: the statistics alone, if any
        snprintf(c->note, sizeof c->note, ",\"capture\":{\"skipped\":\"the server's --dump-max-files %d are written: "
                 "it captures no more\"}", s->o.dump_max_files);
    } else {
        char choice[16] = "";
        if (j->req.n * j->n_prompts > 1) snprintf(choice, sizeof choice, ".c%d", index);
        snprintf(c->name, sizeof c->name, "%s%s-%016llx%s.safetensors", j->req.chat ? "chatcmpl-" : "cmpl-", j->id,
                 random_part(), choice);
        ps.fresh = 1;  // a new name: nothing there is followed or replaced (host/util/outfile.h)
        if (sp->acts_path) snprintf(c->acts, sizeof c->acts, "%s/%s", sp->acts_path, c->name), ps.acts_path = c->acts;
        if (sp->attn_path) snprintf(c->attn, sizeof c->attn, "%s/%s", sp->attn_path, c->name), ps.attn_path = c->attn;
    }
    if (!probe_spec_active(&ps)) return 0;
    if (probe_open(&c->pr, &ps, ss, err)) {
        if (c->reserved) reserve(s, -1);
        return c->reserved = 0, -1;
    }
    return 0;
}

void serve_cap_push(serve_cap *c, int id) {
    if (!c->pr || c->oom) return;
    if (c->n_gen == c->cap_gen) {
        int cap = c->cap_gen ? 2 * c->cap_gen : 64, *p = realloc(c->gen, sizeof(int) * (size_t)cap);
        if (!p) return (void)(c->oom = 1);
        c->gen = p, c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = id;
}

void serve_cap_close(server *s, serve_cap *c, int keep, const int *prompt, int n_prompt) {
    if (!c->active) return;
    const int *gen = c->gen;
    int n_gen = c->oom ? 0 : c->n_gen;
    verr err = { { 0 } };
    int *ids = keep && c->reserved ? malloc(sizeof(int) * (size_t)(n_prompt + n_gen + 1)) : NULL;
    if (ids) memcpy(ids, prompt, sizeof(int) * (size_t)n_prompt), memcpy(ids + n_prompt, gen, sizeof(int) * (size_t)n_gen);
    int rc = keep && c->reserved && !ids ? verr_set(&err, "out of memory") : 0;
    if (rc == 0 && keep) rc = probe_check(c->pr, &err);
    if (probe_close(c->pr, keep && rc == 0, ids, n_prompt + n_gen, &err) && rc == 0) rc = -1;
    free(ids), free(c->gen);
    c->pr = NULL, c->gen = NULL;
    if (!c->reserved) return;
    if (!keep || rc) reserve(s, -1);  // nothing written: the file is not counted
    if (!keep) return;
    sbuf b = { 0 };
    sb_puts(&b, ",\"capture\":{");
    if (rc) {
        sb_puts(&b, "\"error\":");
        sb_json_str(&b, err.msg, strlen(err.msg));
    } else {
        const char *sep = "";
        if (s->o.probe->acts_path) sb_puts(&b, "\"acts\":"), sb_json_str(&b, c->name, strlen(c->name)), sep = ",";
        if (s->o.probe->attn_path) sb_puts(&b, sep), sb_puts(&b, "\"attn\":"), sb_json_str(&b, c->name, strlen(c->name));
    }
    sb_puts(&b, "}");
    if (!b.oom && b.len < sizeof c->note) memcpy(c->note, b.p, b.len), c->note[b.len] = 0;
    sb_free(&b);
}
