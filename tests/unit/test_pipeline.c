/* test_pipeline: the worker's communication thread (worker/client/pipeline.h) and
 * the stamped push under it (dp_ps_push_t.stamp), against real
 * servers in threads of this process on loopback (plain SGD, lr 0.1, so
 * every weight is a known sum of the gradients applied).
 *  - a push carries the versions of the pull it names, not the last pull's
 *  - the worker's overlapped order (pull ahead, push behind) for a dozen
 *    steps on 2 shards: every step's weights lack exactly the previous
 *    step's gradient, every push but the first is 1 version stale, every
 *    gradient (from two alternating buffers) is applied once
 *  - a failed job fails the jobs after it with its error; results not
 *    taken are dropped at destroy; the client is usable again after it */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/pipeline.h"
#include "worker/client/ps_client.h"

#define TMO 5.0 /* client timeout in these tests */
/* A push of g (loss 1, batch 8) as step st, stamped with sp. */
#define PUSH_STAMPED(sp, st, g) \
    (&(dp_ps_push_t){.grads = (g), .loss = 1, .batch = 8, .step = (st), .stamp = (sp)})

static dp_model_t s_small;
static void s_small_model(void) { srv_small_model(&s_small); }

/* ---- cases ------------------------------------------------------------- */

/* Two pulls, then a push stamped with the first: the server measures its
 * staleness against that pull; the client's own versions are untouched. */
static void test_push_stamped(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        size_t n = s_small.n_floats;
        float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        srv_fill(g, n, 3);
        dp_ps_stamp_t a, b;
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        dp_ps_client_stamp(c, &a);
        CHECK_EQ(a.n, 1);
        CHECK_EQ(dp_ps_stamp_sum(&a), 0);
        CHECK_EQ(dp_ps_client_push(c, PUSH_STAMPED(&a, 1, g), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.staleness_max, 0);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        dp_ps_client_stamp(c, &b);
        CHECK_EQ(dp_ps_stamp_sum(&b), 1);
        /* stamped with version 0 while the shard is at 1: 1 stale (a plain
         * push would carry version 1 and be fresh) */
        CHECK_EQ(dp_ps_client_push(c, PUSH_STAMPED(&a, 2, g), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.staleness_max, 1);
        CHECK_EQ(dp_ps_client_version(c), 1); /* the last pull's, put back */
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(3, g, 1, 8), &r, err), 0);
        CHECK_EQ(r.staleness_max, 1); /* version 1 at shard version 2 */
        dp_ps_stamp_t bad = a;
        bad.n = 2;
        CHECK_EQ(dp_ps_client_push(c, PUSH_STAMPED(&bad, 4, g), &r, err), -1);
        CHECK(strstr(err, "stamped for 2 shard(s) on a client of 1") != NULL);
        free(p), free(g);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* The worker loop's order (worker/train/distributed.c, s_loop_overlap) on 2
 * shards: pull step 0's weights; then for each step post the next pull,
 * "compute", post the push, and take results up to that pull. */
static void test_overlapped_order(void)
{
    enum { STEPS = 12 };
    s_small_model();
    srv_t s0, s1;
    srv_init(&s0, DP_MODE_ASYNC, 1);
    srv_init(&s1, DP_MODE_ASYNC, 1);
    s0.cfg.shard_count = s1.cfg.shard_count = 2;
    s1.cfg.shard_index = 1;
    CHECK_EQ(srv_start(&s0), 0);
    CHECK_EQ(srv_start(&s1), 0);
    char err[DP_ERR_LEN] = "", eps[600];
    snprintf(eps, sizeof eps, "%s,%s", s0.endpoint, s1.endpoint);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, eps, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (!c) {
        fprintf(stderr, "  %s\n", err);
        srv_stop(&s0), srv_stop(&s1);
        return;
    }
    size_t n = s_small.n_floats;
    float *params = dp_malloc(n * 4), *g[2] = {dp_malloc(n * 4), dp_malloc(n * 4)};
    float *want = dp_malloc(n * 4), *applied = dp_malloc(n * 4);
    srv_fill(g[0], n, 11);
    srv_fill(g[1], n, 12);
    dp_model_init_params(&s_small, applied, 7); /* init - lr * (gradients of steps < k - 1) */
    dp_pipeline_t *pl = NULL;
    CHECK_EQ(dp_pipeline_new(&pl, c, err), 0);
    dp_pipe_job_t job = {.op = DP_PIPE_PULL, .params = params}, res;
    dp_ps_stamp_t stamp;
    int staleness_ok = 1, weights_ok = 1, versions_ok = 1, pushes = 0;
    dp_pipeline_post(pl, &job);
    CHECK_EQ(dp_pipeline_wait(pl, &res), 0);
    CHECK_EQ(res.rc, 0);
    stamp = res.stamp;
    for (int k = 0; k < STEPS; k++) {
        /* step k's weights: every gradient but step k - 1's */
        memcpy(want, applied, n * 4);
        weights_ok &= t_check_close(__FILE__, __LINE__, "weights", params, want, n, 1e-5, 1e-5);
        versions_ok &= dp_ps_stamp_sum(&stamp) == (uint64_t)(k == 0 ? 0 : 2 * (k - 1));
        if (k >= 1)
            for (size_t i = 0; i < n; i++) applied[i] -= 0.1f * g[(k - 1) & 1][i];
        if (k + 1 < STEPS) dp_pipeline_post(pl, &(dp_pipe_job_t){.op = DP_PIPE_PULL, .params = params});
        job = (dp_pipe_job_t){.op = DP_PIPE_PUSH, .grads = g[k & 1], .step = (uint64_t)k + 1,
                              .loss = 1, .batch = 8, .stamp = stamp};
        dp_pipeline_post(pl, &job);
        while (dp_pipeline_wait(pl, &res) == 0) {
            CHECK_EQ(res.rc, 0);
            if (res.rc) fprintf(stderr, "  %s\n", res.err);
            if (res.op == DP_PIPE_PULL) {
                stamp = res.stamp;
                break;
            }
            pushes++;
            CHECK_EQ(res.res.applied, 2);
            staleness_ok &= res.res.staleness_max == (res.step == 1 ? 0u : 1u);
        }
    }
    CHECK(weights_ok);
    CHECK(versions_ok);
    CHECK(staleness_ok);
    CHECK_EQ(pushes, STEPS);
    dp_pipeline_destroy(&pl);
    dp_pipeline_destroy(&pl); /* safe twice */
    CHECK(pl == NULL);
    /* the client is ours again: the final weights hold every gradient once */
    for (size_t i = 0; i < n; i++) applied[i] -= 0.1f * g[(STEPS - 1) & 1][i];
    CHECK_EQ(dp_ps_client_pull(c, params, err), 0);
    CHECK_CLOSE("final weights", params, applied, n, 1e-5, 1e-5);
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    CHECK_EQ(st.applied, STEPS);
    CHECK_EQ(st.staleness_max, 1);
    free(params), free(g[0]), free(g[1]), free(want), free(applied);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s0), 0);
    CHECK_EQ(srv_stop(&s1), 0);
}

/* A push before any pull fails (no version to stamp); the pull queued
 * after it fails with the same error without asking the server. A new
 * pipeline on the same client works; one destroyed with results not taken
 * drops them. */
static void test_failure_and_teardown(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        size_t n = s_small.n_floats;
        float *p = dp_malloc(n * 4), *g = dp_calloc(n, 4);
        dp_pipeline_t *pl = NULL;
        CHECK_EQ(dp_pipeline_new(&pl, c, err), 0);
        dp_pipe_job_t push = {.op = DP_PIPE_PUSH, .grads = g, .step = 1, .batch = 8};
        dp_ps_client_stamp(c, &push.stamp);
        dp_pipeline_post(pl, &push);
        dp_pipeline_post(pl, &(dp_pipe_job_t){.op = DP_PIPE_PULL, .params = p});
        dp_pipe_job_t r1, r2, r3;
        CHECK_EQ(dp_pipeline_wait(pl, &r1), 0);
        CHECK_EQ(dp_pipeline_wait(pl, &r2), 0);
        CHECK_EQ(dp_pipeline_wait(pl, &r3), -1); /* none left */
        CHECK_EQ(r1.rc, -1);
        CHECK(strstr(r1.err, "push before the first pull") != NULL);
        CHECK_EQ(r2.rc, -1);
        CHECK_STR(r2.err, r1.err);
        dp_pipeline_destroy(&pl);
        /* a fresh pipeline: the pull goes through; two jobs left untaken */
        CHECK_EQ(dp_pipeline_new(&pl, c, err), 0);
        dp_pipeline_post(pl, &(dp_pipe_job_t){.op = DP_PIPE_PULL, .params = p});
        CHECK_EQ(dp_pipeline_wait(pl, &r1), 0);
        CHECK_EQ(r1.rc, 0);
        CHECK_EQ(r1.stamp.n, 1);
        push.stamp = r1.stamp;
        dp_pipeline_post(pl, &push);
        dp_pipeline_post(pl, &(dp_pipe_job_t){.op = DP_PIPE_PULL, .params = p});
        dp_pipeline_destroy(&pl); /* runs both, drops their results */
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.applied, 1);
        free(p), free(g);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

DP_TESTS(T(test_push_stamped), T(test_overlapped_order), T(test_failure_and_teardown))
