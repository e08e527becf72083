/* test_ps_account: an actor-critic run's account at a real server
 * (tests/ps_harness.h, loopback) from the hostile side — what a push says
 * of its segment (Push.env_steps, episode_returns, episode_ends,
 * solved_threshold) is held to the bounds the shard was told at start
 * (--env, --envs, --t-max: server/core/account.h), never to what a push says:
 *  - the honest account: the ACK's run env steps, STATS' episodes, mean of
 *    the last 100 and the env step the environment's threshold was reached;
 *  - each lie (2^32 env steps with 100 returns of 500; a segment one step
 *    over --envs x --t-max; a return outside the environment's range or
 *    NaN; ends out of order, repeated or past the segment; another
 *    threshold, -1e300 or infinite) refused whole: ERROR ERR_ACCOUNT
 *    naming the bound, counted as rejected, the weights and the account
 *    unchanged bit for bit;
 *  - a threshold of -1e300 in the run's first push does not become the
 *    run's: 100 episodes of 20 on cartpole-v1 solve nothing;
 *  - a shard not told the environment refuses any account, naming --env,
 *    and still applies a supervised push;
 *  - the last part of a push in parts carrying a lie refuses the whole
 *    push (a raw peer), the earlier part discarded, the weights unchanged. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0

static dp_model_t s_m;

/* A server of the small model, async, 2 workers, told cartpole-v1 with
 * envs x t_max env steps a segment (env NULL: not told). */
static int s_start(srv_t *s, const char *env, int envs, int t_max)
{
    if (!s_m.n_floats) srv_small_model(&s_m);
    srv_init(s, DP_MODE_ASYNC, 2);
    if (env) snprintf(s->cfg.env, sizeof s->cfg.env, "%s", env);
    s->cfg.envs = envs;
    s->cfg.t_max = t_max;
    return srv_start(s);
}

/* One client push of step st with segment sg (NULL: none) and gradient g. */
static dp_push_result_t s_push(dp_ps_client_t *c, uint64_t st, const float *g, const dp_ps_segment_t *sg)
{
    dp_push_result_t r;
    memset(&r, 0, sizeof r);
    char err[DP_ERR_LEN] = "";
    dp_ps_push_t p = {.grads = g, .loss = 1, .batch = 1, .step = st, .segment = sg};
    if (dp_ps_client_push(c, &p, &r, err) != 0) fprintf(stderr, "  push: %s\n", err);
    return r;
}

/* A push refused for its account: one ERROR naming want, the weights and
 * the run's env steps as before. */
static void s_refused(dp_ps_client_t *c, uint64_t st, const float *g, const dp_ps_segment_t *sg,
                      const char *want, const float *w0, float *w, uint64_t steps_before)
{
    dp_push_result_t r = s_push(c, st, g, sg);
    CHECK_EQ(r.applied, 0);
    CHECK_EQ(r.rejected, 1);
    CHECK_EQ(r.account_refused, 1);
    CHECK(strstr(r.reason, want) != NULL);
    if (!strstr(r.reason, want)) fprintf(stderr, "  want '%s', got: %s\n", want, r.reason);
    srv_weights(c, w);
    CHECK(memcmp(w, w0, s_m.n_floats * sizeof(float)) == 0);
    dp_ps_stats_t st_;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_ps_client_stats(c, &st_, err), 0);
    CHECK_EQ(st_.env_steps, steps_before);
}

/* Ends 1 .. n, every return ret. */
static void s_episodes(double *rets, uint32_t *ends, size_t n, double ret)
{
    for (size_t k = 0; k < n; k++) rets[k] = ret, ends[k] = (uint32_t)(k + 1);
}

/* The honest account, then each lie refused whole: cartpole-v1, --envs 2
 * --t-max 5, so a segment has at most 10 env steps. */
static void test_bounds(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, "cartpole-v1", 2, 5), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 9);
    double rets[100];
    uint32_t ends[100];
    s_episodes(rets, ends, 100, 500);
    const double ret[3] = {5, 7, 9}, bad[3] = {501, 0, NAN};
    if (c) {
        srv_weights(c, w); /* a push needs a version */
        dp_push_result_t r = s_push(c, 1, g, &(dp_ps_segment_t){10, 2, ret, (const uint32_t[]){3, 10}, 475});
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.env_steps, 10);
        srv_weights(c, w0);
        /* the issue's: 2^32 env steps and 100 returns of 500 */
        s_refused(c, 2, g, &(dp_ps_segment_t){(uint64_t)1 << 32, 100, rets, ends, 475},
                  "a segment of 4294967296 env steps, over the shard's --envs x --t-max = 10", w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){11, 1, ret, ends, 475}, "over the shard's --envs x --t-max",
                  w0, w, 10);
        for (int k = 0; k < 3; k++)
            s_refused(c, 2, g, &(dp_ps_segment_t){4, 1, bad + k, ends, 475},
                      "outside cartpole-v1's range [1, 500]", w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){4, 1, ret, (const uint32_t[]){5}, 475}, "within the segment",
                  w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){10, 2, ret, (const uint32_t[]){9, 2}, 475}, "is not after",
                  w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){10, 2, ret, (const uint32_t[]){4, 4}, 475}, "is not after",
                  w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){4, 1, ret, ends, -1e300}, "is not cartpole-v1's 475", w0, w, 10);
        s_refused(c, 2, g, &(dp_ps_segment_t){4, 1, ret, ends, INFINITY}, "is not cartpole-v1's 475", w0, w,
                  10);
        /* honest again: its step (never handled by a refusal) applies */
        r = s_push(c, 2, g, &(dp_ps_segment_t){6, 1, ret + 2, (const uint32_t[]){1}, 475});
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(r.env_steps, 16);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.env_steps, 16);
        CHECK_EQ(st.episodes, 3);
        CHECK_NEAR(st.return_mean_100, 7.0, 1e-12);
        CHECK_EQ(st.solved_at_env_steps, -1); /* fewer than 100 episodes solve nothing */
        CHECK_EQ(st.rejected, 10);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

/* The threshold is the environment's: a first push saying -1e300 is
 * refused and sets nothing, so 100 episodes of 20 on cartpole-v1 (475)
 * solve nothing; 100 of 480 then do, at the env step their 99th ended. */
static void test_threshold(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, "cartpole-v1", 10, 10), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 4);
    double low[100], high[100];
    uint32_t ends[100];
    s_episodes(low, ends, 100, 20);
    s_episodes(high, ends, 100, 480);
    dp_ps_stats_t st;
    if (c) {
        srv_weights(c, w0);
        s_refused(c, 1, g, &(dp_ps_segment_t){100, 100, low, ends, -1e300}, "is not cartpole-v1's 475", w0, w,
                  0);
        CHECK_EQ(s_push(c, 1, g, &(dp_ps_segment_t){100, 100, low, ends, 475}).applied, 1);
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.episodes, 100);
        CHECK_NEAR(st.return_mean_100, 20.0, 0);
        CHECK_EQ(st.solved_at_env_steps, -1);
        CHECK_EQ(s_push(c, 2, g, &(dp_ps_segment_t){100, 100, high, ends, 475}).applied, 1);
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_NEAR(st.return_mean_100, 480.0, 0);
        CHECK_EQ(st.solved_at_env_steps, 199); /* 99 of 480 and one of 20: a mean of 475.4 */
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

/* Not told the environment: an account is refused, naming --env; a push
 * without one (a supervised run's) applies as ever. */
static void test_not_told(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, NULL, 1, 5), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 5);
    const double ret[1] = {9};
    if (c) {
        srv_weights(c, w0);
        s_refused(c, 1, g, &(dp_ps_segment_t){5, 1, ret, (const uint32_t[]){5}, 475},
                  "not told the environment (downpour-ps --env NAME", w0, w, 0);
        CHECK_EQ(s_push(c, 1, g, NULL).applied, 1);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

/* A raw peer's push in two parts whose last part lies (2^32 env steps):
 * refused whole, the first part discarded (the honest last part alone then
 * completes nothing), the weights unchanged. */
static void test_part_lies(void)
{
    srv_t s;
    CHECK_EQ(s_start(&s, "cartpole-v1", 1, 5), 0);
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_m, 0, PS_OPTS(TMO), NULL, err), 0);
    size_t n = s_m.n_floats, h = n / 2;
    float *g = dp_malloc(n * 4), *w0 = dp_malloc(n * 4), *w = dp_malloc(n * 4);
    srv_fill(g, n, 6);
    void *ctx = zmq_ctx_new();
    void *sock = raw_dealer(ctx, s.endpoint, (int)(TMO * 1000));
    Downpour__Envelope he;
    Downpour__Hello hl;
    raw_hello_init(&he, &hl, &s_m, 1, 1);
    CHECK_EQ(raw_request(sock, &he, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    uint64_t ver = srv_weights(c, w0);
    raw_push_t rp;
    raw_push_init(&rp, &s_m, 1, 2, 1, ver, 0, 2, g, h, 0);
    dp_wire_payload_t pl = {g, h * sizeof(float), NULL, NULL};
    CHECK_EQ(dp_wire_send(sock, NULL, &rp.env, &pl, 1, err), 0);
    raw_reply_t r = raw_reply(sock);
    CHECK(r.type == DOWNPOUR__MSG_TYPE__ACK && r.status == DOWNPOUR__ACK_STATUS__RECEIVED);
    raw_push_init(&rp, &s_m, 1, 3, 1, ver, 1, 2, g + h, n - h, h);
    rp.push.env_steps = (uint64_t)1 << 32;
    rp.push.solved_threshold = 475;
    pl = (dp_wire_payload_t){g + h, (n - h) * sizeof(float), NULL, NULL};
    CHECK_EQ(dp_wire_send(sock, NULL, &rp.env, &pl, 1, err), 0);
    r = raw_reply(sock);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "over the shard's --envs x --t-max = 5") != NULL);
    CHECK_EQ(srv_weights(c, w), ver);
    CHECK(memcmp(w, w0, n * sizeof(float)) == 0);
    /* the same last part, honest: its first part is gone, so not applied */
    rp.push.env_steps = 5;
    rp.env.request_id = 4;
    CHECK_EQ(dp_wire_send(sock, NULL, &rp.env, &pl, 1, err), 0);
    r = raw_reply(sock);
    CHECK(!(r.type == DOWNPOUR__MSG_TYPE__ACK && r.status == DOWNPOUR__ACK_STATUS__APPLIED));
    CHECK_EQ(srv_weights(c, w), ver);
    CHECK(memcmp(w, w0, n * sizeof(float)) == 0);
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    CHECK_EQ(st.env_steps, 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
    free(g), free(w0), free(w);
}

/* downpour-ps's flags: --env known, --envs / --t-max only with it. */
static void test_flags(void)
{
    struct { const char *args[4]; int ok; const char *want; } cases[] = {
        {{"--env", "cartpole-v1"}, 1, ""},
        {{"--env", "pong"}, 0, "no such environment"},
        {{"--envs", "4"}, 0, "give --env NAME too"},
        {{"--env", "acrobot-v1", "--t-max", "0"}, 0, "--t-max"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[6] = {"downpour-ps"};
        int argc = 1;
        for (int k = 0; k < 4 && cases[i].args[k]; k++) argv[argc++] = (char *)cases[i].args[k];
        dp_ps_config_t cfg;
        dp_ps_config_default(&cfg);
        char err[DP_ERR_LEN] = "";
        dp_opts_result_t rc = dp_ps_parse_args(&cfg, argc, argv, err);
        CHECK_EQ(rc == DP_OPTS_PARSED, cases[i].ok);
        CHECK(strstr(err, cases[i].want) != NULL);
        if (!strstr(err, cases[i].want)) fprintf(stderr, "  case %zu: %s\n", i, err);
    }
}

/* --env makes the servers' model the environment's, as a worker's --env
 * does: the default actor-critic spec (or --model's) with its ac written
 * out, on the observation's input; a classifier's model refused. */
static void test_env_model(void)
{
    struct { const char *args[6]; const char *spec; int in_c; const char *want; } cases[] = {
        {{"--env", "cartpole-v1"}, "fc:64 tanh fc:64 tanh ac:2", 4, ""},
        {{"--model", "fc:32 tanh ac", "--env", "acrobot-v1"}, "fc:32 tanh ac:3", 6, ""},
        {{"--env", "cartpole-v1", "--model", "fc:8 relu ac:2", "--input", "4x1x1"}, "fc:8 relu ac:2", 4, ""},
        {{"--env", "cartpole-v1", "--model", "fc:8 softmax"}, NULL, 0, "actor-critic head"},
        {{"--env", "cartpole-v1", "--model", "fc:8 ac:3"}, NULL, 0, "2 actions"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[8] = {"downpour-ps"};
        int argc = 1;
        for (int k = 0; k < 6 && cases[i].args[k]; k++) argv[argc++] = (char *)cases[i].args[k];
        dp_ps_config_t cfg;
        dp_ps_config_default(&cfg);
        char err[DP_ERR_LEN] = "";
        dp_opts_result_t rc = dp_ps_parse_args(&cfg, argc, argv, err);
        CHECK_EQ(rc == DP_OPTS_PARSED, cases[i].spec != NULL);
        if (cases[i].spec) {
            CHECK(strcmp(cfg.model_spec, cases[i].spec) == 0);
            CHECK_EQ(cfg.in_c, cases[i].in_c);
            CHECK_EQ(cfg.in_h * cfg.in_w, 1);
            if (strcmp(cfg.model_spec, cases[i].spec) != 0) fprintf(stderr, "  case %zu: '%s'\n", i, cfg.model_spec);
        } else {
            CHECK(strstr(err, cases[i].want) != NULL);
            if (!strstr(err, cases[i].want)) fprintf(stderr, "  case %zu: %s\n", i, err);
        }
    }
}

DP_TESTS(T(test_bounds), T(test_threshold), T(test_not_told), T(test_part_lies), T(test_flags), T(test_env_model))
