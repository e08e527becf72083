/* test_ps_dylu: --local-steps auto (DyLU, common/dylu.h) at a real server
 * (tests/ps_harness.h, loopback), from the hostile side — what a push says
 * of its round (Push.local_steps, Push.step_ms) is held to the shard's
 * --local-steps auto:H, never taken on trust, since a step time sets every
 * other worker's H and a round's steps are what a replay trains:
 *  - honest pushes: each ACK carries the least step time the crew reported
 *    (Ack.crew_step_ms), the later faster worker's once it reported;
 *  - each lie (a round of 0 or H + 1 steps, a step time NaN, infinite,
 *    negative, 1e-9 or 1e10 ms) refused whole: counted as rejected, the
 *    weights unchanged bit for bit, the crew's fastest still the honest one;
 *  - a worker that finished no longer counts: the crew's fastest is then
 *    the one left;
 *  - a shard not running auto refuses a push carrying either field, and
 *    answers no crew time. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0

static dp_model_t s_m;

/* A server of the small model, async, 2 workers, --local-steps auto:4 (or
 * a plain 4 when !dylu). */
static int s_start(srv_t *s, int dylu)
{
    if (!s_m.n_floats) srv_small_model(&s_m);
    srv_init(s, DP_MODE_ASYNC, 2);
    s->cfg.local_steps = 4;
    s->cfg.local_auto = dylu;
    return srv_start(s);
}

/* One push of step st: a round of h steps at ms a step. */
static dp_push_result_t s_push(dp_ps_client_t *c, uint64_t st, const float *g, uint32_t h, float ms)
{
    dp_push_result_t r;
    memset(&r, 0, sizeof r);
    char err[DP_ERR_LEN] = "";
    dp_ps_push_t p = {.grads = g, .loss = 1, .batch = 1, .step = st, .local_steps = h, .step_ms = ms};
    if (dp_ps_client_push(c, &p, &r, err) != 0) fprintf(stderr, "  push: %s\n", err);
    return r;
}

/* A lie refused: rejected, naming want, the weights as w0. */
static void s_refused(dp_ps_client_t *c, uint64_t st, const float *g, uint32_t h, float ms, const char *want,
                      const float *w0, float *w)
{
    dp_push_result_t r = s_push(c, st, g, h, ms);
    CHECK_EQ(r.applied, 0);
    CHECK_EQ(r.rejected, 1);
    CHECK(strstr(r.reason, want) != NULL);
    if (!strstr(r.reason, want)) fprintf(stderr, "  want '%s', got: %s\n", want, r.reason);
    srv_weights(c, w);
    CHECK(memcmp(w, w0, s_m.n_floats * sizeof(float)) == 0);
}

static void test_auto_bounds(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, 1), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *a = NULL, *b = NULL;
    dp_ps_info_t info;
    memset(&info, 0, sizeof info);
    CHECK_EQ(dp_ps_client_new(&a, s.endpoint, &s_m, 0, PS_OPTS(TMO), &info, err), 0);
    CHECK_EQ(dp_ps_client_new(&b, s.endpoint, &s_m, 1, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 5);
    if (a && b) {
        CHECK_EQ(info.local_auto, 1); /* the WELCOME said so */
        CHECK_EQ(info.local_steps, 4);
        srv_weights(a, w);
        srv_weights(b, w);
        dp_push_result_t r = s_push(a, 1, g, 4, 0); /* a first round: no time yet */
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 0);
        r = s_push(a, 2, g, 4, 20);
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 20);
        r = s_push(b, 1, g, 2, 8);
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 8); /* b's the faster now */
        srv_weights(b, w0);
        s_refused(b, 2, g, 5, 8, "takes 1..4 steps", w0, w);
        s_refused(b, 2, g, 0, 8, "takes 1..4 steps", w0, w);
        const float bad[] = {NAN, INFINITY, -1, 1e-9f, 1e10f};
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
            s_refused(b, 2, g, 2, bad[k], "a step time of 0 or", w0, w);
        /* the crew's fastest is still the honest 8 (a refused 1e-9 did not count) */
        r = s_push(a, 3, g, 4, 20);
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 8);
        /* b finishes: its time no longer sets the others' H */
        CHECK_EQ(dp_ps_client_finish(b, err), 0);
        r = s_push(a, 4, g, 4, 20);
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 20);
    }
    dp_ps_client_destroy(&a);
    dp_ps_client_destroy(&b);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

/* A shard of a fixed H: a push carrying a round's steps or a step time is
 * refused; a plain one applies, its ACK without a crew time. */
static void test_not_auto(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, 0), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *a = NULL;
    dp_ps_info_t info;
    memset(&info, 0, sizeof info);
    CHECK_EQ(dp_ps_client_new(&a, s.endpoint, &s_m, 0, PS_OPTS(TMO), &info, err), 0);
    size_t n = s_m.n_floats;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 6);
    if (a) {
        CHECK_EQ(info.local_auto, 0);
        srv_weights(a, w0);
        s_refused(a, 1, g, 3, 0, "not running --local-steps auto", w0, w);
        s_refused(a, 1, g, 0, 12, "not running --local-steps auto", w0, w);
        dp_push_result_t r = s_push(a, 1, g, 0, 0);
        CHECK_EQ(r.applied, 1);
        CHECK(r.crew_step_ms == 0);
    }
    dp_ps_client_destroy(&a);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

DP_TESTS(T(test_auto_bounds), T(test_not_auto))
