// chat_prompt.c: see chat_prompt.h.
#include "host/decode/chat_prompt.h"

#include <stdlib.h>
#include <string.h>

static int register_stops(chat_conv *c, session *s, verr *err) {
    const char *const *stops = chat_stop_strings(c->fmt.kind);
    for (int i = 0; stops && stops[i]; i++) {
        int id = tokenizer_token_id(s->tok, stops[i]);
        if (id >= 0 && session_add_stop(s, id)) return verr_set(err, "too many stop tokens");
    }
    return 0;
}

int chat_conv_init(chat_conv *c, session *s, const char *template_name, int enable_thinking, verr *err) {
    memset(c, 0, sizeof *c);
    if (!s->tok) return verr_set(err, "%s has no tokenizer.json, which chat needs", s->m.dir);
    if (template_name) {
        if (chat_format_from_name(template_name, &c->fmt, err)) return -1;
    } else {
        const char *t = tokenizer_chat_template(s->tok);
        if (!t) return verr_set(err, "%s: tokenizer_config.json has no chat_template (pick one with --chat-template)", s->m.dir);
        c->fmt = chat_detect(t);
        if (c->fmt.kind == CHAT_UNKNOWN)
            return verr_set(err, "%s: chat_template not recognised (pick one with --chat-template: llama3, llama3.1, "
                                 "llama3.2, chatml, qwen2.5, smollm2, qwen3, llama2)", s->m.dir);
    }
    c->opts = chat_opts_default();
    c->opts.enable_thinking = enable_thinking;
    int bos = tokenizer_bos_id(s->tok);
    if (bos >= 0) c->opts.bos_token = tokenizer_piece(s->tok, bos);
    return register_stops(c, s, err);
}

void chat_conv_reset(chat_conv *c) {
    for (int i = 0; i < c->n; i++) free((char *)c->msgs[i].role), free((char *)c->msgs[i].content);
    c->n = 0;
}

void chat_conv_free(chat_conv *c) {
    chat_conv_reset(c);
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

int chat_conv_add(chat_conv *c, const char *role, const char *content, verr *err) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        chat_msg *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) return verr_set(err, "out of memory");
        c->msgs = m, c->cap = cap;
    }
    chat_msg *m = &c->msgs[c->n];
    memset(m, 0, sizeof *m);
    m->role = strdup(role);
    m->content = strdup(content);
    if (!m->role || !m->content) return verr_set(err, "out of memory");
    c->n++;
    return 0;
}

int chat_conv_ids(const chat_conv *c, const session *s, int **ids, verr *err) {
    size_t *spans = NULL;
    int n_spans = 0;
    char *text = chat_render_spans(&c->fmt, c->msgs, c->n, &c->opts, c->escape_special ? &spans : NULL, &n_spans,
                                   err);
    if (!text) return -1;
    int n = tokenizer_encode_spans(s->tok, text, strlen(text), spans, n_spans, ids, err);
    free(spans);
    free(text);
    return n;
}
