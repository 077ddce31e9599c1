// probe.c: see probe.h. The hooks run inside the forward: activations are spooled as
// they come, attention rows are reduced to per-head statistics at once, and the logit
// lens keeps each layer's last row until probe_json asks.
#include "host/runtime/probe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/formats/st_stream.h"
#include "host/util/json_out.h"
#include "host/util/parse.h"
#include "host/util/outfile.h"

#define LENS_TOP 5

struct probe {
    session *s;
    const forward_hooks *prev;  // the session's own hooks (interventions), restored on close
    forward_hooks hooks;
    int n_layers, n_heads, dim;
    unsigned char *hook_layers;  // [n_layers] layers whose activations the hook receives
    unsigned char *dump_layers;  // [n_layers] of those, the ones --dump-acts writes
    unsigned dump_points;
    st_stream *acts, *attn;
    int *act_id;                 // [n_layers * HOOK_NPOINTS]
    int *attn_id, pos_id;        // [n_layers], and "positions"
    int acts_pos_id, first_dump; // --dump-acts "positions"; the layer * HOOK_NPOINTS + point that writes it
    int paused;                  // probe_pause: the hooks ignore what the forwards hand over
    outfile acts_out, attn_out;
    unsigned char *attn_on;      // [n_layers]
    unsigned char *attn_have;    // [n_layers] statistics of the last forward present
    double *H, *V;               // [n_layers, n_heads]
    float *probs;                // [n_heads, ctx]
    int logit_lens;
    float *lens_x;               // [n_layers, dim] each layer's last resid_post row
    unsigned char *lens_have;    // [n_layers]
    float *lens_logits;          // [vocab]
    int failed;
    verr err;
};

int probe_spec_active(const probe_spec *sp) {
    return sp && (sp->acts_path || sp->attn_layers || sp->attn_path || sp->logit_lens);
}

// "all" or a comma-separated list of layers and ranges A-B into on[n].
static int parse_layers(const char *list, int n, unsigned char *on, const char *flag, verr *err) {
    if (!strcmp(list, "all")) {
        memset(on, 1, (size_t)n);
        return 0;
    }
    const char *p = list;
    do {  // an empty list, or an empty or signed item, is not a list of layers
        long a, b;
        const char *end = parse_index(p, 1L << 30, &a);
        b = a;
        if (end && *end == '-') end = parse_index(end + 1, 1L << 30, &b);
        if (!end || b < a || (*end && *end != ','))
            return verr_set(err, "%s: '%s' is not all or a list like 0,3,5-7", flag, list);
        if (b >= n) return verr_set(err, "%s: layer %ld is out of range: the model has layers 0..%d", flag, b, n - 1);
        for (long l = a; l <= b; l++) on[l] = 1;
        p = *end ? end + 1 : end;
    } while (*p || p[-1] == ',');
    return 0;
}

static int parse_points(const char *list, unsigned *mask, verr *err) {
    char buf[256];
    if (strlen(list) >= sizeof buf) return verr_set(err, "--dump-points: list too long");
    strcpy(buf, list);
    *mask = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int pt = hook_point_parse(tok);
        if (pt < 0)
            return verr_set(err, "--dump-points: unknown point '%s' (resid_pre, resid_mid, resid_post, attn_out, mlp_out)",
                            tok);
        *mask |= 1u << pt;
    }
    return *mask ? 0 : verr_set(err, "--dump-points: empty list");
}

static void fail(probe *p, const verr *why) {
    if (!p->failed) p->err = *why;
    p->failed = 1;
}

static void on_act(void *ud, int layer, int point, const float *x, int T, int pos0) {
    probe *p = ud;
    if (p->paused) return;
    if (p->acts && p->dump_layers[layer] && (p->dump_points >> point & 1u)) {
        verr why;
        if (st_stream_append(p->acts, p->act_id[layer * HOOK_NPOINTS + point], x, T, p->dim, &why)) fail(p, &why);
        for (int t = 0; layer * HOOK_NPOINTS + point == p->first_dump && t < T; t++) {
            int pos = pos0 + t;  // rows come in the order fed: a re-fed position (chat) repeats
            if (st_stream_append(p->acts, p->acts_pos_id, &pos, 1, 1, &why)) fail(p, &why);
        }
    }
    if (p->logit_lens && point == HOOK_RESID_POST) {
        memcpy(p->lens_x + (size_t)layer * p->dim, x + (size_t)(T - 1) * p->dim, sizeof(float) * (size_t)p->dim);
        p->lens_have[layer] = 1;
    }
}

// Softmax of each head's filled scores into p->probs, their entropy and varentropy (bits).
static void head_stats(probe *p, int layer, const float *scores, int keys) {
    for (int h = 0; h < p->n_heads; h++) {
        const float *s = scores + (size_t)h * keys;
        float *pr = p->probs + (size_t)h * keys;
        double mx = s[0], z = 0, H = 0, V = 0;
        for (int j = 1; j < keys; j++) mx = s[j] > mx ? s[j] : mx;
        for (int j = 0; j < keys; j++) z += exp((double)s[j] - mx);
        double lz = log(z);
        for (int j = 0; j < keys; j++) {
            double lp = ((double)s[j] - mx - lz) / M_LN2, q = exp((double)s[j] - mx - lz);
            pr[j] = (float)q;
            H -= q * lp;
        }
        for (int j = 0; j < keys; j++) {
            double lp = ((double)s[j] - mx - lz) / M_LN2, d = lp + H;
            V += exp((double)s[j] - mx - lz) * d * d;
        }
        p->H[(size_t)layer * p->n_heads + h] = H, p->V[(size_t)layer * p->n_heads + h] = V;
    }
    p->attn_have[layer] = 1;
}

// The first layer whose scores a forward hands over (a skipped layer attends to nothing):
// it writes the forward's position.
static int first_attn_layer(const probe *p) {
    for (int l = 0; l < p->n_layers; l++)
        if (p->attn_on[l] && !(p->hooks.skip && p->hooks.skip[l])) return l;
    return -1;
}

static void on_attn(void *ud, int layer, const float *scores, int keys) {
    probe *p = ud;
    if (p->paused) return;
    head_stats(p, layer, scores, keys);
    if (!p->attn) return;
    verr why;
    int pos = keys - 1;
    if ((layer == first_attn_layer(p) && st_stream_append(p->attn, p->pos_id, &pos, 1, 1, &why)) ||
        st_stream_append(p->attn, p->attn_id[layer], p->probs, 1, keys, &why))
        fail(p, &why);
}

static int alloc_all(probe *p, const model_config *c, int ctx) {
    size_t L = (size_t)c->n_layers, H = (size_t)c->n_heads;
    p->hook_layers = calloc(L, 1), p->dump_layers = calloc(L, 1), p->attn_on = calloc(L, 1);
    p->attn_have = calloc(L, 1), p->lens_have = calloc(L, 1);
    p->act_id = calloc(L * HOOK_NPOINTS, sizeof(int)), p->attn_id = calloc(L, sizeof(int));
    p->H = calloc(L * H, sizeof(double)), p->V = calloc(L * H, sizeof(double));
    p->probs = malloc(H * (size_t)ctx * sizeof(float));
    p->hooks.attn_buf = malloc(H * (size_t)ctx * sizeof(float));
    return p->hook_layers && p->dump_layers && p->attn_on && p->attn_have && p->lens_have && p->act_id && p->attn_id &&
                   p->H && p->V && p->probs && p->hooks.attn_buf
               ? 0
               : -1;
}

static void free_all(probe *p) {
    free(p->hook_layers), free(p->dump_layers), free(p->attn_on), free(p->attn_have), free(p->lens_have);
    free(p->act_id), free(p->attn_id), free(p->H), free(p->V), free(p->probs), free(p->hooks.attn_buf);
    free(p->lens_x), free(p->lens_logits);
    st_stream_free(p->acts), st_stream_free(p->attn);
    outfile_abort(&p->acts_out), outfile_abort(&p->attn_out);
    free(p);
}

// --dump-acts: the layers, points, tensors and the output file.
static int open_acts(probe *p, const probe_spec *sp, verr *err) {
    if (parse_layers(sp->dump_layers ? sp->dump_layers : "all", p->n_layers, p->dump_layers, "--dump-layers", err) ||
        parse_points(sp->dump_points ? sp->dump_points : "resid_post", &p->dump_points, err) || !(p->acts = st_stream_new(err)))
        return -1;
    if ((p->acts_pos_id = st_stream_tensor(p->acts, "positions", "I32", 0, err)) < 0) return -1;
    char name[64];
    p->first_dump = -1;
    for (int l = 0; l < p->n_layers; l++)
        for (int pt = 0; p->dump_layers[l] && pt < HOOK_NPOINTS; pt++) {
            if (!(p->dump_points >> pt & 1u)) continue;
            if (p->first_dump < 0) p->first_dump = l * HOOK_NPOINTS + pt;
            snprintf(name, sizeof name, "layers.%d.%s", l, hook_point_name(pt));
            if ((p->act_id[l * HOOK_NPOINTS + pt] = st_stream_tensor(p->acts, name, "F32", 1, err)) < 0) return -1;
        }
    for (int l = 0; l < p->n_layers; l++) p->hook_layers[l] |= p->dump_layers[l];
    p->hooks.points |= p->dump_points;
    outfile_opts oo = { .flag = "--dump-acts", .refuse_existing = 1, .force = sp->force, .fresh = sp->fresh };
    return outfile_open(&p->acts_out, sp->acts_path, &oo, err);
}

static int open_attn(probe *p, const probe_spec *sp, verr *err) {
    if (parse_layers(sp->attn_layers ? sp->attn_layers : "all", p->n_layers, p->attn_on, "--attn-layers", err)) return -1;
    p->hooks.attn_layers = p->attn_on, p->hooks.on_attn = on_attn;
    if (!sp->attn_path) return 0;
    if (!(p->attn = st_stream_new(err)) || (p->pos_id = st_stream_tensor(p->attn, "positions", "I32", 0, err)) < 0)
        return -1;
    char name[64];
    for (int l = 0; l < p->n_layers; l++) {
        if (!p->attn_on[l]) continue;
        snprintf(name, sizeof name, "layers.%d.attn", l);
        if ((p->attn_id[l] = st_stream_tensor(p->attn, name, "F32", p->n_heads, err)) < 0) return -1;
    }
    outfile_opts oo = { .flag = "--dump-attn", .refuse_existing = 1, .force = sp->force, .fresh = sp->fresh };
    return outfile_open(&p->attn_out, sp->attn_path, &oo, err);
}

static int open_lens(probe *p, const model_config *c, verr *err) {
    p->logit_lens = 1;
    p->lens_x = malloc(sizeof(float) * (size_t)c->n_layers * c->dim);
    p->lens_logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if (!p->lens_x || !p->lens_logits) return verr_set(err, "out of memory");
    memset(p->hook_layers, 1, (size_t)c->n_layers);
    p->hooks.points |= 1u << HOOK_RESID_POST;
    return 0;
}

int probe_open(probe **out, const probe_spec *sp, session *s, verr *err) {
    *out = NULL;
    const model_config *c = &s->m.cfg;
    probe *p = calloc(1, sizeof *p);
    if (!p) return verr_set(err, "out of memory");
    p->s = s, p->prev = s->fw.hooks, p->n_layers = c->n_layers, p->n_heads = c->n_heads, p->dim = c->dim;
    if (p->prev) p->hooks = *p->prev;  // keep the interventions
    p->hooks.on_act = on_act, p->hooks.ud = p;
    int rc = alloc_all(p, c, s->ctx) ? verr_set(err, "out of memory") : 0;
    if (rc == 0 && sp->acts_path) rc = open_acts(p, sp, err);
    if (rc == 0 && (sp->attn_layers || sp->attn_path)) rc = open_attn(p, sp, err);
    if (rc == 0 && sp->logit_lens) rc = open_lens(p, c, err);
    if (rc) {
        free_all(p);
        return -1;
    }
    p->hooks.act_layers = p->hook_layers;
    s->fw.hooks = &p->hooks;
    *out = p;
    return 0;
}

int probe_check(const probe *p, verr *err) { return p && p->failed ? (*err = p->err, -1) : 0; }

void probe_pause(probe *p, int paused) {
    if (p) p->paused = paused;
}

long probe_rows(const probe *p) { return p && p->acts ? st_stream_rows(p->acts, p->acts_pos_id) : 0; }

static void json_attn(const probe *p, FILE *f) {
    fputs(",\"attn_layers\":[", f);
    int first = 1;
    for (int l = 0; l < p->n_layers; l++) {
        if (!p->attn_on[l]) continue;
        fprintf(f, "%s{\"layer\":%d", first ? "" : ",", l);
        first = 0;
        const char *names[2] = { "entropy", "varentropy" };
        const double *v[2] = { p->H, p->V };
        for (int k = 0; k < 2; k++) {
            fprintf(f, ",\"%s\":", names[k]);
            if (!p->attn_have[l]) {  // a skipped layer computes no attention
                fputs("null", f);
                continue;
            }
            for (int h = 0; h < p->n_heads; h++) {
                fputc(h ? ',' : '[', f);
                json_out_num(f, v[k][(size_t)l * p->n_heads + h]);
            }
            fputc(']', f);
        }
        fputc('}', f);
    }
    fputc(']', f);
}

// One layer's lens: logits of its last row, their entropy (bits) and top tokens.
static void json_lens_layer(probe *p, FILE *f, int l) {
    session *s = p->s;
    const model_config *c = &s->m.cfg;
    float *x = p->lens_x + (size_t)l * c->dim, *lg = p->lens_logits;
    cpu_rmsnorm(x, x, s->m.final_norm, 1, c->dim, c->norm_eps);
    verr lens_err;  // tensor parallelism: every rank makes this call, gathering the vocabulary
    if (forward_lm_head(&s->fw, lg, x, 1, &lens_err)) memset(lg, 0, sizeof(float) * (size_t)c->vocab_size);
    double mx = lg[0], z = 0, H = 0;
    for (int i = 1; i < c->vocab_size; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < c->vocab_size; i++) z += exp((double)lg[i] - mx);
    for (int i = 0; i < c->vocab_size; i++) {
        double lp = (double)lg[i] - mx - log(z);
        H -= exp(lp) * lp / M_LN2;
    }
    int top[LENS_TOP], n = 0;
    for (int i = 0; i < c->vocab_size; i++) {  // insertion into the best LENS_TOP, ties to the lower id
        if (n == LENS_TOP && !(lg[i] > lg[top[LENS_TOP - 1]])) continue;
        int at = n < LENS_TOP ? n++ : LENS_TOP - 1;
        for (; at > 0 && lg[i] > lg[top[at - 1]]; at--) top[at] = top[at - 1];
        top[at] = i;
    }
    fprintf(f, "{\"layer\":%d,\"entropy\":", l);
    json_out_num(f, H);
    fputs(",\"top\":[", f);
    for (int k = 0; k < n; k++) {
        verr why;
        char *text = s->tok ? tokenizer_decode(s->tok, &top[k], 1, 0, &why) : NULL;
        fprintf(f, "%s{\"id\":%d,\"text\":", k ? "," : "", top[k]);
        json_out_str(f, text ? text : "");
        fputs(",\"p\":", f);
        json_out_num(f, exp((double)lg[top[k]] - mx - log(z)));
        fputc('}', f);
        free(text);
    }
    fputs("]}", f);
}

int probe_json(probe *p, FILE *f) {
    if (!p) return 0;
    if (p->hooks.on_attn) json_attn(p, f);
    if (p->logit_lens) {
        fputs(",\"logit_lens\":[", f);
        for (int l = 0, first = 1; l < p->n_layers; l++) {
            if (!p->lens_have[l]) continue;
            if (!first) fputc(',', f);
            first = 0;
            json_lens_layer(p, f, l);
            p->lens_have[l] = 0;  // lens_x now holds the normed row
        }
        fputc(']', f);
    }
    return ferror(f) ? -1 : 0;
}

int probe_add_i32(probe *p, const char *name, const int *v, int n, verr *err) {
    st_stream *w[2] = { p ? p->acts : NULL, p ? p->attn : NULL };
    for (int k = 0; k < 2; k++) {
        int id = w[k] && n > 0 ? st_stream_tensor(w[k], name, "I32", 0, err) : 0;
        if (id < 0 || (w[k] && n > 0 && st_stream_append(w[k], id, v, n, 1, err))) return -1;
    }
    return 0;
}

// One capture file: ids (when they match), the model as metadata, the data, the commit.
static int write_one(st_stream *w, outfile *o, int keep, const char *model_dir, const int *ids, int n_ids, long rows,
                     verr *err) {
    if (ids && rows > 0 && n_ids >= rows) {  // the fed positions are a prefix of the ids
        int id = st_stream_tensor(w, "ids", "I32", 0, err);
        if (id < 0 || st_stream_append(w, id, ids, (int)rows, 1, err)) return -1;
    }
    if (st_stream_meta(w, "model", model_dir, err) || st_stream_write(w, o->f, o->shown, err)) return -1;
    return outfile_finish(o, (outfile_end)keep, err);
}

int probe_close(probe *p, int keep, const int *ids, int n_ids, verr *err) {
    if (!p) return 0;
    p->s->fw.hooks = p->prev;
    int rc = 0;
    if (keep && p->failed) *err = p->err, rc = -1;
    long rows = probe_rows(p);
    if (keep && rc == 0 && p->acts) rc = write_one(p->acts, &p->acts_out, keep, p->s->m.dir, ids, n_ids, rows, err);
    if (keep && rc == 0 && p->attn) rc = write_one(p->attn, &p->attn_out, keep, p->s->m.dir, NULL, 0, 0, err);
    free_all(p);
    return rc;
}
