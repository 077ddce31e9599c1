// summary.h: an evaluation's results per task and arm, and the paired comparisons
// between arms, as a markdown report. Per arm: accuracy with its 95% Wilson interval,
// generated tokens and decode compute per item, wall time, and the mean entropy and
// varentropy of the kept tokens split by right and wrong answers (the mean over items
// of each item's per-token mean). Per pair of arms, on the same (item, repeat) trials:
// the counts where only one is right, the accuracy difference with Newcombe's paired
// 95% interval and McNemar's exact p-value (host/util/stats.h).
#ifndef VARENT_EVAL_SUMMARY_H
#define VARENT_EVAL_SUMMARY_H

#include <stdint.h>
#include <stdio.h>

#include "host/eval/arm.h"
#include "host/eval/task.h"

// One (item, repeat, arm) trial.
typedef struct {
    int done;              // 0: not run (an interrupted evaluation)
    int correct;
    int tokens;
    long compute;
    double wall_s;
    double h, v;           // the item's mean per-token entropy and varentropy; NAN: no tokens
} eval_outcome;

typedef struct {
    const char *model;
    uint64_t seed;
    int repeats, max_new;
    const char *chat;      // "on"/"off"
} eval_meta;

// Per task and arm. res[(item * repeats + r) * n_arms + arm].
typedef struct {
    long n, k;
    double acc, lo, hi;
    double tokens, compute, wall_s;  // means per trial
    double h[2], v[2];               // [wrong, right] means over trials with tokens (NAN: none)
} eval_arm_stats;

typedef struct {
    long a, b, c, d;                 // both right, first only, second only, both wrong
    double diff, lo, hi, p;
} eval_pair_stats;

// Stats of arm over the trials of task (NULL: all tasks).
void eval_arm_stats_of(const eval_set *set, const char *task, int arm, int n_arms, int repeats,
                       const eval_outcome *res, eval_arm_stats *out);
void eval_pair_stats_of(const eval_set *set, const char *task, int x, int y, int n_arms, int repeats,
                        const eval_outcome *res, eval_pair_stats *out);
void eval_summary_md(FILE *f, const eval_set *set, const eval_arm *arms, int n_arms, const eval_outcome *res,
                     const eval_meta *meta);

#endif

// The same numbers as one JSON document, at full precision: {"tasks": [{"task",
// "items", "arms": [{"arm", n, correct, accuracy, ci: [lo, hi], tokens, compute, wall_s,
// entropy: {right, wrong}, varentropy: {right, wrong}}], "pairs": [{"a", "b", both_right,
// a_only, b_only, both_wrong, diff, ci, mcnemar_p}]}]} (the last task is "all" when
// there are several).
void eval_summary_json(FILE *f, const eval_set *set, const eval_arm *arms, int n_arms, const eval_outcome *res,
                       const eval_meta *meta);

// Trial records of `varent eval -o` (several files: call again; records append) read
// back for a new summary: the items (task names only), the arms (names only) in order of
// appearance, and the outcomes. -1 with err naming the file and line of a bad record.
typedef struct {
    eval_set set;
    eval_arm arms[EVAL_MAX_ARMS];
    int n_arms, repeats;
    eval_outcome *res;       // [set.n * repeats * n_arms] once eval_results_finish ran
    // the records as read: item index in set, repeat, arm, outcome
    struct eval_rec { int item, rep, arm; eval_outcome o; } *rec;
    long n_rec, cap_rec;
} eval_results;

int eval_results_read(eval_results *r, const char *path, verr *err);
// Lays the records out as res[]; -1 with err when a trial is recorded twice.
int eval_results_finish(eval_results *r, verr *err);
void eval_results_free(eval_results *r);
