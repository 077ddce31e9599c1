// builtin.c: see builtin.h. A splitmix64 stream per item, keyed by seed, task and index.
#include "host/eval/builtin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t x;
} gen_rng;

static uint64_t next_u64(gen_rng *r) {
    uint64_t z = (r->x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in lo..hi (inclusive); the modulo bias is below 2^-40 for these ranges.
static int uniform(gen_rng *r, int lo, int hi) { return lo + (int)(next_u64(r) % (uint64_t)(hi - lo + 1)); }

static gen_rng item_rng(uint64_t seed, const char *task, int i) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the task name
    for (const char *p = task; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    gen_rng r = { seed ^ h };
    r.x = next_u64(&r) + (uint64_t)i * 0xd1b54a32d192ed03ull;
    next_u64(&r);
    return r;
}

static const char *const WORDS[] = { "strawberry", "banana", "mississippi", "bookkeeper", "committee", "balloon",
                                     "coffee", "letter", "apple", "pepper", "parallel", "assessment", "raspberry",
                                     "tomorrow", "success", "address", "necessary", "occurrence", "possession",
                                     "accommodate", "butterfly", "grammar", "hippopotamus", "millennium", "referee",
                                     "cinnamon", "embarrass", "giraffe", "umbrella", "elephant", "kangaroo",
                                     "chocolate", "cucumber", "vanilla", "pineapple", "sassafras" };
static const char *const NOUNS[] = { "apple", "river", "stone", "cloud", "lamp", "chair", "tiger", "bread", "window",
                                     "garden", "pencil", "candle", "mirror", "bottle", "rocket", "violin", "forest",
                                     "button", "anchor", "basket", "carpet", "dragon", "feather", "guitar", "helmet",
                                     "island", "jacket", "kettle", "ladder", "magnet", "needle", "orange", "pillow",
                                     "saddle", "tunnel", "wallet", "zebra", "castle" };
#define N_WORDS ((int)(sizeof WORDS / sizeof *WORDS))
#define N_NOUNS ((int)(sizeof NOUNS / sizeof *NOUNS))
static const char *const ORDINALS[] = { "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth" };

typedef struct {
    char prompt[512], answer[512];
    eval_match match;
    int pick_last, nocase;
    char choices[2][32];
    int n_choices, gold;
} draft;

static void gen_add(gen_rng *r, draft *d, int lo, int hi) {
    int a = uniform(r, lo, hi), b = uniform(r, lo, hi);
    snprintf(d->prompt, sizeof d->prompt, "What is %d + %d? Reply with just the number.", a, b);
    snprintf(d->answer, sizeof d->answer, "%d", a + b);
    d->match = MATCH_NUMBER, d->pick_last = 1;
}

// k.d (one decimal) against k.ee (two decimals, ee != d0): either can be larger.
static void decimal_pair(gen_rng *r, char x[2][16], int *larger) {
    int k = uniform(r, 1, 20), d = uniform(r, 1, 9), e;
    do e = uniform(r, 10, 99);
    while (e == d * 10);
    int first = uniform(r, 0, 1);  // which is shown first
    snprintf(x[first], 16, "%d.%d", k, d);
    snprintf(x[!first], 16, "%d.%02d", k, e);
    *larger = d * 10 > e ? first : !first;
}

static void gen_decimal(gen_rng *r, draft *d) {
    char x[2][16];
    int larger;
    decimal_pair(r, x, &larger);
    snprintf(d->prompt, sizeof d->prompt, "Which number is larger: %s or %s? Reply with just the number.", x[0], x[1]);
    snprintf(d->answer, sizeof d->answer, "%s", x[larger]);
    d->match = MATCH_NUMBER, d->pick_last = 0;
}

static void gen_decimal_choice(gen_rng *r, draft *d) {
    char x[2][16];
    int larger;
    decimal_pair(r, x, &larger);
    snprintf(d->prompt, sizeof d->prompt, "Which number is larger: %s or %s?\nAnswer:", x[0], x[1]);
    for (int i = 0; i < 2; i++) snprintf(d->choices[i], sizeof d->choices[i], " %s", x[i]);
    d->n_choices = 2, d->gold = larger;
}

static void gen_count_letters(gen_rng *r, draft *d) {
    const char *w = WORDS[uniform(r, 0, N_WORDS - 1)];
    char c = w[uniform(r, 0, (int)strlen(w) - 1)];
    int n = 0;
    for (const char *p = w; *p; p++) n += *p == c;
    snprintf(d->prompt, sizeof d->prompt,
             "How many times does the letter \"%c\" appear in the word \"%s\"? Reply with just the number.", c, w);
    snprintf(d->answer, sizeof d->answer, "%d", n);
    d->match = MATCH_NUMBER, d->pick_last = 0;
}

// k distinct nouns into pick[] (a partial Fisher-Yates shuffle).
static void pick_nouns(gen_rng *r, int k, int *pick) {
    int idx[N_NOUNS];
    for (int i = 0; i < N_NOUNS; i++) idx[i] = i;
    for (int i = 0; i < k; i++) {
        int j = uniform(r, i, N_NOUNS - 1), t = idx[i];
        idx[i] = idx[j], idx[j] = t;
        pick[i] = idx[i];
    }
}

static void join(char *out, size_t n, const int *pick, int k) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < k && at < n; i++) at += (size_t)snprintf(out + at, n - at, "%s%s", i ? ", " : "", NOUNS[pick[i]]);
}

static void gen_count_items(gen_rng *r, draft *d) {
    int k = uniform(r, 3, 9), pick[16];
    char list[256];
    pick_nouns(r, k, pick);
    join(list, sizeof list, pick, k);
    snprintf(d->prompt, sizeof d->prompt, "How many items are in this list: %s? Reply with just the number.", list);
    snprintf(d->answer, sizeof d->answer, "%d", k);
    d->match = MATCH_NUMBER, d->pick_last = 0;
}

// The answer pattern: no other list item is named before the right one.
static void gen_recall(gen_rng *r, draft *d) {
    int k = uniform(r, 4, 8), pick[16], at = uniform(r, 0, k - 1);
    char list[256], others[256];
    pick_nouns(r, k, pick);
    join(list, sizeof list, pick, k);
    snprintf(d->prompt, sizeof d->prompt,
             "Here is a list: %s. What is the %s item in the list? Reply with just the word.", list, ORDINALS[at]);
    size_t o = 0;
    for (int i = 0; i < k; i++)
        if (i != at) o += (size_t)snprintf(others + o, sizeof others - o, "%s%s", o ? "|" : "", NOUNS[pick[i]]);
    snprintf(d->answer, sizeof d->answer, "(?s)^(?:(?!\\b(?:%s)\\b).)*?\\b%s\\b", others, NOUNS[pick[at]]);
    d->match = MATCH_REGEX, d->nocase = 1;
}

typedef struct {
    const char *name;
    void (*fn)(gen_rng *, draft *);
} builtin;

static void add2(gen_rng *r, draft *d) { gen_add(r, d, 10, 99); }
static void add3(gen_rng *r, draft *d) { gen_add(r, d, 100, 999); }

static const builtin BUILTINS[] = {
    { "add2", add2 },
    { "add3", add3 },
    { "decimal", gen_decimal },
    { "count-letters", gen_count_letters },
    { "count-items", gen_count_items },
    { "recall", gen_recall },
    { "decimal-choice", gen_decimal_choice },
};
#define N_BUILTINS ((int)(sizeof BUILTINS / sizeof *BUILTINS))

const char *eval_builtin_names(void) { return "add2, add3, decimal, count-letters, count-items, recall, decimal-choice"; }
const char *eval_builtin_all(void) { return "add2,add3,decimal,count-letters,count-items,recall"; }

int eval_builtin_known(const char *name) {
    for (int i = 0; i < N_BUILTINS; i++)
        if (!strcmp(name, BUILTINS[i].name)) return 1;
    return 0;
}

static int to_item(const draft *d, const char *task, int i, eval_item *it) {
    memset(it, 0, sizeof *it);
    char id[64];
    snprintf(id, sizeof id, "%s-%d", task, i);
    it->task = strdup(task), it->id = strdup(id), it->prompt = strdup(d->prompt);
    int ok = it->task && it->id && it->prompt;
    if (d->n_choices) {
        it->choices = calloc((size_t)d->n_choices, sizeof(char *));
        it->n_choices = d->n_choices, it->gold = d->gold;
        for (int c = 0; ok && c < d->n_choices; c++) ok = it->choices && (it->choices[c] = strdup(d->choices[c]));
    } else {
        it->answer = strdup(d->answer), ok = ok && it->answer;
        it->match = d->match, it->pick_last = d->pick_last, it->nocase = d->nocase;
    }
    return ok ? 0 : -1;
}

int eval_builtin(eval_set *s, const char *name, int n, uint64_t seed, verr *err) {
    const builtin *b = NULL;
    for (int i = 0; i < N_BUILTINS; i++)
        if (!strcmp(name, BUILTINS[i].name)) b = &BUILTINS[i];
    if (!b) return verr_set(err, "unknown task '%s' (built-in tasks: %s, all; or a .jsonl file)", name, eval_builtin_names());
    for (int i = 0; i < n; i++) {
        gen_rng r = item_rng(seed, name, i);
        draft d;
        memset(&d, 0, sizeof d);
        b->fn(&r, &d);
        eval_item it;
        if (to_item(&d, name, i, &it) || eval_set_add(s, &it, err)) {
            eval_item_free(&it);
            return verr_set(err, "out of memory generating %s", name);
        }
    }
    return 0;
}
