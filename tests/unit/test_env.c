/* test_env: the environments (worker/exec/env) against Gymnasium's own.
 *
 * Every expected state below is Gymnasium's: its CartPoleEnv and
 * AcrobotEnv (gymnasium/envs/classic_control, run once with its numpy
 * code, env.state set to the start below, the actions below, env.state
 * printed with %.17g after each step); tests/env_reference.py says how to
 * regenerate them. The states agree to the last bits (libm's sin and cos
 * against numpy's, which may differ by an ulp), the rewards, terminations
 * and steps exactly. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/test.h"
#include "worker/exec/env/env.h"

typedef struct {
    int step;          /* 1-based: the state after this step */
    double s[4];
} s_point_t;

/* Steps env from start under policy until done or max steps, checking
 * the points; returns the steps taken (*ret the return). */
static int s_run(const dp_env_kind_t *k, const double *start, int (*policy)(const double *, int),
                 int max, const s_point_t *pts, int n_pts, double *ret)
{
    dp_env_t e;
    dp_env_reset(&e, k, 1, 0, 0);
    memcpy(e.state, start, 4 * sizeof *start);
    char err[DP_ERR_LEN];
    int done = 0, p = 0;
    while (!done && e.steps < max) {
        double r;
        CHECK_EQ(dp_env_step(&e, policy(e.state, e.steps), &r, &done, err), 0);
        if (p < n_pts && pts[p].step == e.steps) {
            for (int i = 0; i < 4; i++) CHECK_NEAR(e.state[i], pts[p].s[i], 1e-12);
            p++;
        }
    }
    CHECK_EQ(p, n_pts);
    *ret = e.ret;
    return e.steps;
}

static const double s_cp_start[4] = {0.01, -0.02, 0.03, 0.04};
static const double s_ac_start[4] = {0.05, -0.03, 0.02, 0.01};

static int s_alternate(const double *s, int k) { (void)s; return (k + 1) % 2; }
static int s_right(const double *s, int k) { (void)s, (void)k; return 1; }
static int s_balance(const double *s, int k)
{
    (void)k;
    return s[2] + 0.5 * s[3] + 0.01 * s[0] + 0.1 * s[1] > 0;
}

static void test_cartpole(void)
{
    const dp_env_kind_t *k = &dp_env_cartpole_v1;
    CHECK(k->obs_dim == 4 && k->n_actions == 2 && k->max_steps == 500 && k->solved == 475);
    const s_point_t alt[] = {
        {1, {0.0096000000000000009, 0.17467919574755525, 0.030799999999999998, -0.24306871796000826}},
        {2, {0.013093583914951107, -0.020868848948191993, 0.025938625640799833, 0.059167999939416432}},
        {3, {0.012676206935987267, 0.17387177487348129, 0.027121985639588161, -0.22521957255967348}},
        {10, {0.025170769805637132, -0.023430405247453573, 0.016253613775848136, 0.11566955839653661}},
    };
    double ret;
    CHECK_EQ(s_run(k, s_cp_start, s_alternate, 10, alt, 4, &ret), 10);
    CHECK_NEAR(ret, 10, 0);
    /* always right: the pole falls past 12 degrees at step 10, whose reward counts */
    const s_point_t right[] = {
        {2, {0.013093583914951107, 0.36934797605795561, 0.025938625640799833, -0.52587962805014854}},
        {3, {0.020480543436110221, 0.56409550852442503, 0.015421033079796862, -0.81027756003046214}},
        {10, {0.18148412486073115, 1.9330643896994748, -0.22356918082475491, -2.9840827454355869}},
    };
    CHECK_EQ(s_run(k, s_cp_start, s_right, 500, right, 3, &ret), 10);
    CHECK_NEAR(ret, 10, 0);
    /* A balancing policy lasts: truncated after 500 steps. (No state is
     * compared that late: a bang-bang policy turns the last bit into
     * another action within some 400 steps, and Gymnasium's own last bits
     * are numpy's cos and sin, which differ from libm's by an ulp on a CPU
     * where numpy takes its SIMD loops.) */
    dp_env_t e;
    dp_env_reset(&e, k, 1, 0, 0);
    memcpy(e.state, s_cp_start, sizeof s_cp_start);
    char err[DP_ERR_LEN];
    int done = 0;
    double r;
    while (!done) CHECK_EQ(dp_env_step(&e, s_balance(e.state, e.steps), &r, &done, err), 0);
    CHECK(e.steps == 500 && e.truncated && !e.terminated && e.ret == 500);
    CHECK_EQ(dp_env_step(&e, 0, &r, &done, err), -1);
    CHECK_STR(err, "cartpole-v1: a step after the episode ended (truncated at step 500): reset first");
}

static const int s_fixed[10] = {0, 1, 2, 2, 1, 0, 0, 2, 1, 2};
static int s_fixed_actions(const double *s, int k) { (void)s; return s_fixed[k]; }
static int s_pump(const double *s, int k) { (void)k; return s[3] > 0 ? 2 : 0; }

static void test_acrobot(void)
{
    const dp_env_kind_t *k = &dp_env_acrobot_v1;
    CHECK(k->obs_dim == 6 && k->n_actions == 3 && k->max_steps == 500 && k->solved == -100);
    const s_point_t fixed[] = {
        {1, {0.060487724678205332, -0.054539985093977963, 0.081855704034659804, -0.24927319984543655}},
        {2, {0.06751882623619139, -0.090956312581846235, -0.013950234500941558, -0.10780460246068199}},
        {3, {0.041610107981787131, -0.062063759609192762, -0.23871944681992568, 0.38731872664323863}},
        {10, {0.062113761325019723, -0.1495665544284954, 0.032842748856505538, 0.036610690080318475}},
    };
    double ret;
    CHECK_EQ(s_run(k, s_ac_start, s_fixed_actions, 10, fixed, 4, &ret), 10);
    CHECK_NEAR(ret, -10, 0);
    /* pumping with the second link's velocity swings the tip over the bar
     * at step 73: 72 rewards of -1, the terminating one 0 */
    const s_point_t up[] = {
        {73, {-1.7630164990581965, -1.7401243126315977, -1.9005077418697756, 3.8740434033622311}},
    };
    CHECK_EQ(s_run(k, s_ac_start, s_pump, 500, up, 1, &ret), 73);
    CHECK_NEAR(ret, -72, 0);
    dp_env_t e;
    dp_env_reset(&e, k, 1, 0, 0);
    memcpy(e.state, up[0].s, sizeof up[0].s);
    float obs[DP_ENV_MAX_OBS];
    dp_env_observe(&e, obs);
    CHECK_NEAR(obs[0], (float)cos(up[0].s[0]), 0);
    CHECK_NEAR(obs[3], (float)sin(up[0].s[1]), 0);
    CHECK_NEAR(obs[5], (float)up[0].s[3], 0);
}

/* A bad action, and a step after the end: one line, nothing changed. */
static void test_refusals(void)
{
    char err[DP_ERR_LEN];
    dp_env_t e;
    double r = 7;
    int done = 5;
    dp_env_reset(&e, &dp_env_cartpole_v1, 3, 1, 2);
    dp_env_t before = e;
    CHECK_EQ(dp_env_step(&e, 2, &r, &done, err), -1);
    CHECK_STR(err, "cartpole-v1: action 2 is not one of 0 .. 1");
    CHECK_EQ(dp_env_step(&e, -1, &r, &done, err), -1);
    CHECK(memcmp(&e, &before, sizeof e) == 0 && r == 7 && done == 5);
    dp_env_reset(&e, &dp_env_acrobot_v1, 3, 1, 2);
    CHECK_EQ(dp_env_step(&e, 3, &r, &done, err), -1);
    CHECK_STR(err, "acrobot-v1: action 3 is not one of 0 .. 2");
    dp_env_reset(&e, &dp_env_cartpole_v1, 3, 1, 2);
    memcpy(e.state, s_cp_start, sizeof s_cp_start);
    while (dp_env_step(&e, 1, &r, &done, err) == 0 && !done) {}
    CHECK(done && e.terminated && e.steps == 10);
    before = e;
    CHECK_EQ(dp_env_step(&e, 0, &r, &done, err), -1);
    CHECK_STR(err, "cartpole-v1: a step after the episode ended (terminated at step 10): reset first");
    CHECK(memcmp(&e, &before, sizeof e) == 0);
    CHECK(dp_env_find("cartpole-v0", err) == NULL);
    CHECK_STR(err, "--env 'cartpole-v0': no such environment (there are: cartpole-v1, acrobot-v1)");
    CHECK(dp_env_find("acrobot-v1", err) == &dp_env_acrobot_v1);
}

/* An episode's start is a function of (seed, worker, episode), in the
 * documented ranges. */
static void test_seeding(void)
{
    dp_env_t a, b;
    const dp_env_kind_t *kinds[2] = {&dp_env_cartpole_v1, &dp_env_acrobot_v1};
    const double half[2] = {0.05, 0.1};
    for (int k = 0; k < 2; k++) {
        dp_env_reset(&a, kinds[k], 7, 2, 5);
        dp_env_reset(&b, kinds[k], 7, 2, 5);
        CHECK(memcmp(a.state, b.state, sizeof a.state) == 0);
        const uint64_t other[3][3] = {{8, 2, 5}, {7, 3, 5}, {7, 2, 6}};
        for (int o = 0; o < 3; o++) {
            dp_env_reset(&b, kinds[k], other[o][0], (int)other[o][1], other[o][2]);
            CHECK(memcmp(a.state, b.state, sizeof a.state) != 0);
        }
        for (uint64_t ep = 0; ep < 200; ep++) {
            dp_env_reset(&b, kinds[k], 1, 0, ep);
            for (int i = 0; i < 4; i++) CHECK(b.state[i] >= -half[k] && b.state[i] < half[k]);
            CHECK(b.steps == 0 && !b.terminated && !b.truncated && b.ret == 0);
        }
    }
}

/* The range of an episode's return (what the servers hold a push's
 * returns to, server/core/account.h): cartpole-v1 1 .. 500, acrobot-v1
 * -500 .. 0; and every reward of random episodes within the kind's
 * reward_lo .. reward_hi, every return within the range. */
static void test_return_range(void)
{
    double lo, hi;
    dp_env_return_range(&dp_env_cartpole_v1, &lo, &hi);
    CHECK(lo == 1 && hi == 500);
    dp_env_return_range(&dp_env_acrobot_v1, &lo, &hi);
    CHECK(lo == -500 && hi == 0);
    const dp_env_kind_t *kinds[] = {&dp_env_cartpole_v1, &dp_env_acrobot_v1};
    char err[DP_ERR_LEN];
    for (int i = 0; i < 2; i++) {
        const dp_env_kind_t *k = kinds[i];
        dp_env_return_range(k, &lo, &hi);
        dp_rng_t r;
        dp_rng_seed(&r, 11);
        int outside = 0, bad_return = 0;
        for (uint64_t ep = 0; ep < 20; ep++) {
            dp_env_t e;
            dp_env_reset(&e, k, 3, 0, ep);
            int done = 0;
            double rw;
            while (!done && dp_env_step(&e, (int)(dp_rng_next(&r) % (uint64_t)k->n_actions), &rw, &done,
                                        err) == 0)
                outside += rw < k->reward_lo || rw > k->reward_hi;
            bad_return += !done || e.ret < lo || e.ret > hi;
        }
        CHECK_EQ(outside, 0);
        CHECK_EQ(bad_return, 0);
    }
}

DP_TESTS(T(test_cartpole), T(test_acrobot), T(test_refusals), T(test_seeding), T(test_return_range))
