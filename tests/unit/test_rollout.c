/* test_rollout: an actor-critic worker's segment (worker/exec/a3c.h) under
 * --reward-scale: the same actions and episodes as at scale 1, each reward
 * (so each return learned from) times the scale, each episode's return as
 * the environment gave it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/test.h"
#include "worker/exec/a3c.h"

/* Two segments of the same worker (seed, weights), scales 1 and s. */
static void s_pair(const dp_env_kind_t *kind, float s, int envs, int t_max)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    CHECK_EQ(dp_a3c_model(&m, NULL, kind, 0, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, envs * t_max, err), 0);
    float *params = malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 3);
    dp_net_set_params(&net, params);
    dp_a3c_conf_t c;
    dp_a3c_conf_default(&c);
    c.envs = envs, c.t_max = t_max;
    dp_a3c_t a[2];
    for (int i = 0; i < 2; i++) {
        c.reward_scale = i ? s : 1;
        CHECK_EQ(dp_a3c_init(&a[i], kind, &c, 7, 1, err), 0);
    }
    int rows = envs * t_max, ended = 0, same_act = 1, scaled = 1, same_ret = 1, bounded = 1;
    for (int seg = 0; seg < 60; seg++) {
        for (int i = 0; i < 2; i++) CHECK_EQ(dp_a3c_segment(&a[i], &net, err), 0);
        for (int r = 0; r < rows; r++) {
            same_act &= a[0].act[r] == a[1].act[r];
            scaled &= a[1].reward[r] == (float)(a[0].reward[r] * s);
        }
        same_ret &= a[0].n_ended == a[1].n_ended;
        for (int e = 0; e < a[0].n_ended && e < a[1].n_ended; e++) {
            same_ret &= a[0].ended[e] == a[1].ended[e];
            bounded &= a[1].ended[e] >= -kind->max_steps && a[1].ended[e] <= kind->max_steps;
        }
        ended += a[0].n_ended;
    }
    CHECK(same_act);
    CHECK(scaled);
    CHECK(same_ret);
    CHECK(bounded);
    CHECK(ended > 0); /* the segments reached episodes' ends: the returns were compared */
    for (int i = 0; i < 2; i++) dp_a3c_fini(&a[i]);
    free(params);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

static void test_reward_scale(void)
{
    s_pair(&dp_env_cartpole_v1, 0.25f, 2, 5);
    s_pair(&dp_env_acrobot_v1, 0.125f, 3, 20);
}

/* The default is the documented one, and a segment at the default scales. */
static void test_default(void)
{
    dp_a3c_conf_t c;
    dp_a3c_conf_default(&c);
    CHECK(c.reward_scale == DP_A3C_REWARD_SCALE);
    CHECK(DP_A3C_REWARD_SCALE == 0.1f);
}

DP_TESTS(T(test_reward_scale), T(test_default))
