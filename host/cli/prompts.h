// prompts.h: prompt lists for batch runs and comparisons, and turning one prompt into
// ids (plain text, or a user turn in the model's chat template).
//
// Line files: one prompt per line; "\r\n" endings are accepted; blank (whitespace-only)
// lines are skipped. CSV (RFC 4180): a header row naming the columns, one of them
// "prompt" (case-insensitive, surrounding spaces ignored); fields separated by commas;
// a field in double quotes may hold commas, newlines and "" for a quote; every record
// has the header's number of fields; empty lines are skipped; an empty prompt field
// is an error. A UTF-8 byte-order mark at the start is ignored.
#ifndef VARENT_PROMPTS_H
#define VARENT_PROMPTS_H

#include "host/cli/args.h"
#include "host/runtime/session.h"

typedef struct {
    char **text;  // [n], malloc'd NUL-terminated prompts
    int *line;    // [n], 1-based line in the file where each prompt (its record) starts
    int n, cap;
} prompt_list;

int prompts_read_lines(prompt_list *l, const char *path, verr *err);
int prompts_read_csv(prompt_list *l, const char *path, verr *err);
// Parses CSV text already in memory (where: the file name for messages).
int prompts_parse_csv(prompt_list *l, const char *text, const char *where, verr *err);
void prompts_free(prompt_list *l);

// How prompts become ids: --chat [--system TEXT] [--chat-template NAME] [--no-think],
// or --raw.
typedef struct {
    int chat, think;
    int raw;  // --raw/-no-cnv: plain text even when the model has a chat template
    const char *system, *template_name;
} prompt_style;

// --chat, -sys/--system, --chat-template, --no-think; the last three imply --chat.
extern const cli_opt cli_opts_chat[];
void prompt_style_read(args *a, prompt_style *ps);
// A --chat-template NAME that names no format is a usage error (recorded in a).
void cli_check_template(args *a, const char *name);
// --raw, -no-cnv/--no-conversation (run's): read into ps->raw.
extern const cli_opt cli_opts_raw[];
void prompt_style_read_raw(args *a, prompt_style *ps);
// A text prompt is a user turn by default, as llama-cli's conversation mode, when the
// model's chat template is one varent renders: turns ps->chat on then (unless --raw)
// and returns 1. 0 when the prompt stays plain text.
int prompt_style_auto(const session *s, prompt_style *ps);
// Plain: session_encode_prompt (BOS per the tokenizer config). Chat: the system and
// user turns rendered with the template (which also registers its stop tokens).
int prompt_encode(session *s, const prompt_style *ps, const char *text, int **ids, verr *err);
// Every prompt of pl into ids[i] (n[i] of them) before anything runs, so that a prompt
// that cannot run (not encodable, or too long for the context) fails first: 0, or -1
// with err naming path:line.
int prompts_encode_all(session *s, const prompt_style *ps, const prompt_list *pl, const char *path, int **ids, int *n,
                       verr *err);

#endif
