// lora_targets.h: which modules an adapter_config.json adapts, decided as PEFT decides
// it (peft.tuners.tuners_utils.check_target_module_exists), so an adapter is applied to
// exactly the modules PEFT would have given it, and a tensor for any other module is an
// error rather than silently applied. A module is named as PEFT's base model names it,
// "model.layers.3.self_attn.q_proj".
//   target_modules: a string is a regular expression that must match the whole name
//     (re.fullmatch), "all-linear" (any case) every projection; a list matches a name
//     equal to an entry or ending in "." + entry; absent or null: the tensors decide.
//   exclude_modules: the same two forms; a match is not adapted.
//   layers_to_transform (an int or a list, list form of target_modules only): the layer
//     index (after layers_pattern, default any component) must be one of them.
#ifndef VARENT_LORA_TARGETS_H
#define VARENT_LORA_TARGETS_H

#include <cjson/cJSON.h>

#include "host/util/err.h"

typedef struct {
    const cJSON *targets, *exclude, *layers, *pattern;  // borrowed from the parsed config
    void *target_re, *exclude_re;                       // compiled string forms (pcre2_code)
    int all;                                            // every projection
} lora_targets;

// Reads and checks the keys of config (path names the file in errors): a regular
// expression that does not compile, a list entry that is not a string, or targets that
// name the embedding or lm_head are errors naming the key. 0, or -1 with err.
int lora_targets_read(lora_targets *t, const cJSON *config, const char *path, verr *err);
// Whether module (a projection's name, as above) is adapted: 1, or 0 with why ("target_modules
// does not match it").
int lora_targets_match(const lora_targets *t, const char *module, const char **why);
void lora_targets_free(lora_targets *t);

#endif
