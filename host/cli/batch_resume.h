// batch_resume.h: what a batch's JSONL records say about the run that wrote them, and
// `run --resume` reading them back. Every record carries "settings", one JSON object of
// what decides its text (model, -n, sampling, penalties, sampler, chat style); a
// continuation must have the same ones, and takes the recorded seed when --seed is not
// given, so a resumed file reads as one run.
#ifndef VARENT_CLI_BATCH_RESUME_H
#define VARENT_CLI_BATCH_RESUME_H

#include <stdint.h>

#include "host/cli/prompts.h"
#include "host/decode/generate.h"

// The settings object as compact JSON (malloc'd; NULL when out of memory). sampler and
// profile are the names given (--sampler, --profile).
char *batch_settings_json(const char *model_arg, const gen_opts *g, const char *sampler_name, const char *profile,
                          const prompt_style *ps);

typedef struct {
    unsigned char *skip;  // [pl->n]: 1 for a prompt already recorded
    int n_done;
    int has_seed;         // the records' seed, when they have one
    uint64_t seed;
    char *settings;       // the first record's settings (compact JSON), NULL: none recorded
} batch_done;

// Reads path's records (a missing file holds none): each must belong to this prompt
// list, and they must agree on the seed and the settings. 0, or -1 with err naming the line.
int batch_done_read(const char *path, const prompt_list *pl, batch_done *d, verr *err);
// The recorded settings against this run's: 0, or -1 with err naming the first setting
// that differs (records without settings are not checked).
int batch_done_check(const batch_done *d, const char *settings, const char *path, verr *err);
void batch_done_free(batch_done *d);

#endif
