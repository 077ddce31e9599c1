// critic.c: see critic.h.
#include "host/agents/critic.h"
#include "host/runtime/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Stands in for the question while the template is rendered: never trimmed, never
// in a real template.
#define PLACEHOLDER "\x01varent-critic-question\x01"

// ids of `tail + word` beyond the ids of `tail` (the word as it follows the prompt's
// last part); encode(word) alone when tail's ids are not a prefix.
static int continuation(const tokenizer *t, const char *tail, int special, const char *word, int **out, verr *err) {
    size_t nt = strlen(tail), nw = strlen(word);
    char *both = malloc(nt + nw + 1);
    if (!both) return verr_set(err, "out of memory");
    memcpy(both, tail, nt), memcpy(both + nt, word, nw + 1);
    int *a = NULL, *b = NULL;
    int na = tokenizer_encode(t, tail, nt, special, &a, err);
    int nb = na < 0 ? -1 : tokenizer_encode(t, both, nt + nw, special, &b, err);
    free(both);
    int n = -1;
    if (nb > na && !memcmp(a, b, sizeof(int) * (size_t)na)) {
        n = nb - na;
        memmove(b, b + na, sizeof(int) * (size_t)n);
        *out = b, b = NULL;
    } else if (nb >= 0) {
        n = tokenizer_encode(t, word, nw, 0, out, err);
    }
    free(a), free(b);
    if (n == 0) free(*out);
    return n == 0 ? verr_set(err, "the critic's tokenizer encodes '%s' to no tokens", word) : n;
}

// The rendered prompt around the question: pre + question + post (chat), or
// "" + question + "" with BOS (plain).
static int split_template(const critic *c, char **pre, char **post, verr *err) {
    chat_msg m = { "user", PLACEHOLDER, NULL };
    char *r = chat_render(&c->fmt, &m, 1, &c->opts, err);
    if (!r) return -1;
    char *at = strstr(r, PLACEHOLDER);
    if (!at || strstr(at + 1, PLACEHOLDER)) {
        free(r);
        return verr_set(err, "the critic's chat template does not hold the question exactly once");
    }
    *at = 0;
    *pre = r;
    *post = strdup(at + strlen(PLACEHOLDER));
    if (!*post) return free(r), verr_set(err, "out of memory");
    return 0;
}

// Chat format from the tokenizer's chat_template, if it has one we know.
static int pick_format(critic *c, verr *err) {
    const tokenizer *t = c->s->tok;
    const char *tmpl = tokenizer_chat_template(t);
    if (!tmpl) return 0;
    c->fmt = chat_detect(tmpl);
    if (c->fmt.kind == CHAT_UNKNOWN) {
        c->template_unknown = 1;
        return 0;
    }
    c->chat = 1;
    c->opts = chat_opts_default();
    c->opts.enable_thinking = 0;  // answer at once (Qwen3: the empty think block)
    int bos = tokenizer_bos_id(t);
    if (bos >= 0) c->opts.bos_token = tokenizer_piece(t, bos);
    return 0;
}

static int critic_setup(critic *c, verr *err) {
    if (!c->s->tok) return verr_set(err, "%s has no tokenizer.json, which the critic needs", c->s->m.dir);
    if (pick_format(c, err)) return -1;
    char *pre = NULL, *post = NULL;
    if (c->chat && split_template(c, &pre, &post, err)) return -1;
    const char *tail = c->chat ? post : "Answer:";
    c->n_good = continuation(c->s->tok, tail, c->chat, " GOOD", &c->good, err);
    c->n_bad = c->n_good < 0 ? -1 : continuation(c->s->tok, tail, c->chat, " BAD", &c->bad, err);
    free(pre), free(post);
    if (c->n_good < 0 || c->n_bad < 0) return -1;
    int V = c->s->m.cfg.vocab_size;
    for (int i = 0; i < c->n_good + c->n_bad; i++) {
        int id = i < c->n_good ? c->good[i] : c->bad[i - c->n_good];
        if (id >= V)
            return verr_set(err, "critic: the %s token %d is beyond the model's vocab (%d)",
                            i < c->n_good ? "' GOOD'" : "' BAD'", id, V);
    }
    return 0;
}

int critic_open_shared(critic *c, const session *base, int ctx, verr *err) {
    memset(c, 0, sizeof *c);
    if (session_open_shared(&c->own, base, ctx, err)) return -1;
    c->s = &c->own;
    if (critic_setup(c, err)) return critic_close(c), -1;
    return 0;
}

int critic_open_model(critic *c, const session_opts *o, verr *err) {
    memset(c, 0, sizeof *c);
    if (session_open(&c->own, o, err)) return -1;
    c->s = &c->own;
    if (critic_setup(c, err)) return critic_close(c), -1;
    return 0;
}

void critic_close(critic *c) {
    if (c->s) session_close(c->s);
    free(c->good), free(c->bad), free(c->cached);
    memset(c, 0, sizeof *c);
}

// Appends encode(text) to the growing array *ids (n so far, capacity *cap).
static int append_encoded(const tokenizer *t, const char *text, int special, int **ids, int n, verr *err) {
    int *part = NULL;
    int k = tokenizer_encode(t, text, strlen(text), special, &part, err);
    if (k < 0) return -1;
    int *grown = realloc(*ids, sizeof(int) * (size_t)(n + k + 1));
    if (!grown) return free(part), verr_set(err, "out of memory");
    memcpy(grown + n, part, sizeof(int) * (size_t)k);
    free(part);
    *ids = grown;
    return n + k;
}

int critic_prompt_ids(const critic *c, const char *text, int **ids, verr *err) {
    const tokenizer *t = c->s->tok;
    size_t nt = strlen(text);
    char *q = malloc(nt + strlen(CRITIC_QUESTION) + 8);
    if (!q) return verr_set(err, "out of memory");
    memcpy(q, "Text:\n", 6), memcpy(q + 6, text, nt), strcpy(q + 6 + nt, CRITIC_QUESTION);
    *ids = NULL;
    int n = 0;
    char *pre = NULL, *post = NULL;
    if (c->chat) {
        // The text is encoded with special tokens off: it cannot forge template tokens.
        if (split_template(c, &pre, &post, err)) n = -1;
        if (n >= 0) n = append_encoded(t, pre, 1, ids, n, err);
        if (n >= 0) n = append_encoded(t, q, 0, ids, n, err);
        if (n >= 0) n = append_encoded(t, post, 1, ids, n, err);
    } else {
        int bos = tokenizer_add_bos(t) ? tokenizer_bos_id(t) : -1;
        if (bos >= 0 && !(*ids = malloc(sizeof(int)))) n = verr_set(err, "out of memory");
        if (bos >= 0 && n >= 0) (*ids)[n++] = bos;
        if (n >= 0) n = append_encoded(t, q, 0, ids, n, err);
    }
    free(q), free(pre), free(post);
    if (n < 0) free(*ids), *ids = NULL;
    return n;
}

// Feeds one id and records it as cached.
static int feed(critic *c, kv_view *kv, int id, critic_verdict *v, verr *err) {
    if (session_forward(c->s, kv, &id, 1, err)) return -1;
    v->n_fed++;
    c->cached[c->n_cached++] = id;
    return 0;
}

static int ensure_cache(critic *c, int need, verr *err) {
    if (need <= c->cap) return 0;
    int *g = realloc(c->cached, sizeof(int) * (size_t)need);
    if (!g) return verr_set(err, "out of memory");
    c->cached = g, c->cap = need;
    return 0;
}

// Prompt into the cache, reusing the longest common prefix; leaves its logits.
static int feed_prompt(critic *c, const int *ids, int n, critic_verdict *v, verr *err) {
    int keep = 0;
    while (keep < c->n_cached && keep < n && c->cached[keep] == ids[keep]) keep++;
    if (keep > n - 1) keep = n - 1;  // the last id is fed again: its logits are needed
    kv_cache_truncate(&c->s->kv, keep);
    memcpy(c->cached, ids, sizeof(int) * (size_t)n);
    c->n_cached = n;
    v->n_fed += n - keep;
    kv_view kv = kv_view_of(&c->s->kv);
    if (session_forward(c->s, &kv, ids + keep, n - keep, err)) {
        c->n_cached = keep;
        kv_cache_truncate(&c->s->kv, keep);
        return -1;
    }
    return 0;
}

// Scores " GOOD" token by token, and " BAD" as far as it shares GOOD's prefix (same
// logits); then the rest of " BAD" after truncating back to the shared part.
static int score(critic *c, int n_p, critic_verdict *v, verr *err) {
    session *s = c->s;
    int V = s->m.cfg.vocab_size, k = 0;
    kv_view kv = kv_view_of(&s->kv);
    double lg = metrics_log_prob(s->fw.logits, V, c->good[0]), lb = metrics_log_prob(s->fw.logits, V, c->bad[0]);
    for (int j = 1; j < c->n_good; j++) {
        if (feed(c, &kv, c->good[j - 1], v, err)) return -1;
        lg += metrics_log_prob(s->fw.logits, V, c->good[j]);
        if (j < c->n_bad && c->good[j - 1] == c->bad[j - 1] && k == j - 1) {
            lb += metrics_log_prob(s->fw.logits, V, c->bad[j]);
            k = j;
        }
    }
    kv_cache_truncate(&s->kv, n_p + k);
    c->n_cached = n_p + k;
    kv = kv_view_of(&s->kv);
    for (int j = k + 1; j < c->n_bad; j++) {
        if (feed(c, &kv, c->bad[j - 1], v, err)) return -1;
        lb += metrics_log_prob(s->fw.logits, V, c->bad[j]);
    }
    v->logp_good = lg, v->logp_bad = lb, v->good = lg >= lb;
    return 0;
}

int critic_judge(critic *c, const char *text, critic_verdict *v, verr *err) {
    memset(v, 0, sizeof *v);
    int *ids = NULL;
    int n = critic_prompt_ids(c, text, &ids, err);
    if (n < 0) return -1;
    int longest = c->n_good > c->n_bad ? c->n_good : c->n_bad;
    int rc = 0;
    if (n == 0) rc = verr_set(err, "critic: empty prompt");
    else if (n + longest - 1 > c->s->ctx)
        rc = verr_set(err, "the critic prompt is %d tokens but the critic context holds %d (raise --ctx)", n, c->s->ctx);
    if (rc == 0) rc = ensure_cache(c, n + longest, err);
    if (rc == 0) rc = feed_prompt(c, ids, n, v, err);
    if (rc == 0) rc = score(c, n, v, err);
    if (rc == 0) v->n_prompt = n;
    free(ids);
    return rc;
}
