// chat.h: chat templates rendered by native code, one renderer per format, with no
// jinja engine. chat_detect() recognises a model's Hugging Face `chat_template` text
// and extracts the few values its renderer needs (default system prompt, Llama 3.1
// default date); the output matches transformers' apply_chat_template byte-for-byte
// for the supported roles (system, user, assistant, tool). Tool calls are not rendered.
#ifndef VARENT_CHAT_H
#define VARENT_CHAT_H

#include "host/util/err.h"

typedef enum {
    CHAT_UNKNOWN = 0,
    CHAT_LLAMA3,  // <|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>
    CHAT_CHATML,  // <|im_start|>role\n ... <|im_end|>\n (Qwen2/2.5, SmolLM2)
    CHAT_QWEN3,   // ChatML plus <think> blocks and reasoning stripping
    CHAT_LLAMA2,  // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n ... [/INST] ... </s>
} chat_kind;

typedef struct {
    chat_kind kind;
    // ChatML: system prompt inserted when the conversation has none (Qwen2.5, SmolLM2).
    int has_default_system;
    char default_system[1024];
    // ChatML: tool turns go inside a user turn as <tool_response> blocks (Qwen).
    int tool_response;
    // Llama 3: 1 for the 3.1+ system block (Cutting Knowledge Date / Today Date lines).
    int date_block;
    // Llama 3.2: with no date_string, today's date ("%d %b %Y") instead of default_date.
    int date_today;
    char default_date[64];  // Llama 3.1's fallback date, "26 Jul 2024"
    // Llama 3.0's template appends the assistant header even when not asked to.
    int gen_prompt_always;
} chat_format;

typedef struct {
    const char *role;       // "system", "user", "assistant" or "tool"
    const char *content;    // UTF-8, never NULL
    const char *reasoning;  // Qwen3 reasoning_content of an assistant turn, or NULL
} chat_msg;

typedef struct {
    int add_generation_prompt;  // end with the assistant turn opener
    int enable_thinking;        // Qwen3: 0 renders the empty <think> block
    const char *bos_token;      // NULL: the format's usual one (<|begin_of_text|>, <s>)
    const char *eos_token;      // NULL: the format's usual one (Llama 2: </s>)
    const char *date_string;    // Llama 3.1+: "Today Date" value; NULL: template default
} chat_opts;

// Generation prompt on, thinking on, format-default tokens and date.
chat_opts chat_opts_default(void);

// Recognise a chat_template text. kind is CHAT_UNKNOWN when not recognised.
chat_format chat_detect(const char *template_text);

// Formats by name: llama3, llama3.1, llama3.2, chatml, qwen2.5, smollm2, qwen3,
// llama2. Returns 0, or -1 with err listing the names.
int chat_format_from_name(const char *name, chat_format *f, verr *err);
// The kind a name selects, CHAT_UNKNOWN if none.
chat_kind chat_kind_from_name(const char *name);
const char *chat_kind_name(chat_kind k);

// Render a conversation to a malloc'd NUL-terminated string, or NULL with err
// (no messages, unknown role, roles that the format's template rejects).
char *chat_render(const chat_format *f, const chat_msg *msgs, int n, const chat_opts *opts,
                  verr *err);
// chat_render that also returns the byte ranges of message text in the result (*spans:
// malloc'd [2 * *n_spans] start/end pairs, in order; template text is outside them), for
// tokenizing that text with special tokens escaped (tokenizer_encode_spans).
char *chat_render_spans(const chat_format *f, const chat_msg *msgs, int n, const chat_opts *opts,
                        size_t **spans, int *n_spans, verr *err);

// Token strings that end an assistant turn, NULL-terminated: generation stops there.
const char *const *chat_stop_strings(chat_kind k);

#endif
