// test_models.h: random-weight checkpoints for the C tests, written by
// tools/gen_random_checkpoint.py (run from the repository root, with $PYTHON).
#ifndef VARENT_TEST_MODELS_H
#define VARENT_TEST_MODELS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

// make test-asan (ASAN_OPTIONS set): the whole-model programs on the emulated device take
// fewer models there. Their host code is the same for every preset, the emulator and the
// kernels are not sanitized, and make test runs every model without ASan (CI's time).
static inline int test_under_asan(void) {
    const char *e = getenv("ASAN_OPTIONS");
    return e && *e;
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

// stories260K converted to bf16 by the Python tests' helper (cached under TESTTMP), or
// -1 when that is not possible here (no python, no varent binary).
static inline int stories_bf16_dir(char *out, size_t n) {
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
    const char *root = getenv("ROOT") ? getenv("ROOT") : ".";
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' -c 'import os, sys; sys.path.insert(0, \"tests/py\"); import vtest; "
             "os.makedirs(vtest.TESTTMP, exist_ok=True); print(vtest.stories_dir(\"bf16\"))' 2>/dev/null",
             root, py);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    out[0] = 0;
    if (!fgets(out, (int)n, p)) out[0] = 0;
    int rc = pclose(p);
    out[strcspn(out, "\n")] = 0;
    return rc == 0 && out[0] ? 0 : -1;
}

#endif
