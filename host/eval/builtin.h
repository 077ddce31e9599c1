// builtin.h: seeded generators of evaluation tasks with exact answers that a small
// instruct model can partly solve (docs/research.md lists the prompts):
//   add2, add3        two- and three-digit addition (match number, last number)
//   decimal           "which is larger: 9.9 or 9.11?" (one vs two decimals; number, first)
//   count-letters     how often a letter occurs in a word (number, first)
//   count-items       how many items a comma-separated list has (number, first)
//   recall            the k-th item of a list (regex: the first list item the output
//                     names is the right one)
//   decimal-choice    the decimal comparison as log-likelihood multiple choice
// Item i of a task depends only on (seed, task, i): the same seed gives the same items
// whatever the count.
#ifndef VARENT_EVAL_BUILTIN_H
#define VARENT_EVAL_BUILTIN_H

#include <stdint.h>

#include "host/eval/task.h"

// "add2, add3, ..." for messages.
const char *eval_builtin_names(void);
// The generation tasks "all" stands for (every built-in but decimal-choice).
const char *eval_builtin_all(void);
int eval_builtin_known(const char *name);
// Appends n items of task name generated from seed; -1 with err for an unknown name.
int eval_builtin(eval_set *s, const char *name, int n, uint64_t seed, verr *err);

#endif
