// prompt.c: see prompt.h.
#include "host/eval/prompt.h"

int eval_prompter_open(eval_prompter *p, session *s, const eval_set *set, verr *err) {
    int need = p->chat;
    for (int i = 0; !need && set && i < set->n; i++) need = set->it[i].n_msgs > 0;
    p->conv_open = 0;
    if (!need) return 0;
    if (chat_conv_init(&p->conv, s, p->template_name, p->think, err)) return -1;
    p->conv_open = 1;
    return 0;
}

void eval_prompter_close(eval_prompter *p) {
    if (p->conv_open) chat_conv_free(&p->conv);
    p->conv_open = 0;
}

int eval_prompt_ids(eval_prompter *p, session *s, const eval_item *it, int **ids, verr *err) {
    if (!it->n_msgs && !p->chat) return session_encode_prompt(s, it->prompt, ids, err);
    if (!p->conv_open) return verr_set(err, "internal: the chat template is not open");
    chat_conv_reset(&p->conv);
    int rc = 0;
    if (it->n_msgs) {
        for (int i = 0; rc == 0 && i < it->n_msgs; i++) rc = chat_conv_add(&p->conv, it->roles[i], it->contents[i], err);
    } else {
        if (p->system) rc = chat_conv_add(&p->conv, "system", p->system, err);
        if (rc == 0) rc = chat_conv_add(&p->conv, "user", it->prompt, err);
    }
    return rc ? -1 : chat_conv_ids(&p->conv, s, ids, err);
}
