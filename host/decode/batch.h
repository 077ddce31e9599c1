// batch.h: one generation with everything a batch run or a comparison reports about
// it: the generated ids, their text (decoded as `varent run` prints it), the timing
// and the per-token entropix metrics summed (host/runtime/metrics.h), plus the JSONL helpers
// those commands share.
#ifndef VARENT_BATCH_H
#define VARENT_BATCH_H

#include <stdio.h>

#include "host/decode/generate.h"
#include "host/util/json_out.h"

typedef struct {
    int *ids, n, cap;        // [n] generated ids (stop ids excluded)
    char *text;              // decoded with a tokenizer stream (NULL without a tokenizer)
    size_t len, text_cap;
    gen_stats st;
    double sum[M_COUNT];     // metric sums over the generated tokens (entropy, varentropy, ...)
    int n_metrics;
    double sum_logp;         // ln p of each generated id under the logits it was drawn from
    int n_logp;              // ids with their logits on the host (== n: sum_logp covers all)
} batch_result;

// Resets the session's KV cache and generates from prompt[n_prompt] with g (which
// needs g->ex: metrics are always computed, as with --metrics-out). g's on_token is
// replaced; its on_record, when set, sees every record after the sums.
int batch_generate(session *s, const int *prompt, int n_prompt, const gen_opts *g, batch_result *r, verr *err);

// batch_generate in two halves, for a generation someone else runs (the scheduler,
// host/decode/sched.h): begin fills j->o, the options to generate with (g's, collecting
// into r); end, with the generation's outcome and statistics, finishes r (freed when rc
// or end fails). j must stay in place in between.
typedef struct {
    batch_result *r;
    tokenizer_stream *ts;
    int oom;
    double logp;        // the last record's ln p, NAN when its logits stayed on the device
    const gen_opts *g;  // the caller's on_record, called after the sums
    gen_opts o;
} batch_job;
int batch_job_begin(batch_job *j, session *s, const gen_opts *g, batch_result *r, verr *err);
int batch_job_end(batch_job *j, int rc, const gen_stats *st, verr *err);
// A job begun but never ended (a stopped batch): frees its stream and result. A job
// that was ended, or never begun (zeroed), is left as it is.
void batch_job_drop(batch_job *j);
void batch_result_free(batch_result *r);
// Decode speed as `varent run --stats` reports it: (tokens - 1) / decode seconds.
double batch_tok_s(const batch_result *r);
const char *batch_stop_reason(const batch_result *r);  // "eos", "context" or "length"

// "mean":{"entropy":..,...} and "quadrants":{"LELV":..,...} (without braces around both).
void batch_json_metrics(FILE *f, const batch_result *r);

#endif
