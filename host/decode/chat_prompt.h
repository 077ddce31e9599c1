// chat_prompt.h: a conversation rendered with the model's chat template and encoded
// for generation. Generation stops at the format's end-of-turn tokens.
#ifndef VARENT_CHAT_PROMPT_H
#define VARENT_CHAT_PROMPT_H

#include "host/runtime/session.h"
#include "tokenizer/chat.h"

typedef struct {
    chat_format fmt;
    chat_opts opts;
    chat_msg *msgs;      // [n], strings owned
    int n, cap;
    int escape_special;  // 1: special-token text inside messages is tokenized as plain text
} chat_conv;

// template_name: NULL to recognise the model's chat_template. Also registers the
// format's end-of-turn tokens as stop ids on the session.
int chat_conv_init(chat_conv *c, session *s, const char *template_name, int enable_thinking, verr *err);
void chat_conv_free(chat_conv *c);
void chat_conv_reset(chat_conv *c);  // drop every message
int chat_conv_add(chat_conv *c, const char *role, const char *content, verr *err);
// Render with the generation prompt and encode (special tokens parsed, no extra BOS:
// the template writes it). *ids is malloc'd; returns the count or -1.
int chat_conv_ids(const chat_conv *c, const session *s, int **ids, verr *err);

#endif
