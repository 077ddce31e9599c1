// task.h: evaluation items and their JSONL task files. One JSON object per line:
//   prompt (a string) or messages ([{"role","content"}, ...]: a chat conversation),
//   and either
//     answer (a string) with match: exact | number | regex | contains (default exact),
//       pick: first | last (number only: which number of the output is compared;
//       default last), nocase: true (exact/contains/regex ignore case);
//     or choices (a non-empty array of strings) with gold (the right choice's index),
//       scored by the log-likelihood of each choice after the prompt.
//   Optional: task (the task's name; default the file's base name), id (a string),
//   stop (strings that end the generated answer).
// Blank lines are skipped; unknown fields are an error (a typo is not silently
// ignored). Every error names the file and line.
#ifndef VARENT_EVAL_TASK_H
#define VARENT_EVAL_TASK_H

#include <stdio.h>

#include "host/util/err.h"

typedef enum { MATCH_EXACT, MATCH_NUMBER, MATCH_REGEX, MATCH_CONTAINS } eval_match;

#define EVAL_MAX_STOP 8

typedef struct {
    char *task, *id;
    char *prompt;                   // NULL when the item has messages
    char **roles, **contents;       // [n_msgs]
    int n_msgs;
    char *answer;                   // generation items
    eval_match match;
    int pick_last, nocase;
    char **choices;                 // choice items: [n_choices]
    int n_choices, gold;
    char *stop[EVAL_MAX_STOP];
    int n_stop;
    int line;                       // in its file (0: generated)
} eval_item;

typedef struct {
    eval_item *it;
    int n, cap;
} eval_set;

const char *eval_match_name(eval_match m);
// Parses one line (a JSON object) into it; where/line for messages, task the default
// task name. -1 with err "WHERE:LINE: what is wrong".
int eval_item_parse(eval_item *it, const char *json, const char *where, int line, const char *task, verr *err);
// Appends the items of a JSONL file; task names default to the file's base name
// without its extension.
int eval_set_read(eval_set *s, const char *path, verr *err);
// Takes ownership of *it (appends a shallow copy). -1 when out of memory.
int eval_set_add(eval_set *s, eval_item *it, verr *err);
void eval_item_free(eval_item *it);
void eval_set_free(eval_set *s);
// One item as its JSONL line (the format above, without the newline).
void eval_item_write(FILE *f, const eval_item *it);

#endif
