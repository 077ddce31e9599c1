// summary.c: see summary.h.
#include "host/eval/summary.h"

#include <math.h>
#include <string.h>

#include "host/util/json_out.h"
#include "host/util/stats.h"

static int in_task(const eval_item *it, const char *task) { return !task || !strcmp(it->task, task); }

void eval_arm_stats_of(const eval_set *set, const char *task, int arm, int n_arms, int repeats,
                       const eval_outcome *res, eval_arm_stats *o) {
    memset(o, 0, sizeof *o);
    double hs[2] = { 0, 0 }, vs[2] = { 0, 0 };
    long nm[2] = { 0, 0 };
    for (int i = 0; i < set->n; i++) {
        if (!in_task(&set->it[i], task)) continue;
        for (int r = 0; r < repeats; r++) {
            const eval_outcome *x = &res[((long)i * repeats + r) * n_arms + arm];
            if (!x->done) continue;
            o->n++, o->k += x->correct;
            o->tokens += x->tokens, o->compute += (double)x->compute, o->wall_s += x->wall_s;
            if (isfinite(x->h)) hs[x->correct] += x->h, vs[x->correct] += x->v, nm[x->correct]++;
        }
    }
    o->acc = o->n ? (double)o->k / o->n : NAN;
    stats_wilson(o->k, o->n, STATS_Z95, &o->lo, &o->hi);
    if (o->n) o->tokens /= o->n, o->compute /= o->n, o->wall_s /= o->n;
    for (int c = 0; c < 2; c++) o->h[c] = nm[c] ? hs[c] / nm[c] : NAN, o->v[c] = nm[c] ? vs[c] / nm[c] : NAN;
}

void eval_pair_stats_of(const eval_set *set, const char *task, int x, int y, int n_arms, int repeats,
                        const eval_outcome *res, eval_pair_stats *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < set->n; i++) {
        if (!in_task(&set->it[i], task)) continue;
        for (int r = 0; r < repeats; r++) {
            const eval_outcome *base = &res[((long)i * repeats + r) * n_arms];
            if (!base[x].done || !base[y].done) continue;
            int p = base[x].correct, q = base[y].correct;
            if (p && q) o->a++;
            else if (p) o->b++;
            else if (q) o->c++;
            else o->d++;
        }
    }
    long n = o->a + o->b + o->c + o->d;
    o->diff = n ? (double)(o->b - o->c) / n : NAN;
    stats_paired_diff(o->a, o->b, o->c, o->d, STATS_Z95, &o->lo, &o->hi);
    o->p = stats_mcnemar_exact(o->b, o->c);
}

static void num(FILE *f, double x, const char *fmt) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("-", f);
}

static void arm_table(FILE *f, const eval_set *set, const char *task, const eval_arm *arms, int n_arms,
                      const eval_outcome *res, int repeats) {
    fputs("| arm | n | accuracy | 95% CI | tokens/item | compute/item | s/item | H right | H wrong | V right | V wrong |\n"
          "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|\n", f);
    for (int a = 0; a < n_arms; a++) {
        eval_arm_stats s;
        eval_arm_stats_of(set, task, a, n_arms, repeats, res, &s);
        fprintf(f, "| %s | %ld | ", arms[a].name, s.n);
        num(f, s.acc, "%.3f");
        fprintf(f, " | [%.3f, %.3f] | %.1f | %.1f | %.3f | ", s.lo, s.hi, s.tokens, s.compute, s.wall_s);
        num(f, s.h[1], "%.3f"), fputs(" | ", f), num(f, s.h[0], "%.3f"), fputs(" | ", f);
        num(f, s.v[1], "%.3f"), fputs(" | ", f), num(f, s.v[0], "%.3f"), fputs(" |\n", f);
    }
}

static void pair_table(FILE *f, const eval_set *set, const char *task, const eval_arm *arms, int n_arms,
                       const eval_outcome *res, int repeats) {
    if (n_arms < 2) return;
    fputs("\n| A | B | both right | A only | B only | both wrong | acc A - B | 95% CI | McNemar p |\n"
          "|---|---|--:|--:|--:|--:|--:|---|--:|\n", f);
    for (int x = 0; x < n_arms; x++)
        for (int y = x + 1; y < n_arms; y++) {
            eval_pair_stats p;
            eval_pair_stats_of(set, task, x, y, n_arms, repeats, res, &p);
            fprintf(f, "| %s | %s | %ld | %ld | %ld | %ld | ", arms[x].name, arms[y].name, p.a, p.b, p.c, p.d);
            num(f, p.diff, "%+.3f");
            fprintf(f, " | [%+.3f, %+.3f] | %.3g |\n", p.lo, p.hi, p.p);
        }
}

// The distinct task names of the set, in their first order (at most cap).
static int task_names(const eval_set *set, const char **tasks, int cap) {
    int n_tasks = 0;
    for (int i = 0; i < set->n && n_tasks < cap; i++) {
        int seen = 0;
        for (int t = 0; t < n_tasks && !seen; t++) seen = !strcmp(tasks[t], set->it[i].task);
        if (!seen) tasks[n_tasks++] = set->it[i].task;
    }
    return n_tasks;
}

void eval_summary_md(FILE *f, const eval_set *set, const eval_arm *arms, int n_arms, const eval_outcome *res,
                     const eval_meta *m) {
    const char *tasks[256];
    int n_tasks = task_names(set, tasks, 256);
    fprintf(f, "## varent eval: %s\n\n%d items, %d repeat%s, seed %llu, up to %d tokens, chat %s; arms:", m->model, set->n,
            m->repeats, m->repeats == 1 ? "" : "s", (unsigned long long)m->seed, m->max_new, m->chat);
    for (int a = 0; a < n_arms; a++) fprintf(f, "%s %s", a ? "," : "", arms[a].name);
    fputs(".\nH, V: mean entropy (bits) and varentropy (bits^2) per kept token, over right and wrong answers. "
          "compute: decode forward positions (discarded tokens, branches and critic included).\n", f);
    for (int t = 0; t <= n_tasks; t++) {
        if (t == n_tasks && n_tasks == 1) break;
        const char *task = t < n_tasks ? tasks[t] : NULL;
        int n = 0;
        for (int i = 0; i < set->n; i++) n += in_task(&set->it[i], task);
        fprintf(f, "\n### %s (%d items)\n\n", task ? task : "all tasks", n);
        arm_table(f, set, task, arms, n_arms, res, m->repeats);
        pair_table(f, set, task, arms, n_arms, res, m->repeats);
    }
}

// ---- JSON ----

static void json_task(FILE *f, const eval_set *set, const char *task, const eval_arm *arms, int n_arms,
                      const eval_outcome *res, int repeats) {
    int n = 0;
    for (int i = 0; i < set->n; i++) n += in_task(&set->it[i], task);
    fputs("{\"task\":", f), json_out_str(f, task ? task : "all");
    fprintf(f, ",\"items\":%d,\"arms\":[", n);
    for (int a = 0; a < n_arms; a++) {
        eval_arm_stats s;
        eval_arm_stats_of(set, task, a, n_arms, repeats, res, &s);
        fputs(a ? ",{\"arm\":" : "{\"arm\":", f), json_out_str(f, arms[a].name);
        fprintf(f, ",\"n\":%ld,\"correct\":%ld,\"accuracy\":", s.n, s.k);
        json_out_num(f, s.acc);
        fputs(",\"ci\":[", f), json_out_num(f, s.lo), fputc(',', f), json_out_num(f, s.hi);
        fputs("],\"tokens\":", f), json_out_num(f, s.tokens);
        fputs(",\"compute\":", f), json_out_num(f, s.compute);
        fputs(",\"wall_s\":", f), json_out_num(f, s.wall_s);
        fputs(",\"entropy\":{\"right\":", f), json_out_num(f, s.h[1]), fputs(",\"wrong\":", f), json_out_num(f, s.h[0]);
        fputs("},\"varentropy\":{\"right\":", f), json_out_num(f, s.v[1]), fputs(",\"wrong\":", f), json_out_num(f, s.v[0]);
        fputs("}}", f);
    }
    fputs("],\"pairs\":[", f);
    for (int x = 0, k = 0; x < n_arms; x++)
        for (int y = x + 1; y < n_arms; y++) {
            eval_pair_stats p;
            eval_pair_stats_of(set, task, x, y, n_arms, repeats, res, &p);
            fputs(k++ ? ",{\"a\":" : "{\"a\":", f), json_out_str(f, arms[x].name);
            fputs(",\"b\":", f), json_out_str(f, arms[y].name);
            fprintf(f, ",\"both_right\":%ld,\"a_only\":%ld,\"b_only\":%ld,\"both_wrong\":%ld,\"diff\":", p.a, p.b, p.c,
                    p.d);
            json_out_num(f, p.diff);
            fputs(",\"ci\":[", f), json_out_num(f, p.lo), fputc(',', f), json_out_num(f, p.hi);
            fputs("],\"mcnemar_p\":", f), json_out_num(f, p.p), fputc('}', f);
        }
    fputs("]}", f);
}

void eval_summary_json(FILE *f, const eval_set *set, const eval_arm *arms, int n_arms, const eval_outcome *res,
                       const eval_meta *m) {
    const char *tasks[256];
    int n_tasks = task_names(set, tasks, 256);
    fprintf(f, "{\"seed\":%llu,\"repeats\":%d,\"tasks\":[", (unsigned long long)m->seed, m->repeats);
    for (int t = 0; t <= n_tasks; t++) {
        if (t == n_tasks && n_tasks == 1) break;
        if (t) fputc(',', f);
        json_task(f, set, t < n_tasks ? tasks[t] : NULL, arms, n_arms, res, m->repeats);
    }
    fputs("]}\n", f);
}
