// test_models.h: random-weight checkpoints for the C tests, written by
// tools/gen_random_checkpoint.py (run from the repository root, with $PYTHON).
#ifndef VARENT_TEST_MODELS_H
#define VARENT_TEST_MODELS_H
#include <stdio.h>
#include <stdlib.h>

static inline const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

// Writes preset (e.g. llama3-tiny) in dtype (f32, bf16) to workdir/preset-dtype; its
// path goes to dir. 0 on success.
static inline int gen_random_model(const char *workdir, const char *preset, const char *dtype, int seed, char *dir,
                                   size_t n) {
    snprintf(dir, n, "%s/%s-%s", workdir, preset, dtype);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tools/gen_random_checkpoint.py --preset %s '%s' --seed %d --dtype %s >/dev/null",
             env_or("PYTHON", "python3"), preset, dir, seed, dtype);
    return system(cmd) == 0 ? 0 : -1;
}
#endif
