// sched_map.c: sched_map (see sched.h): a list through the scheduler, taken in order.
#include <stdlib.h>
#include <string.h>

#include "host/decode/sched_internal.h"

typedef struct {
    int state;  // 0: not submitted, 1: running, 2: ended, 3: the caller's own
    int rc;
    gen_stats st;
    char why[512];
} map_item;

static void map_done(void *ud, int rc, const gen_stats *st, const char *why) {
    map_item *it = ud;
    it->state = 2, it->rc = rc, it->st = *st;
    snprintf(it->why, sizeof it->why, "%s", why);
}

// Submits items from *next on while there is room; -1 with err.
static int feed(sched *q, int n, const sched_map_fns *f, map_item *items, int *next, int taken, int window, verr *err) {
    while (*next < n && *next - taken < window && (sched_has_room(q) || sched_pending(q) == 0)) {
        int i = (*next)++;
        sched_seq r = { 0 };
        int rc = f->submit(f->ud, i, &r, err);
        if (rc < 0) return -1;
        if (rc > 0) {
            items[i].state = 3;
            continue;
        }
        r.on_done = map_done, r.ud = &items[i];
        items[i].state = 1;
        if (sched_submit(q, &r, err)) {
            char at[256] = "";
            if (f->where) f->where(f->ud, i, at, sizeof at);
            if (at[0]) verr_set(err, "%s: %.900s", at, err->msg);
            return -1;
        }
    }
    return 0;
}

// No scheduler: every item is the caller's, taken one after another.
static int map_own(int n, const sched_map_fns *f, verr *err) {
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) rc = f->take(f->ud, i, 1, NULL, "", err);
    return rc;
}

int sched_map(sched *q, int n, const sched_map_fns *f, verr *err) {
    if (!q) return map_own(n, f, err);
    map_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof *items);
    if (!items) return verr_set(err, "out of memory");
    int window = f->window > 0 ? f->window : 2 * q->max_rows, next = 0, taken = 0, rc = 0;
    while (rc == 0 && taken < n) {
        if (feed(q, n, f, items, &next, taken, window, err)) {
            rc = -1;
            break;
        }
        int took = 0;
        while (rc == 0 && taken < n && items[taken].state >= 2) {
            map_item *it = &items[taken];
            int own = it->state == 3;
            rc = f->take(f->ud, taken, own ? 1 : it->rc, own ? NULL : &it->st, own ? "" : it->why, err);
            taken++, took = 1;
        }
        if (rc || taken == n) break;
        if (took) continue;  // the window moved: submit more before the next step
        if (sched_pending(q) == 0 && items[taken].state < 2) {
            rc = verr_set(err, "the scheduler stalled at item %d", taken);
            break;
        }
        if (sched_step(q, err)) rc = -1;
    }
    if (rc) {  // what is still running ends now; its results are dropped
        volatile sig_atomic_t stop = 1;
        const volatile sig_atomic_t *was = q->o.interrupt;
        q->o.interrupt = &stop;
        verr e2;
        sched_step(q, &e2);
        q->o.interrupt = was;
    }
    free(items);
    return rc;
}
