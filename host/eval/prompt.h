// prompt.h: an item's prompt as ids, the same for every arm. A "prompt" item is plain
// text (BOS per the tokenizer config) or, with chat on, one user turn (after the
// optional system turn) in the model's chat template; a "messages" item is always
// rendered with the chat template. The template's end-of-turn tokens become stop ids.
#ifndef VARENT_EVAL_PROMPT_H
#define VARENT_EVAL_PROMPT_H

#include "host/decode/chat_prompt.h"
#include "host/eval/task.h"

typedef struct {
    int chat;                  // render prompt items as a user turn
    const char *system;        // system turn for prompt items (chat), or NULL
    const char *template_name; // NULL: recognise the model's template
    int think;                 // Qwen3: enable_thinking
    chat_conv conv;
    int conv_open;
} eval_prompter;

// Opens the template when chat is on or any item of set has messages.
int eval_prompter_open(eval_prompter *p, session *s, const eval_set *set, verr *err);
void eval_prompter_close(eval_prompter *p);
// *ids is malloc'd; returns the count or -1.
int eval_prompt_ids(eval_prompter *p, session *s, const eval_item *it, int **ids, verr *err);

#endif
