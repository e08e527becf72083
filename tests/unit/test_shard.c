/* test_shard: the shard's live buffer (server/core/shard.h) — PARAMS replies
 * hold it without a copy, so a step while one is held writes the next
 * version elsewhere and leaves the held one as it was; the result has the
 * same bits as a step in place, and on any number of threads; retired
 * buffers are reused (no allocation in the steady state); the threaded
 * finite check finds a bad float anywhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/core/shard.h"
#include "tests/test.h"

/* fc:10 over 1x1x3001: 30,020 floats (not a multiple of 16 or of 4096). */
#define SPEC "fc:10 softmax"

static int s_shard(dp_shard_t *s, dp_optim_kind_t kind, int threads)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    o.kind = kind;
    if (dp_model_parse(&m, SPEC, 1, 1, 3001, err) != 0 || dp_shard_init(s, &m, 0, 1, 5, &o, err) != 0 ||
        dp_shard_set_threads(s, threads, err) != 0) {
        fprintf(stderr, "  shard: %s\n", err);
        return -1;
    }
    return 0;
}

static void s_grad(float *g, size_t n, int step)
{
    for (size_t i = 0; i < n; i++) g[i] = 1e-3f * (float)((int)((i * 7 + (size_t)step) % 19) - 9);
}

/* Three Adam shards stepped by the same gradients: one in place, one with a
 * reply holding its buffer at every step (out of place), one on 3 threads. */
static void test_held_buffer(void)
{
    dp_shard_t a, b, c;
    if (s_shard(&a, DP_OPT_ADAM, 1) || s_shard(&b, DP_OPT_ADAM, 1) || s_shard(&c, DP_OPT_ADAM, 3)) {
        CHECK(0);
        return;
    }
    size_t n = a.n;
    float *g = dp_malloc(n * sizeof *g), *before = dp_malloc(n * sizeof *before);
    int held_intact = 1, moved = 0;
    for (int step = 1; step <= 5; step++) {
        s_grad(g, n, step);
        dp_grad_slice_t sl = {g, n * 4, 0};
        dp_snap_t *held = dp_shard_snapshot(&b); /* as a PARAMS reply in flight */
        memcpy(before, held->data, n * sizeof *before);
        uint64_t v = held->version;
        dp_shard_step(&a, &sl, 1, 0.01f);
        dp_shard_step(&b, &sl, 1, 0.01f);
        dp_shard_step(&c, &sl, 1, 0.01f);
        held_intact &= memcmp(before, held->data, n * sizeof *before) == 0 && held->version == v;
        moved += b.w != held->data;
        dp_snap_unref(NULL, held);
    }
    CHECK(held_intact);
    CHECK_EQ(moved, 5);
    CHECK_EQ(a.version, 5);
    CHECK_EQ(b.version, 5);
    CHECK(memcmp(a.w, b.w, n * sizeof *a.w) == 0);
    CHECK(memcmp(a.w, c.w, n * sizeof *a.w) == 0);
    CHECK(memcmp(a.state, c.state, 2 * n * sizeof *a.state) == 0);
    dp_snap_t *s = dp_shard_snapshot(&b);
    CHECK(s->data == b.w && s->version == 5);
    dp_snap_unref(NULL, s);
    free(g);
    free(before);
    dp_shard_fini(&a);
    dp_shard_fini(&b);
    dp_shard_fini(&c);
}

/* Held and released at every step, the buffers cycle through the retired
 * ones: at most 1 + DP_SHARD_RETIRED distinct buffers over many steps. */
static void test_buffers_reused(void)
{
    dp_shard_t s;
    if (s_shard(&s, DP_OPT_SGD, 2) != 0) {
        CHECK(0);
        return;
    }
    float *g = dp_calloc(s.n, sizeof *g);
    const float *seen[16];
    int n_seen = 0;
    for (int step = 1; step <= 20; step++) {
        dp_snap_t *held = dp_shard_snapshot(&s);
        dp_grad_slice_t sl = {g, s.n * 4, 0};
        dp_shard_step(&s, &sl, 1, 0.1f);
        dp_snap_unref(NULL, held); /* ZeroMQ let go */
        int known = 0;
        for (int k = 0; k < n_seen; k++) known |= seen[k] == s.w;
        if (!known && n_seen < 16) seen[n_seen++] = s.w;
    }
    CHECK(n_seen <= 1 + DP_SHARD_RETIRED);
    /* nobody holds it: in place */
    const float *w = s.w;
    dp_grad_slice_t sl = {g, s.n * 4, 0};
    dp_shard_step(&s, &sl, 1, 0.1f);
    CHECK(s.w == w);
    uint32_t c1 = dp_snap_crc(s.snap);
    s.w[3] += 1.0f;
    dp_shard_step(&s, &sl, 1, 0.1f);
    CHECK(dp_snap_crc(s.snap) != c1); /* a new version gets a new CRC */
    free(g);
    dp_shard_fini(&s);
}

static void test_grad_nonfinite(void)
{
    dp_shard_t s;
    if (s_shard(&s, DP_OPT_SGD, 3) != 0) {
        CHECK(0);
        return;
    }
    float *g = dp_calloc(s.n + 1, sizeof *g);
    dp_grad_slice_t sl[2] = {{g, 4 * 1000, 0}, {g + 1000, 4 * (s.n - 1000), 1000}};
    CHECK_EQ(dp_shard_grad_nonfinite(&s, sl, 2), 0);
    size_t where[] = {0, 999, 1000, 15000, s.n - 1};
    int missed = 0;
    for (size_t k = 0; k < sizeof where / sizeof where[0]; k++) {
        g[where[k]] = k % 2 ? NAN : -INFINITY;
        missed += dp_shard_grad_nonfinite(&s, sl, 2) != 1;
        g[where[k]] = 0;
    }
    CHECK_EQ(missed, 0);
    free(g);
    dp_shard_fini(&s);
}

DP_TESTS(T(test_held_buffer), T(test_buffers_reused), T(test_grad_nonfinite))
