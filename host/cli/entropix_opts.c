// entropix_opts.c: see entropix_opts.h.
#include "host/cli/entropix_opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "host/util/json_out.h"

static int read_branch(const char *v, gen_opts *g, verr *err) {
    char *end;
    long k = strtol(v, &end, 10), b = *end == ':' ? strtol(end + 1, &end, 10) : -1;
    if (*end || k < 1 || k > 64 || b < 1 || b > 1024)
        return verr_set(err, "--branch: '%s' is not K:B with 1 <= K <= 64 and 1 <= B <= 1024 (e.g. 3:8)", v);
    g->branch_k = (int)k, g->branch_b = (int)b;
    return 0;
}

const cli_opt cli_opts_entropix[] = {
    { "--sampler", "NAME", "entropix", "standard", "standard, or entropix (per-token strategy from the uncertainty)", 0 },
    { "--profile", "NAME|FILE", "entropix", "seed", "entropix thresholds and constants: seed, jax, frog, or a profile file NAME.json (docs/entropix.md)", 0 },
    { "--sampler-config", "FILE", "entropix", NULL, "entropix settings from a JSON file, over the profile", 0 },
    { "--set", "KEY=VALUE", "entropix", NULL, "one entropix setting, over the profile and the file", ARG_REPEAT },
    { "--attn-layer", "N", "entropix", "the last", "layer of the attention metrics (-1: the last)", 0 },
    { "--clarifier-token", "ID", "entropix", "\" ...\" encoded", "the token HELV inserts", 0 },
    { "--branch", "K:B", "entropix", "off", "LEHV branching: K candidates, B steps each", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

// --set KEY=VALUE, any number of times, in order.
static int apply_sets(const char *const *sets, int n, entropix_cli *c, verr *err) {
    for (int i = 0; i < n; i++) {
        const char *kv = sets[i];
        const char *eq = strchr(kv, '=');
        char key[128];
        if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key) return verr_set(err, "--set: '%s' is not KEY=VALUE", kv);
        memcpy(key, kv, (size_t)(eq - kv)), key[eq - kv] = 0;
        if (entropix_set(&c->ex, key, eq + 1, err)) return -1;
    }
    return 0;
}

int entropix_cli_read(args *a, gen_opts *g, entropix_cli *c, verr *err) {
    memset(c, 0, sizeof *c);
    c->sampler_name = args_str(a, "--sampler", "standard");
    const char *profile = args_str(a, "--profile", "seed"), *cfg = args_str(a, "--sampler-config", NULL);
    const char *branch = args_str(a, "--branch", NULL);
    g->attn_layer = (int)args_int_range(a, "--attn-layer", -1, -1, 4095);
    g->attn_layer_given = g->attn_layer != -1;  // -1 (or absent): the last layer
    c->clarifier = (int)args_int_range(a, "--clarifier-token", -1, -1, 1 << 30);
    // every --set is read before anything is checked (args_finish then sees them read)
    const char *sets[64];
    int n_sets = 0;
    for (const char *kv; (kv = args_each(a, "--set"));)
        if (n_sets < 64) sets[n_sets++] = kv;
    if (n_sets == 64) return verr_set(err, "--set: at most 63 settings");
    if (strcmp(c->sampler_name, "standard") && strcmp(c->sampler_name, "entropix"))
        return verr_set(err, "--sampler: '%s' is not standard or entropix", c->sampler_name);
    g->sampler = strcmp(c->sampler_name, "entropix") ? GEN_STANDARD : GEN_ENTROPIX;
    if (entropix_profile_load(profile, &c->ex, err) || (cfg && entropix_load_json(&c->ex, cfg, err)) ||
        apply_sets(sets, n_sets, c, err))
        return -1;
    if (branch && read_branch(branch, g, err)) return -1;
    g->ex = &c->ex;
    return 0;
}

int entropix_cli_check(const entropix_cli *c, int force, verr *err) {
    outfile_opts oo = { .records = 1, .force = force, .flag = "--metrics-out" };
    return c->metrics_path ? outfile_check(c->metrics_path, &oo, err) : 0;
}

int entropix_cli_open(entropix_cli *c, int force, verr *err) {
    if (!c->metrics_path) return 0;
    outfile_opts oo = { .records = 1, .force = force, .flag = "--metrics-out" };
    if (outfile_open(&c->out, c->metrics_path, &oo, err)) return -1;
    c->log = c->out.f;
    return 0;
}

int entropix_cli_start(entropix_cli *c, const session *s, gen_opts *g, verr *err) {
    c->s = s;
    c->seed = g->seed;
    g->clarifier = c->clarifier >= 0 ? c->clarifier : gen_find_clarifier(s);
    if (g->clarifier >= s->m.cfg.vocab_size)
        return verr_set(err, "--clarifier-token %d is out of range (vocab_size %d)", g->clarifier, s->m.cfg.vocab_size);
    if (c->log) g->on_record = entropix_cli_record, g->record_ud = c, g->want_metrics = 1;
    return 0;
}

int entropix_cli_close(entropix_cli *c, outfile_end how, verr *err) {
    if (!c->log) return 0;
    c->log = NULL;
    return outfile_finish(&c->out, how, err);
}


int entropix_cli_record(void *ud, const gen_record *r) {
    entropix_cli *c = ud;
    FILE *f = c->log;
    const token_metrics *m = &r->m;
    fprintf(f, "{%s\"pos\":%d,\"token\":%d,\"text\":", c->tag, r->pos, r->token);
    verr err;
    char *text = c->s->tok ? tokenizer_decode(c->s->tok, &r->token, 1, 0, &err) : NULL;
    json_out_str(f, text ? text : "");
    free(text);
    fprintf(f,
            ",\"entropy\":%.17g,\"varentropy\":%.17g,\"attn_entropy\":%.17g,\"attn_varentropy\":%.17g,"
            "\"agreement\":%.17g,\"interaction_strength\":%.17g,\"quadrant\":\"%s\",\"sampler\":",
            m->entropy, m->varentropy, m->attn_entropy, m->attn_varentropy, m->agreement, m->interaction_strength,
            entropix_quadrant_name(r->q));
    json_out_str(f, c->sampler_name);
    fprintf(f, ",\"temperature\":%.9g,\"top_k\":%d,\"top_p\":%.9g,\"min_p\":%.9g", r->sp.temperature, r->sp.top_k,
            r->sp.top_p, r->sp.min_p);
    if (r->q == Q_ADAPTIVE && r->score != 0) fprintf(f, ",\"score\":%.17g", r->score);
    if (c->probe) probe_json(c->probe, f);
    fprintf(f, ",\"seed\":%llu", (unsigned long long)c->seed);
    fputs("}\n", f);
    return fflush(f) != 0 || ferror(f);
}

void entropix_cli_report(const entropix_cli *c, const gen_stats *st) {
    if (st->n_metrics == 0) return;
    fprintf(stderr, "quadrants");
    for (int q = 0; q < Q_COUNT; q++)
        if (q != Q_STANDARD) fprintf(stderr, " %s %d", entropix_quadrant_name((entropix_quadrant)q), st->quadrant_count[q]);
    fprintf(stderr, " | mean entropy %.4f bits over %d tokens (%s sampler, %s profile)\n",
            st->sum_entropy / st->n_metrics, st->n_metrics, c->sampler_name, c->ex.name);
}
