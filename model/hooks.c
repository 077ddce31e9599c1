// hooks.c: see hooks.h.
#include "model/hooks.h"

#include <string.h>

static const char *const point_names[HOOK_NPOINTS] = { "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out" };

const char *hook_point_name(int point) { return point >= 0 && point < HOOK_NPOINTS ? point_names[point] : "?"; }

int hook_point_parse(const char *name) {
    for (int i = 0; i < HOOK_NPOINTS; i++)
        if (!strcmp(name, point_names[i])) return i;
    return -1;
}
