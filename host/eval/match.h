// match.h: whether a generated output answers an item (host/eval/task.h). The output
// is first cut at the item's first stop string. Then, by the item's rule:
//   exact     the output without surrounding whitespace equals the answer;
//   contains  the answer occurs in the output;
//   regex     the answer, a PCRE2 pattern, matches somewhere in the output;
//   number    the first or last number in the output (pick) equals the answer
//             numerically: an optional minus sign, digits with optional thousands
//             separators ("1,234"), an optional decimal part ("9.11"); |x - a| <= 1e-9 max(1, |a|).
// nocase makes exact, contains and regex ignore case (ASCII letters; regex: Unicode).
#ifndef VARENT_EVAL_MATCH_H
#define VARENT_EVAL_MATCH_H

#include <stddef.h>

#include "host/eval/task.h"

// 1 when output answers it, else 0. extracted (n bytes) receives what was compared:
// the number picked, the trimmed output (exact), or "" when nothing matched.
int eval_judge(const eval_item *it, const char *output, char *extracted, size_t n);
// The length of output before the item's first stop string.
size_t eval_cut(const eval_item *it, const char *output);
// Parses a whole string as a number (the format above, surrounding spaces allowed).
int eval_number_value(const char *s, double *v);
// Checks that pattern compiles; -1 with err naming the offset and reason.
int eval_regex_check(const char *pattern, int nocase, verr *err);

#endif
