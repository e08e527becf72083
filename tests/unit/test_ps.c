/* test_ps: the parameter server (server/loop/ps.h) and the worker's client
 * (worker/client/ps_client.h) over real ZeroMQ TCP sockets on 127.0.0.1, each server
 * in a thread of this process bound to a free port ("tcp://127.0.0.1:*").
 * Every case is bounded in time: client calls use short timeouts, servers
 * stop within 100 ms of their stop flag. Also reports the pull+push
 * round-trip time of the default model (6.6 MB) with 1 and 2 shards. */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "proto/shm.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0 /* client timeout in these tests */

static dp_model_t s_small;
static void s_small_model(void) { srv_small_model(&s_small); }

/* ---- cases ------------------------------------------------------------- */

/* Async, plain SGD: one push moves the weights by exactly -lr * g, starting
 * from dp_model_init_params(seed). */
static void s_async_sgd_exact(const dp_ps_client_opts_t *o)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    dp_ps_info_t info;
    int rc = dp_ps_client_new(&c, s.endpoint, &s_small, 0, o, &info, err);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    if (c) {
        size_t n = s_small.n_floats;
        float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4), *g = dp_malloc(n * 4),
              *want = dp_malloc(n * 4), *init = dp_malloc(n * 4);
        CHECK_EQ(info.mode, DP_MODE_ASYNC);
        CHECK_EQ(info.num_shards, 1);
        CHECK_EQ(info.num_workers, 1);
        CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
        dp_model_init_params(&s_small, init, 7);
        CHECK_CLOSE("initial weights", p0, init, n, 0, 0);
        srv_fill(g, n, 1);
        dp_push_result_t res;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1.5f, 32), &res, err), 0);
        CHECK_EQ(res.applied, 1);
        CHECK_EQ(res.dropped + res.rejected, 0);
        CHECK_EQ(res.version, 1);
        CHECK_EQ(res.staleness_max, 0);
        CHECK_STR(res.reason, "");
        CHECK_EQ(dp_ps_client_pull(c, p1, err), 0);
        CHECK_EQ(dp_ps_client_version(c), 1);
        for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * g[i];
        CHECK_CLOSE("w - lr*g", p1, want, n, 0, 0);
        /* A second push on the old version: staleness 1, still applied. */
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1.0f, 32), &res, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1.0f, 32), &res, err), 0);
        CHECK_EQ(res.applied, 1);
        CHECK_EQ(res.staleness_max, 1);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.applied, 3);
        CHECK_EQ(st.version, 3);
        CHECK_EQ(st.staleness_max, 1);
        CHECK_NEAR(st.staleness_mean, 1.0 / 3.0, 1e-9);
        free(p0), free(p1), free(g), free(want), free(init);
    }
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&c); /* safe twice */
    CHECK(c == NULL);
    CHECK_EQ(srv_stop(&s), 0);
}

static void test_async_sgd_exact(void)
{
    s_async_sgd_exact(PS_OPTS(TMO));
}

/* Sync, R = 2 of 3 workers: two pushes make one step with their average;
 * the third worker's push on the old version is dropped (backup worker);
 * a second push by the same worker on one version is not counted twice. */
static void test_sync_aggregate_backup(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 3);
    s.cfg.replicas = 2;
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c[3] = {0};
    dp_ps_info_t info;
    for (int i = 0; i < 3; i++) CHECK_EQ(dp_ps_client_new(&c[i], s.endpoint, &s_small, i, PS_OPTS(TMO), &info, err), 0);
    if (c[0] && c[1] && c[2]) {
        CHECK_EQ(info.replicas, 2);
        size_t n = s_small.n_floats;
        float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4), *ga = dp_malloc(n * 4),
              *gb = dp_malloc(n * 4), *want = dp_malloc(n * 4);
        for (int i = 0; i < 3; i++) CHECK_EQ(dp_ps_client_pull(c[i], p0, err), 0);
        srv_fill(ga, n, 11);
        srv_fill(gb, n, 12);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c[0], PS_PUSH(ga, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.version, 0); /* accumulated, no step yet */
        CHECK_EQ(dp_ps_client_push(c[0], PS_PUSH(ga, 1, 8), &r, err), 0);
        CHECK_EQ(r.dropped, 1);
        CHECK(strstr(r.reason, "duplicate: worker 0 already contributed to version 0") != NULL);
        CHECK_EQ(dp_ps_client_push(c[1], PS_PUSH(gb, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.version, 1); /* this push completed the aggregate */
        CHECK_EQ(dp_ps_client_push(c[2], PS_PUSH(ga, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 0);
        CHECK_EQ(r.dropped, 1);
        CHECK(strstr(r.reason, "stale: computed on version 0, current 1") != NULL);
        if (!strstr(r.reason, "stale")) fprintf(stderr, "  reason: %s\n", r.reason);
        CHECK_EQ(dp_ps_client_pull(c[0], p1, err), 0);
        CHECK_EQ(dp_ps_client_version(c[0]), 1);
        for (size_t i = 0; i < n; i++) want[i] = p0[i] - 0.1f * ((ga[i] + gb[i]) * 0.5f);
        CHECK_CLOSE("one step of the average", p1, want, n, 0, 0);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c[2], &st, err), -1); /* only the chief may ask */
        CHECK(strstr(err, "only the chief") != NULL);
        CHECK_EQ(dp_ps_client_stats(c[0], &st, err), 0);
        CHECK_EQ(st.applied, 2);
        CHECK_EQ(st.dropped, 2);
        CHECK_EQ(st.version, 1);
        free(p0), free(p1), free(ga), free(gb), free(want);
    }
    for (int i = 0; i < 3; i++) dp_ps_client_destroy(&c[i]);
    CHECK_EQ(srv_stop(&s), 0);
}

/* A pull in a thread, to see whether the server defers it. */
typedef struct {
    dp_ps_client_t *c;
    float *params;
    atomic_int done;
    int rc;
    char err[DP_ERR_LEN];
} puller_t;

static void *s_puller(void *arg)
{
    puller_t *p = arg;
    p->rc = dp_ps_client_pull(p->c, p->params, p->err);
    atomic_store(&p->done, 1);
    return NULL;
}

/* Is the pull still blocked after `hold` seconds? Then wait up to 5 s. */
static int s_wait_done(puller_t *p, double limit)
{
    double t0 = dp_now();
    while (!atomic_load(&p->done) && dp_now() - t0 < limit) usleep(5000);
    return atomic_load(&p->done);
}

/* Sync with 2 workers: a fast worker's pull waits for the aggregate; once a
 * worker has finished it no longer blocks a step; wait_all_finished ends. */
static void test_sync_defer_and_finish(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *a = NULL, *b = NULL;
    CHECK_EQ(dp_ps_client_new(&a, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&b, s.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (a && b) {
        size_t n = s_small.n_floats;
        float *pa = dp_malloc(n * 4), *pb = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        srv_fill(g, n, 3);
        CHECK_EQ(dp_ps_client_pull(a, pa, err), 0);
        CHECK_EQ(dp_ps_client_pull(b, pb, err), 0);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(a, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 0);
        puller_t p = {a, pa, 0, 0, ""};
        pthread_t th;
        pthread_create(&th, NULL, s_puller, &p);
        CHECK_EQ(s_wait_done(&p, 0.3), 0); /* deferred: B has not pushed */
        CHECK_EQ(dp_ps_client_push(b, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 1);
        CHECK_EQ(s_wait_done(&p, 5), 1); /* released by the step */
        pthread_join(th, NULL);
        CHECK_EQ(p.rc, 0);
        CHECK_EQ(dp_ps_client_version(a), 1);
        /* B finishes: A alone makes the next steps without waiting. */
        CHECK_EQ(dp_ps_client_pull(b, pb, err), 0);
        CHECK_EQ(dp_ps_client_finish(b, err), 0);
        for (int k = 0; k < 3; k++) {
            CHECK_EQ(dp_ps_client_push(a, PS_PUSH(g, 1, 8), &r, err), 0);
            CHECK_EQ(r.applied, 1);
            CHECK_EQ(r.version, 2 + k);
            double t0 = dp_now();
            CHECK_EQ(dp_ps_client_pull(a, pa, err), 0);
            CHECK(dp_now() - t0 < 1.0);
        }
        CHECK_EQ(dp_ps_client_wait_all_finished(a, 3, err), 0);
        free(pa), free(pb), free(g);
    }
    dp_ps_client_destroy(&a);
    dp_ps_client_destroy(&b);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Sync, 2 workers; worker 1 says HELLO, pulls, then falls silent. Worker
 * 0's pull waits for the aggregate, which fires only once worker 1 is gone:
 * not before the heartbeat timeout has passed since worker 1's last
 * message (the server's last_seen of it is no earlier than the moment the
 * test sent it, so "released >= sent + timeout" holds whatever the load),
 * and well within a few timeouts after. wait_all_finished counts it gone. */
static void test_sync_heartbeat_timeout(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 2);
    const double timeout = 0.5;
    s.cfg.heartbeat_timeout = timeout;
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *a = NULL, *b = NULL;
    CHECK_EQ(dp_ps_client_new(&a, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&b, s.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (a && b) {
        size_t n = s_small.n_floats;
        float *pa = dp_malloc(n * 4), *pb = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        srv_fill(g, n, 5);
        CHECK_EQ(dp_ps_client_pull(a, pa, err), 0);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(a, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.version, 0); /* worker 1's gradient is still awaited */
        /* Worker 1's last message: sent no earlier than t_last. */
        double t_last = dp_now();
        CHECK_EQ(dp_ps_client_pull(b, pb, err), 0);
        CHECK_EQ(dp_ps_client_pull(a, pa, err), 0); /* deferred until worker 1 is gone */
        double dt = dp_now() - t_last;
        if (dt < timeout || dt >= 3.0)
            fprintf(stderr, "  released %.3f s after worker 1's last message (timeout %.1f s)\n", dt, timeout);
        CHECK(dt >= timeout); /* not dropped before its timeout */
        CHECK(dt < 3.0);      /* and dropped soon after it */
        CHECK_EQ(dp_ps_client_version(a), 1);
        CHECK_EQ(dp_ps_client_wait_all_finished(a, 3, err), 0);
        free(pa), free(pb), free(g);
    }
    dp_ps_client_destroy(&b);
    dp_ps_client_destroy(&a);
    CHECK_EQ(srv_stop(&s), 0);
}

/* SSP with S = 0 is lockstep: a worker one push ahead waits in its pull
 * until the other pushes. */
static void test_ssp_zero_lockstep(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_SSP, 2);
    s.cfg.staleness = 0;
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *a = NULL, *b = NULL;
    dp_ps_info_t info;
    CHECK_EQ(dp_ps_client_new(&a, s.endpoint, &s_small, 0, PS_OPTS(TMO), &info, err), 0);
    CHECK_EQ(dp_ps_client_new(&b, s.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (a && b) {
        CHECK_EQ(info.mode, DP_MODE_SSP);
        CHECK_EQ(info.staleness, 0);
        size_t n = s_small.n_floats;
        float *pa = dp_malloc(n * 4), *pb = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        srv_fill(g, n, 4);
        CHECK_EQ(dp_ps_client_pull(a, pa, err), 0);
        CHECK_EQ(dp_ps_client_pull(b, pb, err), 0);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(a, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1); /* ssp applies on arrival */
        CHECK_EQ(r.version, 1);
        puller_t p = {a, pa, 0, 0, ""};
        pthread_t th;
        pthread_create(&th, NULL, s_puller, &p);
        CHECK_EQ(s_wait_done(&p, 0.3), 0); /* A is 1 ahead of B > S = 0 */
        CHECK_EQ(dp_ps_client_push(b, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.staleness_max, 1); /* B computed on version 0 */
        CHECK_EQ(s_wait_done(&p, 5), 1);
        pthread_join(th, NULL);
        CHECK_EQ(p.rc, 0);
        CHECK_EQ(dp_ps_client_version(a), 2);
        /* B is not ahead of A: its pull is immediate. */
        double t0 = dp_now();
        CHECK_EQ(dp_ps_client_pull(b, pb, err), 0);
        CHECK(dp_now() - t0 < 1.0);
        free(pa), free(pb), free(g);
    }
    dp_ps_client_destroy(&a);
    dp_ps_client_destroy(&b);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Pushes g1, g2 through endpoints with a client made with o, returns the
 * final weights in out. */
static int s_two_pushes(const char *endpoints, const dp_model_t *m, const dp_ps_client_opts_t *o,
                        float *out, char *err)
{
    dp_ps_client_t *c = NULL;
    if (dp_ps_client_new(&c, endpoints, m, 0, o, NULL, err) != 0) return -1;
    size_t n = m->n_floats;
    float *g = dp_malloc(n * 4);
    int rc = -1;
    dp_push_result_t r;
    for (int k = 0; k < 2; k++) {
        if (dp_ps_client_pull(c, out, err) != 0) goto done;
        srv_fill(g, n, 100 + k);
        if (dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err) != 0 || r.dropped || r.rejected) goto done;
    }
    if (dp_ps_client_pull(c, out, err) != 0) goto done;
    rc = 0;
done:
    free(g);
    dp_ps_client_destroy(&c);
    return rc;
}

/* 2 shards (fc1.weight split between them) give exactly the weights of 1
 * shard after the same pushes, with a stateful optimizer. */
static void s_two_shards_equal_one(const dp_ps_client_opts_t *o)
{
    s_small_model();
    srv_t one, s0, s1;
    srv_init(&one, DP_MODE_ASYNC, 1);
    srv_init(&s0, DP_MODE_ASYNC, 1);
    srv_init(&s1, DP_MODE_ASYNC, 1);
    srv_t *all[3] = {&one, &s0, &s1};
    for (int i = 0; i < 3; i++) {
        all[i]->cfg.optim.kind = DP_OPT_MOMENTUM;
        all[i]->cfg.optim.momentum = 0.9f;
    }
    s0.cfg.shard_count = s1.cfg.shard_count = 2;
    s1.cfg.shard_index = 1;
    for (int i = 0; i < 3; i++) CHECK_EQ(srv_start(all[i]), 0);
    size_t lo, hi;
    dp_shard_range(s_small.n_floats, 1, 2, &lo, &hi);
    CHECK_EQ(lo, s_small.n_floats / 2);
    CHECK_EQ(hi, s_small.n_floats);
    size_t n = s_small.n_floats;
    float *a = dp_malloc(n * 4), *b = dp_malloc(n * 4);
    char err[DP_ERR_LEN] = "", eps[600];
    CHECK_EQ(s_two_pushes(one.endpoint, &s_small, o, a, err), 0);
    snprintf(eps, sizeof eps, "%s,%s", s0.endpoint, s1.endpoint);
    int rc = s_two_pushes(eps, &s_small, o, b, err);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_CLOSE("2 shards vs 1", b, a, n, 0, 0);
    /* Endpoints in the wrong order are refused with a clear line. */
    snprintf(eps, sizeof eps, "%s,%s", s1.endpoint, s0.endpoint);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, eps, &s_small, 0, PS_OPTS(TMO), NULL, err), -1);
    CHECK(strstr(err, "but it is listed at position") != NULL);
    /* A missing shard is refused too. */
    CHECK_EQ(dp_ps_client_new(&c, s0.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), -1);
    CHECK(strstr(err, "shard 0 of 2") != NULL);
    free(a), free(b);
    for (int i = 0; i < 3; i++) CHECK_EQ(srv_stop(all[i]), 0);
}

static void test_two_shards_equal_one(void)
{
    s_two_shards_equal_one(PS_OPTS(TMO));
}

static void test_fingerprint_mismatch(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    dp_model_t other;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&other, "conv3x3:3 relu maxpool2 fc:4 softmax", 1, 8, 8, err), 0);
    dp_ps_client_t *c = NULL;
    dp_ps_err_t kind = DP_PS_OK;
    dp_ps_client_opts_t o = {.timeout_s = TMO, .new_error = &kind};
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &other, 0, &o, NULL, err), -1);
    CHECK(c == NULL);
    CHECK(strstr(err, "model mismatch: this shard serves another model than the worker's 'conv3x3:3") != NULL);
    CHECK_EQ(kind, DP_PS_ERR_MODEL_MISMATCH); /* the kind, not the text */
    /* Not the server's spec nor its fingerprint: all a HELLO needs (issue 19, hole 8). */
    char fp[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, s_small.fingerprint);
    CHECK(strstr(err, "conv3x3:2") == NULL);
    CHECK(strstr(err, fp) == NULL);
    fprintf(stderr, "  (expected) %s\n", err);
    /* A spec of a real size makes the line ~300 characters: the user gets
     * it whole, to its last words (no error text is cut). */
    CHECK_EQ(dp_model_parse(&other, "conv3x3:8 relu conv3x3:16 relu maxpool2 conv3x3:32 relu fc:64 "
                                    "relu fc:4 softmax", 1, 8, 8, err), 0);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &other, 0, PS_OPTS(TMO), NULL, err), -1);
    const char *tail = "check --model and the data set on both sides (the shard's log names its own)";
    CHECK(strlen(err) > 280);
    CHECK(strlen(err) > strlen(tail) && strcmp(err + strlen(err) - strlen(tail), tail) == 0);
    /* Same spec, other input shape: refused as well. */
    CHECK_EQ(dp_model_parse(&other, SRV_SMALL_SPEC, 1, 10, 10, err), 0);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &other, 0, PS_OPTS(TMO), NULL, err), -1);
    CHECK(strstr(err, "on 1x10x10") != NULL);
    /* A worker id beyond --workers is refused. */
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 5, PS_OPTS(TMO), NULL, err), -1);
    CHECK(strstr(err, "worker id 5 out of range") != NULL);
    CHECK_EQ(srv_stop(&s), 0);
}

static void s_nan_rejected(const dp_ps_client_opts_t *o)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, o, NULL, err), 0);
    if (c) {
        size_t n = s_small.n_floats;
        float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
        srv_fill(g, n, 9);
        g[n / 3] = NAN;
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.rejected, 1);
        CHECK_EQ(r.applied, 0);
        CHECK(strstr(r.reason, "non-finite gradient") != NULL);
        g[n / 3] = INFINITY;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.rejected, 1);
        CHECK_EQ(dp_ps_client_pull(c, p1, err), 0);
        CHECK_CLOSE("weights unchanged", p1, p0, n, 0, 0);
        CHECK_EQ(dp_ps_client_version(c), 0);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.rejected, 2);
        CHECK_EQ(st.applied, 0);
        free(p0), free(p1), free(g);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

static void test_nan_rejected(void)
{
    s_nan_rejected(PS_OPTS(TMO));
}

/* ---- malformed messages on a raw socket ------------------------------- */

typedef struct {
    const void *data;
    size_t len;
} frame_t;

/* Send frames on a raw DEALER; the reply's type and error text. */
/* The Error.code of s_raw's last ERROR reply (-1: another reply). */
static int s_raw_code = -1;

static int s_raw(void *sock, const frame_t *f, int n, char *text, size_t text_n)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(sock, f[i].data, f[i].len, i + 1 < n ? ZMQ_SNDMORE : 0) < 0) return -1;
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return -1; /* RCVTIMEO bounds it */
    int type = -1;
    Downpour__Envelope *env = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    if (env) {
        type = env->type;
        snprintf(text, text_n, "%s", env->error && env->error->message ? env->error->message : "");
        s_raw_code = env->error ? (int)env->error->code : -1;
    }
    dp_wire_destroy(&env);
    dp_wire_rx_fini(&rx);
    return type;
}

/* A PUSH envelope for floats [lo, lo+cnt) of data, mutated by the flags. */
static size_t s_push_env(uint8_t *buf, const float *data, size_t lo, size_t cnt, uint64_t fp,
                         uint32_t version, int bad_crc, size_t claim_bytes)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 5, 1, fp); /* worker 1: the raw socket */
    env.protocol_version = version;
    Downpour__Push p = DOWNPOUR__PUSH__INIT;
    env.push = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", data, cnt, lo, 0, 0);
    if (bad_crc) d.crc32 ^= 0x5a5a;
    if (claim_bytes) {
        d.byte_length = claim_bytes;
        shape[0] = (int64_t)claim_bytes / 4;
    }
    env.n_tensors = 1;
    env.tensors = dv;
    size_t len = downpour__envelope__get_packed_size(&env);
    downpour__envelope__pack(&env, buf);
    return len;
}

/* HELLO as worker wid on a raw socket (its pushes are then its own). */
static int s_raw_hello(void *sock, int wid, char *text, size_t text_n)
{
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &s_small, wid, 1);
    static uint8_t buf[4096];
    frame_t f = {buf, downpour__envelope__pack(&env, buf)};
    return s_raw(sock, &f, 1, text, text_n);
}

static void test_malformed_envelopes(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2); /* worker 0 the client (the chief asks STATS), 1 the raw socket */
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    /* A real worker joins first, so that a valid push would be applied. */
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_small.n_floats;
    float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    if (c) CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
    srv_fill(g, n, 77);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_connect(sock, s.endpoint);
    uint64_t fp = s_small.fingerprint;
    static uint8_t buf[1 << 16];
    char text[DP_ERR_LEN + 200];
    CHECK_EQ(s_raw_hello(sock, 1, text, sizeof text), DOWNPOUR__MSG_TYPE__WELCOME);
    const char garbage[] = "\xff\xfe this is not a protobuf \x01\x02\x03";
    size_t len;
    typedef struct {
        const char *name;
        int n_frames;
        frame_t f[3];
        const char *want;
    } mcase_t;
    mcase_t cases[8];
    int k = 0;
    cases[k++] = (mcase_t){"garbage", 1, {{garbage, sizeof garbage}}, "does not parse"};
    cases[k++] = (mcase_t){"empty frame", 1, {{"", 0}}, "empty envelope"};
    /* Envelopes built into separate regions of buf. */
    uint8_t *b0 = buf, *b1 = buf + 8192, *b2 = buf + 16384, *b3 = buf + 24576, *b4 = buf + 32768;
    len = s_push_env(b0, g, 0, n, fp, 1, 0, 0);
    cases[k++] = (mcase_t){"no tensor frame", 1, {{b0, len}}, "1 tensor descriptors but 0 tensor frames"};
    cases[k++] = (mcase_t){"two tensor frames", 3, {{b0, len}, {g, n * 4}, {g, n * 4}}, "but 2 tensor frames"};
    size_t len1 = s_push_env(b1, g, 0, n, fp, 1, 0, (n - 1) * 4);
    cases[k++] = (mcase_t){"byte length", 2, {{b1, len1}, {g, n * 4}}, "frame has"};
    size_t len2 = s_push_env(b2, g, 0, n, fp, 1, 1, 0);
    cases[k++] = (mcase_t){"checksum", 2, {{b2, len2}, {g, n * 4}}, "checksum"};
    size_t len3 = s_push_env(b3, g, 0, n, fp, 9, 0, 0);
    cases[k++] = (mcase_t){"protocol version", 2, {{b3, len3}, {g, n * 4}}, "protocol version 9"};
    size_t len4 = s_push_env(b4, g, 1, n - 1, fp, 1, 0, 0);
    cases[k++] = (mcase_t){"range", 2, {{b4, len4}, {g, (n - 1) * 4}}, "this shard holds"};
    for (int i = 0; i < k; i++) {
        text[0] = 0;
        int type = s_raw(sock, cases[i].f, cases[i].n_frames, text, sizeof text);
        CHECK_EQ(type, DOWNPOUR__MSG_TYPE__ERROR);
        if (!strstr(text, cases[i].want)) {
            fprintf(stderr, "  case %s: reply '%s' lacks '%s'\n", cases[i].name, text, cases[i].want);
            CHECK(0);
        }
    }
    /* A fingerprint mismatch on a push. */
    len = s_push_env(b0, g, 0, n, fp ^ 1, 1, 0, 0);
    frame_t ff[2] = {{b0, len}, {g, n * 4}};
    CHECK_EQ(s_raw(sock, ff, 2, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "model mismatch") != NULL);
    CHECK_EQ(s_raw_code, DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH);
    char fps[32]; /* the reply names neither the shard's spec nor its fingerprint */
    snprintf(fps, sizeof fps, "%016" PRIx64, fp);
    CHECK(strstr(text, fps) == NULL);
    CHECK(strstr(text, s_small.spec) == NULL);
    /* A reply type sent as a request. */
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, fp);
    env.type = DOWNPOUR__MSG_TYPE__ERROR;
    Downpour__Error e = DOWNPOUR__ERROR__INIT;
    e.message = "hi";
    env.error = &e;
    len = downpour__envelope__pack(&env, b0);
    frame_t fe = {b0, len};
    CHECK_EQ(s_raw(sock, &fe, 1, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "not a request") != NULL);
    /* Sanity: the raw socket does get an ACK for a well-formed push. */
    len = s_push_env(b0, g, 0, n, fp, 1, 0, 0);
    frame_t ok[2] = {{b0, len}, {g, n * 4}};
    CHECK_EQ(s_raw(sock, ok, 2, text, sizeof text), DOWNPOUR__MSG_TYPE__ACK);
    /* Only that last push changed anything. */
    if (c) {
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.applied, 1);
        CHECK_EQ(st.version, 1);
        CHECK_EQ(st.rejected, 1); /* the push among them (rejected counts pushes) */
        CHECK_EQ(st.requests_refused, k + 1);
        CHECK_EQ(dp_ps_client_pull(c, p1, err), 0);
        for (size_t i = 0; i < n; i++) p0[i] -= 0.1f * g[i];
        CHECK_CLOSE("only the valid push applied", p1, p0, n, 0, 0);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    free(p0), free(p1), free(g);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* This process's resident memory in kB (VmRSS), -1 when unknown. */
static long s_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

/* One peer sends multiparts far over this shard's limit (a PUSH of its range
 * plus an envelope): 32 frames of 1 MB, each under the per-frame limit but
 * 32 MB together, again and again, and one of 100 tiny frames. Each is
 * refused with an ERROR naming the limit and counted; the frames are not
 * kept (memory does not grow with the number sent) and the shard serves the
 * real worker afterwards. */
/* AddressSanitizer's allocator keeps freed memory in quarantine and ignores
 * mallopt, so resident memory says nothing there (LSan checks leaks instead). */
#ifdef __SANITIZE_ADDRESS__
#define S_ASAN 1
#else
#define S_ASAN 0
#endif

static void test_oversized_refused(void)
{
    /* A fixed mmap threshold: large buffers go back to the system when freed
     * (glibc would otherwise raise it and keep freed megabytes in its heap),
     * so resident memory measures the buffers alive. */
    if (!S_ASAN) CHECK_EQ(mallopt(M_MMAP_THRESHOLD, 128 * 1024), 1);
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "", text[DP_ERR_LEN + 200] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = 10000;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    CHECK_EQ(zmq_connect(sock, s.endpoint), 0);
    uint8_t env_buf[256];
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 1, 0, s_small.fingerprint);
    size_t env_len = downpour__envelope__pack(&env, env_buf);
    enum { FRAMES = 32, ROUNDS = 16, MB = 1000 * 1000 };
    frame_t *f = dp_calloc(FRAMES + 1, sizeof *f);
    char *big = dp_malloc(MB);
    memset(big, 0x5a, MB);
    f[0] = (frame_t){env_buf, env_len};
    for (int i = 1; i <= FRAMES; i++) f[i] = (frame_t){big, MB};
    long rss0 = 0;
    int refused = 0;
    for (int r = 0; r < ROUNDS; r++) {
        if (r == 1) rss0 = s_rss_kb(); /* after one round: ZeroMQ's and malloc's pools exist */
        text[0] = 0;
        int type = s_raw(sock, f, FRAMES + 1, text, sizeof text);
        refused += type == DOWNPOUR__MSG_TYPE__ERROR && strstr(text, "refused") &&
                   strstr(text, "at most");
        if (r == 0) fprintf(stderr, "  (expected) %s\n", text);
    }
    long grown_mb = (s_rss_kb() - rss0) / 1024;
    fprintf(stderr, "  resident memory grew %ld MB over %d more messages of %d MB\n", grown_mb,
            ROUNDS - 1, FRAMES);
    CHECK_EQ(refused, ROUNDS);
    if (S_ASAN)
        fprintf(stderr, "  (under ASan resident memory is not checked: its allocator quarantines)\n");
    else
        CHECK(rss0 > 0 && grown_mb < 16); /* kept, they would be 480 MB */
    /* Too many frames, each tiny. */
    frame_t tiny[100];
    tiny[0] = f[0];
    for (int i = 1; i < 100; i++) tiny[i] = (frame_t){"x", 1};
    CHECK_EQ(s_raw(sock, tiny, 100, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "in 101 frames refused") != NULL);
    if (c) { /* counted, changed nothing, and the shard still serves */
        size_t n = s_small.n_floats;
        float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.requests_refused, ROUNDS + 1); /* messages, no push among them */
        CHECK_EQ(st.rejected, 0);
        CHECK_EQ(st.version, 0);
        srv_fill(g, n, 5);
        dp_push_result_t res;
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &res, err), 0);
        CHECK_EQ(res.applied, 1);
        CHECK_EQ(res.version, 1);
        free(p), free(g);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    free(f), free(big);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* ---- checkpoints ------------------------------------------------------ */

static void s_tmpdir(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "/tmp/dp-test-ps-%s-%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0) fprintf(stderr, "  (could not clean %s)\n", out);
}

/* Written on SHUTDOWN and restored on restart, optimizer state included:
 * push, shutdown, restart, push == two pushes on one server. */
static void test_checkpoint_restore(void)
{
    s_small_model();
    char dir[256], path[DP_PS_PATH_LEN + 64], err[DP_ERR_LEN] = "";
    s_tmpdir(dir, sizeof dir, "ckpt");
    size_t n = s_small.n_floats;
    float *p = dp_malloc(n * 4), *after1 = dp_malloc(n * 4), *want = dp_malloc(n * 4),
          *g1 = dp_malloc(n * 4), *g2 = dp_malloc(n * 4);
    srv_fill(g1, n, 21);
    srv_fill(g2, n, 22);
    dp_push_result_t r;
    /* Reference: one server, both pushes. */
    srv_t ref;
    srv_init(&ref, DP_MODE_ASYNC, 1);
    ref.cfg.optim.kind = DP_OPT_ADAM;
    CHECK_EQ(srv_start(&ref), 0);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, ref.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g1, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g2, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_pull(c, want, err), 0);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&ref), 0);
    /* First life: one push, then SHUTDOWN (checkpoint before the reply). */
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    s.cfg.optim.kind = DP_OPT_ADAM;
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", dir);
    CHECK_EQ(srv_start(&s), 0);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g1, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_pull(c, after1, err), 0);
        CHECK_EQ(dp_ps_client_shutdown_servers(c, err), 0);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop_after(&s, 5), 0);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    CHECK_EQ(access(path, F_OK), 0);
    /* Second life: restored at version 1 with the same weights and state. */
    srv_t s2;
    srv_init(&s2, DP_MODE_ASYNC, 1);
    s2.cfg.optim.kind = DP_OPT_ADAM;
    s2.cfg.resume = 1; /* the first life ended with SHUTDOWN: a finished run */
    snprintf(s2.cfg.checkpoint_dir, sizeof s2.cfg.checkpoint_dir, "%s", dir);
    CHECK_EQ(srv_start(&s2), 0);
    CHECK_EQ(dp_ps_client_new(&c, s2.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_version(c), 1);
        CHECK_CLOSE("restored weights", p, after1, n, 0, 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g2, 1, 8), &r, err), 0);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_CLOSE("restored optimizer state", p, want, n, 0, 0);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s2), 0); /* stop flag: writes the checkpoint at version 2 */
    /* A different optimizer refuses the file instead of starting fresh. */
    srv_t s3;
    srv_init(&s3, DP_MODE_ASYNC, 1);
    snprintf(s3.cfg.checkpoint_dir, sizeof s3.cfg.checkpoint_dir, "%s", dir);
    CHECK_EQ(srv_start(&s3), -1);
    CHECK_EQ(srv_stop(&s3), -1);
    CHECK(strstr(s3.err, "optimizer") != NULL);
    free(p), free(after1), free(want), free(g1), free(g2);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
}

static void test_corrupt_checkpoint(void)
{
    char dir[256], path[DP_PS_PATH_LEN + 64], err[DP_ERR_LEN];
    s_tmpdir(dir, sizeof dir, "corrupt");
    CHECK_EQ(mkdir(dir, 0755), 0);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    const char junk[] = "\x10\x00\x00\x00\x00\x00\x00\x00{\"params\": broken";
    CHECK_EQ(dp_write_file_atomic(path, junk, sizeof junk - 1, err), 0);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", dir);
    CHECK_EQ(srv_start(&s), -1);
    CHECK_EQ(srv_stop(&s), -1);
    CHECK(strstr(s.err, path) != NULL);
    fprintf(stderr, "  (expected) %s\n", s.err);
    /* The file is left alone for a human to look at. */
    CHECK_EQ(access(path, F_OK), 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ(system(cmd), 0);
}

/* No server: a clear timeout error, not a hang. Then a server that dies
 * mid-session: the next call times out too. */
static void test_dead_server_times_out(void)
{
    s_small_model();
    /* A port nobody listens on: bind one, note it, close it. */
    void *ctx = zmq_ctx_new();
    void *tmp = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_bind(tmp, "tcp://127.0.0.1:*");
    char ep[256];
    size_t len = sizeof ep;
    zmq_getsockopt(tmp, ZMQ_LAST_ENDPOINT, ep, &len);
    zmq_close(tmp);
    zmq_ctx_term(ctx);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    double t0 = dp_now();
    CHECK_EQ(dp_ps_client_new(&c, ep, &s_small, 0, PS_OPTS(1.0), NULL, err), -1);
    double dt = dp_now() - t0;
    CHECK(dt >= 0.9 && dt < 3.0);
    CHECK(strstr(err, "no reply in 1 s (is downpour-ps running?)") != NULL);
    CHECK(strstr(err, ep) != NULL);
    CHECK(strstr(err, "start-up: no reply in 1 s (is downpour-ps running?) from ps shard 0 at ") != NULL);
    fprintf(stderr, "  (expected) %s\n", err);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(1.0), NULL, err), 0);
    CHECK_EQ(srv_stop(&s), 0);
    if (c) {
        float *p = dp_malloc(s_small.n_floats * 4), *g = dp_calloc(s_small.n_floats, 4);
        t0 = dp_now();
        CHECK_EQ(dp_ps_client_pull(c, p, err), -1);
        CHECK(dp_now() - t0 < 3.0);
        CHECK(strstr(err, "no reply in 1 s") != NULL);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 1), &r, err), -1); /* never pulled */
        free(p), free(g);
    }
    dp_ps_client_destroy(&c);
}

/* Flags: the cluster form implies the shard, bad values name the flag. */
static void test_parse_args(void)
{
    dp_ps_config_t c;
    char err[DP_ERR_LEN] = "";
    dp_ps_config_default(&c);
    char *a1[] = {"downpour-ps", "--job-name", "ps", "--task-index", "1", "--ps-hosts",
                  "localhost:5000,localhost:5001,localhost:5002", "--worker-hosts",
                  "localhost:6000,localhost:6001", "--mode=ssp", "--staleness", "3", "--lr", "0.01"};
    int rc = dp_ps_parse_args(&c, (int)(sizeof a1 / sizeof a1[0]), a1, err);
    CHECK_EQ(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_STR(c.bind, "tcp://*:5001");
    CHECK_EQ(c.shard_index, 1);
    CHECK_EQ(c.shard_count, 3);
    CHECK_EQ(c.num_workers, 2);
    CHECK_EQ(c.mode, DP_MODE_SSP);
    CHECK_EQ(c.staleness, 3);
    CHECK_NEAR(c.optim.lr, 0.01, 1e-9);
    dp_ps_config_default(&c);
    char *a2[] = {"downpour-ps", "--shard", "2/2"};
    CHECK_EQ(dp_ps_parse_args(&c, 3, a2, err), DP_OPTS_BAD);
    CHECK(strstr(err, "--shard") != NULL);
    char *a3[] = {"downpour-ps", "--workers", "2", "--replicas-to-aggregate", "3"};
    CHECK_EQ(dp_ps_parse_args(&c, 5, a3, err), DP_OPTS_BAD);
    CHECK(strstr(err, "--replicas-to-aggregate") != NULL);
    char *a4[] = {"downpour-ps", "--mode", "fast"};
    CHECK_EQ(dp_ps_parse_args(&c, 3, a4, err), DP_OPTS_BAD);
    CHECK(strstr(err, "--mode") != NULL);
    char *a5[] = {"downpour-ps", "--optimizer", "adam", "--input", "3x32x32", "--bogus"};
    CHECK_EQ(dp_ps_parse_args(&c, 6, a5, err), DP_OPTS_BAD);
    CHECK(strstr(err, "--bogus") != NULL);
    CHECK_EQ(c.in_c, 3);
}

/* Pull + push round trip of the default model (6.6 MB), 1 and 2 shards. */
static void test_roundtrip_time(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, DP_MODEL_DEFAULT_SPEC, 1, 28, 28, err), 0);
    size_t n = m.n_floats;
    float *p = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    srv_fill(g, n, 1);
    for (size_t i = 0; i < n; i++) g[i] *= 1e-3f;
    for (int shards = 1; shards <= 2; shards++) {
        srv_t s[2];
        char eps[600] = "";
        for (int i = 0; i < shards; i++) {
            srv_init(&s[i], DP_MODE_ASYNC, 1);
            snprintf(s[i].cfg.model_spec, sizeof s[i].cfg.model_spec, "%s", DP_MODEL_DEFAULT_SPEC);
            s[i].cfg.in_h = s[i].cfg.in_w = 28;
            s[i].cfg.shard_index = i;
            s[i].cfg.shard_count = shards;
            CHECK_EQ(srv_start(&s[i]), 0);
            size_t l = strlen(eps);
            snprintf(eps + l, sizeof eps - l, "%s%s", i ? "," : "", s[i].endpoint);
        }
        dp_ps_client_t *c = NULL;
        CHECK_EQ(dp_ps_client_new(&c, eps, &m, 0, PS_OPTS(TMO), NULL, err), 0);
        if (c) {
            const int iters = 20;
            int ok = 1;
            dp_push_result_t r;
            for (int k = 0; k < 3 && ok; k++) /* warm up */
                ok = dp_ps_client_pull(c, p, err) == 0 && dp_ps_client_push(c, PS_PUSH(g, 1, 1), &r, err) == 0;
            double t0 = dp_now(), tpull = 0;
            for (int k = 0; k < iters && ok; k++) {
                double a = dp_now();
                ok = dp_ps_client_pull(c, p, err) == 0;
                tpull += dp_now() - a;
                ok = ok && dp_ps_client_push(c, PS_PUSH(g, 1, 1), &r, err) == 0 && r.applied == shards;
            }
            double dt = (dp_now() - t0) / iters;
            CHECK(ok);
            printf("roundtrip: %zu floats (%.1f MB), %d shard%s: pull+push %.2f ms (pull %.2f ms, push %.2f ms)\n",
                   n, n * 4 / 1e6, shards, shards > 1 ? "s" : "", dt * 1e3, tpull / iters * 1e3,
                   (dt - tpull / iters) * 1e3);
            fflush(stdout);
        }
        dp_ps_client_destroy(&c);
        for (int i = 0; i < shards; i++) CHECK_EQ(srv_stop(&s[i]), 0);
    }
    free(p), free(g);
}

/* The cases above ran through shared memory (a client on loopback asks for
 * it by default); the same cases with tensors as ZeroMQ frames. */
static void test_frames_transport(void)
{
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    s_async_sgd_exact(&frames);
    s_nan_rejected(&frames);
    s_two_shards_equal_one(&frames);
}

/* --wire bf16: the server applies exactly the gradient rounded to bfloat16
 * (its weights stay float32), and a pull returns the weights rounded to
 * bfloat16; a gradient that rounds to Inf is refused and changes nothing. */
static void test_bf16_wire(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL, *c32 = NULL;
    /* the CRC of the bf16 bytes, both ways */
    dp_ps_client_opts_t bf16 = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ,
                                .wire = DP_PS_WIRE_BF16, .crc = DP_PS_CRC_ON};
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &bf16, NULL, err), 0);
    if (c) {
        size_t n = s_small.n_floats;
        float *w0 = dp_malloc(n * 4), *p16 = dp_malloc(n * 4), *g = dp_malloc(n * 4),
              *want = dp_malloc(n * 4), *w1 = dp_malloc(n * 4);
        uint16_t *h = dp_malloc(n * 2);
        dp_model_init_params(&s_small, w0, 7);
        CHECK_EQ(dp_ps_client_pull(c, p16, err), 0);
        dp_wire_to_bf16(h, w0, n);
        dp_wire_from_bf16(want, h, n);
        CHECK_CLOSE("pulled weights = bf16(w)", p16, want, n, 0, 0);
        srv_fill(g, n, 3);
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        dp_wire_to_bf16(h, g, n);
        dp_wire_from_bf16(want, h, n);
        for (size_t i = 0; i < n; i++) want[i] = w0[i] - 0.1f * want[i];
        CHECK_EQ(dp_ps_client_new(&c32, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), -1); /* id taken */
        g[5] = 3.4e38f; /* finite in float32, Inf in bf16 */
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.rejected, 1);
        dp_ps_client_destroy(&c);
        /* the same worker id again, float32 this time: the exact master weights */
        CHECK_EQ(dp_ps_client_new(&c32, s.endpoint, &s_small, 0, &frames, NULL, err), 0);
        if (c32) {
            CHECK_EQ(dp_ps_client_pull(c32, w1, err), 0);
            CHECK_CLOSE("w - lr * bf16(g), in float32", w1, want, n, 0, 0);
        }
        free(w0), free(p16), free(g), free(want), free(w1), free(h);
    }
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&c32);
    CHECK_EQ(srv_stop(&s), 0);
}

/* Shared memory is what a loopback client gets, and what --transport zmq
 * refuses; a PUSH that claims shared memory from a worker that has none is
 * an ERROR that changes nothing. */
static void test_shm_granted(void)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
    dp_ps_client_opts_t frames = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &shm, NULL, err), 0);
    if (c) {
        CHECK_EQ(dp_ps_client_shm_shards(c), 1);
        size_t n = s_small.n_floats;
        float *p0 = dp_malloc(n * 4), *p1 = dp_malloc(n * 4), *g = dp_malloc(n * 4);
        CHECK_EQ(dp_ps_client_pull(c, p0, err), 0);
        /* a raw worker 1 that said HELLO without asking for shared memory */
        void *ctx = zmq_ctx_new(), *raw = zmq_socket(ctx, ZMQ_DEALER);
        int tmo = 3000, zero = 0;
        zmq_setsockopt(raw, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
        zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
        zmq_connect(raw, s.endpoint);
        char text[512] = "";
        CHECK_EQ(s_raw_hello(raw, 1, text, sizeof text), DOWNPOUR__MSG_TYPE__WELCOME);
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 9, 1, s_small.fingerprint);
        Downpour__Push pu = DOWNPOUR__PUSH__INIT;
        env.push = &pu;
        env.shm = 1;
        Downpour__TensorDesc d;
        Downpour__TensorDesc *dv[1] = {&d};
        int64_t shape[1];
        dp_wire_desc_fill(&d, shape, "params", g, n, 0, 1, 0);
        dp_wire_desc_no_checksum(&d);
        env.n_tensors = 1;
        env.tensors = dv;
        static uint8_t buf[4096];
        frame_t f = {buf, downpour__envelope__pack(&env, buf)};
        CHECK_EQ(s_raw(raw, &f, 1, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(text, "has no segment") != NULL);
        zmq_close(raw);
        zmq_ctx_term(ctx);
        CHECK_EQ(dp_ps_client_pull(c, p1, err), 0);
        CHECK_CLOSE("weights unchanged", p1, p0, n, 0, 0);
        free(p0), free(p1), free(g);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &frames, NULL, err), 0);
    if (c) CHECK_EQ(dp_ps_client_shm_shards(c), 0);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* dp_ps_client_pull_to: what reaches the sink is what a pull into a buffer
 * gets, every float exactly once, over two shards, for frames in float32
 * (lent from ZeroMQ's buffer, or copied first when a small message starts
 * at an odd byte of ZeroMQ's shared receive buffer), bfloat16 (widened) and
 * shared memory. */
typedef struct {
    float *dst;
    unsigned char *seen; /* times each float arrived */
    size_t n;
    int out_of_range;
} s_sink_t;

static void s_sink(void *arg, size_t off, const float *data, size_t n)
{
    s_sink_t *k = arg;
    if (off + n > k->n) {
        k->out_of_range = 1;
        return;
    }
    memcpy(k->dst + off, data, n * sizeof(float));
    for (size_t i = 0; i < n; i++) k->seen[off + i]++;
}

static void s_pull_to_case(const char *eps, const dp_model_t *m, dp_ps_transport_t transport,
                           int bf16, int worker)
{
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    dp_ps_client_opts_t o = {.timeout_s = TMO, .transport = transport,
                             .wire = bf16 ? DP_PS_WIRE_BF16 : DP_PS_WIRE_FP32};
    CHECK_EQ(dp_ps_client_new(&c, eps, m, worker, &o, NULL, err), 0);
    if (!c) return;
    CHECK_EQ(dp_ps_client_shm_shards(c), transport == DP_PS_TRANSPORT_SHM ? 2 : 0);
    size_t n = m->n_floats;
    float *want = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    s_sink_t k = {dp_calloc(n, 4), dp_calloc(n, 1), n, 0};
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_pull(c, want, err), 0);
    srv_fill(g, n, 11 + worker);
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
    CHECK_EQ(r.applied, 2);
    CHECK_EQ(dp_ps_client_pull(c, want, err), 0);
    CHECK_EQ(dp_ps_client_pull_to(c, s_sink, &k, err), 0);
    CHECK_EQ(k.out_of_range, 0);
    size_t once = 0;
    for (size_t i = 0; i < n; i++) once += k.seen[i] == 1;
    CHECK_EQ(once, n);
    CHECK_CLOSE("lent pull = pull into a buffer", k.dst, want, n, 0, 0);
    free(want), free(g), free(k.dst), free(k.seen);
    dp_ps_client_destroy(&c);
}

static void test_pull_to(void)
{
    s_small_model();
#define S_WIDE_SPEC "fc:10 softmax"
    dp_model_t wide; /* 164 kB on 64x64 inputs: each shard's frame is a message buffer of its own */
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_model_parse(&wide, S_WIDE_SPEC, 1, 64, 64, err), 0);
    const dp_model_t *models[2] = {&s_small, &wide};
    for (int k = 0; k < 2; k++) {
        srv_t s[2];
        char eps[600];
        for (int i = 0; i < 2; i++) {
            srv_init(&s[i], DP_MODE_ASYNC, 3);
            if (k == 1) {
                snprintf(s[i].cfg.model_spec, sizeof s[i].cfg.model_spec, S_WIDE_SPEC);
                s[i].cfg.in_h = s[i].cfg.in_w = 64;
            }
            s[i].cfg.shard_count = 2;
            s[i].cfg.shard_index = i;
            CHECK_EQ(srv_start(&s[i]), 0);
        }
        snprintf(eps, sizeof eps, "%s,%s", s[0].endpoint, s[1].endpoint);
        s_pull_to_case(eps, models[k], DP_PS_TRANSPORT_ZMQ, 0, 0);
        s_pull_to_case(eps, models[k], DP_PS_TRANSPORT_ZMQ, 1, 1);
        s_pull_to_case(eps, models[k], DP_PS_TRANSPORT_SHM, 0, 2);
        for (int i = 0; i < 2; i++) CHECK_EQ(srv_stop(&s[i]), 0);
    }
}

/* A shared-memory copy that a step races, through the sink (the path
 * downpour_pull_tensors and the Python Worker take): the sink's first call
 * makes another worker push DP_SHM_PARAM_SLOTS times, so the slot it is
 * reading from is rewritten under it; the seqlock's second look sees it,
 * the pull goes again, and the sink gets every float again, of the new
 * version: what a pull into a buffer gets afterwards. */
typedef struct {
    s_sink_t k;
    dp_ps_client_t *other; /* pushes from the sink's first call */
    const float *g;
    int calls, pushed;
    int every;             /* push from every call, not the first only */
} s_racing_sink_t;

static void s_racing_sink(void *arg, size_t off, const float *data, size_t n)
{
    s_racing_sink_t *r = arg;
    s_sink(&r->k, off, data, n);
    if (r->calls++ > 0 && !r->every) return;
    char err[DP_ERR_LEN];
    dp_push_result_t res;
    for (int i = 0; i < DP_SHM_PARAM_SLOTS; i++)
        r->pushed += dp_ps_client_push(r->other, PS_PUSH(r->g, 1, 8), &res, err) == 0 && res.applied == 1;
}

/* A pull through the racing sink, into a shared-memory client while a
 * socket client pushes: from the sink's first call only (every 0), or
 * from each (every 1: shared memory that tears every time, as a busy
 * crew's steps tear it while a reader waits for a core). */
static void s_torn_case(int every)
{
    s_small_model();
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL, *other = NULL;
    dp_ps_client_opts_t shm = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_SHM};
    dp_ps_client_opts_t zmq = {.timeout_s = TMO, .transport = DP_PS_TRANSPORT_ZMQ};
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, &shm, NULL, err), 0);
    CHECK_EQ(dp_ps_client_new(&other, s.endpoint, &s_small, 1, &zmq, NULL, err), 0);
    size_t n = s_small.n_floats;
    float *want = dp_malloc(n * 4), *g = dp_malloc(n * 4);
    srv_fill(g, n, 5);
    if (c && other) {
        CHECK_EQ(dp_ps_client_shm_shards(c), 1);
        CHECK_EQ(dp_ps_client_pull(other, want, err), 0); /* its pushes need a version */
        s_racing_sink_t r = {{dp_calloc(n, 4), dp_calloc(n, 1), n, 0}, other, g, 0, 0, every};
        int rc = dp_ps_client_pull_to(c, s_racing_sink, &r, err);
        CHECK_EQ(rc, 0);
        if (rc != 0) fprintf(stderr, "  pull: %s\n", err);
        size_t again = 0, never = 0;
        for (size_t i = 0; i < n; i++) again += r.k.seen[i] >= 2, never += r.k.seen[i] == 0;
        CHECK_EQ(never, 0);
        CHECK(again > 0); /* the torn copy was handed again */
        CHECK_EQ(r.k.out_of_range, 0);
        if (!every) {
            CHECK_EQ(r.pushed, DP_SHM_PARAM_SLOTS);
            CHECK_EQ(dp_ps_client_pull(c, want, err), 0);
            CHECK_CLOSE("the sink ends on the new version", r.k.dst, want, n, 0, 0);
            CHECK_EQ(dp_ps_client_version(c), DP_SHM_PARAM_SLOTS);
        } else {
            CHECK(r.pushed > 4 * DP_SHM_PARAM_SLOTS); /* it tore (at least) 4 times first */
            /* the socket's copy is whole: a version the servers held when they sent it */
            CHECK(dp_ps_client_version(c) >= 4 * DP_SHM_PARAM_SLOTS);
            CHECK_EQ(dp_ps_client_pull(c, want, err), 0); /* and shared memory serves the next */
        }
        free(r.k.dst), free(r.k.seen);
    }
    free(want), free(g);
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&other);
    CHECK_EQ(srv_stop(&s), 0);
}

static void test_pull_to_torn(void)
{
    s_torn_case(0);
}

/* Shared memory that tears every time: after a few torn tries the pull
 * goes through the socket, whose copy cannot tear, and succeeds, where it
 * used to fail the worker ("16 pulls in a row raced the servers' steps",
 * seen with two A3C workers on 2 busy cores). */
static void test_pull_torn_falls_back(void)
{
    s_torn_case(1);
}

DP_TESTS(T(test_async_sgd_exact), T(test_sync_aggregate_backup), T(test_sync_defer_and_finish),
         T(test_sync_heartbeat_timeout), T(test_ssp_zero_lockstep), T(test_two_shards_equal_one),
         T(test_fingerprint_mismatch), T(test_nan_rejected), T(test_malformed_envelopes),
         T(test_oversized_refused),
         T(test_checkpoint_restore), T(test_corrupt_checkpoint), T(test_dead_server_times_out),
         T(test_parse_args), T(test_frames_transport), T(test_shm_granted), T(test_pull_to_torn), T(test_pull_torn_falls_back),
         T(test_bf16_wire), T(test_pull_to), T(test_roundtrip_time))
