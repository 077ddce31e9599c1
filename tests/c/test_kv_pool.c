// test_kv_pool.c: the paged KV pool (model/kv_pool.h) on its own: block accounting
// (open, grow, release give every block back), a full pool refused without changing the
// cache, prefixes registered and found (same blocks, counted; another salt or other ids
// are not found; lookups rounded to whole chunks), least-recently-used eviction (plain
// idle blocks go before any prefix, older prefixes before newer ones), sharing and
// copying blocks, and a branch committed into a paged trunk, row by row.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/kv_pool.h"

enum { L = 2, D = 3, B = 4 };

// Fills positions [from, to) of c with values naming the position.
static void fill(kv_cache *c, int from, int to, float base) {
    for (int l = 0; l < L; l++)
        for (int p = from; p < to; p++)
            for (int i = 0; i < D; i++) {
                ((float *)kv_cache_k(c, l))[kv_cache_phys(c, p) * D + i] = base + 1000 * l + 10 * p + i;
                ((float *)kv_cache_v(c, l))[kv_cache_phys(c, p) * D + i] = -(base + 1000 * l + 10 * p + i);
            }
}

static int holds(const kv_cache *c, int from, int to, float base) {
    for (int l = 0; l < L; l++)
        for (int p = from; p < to; p++)
            for (int i = 0; i < D; i++)
                if (((float *)kv_cache_k(c, l))[kv_cache_phys(c, p) * D + i] != base + 1000 * l + 10 * p + i ||
                    ((float *)kv_cache_v(c, l))[kv_cache_phys(c, p) * D + i] != -(base + 1000 * l + 10 * p + i))
                    return 0;
    return 1;
}

static void test_accounting(void) {
    kv_pool p;
    verr err;
    CHECK(kv_pool_init(&p, L, D, 0, 3, 8, &err) < 0, "pool_refuses_block_3", "accepted");
    CHECK(kv_pool_init(&p, L, D, 0, B, 8, &err) == 0 && kv_pool_idle(&p) == 8, "pool_opens", "%s", err.msg);
    kv_cache a, b;
    kv_pool_open(&p, &a, 20, &err), kv_pool_open(&p, &b, 40, &err);
    CHECK(kv_pool_grow(&p, &a, 9, &err) == 0 && a.ctx == 12 && kv_pool_idle(&p) == 5, "pool_grow_whole_blocks",
          "ctx %d idle %d", a.ctx, kv_pool_idle(&p));
    CHECK(kv_pool_grow(&p, &a, 24, &err) < 0 && strstr(err.msg, "may hold") && a.ctx == 12, "pool_grow_past_max_pos",
          "%s", err.msg);
    CHECK(kv_pool_grow(&p, &b, 32, &err) < 0 && strstr(err.msg, "KV pool full") && b.ctx == 0 && kv_pool_idle(&p) == 5,
          "pool_full_refused_untouched", "%s (ctx %d, idle %d)", err.msg, b.ctx, kv_pool_idle(&p));
    fill(&a, 0, 12, 1);
    kv_view v = kv_view_of(&a);
    CHECK(kv_view_room(&v) == 12 && holds(&a, 0, 12, 1), "pool_rows_through_table", "room %d", kv_view_room(&v));
    kv_cache_free(&a);  // a paged cache's blocks go back
    kv_pool_release(&p, &b);
    CHECK(kv_pool_idle(&p) == 8, "pool_release_gives_all_back", "idle %d", kv_pool_idle(&p));
    kv_pool_free(&p);
}

static void test_prefixes(void) {
    kv_pool p;
    verr err;
    kv_pool_init(&p, L, D, 0, B, 10, &err);
    int ids[16], other[16];
    for (int i = 0; i < 16; i++) ids[i] = 100 + i, other[i] = i < 8 ? 100 + i : 7;
    kv_cache a, b, c, d;
    kv_pool_open(&p, &a, 16, &err);
    kv_pool_grow(&p, &a, 16, &err);
    fill(&a, 0, 16, 5);
    kv_pool_register(&p, &a, ids, 3, 42);  // 3 of its 4 blocks
    kv_pool_open(&p, &b, 16, &err);
    int got = kv_pool_lookup(&p, &b, ids, 4, 1, 42);
    CHECK(got == 3 && b.len == 12 && b.table[0] == a.table[0] && b.table[2] == a.table[2] && p.refs[a.table[1]] == 2 &&
          holds(&b, 0, 12, 5), "prefix_found_same_blocks", "got %d len %d", got, b.len);
    CHECK(p.lookup_tokens == 16 && p.hit_tokens == 12, "prefix_counted", "%ld asked, %ld found", p.lookup_tokens,
          p.hit_tokens);
    kv_pool_open(&p, &c, 16, &err);
    CHECK(kv_pool_lookup(&p, &c, ids, 4, 1, 43) == 0 && c.ctx == 0, "prefix_other_salt_not_found", "found");
    CHECK(kv_pool_lookup(&p, &c, other, 4, 1, 42) == 2 && c.len == 8, "prefix_other_ids_stop", "len %d", c.len);
    kv_pool_release(&p, &c);
    kv_pool_open(&p, &c, 16, &err);
    CHECK(kv_pool_lookup(&p, &c, ids, 4, 2, 42) == 2, "prefix_whole_chunks_only", "len %d", c.len);
    kv_pool_release(&p, &c);
    // d copies a's partly filled block 3 after sharing its first 3 blocks
    kv_pool_open(&p, &d, 16, &err);
    a.len = 14;
    CHECK(kv_pool_share(&p, &d, &a, 3, &err) == 0 && kv_pool_copy_block(&p, &d, &a, 3, &err) == 0 &&
          d.table[3] != a.table[3] && holds(&d, 0, 16, 5), "share_and_copy", "%s", err.msg);
    kv_pool_release(&p, &d);
    kv_pool_release(&p, &b);
    kv_pool_release(&p, &a);
    CHECK(kv_pool_idle(&p) == 10, "prefix_blocks_idle_after_release", "idle %d", kv_pool_idle(&p));
    // 10 blocks: 3 registered idle. Taking 7 uses the plain ones first: the prefix survives.
    kv_pool_open(&p, &a, 40, &err);
    kv_pool_grow(&p, &a, 28, &err);
    kv_pool_open(&p, &b, 16, &err);
    CHECK(p.evictions == 0 && kv_pool_lookup(&p, &b, ids, 3, 1, 42) == 3, "plain_blocks_go_before_prefixes",
          "%ld evicted", p.evictions);
    kv_pool_release(&p, &b);
    // one more block evicts the least recently used prefix block: the chain's last one
    // (released first), so the first two are still found
    kv_pool_grow(&p, &a, 32, &err);
    kv_pool_open(&p, &b, 16, &err);
    got = kv_pool_lookup(&p, &b, ids, 3, 1, 42);
    CHECK(p.evictions == 1 && got == 2, "lru_evicts_the_chain_end_first", "%ld evicted, %d found", p.evictions, got);
    kv_pool_release(&p, &b);
    kv_pool_release(&p, &a);
    kv_pool_free(&p);
}

// A branch tail committed into a paged trunk lands at the trunk's positions.
static void test_commit(void) {
    kv_pool p;
    verr err;
    kv_pool_init(&p, L, D, 0, B, 6, &err);
    kv_cache t, tail, ref;
    kv_pool_open(&p, &t, 24, &err);
    kv_pool_grow(&p, &t, 12, &err);
    kv_cache_init(&tail, L, 6, D, &err);  // positions 6..11
    kv_cache_init(&ref, L, 12, D, &err);
    fill(&ref, 0, 12, 9);
    for (int l = 0; l < L; l++)
        for (int pos = 0; pos < 12; pos++) {
            kv_cache *dst = pos < 6 ? &t : &tail;
            int at = pos < 6 ? pos : pos - 6;
            memcpy((float *)kv_cache_k(dst, l) + kv_cache_phys(dst, at) * D, (float *)kv_cache_k(&ref, l) + pos * D, 4 * D);
            memcpy((float *)kv_cache_v(dst, l) + kv_cache_phys(dst, at) * D, (float *)kv_cache_v(&ref, l) + pos * D, 4 * D);
        }
    t.len = 6, tail.len = 5;
    CHECK(kv_cache_commit(&t, &tail, 5, &err) == 0 && t.len == 11 && holds(&t, 0, 11, 9), "commit_into_paged_trunk",
          "%s (len %d)", err.msg, t.len);
    tail.len = 5;
    CHECK(kv_cache_commit(&t, &tail, 2, &err) < 0, "commit_past_mapped_blocks_refused", "accepted");
    kv_cache_free(&t), kv_cache_free(&tail), kv_cache_free(&ref);
    kv_pool_free(&p);
}

int main(void) {
    test_accounting();
    test_prefixes();
    test_commit();
    CHECK_DONE();
}
