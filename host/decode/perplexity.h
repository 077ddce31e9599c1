// perplexity.h: teacher-forced log-likelihood of a token sequence under the model,
// and perplexity over a long text in strided windows (the Hugging Face "perplexity
// of fixed-length models" scheme, which is llama.cpp's with stride = ctx/2):
//
//   window w covers ids[b, e) with b = w * stride, e = min(b + ctx, n); each window
//   starts from an empty KV cache at position 0. Window 0 scores tokens 1..e-1; window
//   w > 0 scores the tokens after the previous window's end, [e_prev, e), each with
//   the context ids[b, i). Every token but the first is scored exactly once; with
//   stride < ctx each scored token of window w > 0 sees at least ctx - stride tokens.
//
// Perplexity and its standard error follow llama.cpp: with x_i = -ln p(token_i),
// mean m and N scored tokens, se(m) = sqrt((mean(x^2) - m^2) / (N - 1)),
// PPL = exp(m) and se(PPL) = PPL * se(m) (first-order error propagation).
#ifndef VARENT_PERPLEXITY_H
#define VARENT_PERPLEXITY_H

#include "host/runtime/session.h"

typedef struct {
    int n_tokens, n_scored, n_windows;
    double sum_nll, sum_nll2;    // over scored tokens, natural log
    double nll_mean, nll_se, ppl, ppl_se;
} ppl_result;

// Natural-log probabilities of ids[from..n) given everything before them, written to
// logp[from..n) (logp has n entries; the first `from` are untouched). Resets the
// session's KV cache and fills it with ids[0..n-1) from position 0: prefills
// ids[0..from-1) as one batch, then the scored tokens in batches of up to 64 with
// every position's logits kept (session_forward_all). Needs 1 <= from <= n and n - 1 <= s->ctx.
int ppl_score(session *s, const int *ids, int n, int from, double *logp, verr *err);
// The same, every position in its own forward (the prefix too): slower, but a capture of
// each forward's last query (probe.h: attention rows, the logit lens) sees every position.
int ppl_score_each(session *s, const int *ids, int n, int from, double *logp, verr *err);
// The same pass, handing each scored position's whole logits row to fn: row i (from <= i
// < n) is the distribution ids[i] was drawn from. Non-zero from fn stops with an error.
typedef int (*ppl_row_fn)(void *ud, int i, const float *logits);
int ppl_score_rows(session *s, const int *ids, int n, int from, ppl_row_fn fn, void *ud, verr *err);

// Called after each window with the running totals; non-zero stops with an error.
typedef int (*ppl_window_fn)(void *ud, int window, int n_windows, const ppl_result *so_far);

// What ppl_eval and ppl_eval_chunks tell the caller as they go (each optional; non-zero
// from a callback stops with an error).
typedef struct {
    ppl_window_fn on_window;  // after each window (chunk) with the running totals
    // before each window: the ids it feeds, in order, from position 0 (the window's ids
    // but its last; a chunk's first is BOS when one replaces it), ids[0] standing for the
    // text's token text0
    int (*on_feed)(void *ud, const int *ids, int n, int text0);
    // after the forward that scored text token i (in increasing i), with its log-probability
    int (*on_token)(void *ud, int i, double logp);
    int each;                 // every position in its own forward (ppl_score_each)
    void *ud;
} ppl_watch;

// The number of windows for n tokens, or -1 with err when ctx/stride are invalid
// (need 2 <= ctx, 1 <= stride < ctx) or fewer than 2 tokens would be scored.
int ppl_count_windows(int n, int ctx, int stride, verr *err);
// Perplexity of ids[0..n) in windows of ctx (<= s->ctx) tokens moved by stride.
int ppl_eval(session *s, const int *ids, int n, int ctx, int stride, const ppl_watch *w, ppl_result *r, verr *err);
// llama-perplexity's protocol (--protocol llamacpp): the text is cut into
// floor(n / ctx) non-overlapping chunks of ctx tokens (at most max_chunks when > 0; a
// shorter tail is dropped), each evaluated from an empty cache with its first token
// replaced by BOS when the tokenizer adds one (bos >= 0), and only the second half is
// scored: chunk tokens ctx/2 + 1 .. ctx - 1, each given the chunk before it. Needs
// ctx >= 3 and n >= 2 ctx, as llama-perplexity does. The sums, PPL and its standard
// error are as above; n_windows counts chunks.
int ppl_count_chunks(int n, int ctx, int max_chunks, verr *err);
int ppl_eval_chunks(session *s, const int *ids, int n, int ctx, int bos, int max_chunks, const ppl_watch *w,
                    ppl_result *r, verr *err);
// Fills nll_mean, nll_se, ppl and ppl_se from the sums.
void ppl_finish(ppl_result *r);

#endif
