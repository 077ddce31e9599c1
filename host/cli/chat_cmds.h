// chat_cmds.h: the state of a `varent chat` session and its slash commands (/help,
// /reset, /system, /save, /load, /quit), which never reach the model. chat.c reads the
// lines and runs the turns; chat_cmds.c edits the conversation.
#ifndef VARENT_CHAT_CMDS_H
#define VARENT_CHAT_CMDS_H

#include "host/cli/entropix_opts.h"
#include "host/cli/repl.h"
#include "host/decode/chat_prompt.h"
#include "host/decode/generate.h"

typedef struct {
    session *s;
    chat_conv conv;
    gen_opts g;
    char *system;      // the system prompt (malloc'd), NULL: none
    int *cached;       // ids whose keys and values are in the KV cache
    int n_cached;
    repl *in;
    int tty;           // people at a terminal: confirmations, banner
    struct chat_capture *cap;  // --metrics-out and the captures (chat.c); NULL: none
    const entropix_cli *ex;    // the sampler options (--sampler, --profile, ...)
    int stats;                 // --stats: each reply's timings on stderr
} chat_state;

typedef enum { CHAT_CMD_DONE, CHAT_CMD_QUIT } chat_cmd_result;

// Runs the slash command in line ("/name args"). Messages go to stderr.
chat_cmd_result chat_command(chat_state *c, const char *line);
// The /help text (also shown by the banner's hint).
void chat_print_help(FILE *f);
// Sets (text) or removes (NULL) the system prompt, first in the conversation.
int chat_set_system(chat_state *c, const char *text, verr *err);
// Removes message i of the conversation.
void chat_remove_message(chat_conv *conv, int i);

#endif
