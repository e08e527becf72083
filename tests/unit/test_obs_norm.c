/* test_obs_norm: the obsnorm layer (kernels/ops.h, common/model.h) —
 * its statistics merged batch by batch against the plain two-pass mean and
 * variance of every observation; its output against the formula, clipped;
 * the count's ceiling; the grammar's place for it; and a net's training
 * forward carrying the new statistics where a push carries them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/test.h"
#include "worker/exec/net.h"

enum { F = 5 };

/* Batches of awkward sizes (1, 7, 64, 3) of observations with a component
 * of each scale: the merged statistics are those of all of them at once. */
static void test_update_matches_two_pass(void)
{
    static const int sizes[] = {1, 7, 64, 3, 1, 30};
    static const float scale[F] = {1e-3f, 1, 40, 0.5f, 9};
    float mean[F] = {0}, var[F] = {1, 1, 1, 1, 1}, count = 0;
    float *all = malloc(200 * F * sizeof(float));
    int n = 0;
    dp_rng_t r;
    dp_rng_seed(&r, 3);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        float *b = all + (size_t)n * F;
        for (int k = 0; k < sizes[s] * F; k++)
            b[k] = scale[k % F] * ((float)(dp_rng_next(&r) >> 40) / (float)(1 << 24) - 0.3f) + (float)(k % F);
        dp_obs_norm_update(mean, var, &count, b, sizes[s], F);
        n += sizes[s];
    }
    CHECK(count == (float)n);
    for (int i = 0; i < F; i++) {
        double m = 0, v = 0;
        for (int k = 0; k < n; k++) m += all[(size_t)k * F + i];
        m /= n;
        for (int k = 0; k < n; k++) v += (all[(size_t)k * F + i] - m) * (all[(size_t)k * F + i] - m);
        v /= n;
        CHECK_NEAR(mean[i], m, 1e-5 * (1 + fabs(m)));
        CHECK_NEAR(var[i], v, 1e-4 * v + 1e-9);
    }
    free(all);
}

static void test_forward_and_clip(void)
{
    const float mean[F] = {1, -2, 0, 5, 0}, var[F] = {4, 1, 1e-12f, 0.25f, 1};
    const float in[2 * F] = {3, -2, 1, 5.5f, 11, -1, 0, -1, 4, -30};
    float out[2 * F];
    dp_obs_norm_forward(out, in, mean, var, 2, F);
    for (int k = 0; k < 2 * F; k++) {
        int i = k % F;
        double want = (in[k] - mean[i]) / sqrt((double)var[i] + DP_OBS_NORM_EPS);
        want = want > 10 ? 10 : want < -10 ? -10 : want;
        CHECK_NEAR(out[k], want, 1e-5 * (1 + fabs(want)));
    }
    CHECK(out[2] == 10.0f && out[7] == -10.0f && out[9] == -10.0f); /* clipped */
}

/* The count stops at 2^20: a batch then weighs B / (2^20 + B). */
static void test_count_ceiling(void)
{
    float mean[1] = {0}, var[1] = {1}, count = (float)DP_OBS_NORM_MAX_COUNT;
    float x[4] = {8, 8, 8, 8};
    dp_obs_norm_update(mean, var, &count, x, 4, 1);
    CHECK(count == (float)DP_OBS_NORM_MAX_COUNT);
    CHECK_NEAR(mean[0], 8.0 * 4 / (DP_OBS_NORM_MAX_COUNT + 4), 1e-9);
}

static void test_grammar(void)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, "obsnorm fc:8 tanh ac:2", 4, 1, 1, err), 0);
    CHECK_EQ(m.layers[0].kind, DP_LAYER_OBSNORM);
    CHECK(dp_model_find_param(&m, "obsnorm.running_mean") && dp_model_find_param(&m, "obsnorm.count"));
    CHECK(!dp_model_find_param(&m, "obsnorm.count")->trainable);
    CHECK(dp_model_find_param(&m, "obsnorm.count")->counter);
    CHECK_EQ(dp_model_find_param(&m, "obsnorm.running_var")->count, 4);
    CHECK(dp_model_has_state(&m));
    CHECK_EQ(dp_model_parse(&m, "fc:8 obsnorm tanh ac:2", 4, 1, 1, err), -1);
    CHECK(strstr(err, "'obsnorm' must be the first token") != NULL);
    CHECK_EQ(dp_model_parse(&m, "embed:4 obsnorm fc:2 softmax", 1, 1, 1, err), -1);
}

/* A training forward normalises by the statistics it was given, then
 * merges the batch's into them, and d_grads carries the new values (what a
 * push carries, and what the servers set); an acting forward changes none. */
static void test_net_carries_statistics(void)
{
    char err[DP_ERR_LEN];
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, "obsnorm fc:6 tanh ac:2", 3, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, 8, err), 0);
    float *p = malloc(m.n_floats * sizeof(float)), *g = malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, p, 4);
    const dp_param_t *mu = dp_model_find_param(&m, "obsnorm.running_mean");
    const dp_param_t *va = dp_model_find_param(&m, "obsnorm.running_var");
    const dp_param_t *ct = dp_model_find_param(&m, "obsnorm.count");
    p[mu->offset] = 2, p[va->offset] = 9, p[ct->offset] = 10;
    dp_net_set_params(&net, p);
    float x[4 * 3] = {5, 0, 1, -1, 2, 3, 2, 2, 2, 8, -4, 0};
    float probs[8], value[4];
    dp_net_act(&net, x, 4, probs, value);
    dp_net_get_params(&net, g);
    CHECK(g[ct->offset] == 10 && g[mu->offset] == 2); /* acting keeps them */
    int act[4] = {0, 1, 1, 0};
    float ret[4] = {1, 0.5f, -1, 2};
    dp_net_train_step_ac(&net, x, act, ret, 4);
    dp_net_get_grads(&net, g);
    float mean[3] = {2, p[mu->offset + 1], p[mu->offset + 2]};
    float var[3] = {9, p[va->offset + 1], p[va->offset + 2]}, count = 10;
    dp_obs_norm_update(mean, var, &count, x, 4, 3);
    CHECK(g[ct->offset] == 14);
    for (int i = 0; i < 3; i++) CHECK(g[mu->offset + i] == mean[i] && g[va->offset + i] == var[i]);
    free(p), free(g);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

/* Statistics that came with a push (a peer's): a negative variance or
 * count is taken as 0, so the output stays finite and the next merge
 * starts clean, never a NaN in every worker's policy. */
static void test_lying_statistics(void)
{
    float mean[2] = {1, 0}, var[2] = {-4, -1e30f}, count = -7;
    const float in[4] = {3, 2, -1, 0};
    float out[4];
    dp_obs_norm_forward(out, in, mean, var, 2, 2);
    for (int k = 0; k < 4; k++) CHECK(isfinite(out[k]) && fabsf(out[k]) <= DP_OBS_NORM_CLIP);
    dp_obs_norm_update(mean, var, &count, in, 2, 2);
    CHECK(count == 2);
    CHECK(var[0] == 4 && var[1] == 1 && mean[0] == 1 && mean[1] == 1); /* the batch's own */
}

DP_TESTS(T(test_update_matches_two_pass), T(test_forward_and_clip), T(test_count_ceiling), T(test_grammar),
         T(test_net_carries_statistics), T(test_lying_statistics))
