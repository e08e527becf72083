/* test_ac_loss: the actor-critic loss and global-norm clipping
 * (kernels/ac_loss.c).
 *  - the gradient against central differences of the forward: the logits
 *    through the whole loss (the advantage is constant there, as the
 *    estimator holds it), the values through the value term alone (the
 *    policy term's advantage is held constant: no gradient reaches the
 *    critic from it), on awkward shapes (1 action short of a power of two,
 *    a batch of 1, 3 actions, logits far apart so a probability underflows);
 *  - against PyTorch (tests/torch_ac.py: the same loss by autograd with the
 *    advantage detached, Categorical's entropy, clip_grad_norm_);
 *  - clipping: below the bound untouched, above it scaled to the bound;
 *  - n-step returns by hand: bootstrapped, cut by a termination, by a
 *    truncation (its future the critic's), a terminated last step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/episodes.h"
#include "common/rng.h"
#include "kernels/ops.h"
#include "tests/test.h"

typedef struct {
    int B, A;
    float beta, vcoef;
    float *z, *v, *ret, *probs, *dz, *dv;
    int *act;
} s_case_t;

static void s_make(s_case_t *c, int B, int A, float spread, uint64_t seed)
{
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    c->B = B, c->A = A, c->beta = 0.01f, c->vcoef = 0.5f;
    c->z = malloc(sizeof(float) * B * A), c->probs = malloc(sizeof(float) * B * A);
    c->dz = malloc(sizeof(float) * B * A);
    c->v = malloc(sizeof(float) * B), c->ret = malloc(sizeof(float) * B), c->dv = malloc(sizeof(float) * B);
    c->act = malloc(sizeof(int) * B);
    for (int i = 0; i < B * A; i++) c->z[i] = spread * (dp_rng_uniform(&r) - 0.5f);
    for (int n = 0; n < B; n++) {
        c->v[n] = 2 * dp_rng_uniform(&r) - 1;
        c->ret[n] = 3 * dp_rng_uniform(&r) - 1;
        c->act[n] = (int)dp_rng_below(&r, (uint32_t)A);
    }
}

static void s_free(s_case_t *c)
{
    free(c->z), free(c->probs), free(c->dz), free(c->v), free(c->ret), free(c->dv), free(c->act);
}

/* The loss in double from the forward's parts. */
static double s_total(s_case_t *c, dp_ac_parts_t *p)
{
    dp_ac_loss_forward(c->probs, c->z, c->v, c->act, c->ret, c->B, c->A, c->beta, c->vcoef, p);
    return p->policy + c->vcoef * p->value - c->beta * p->entropy;
}

static void s_fd(int B, int A, float spread, uint64_t seed)
{
    s_case_t c;
    s_make(&c, B, A, spread, seed);
    dp_ac_parts_t p;
    float loss = dp_ac_loss_forward(c.probs, c.z, c.v, c.act, c.ret, B, A, c.beta, c.vcoef, &p);
    CHECK_NEAR(loss, s_total(&c, &p), 1e-5);
    for (int n = 0; n < B; n++) {
        double s = 0;
        for (int k = 0; k < A; k++) s += c.probs[n * A + k];
        CHECK_NEAR(s, 1, 1e-5);
    }
    dp_ac_loss_backward(c.dz, c.dv, c.z, c.v, c.act, c.ret, B, A, c.beta, c.vcoef);
    for (int i = 0; i < B * A; i++) {
        float keep = c.z[i], h = 1e-3f;
        c.z[i] = keep + h;
        double up = s_total(&c, &p);
        float hu = c.z[i] - keep;
        c.z[i] = keep - h;
        double down = s_total(&c, &p);
        float hd = keep - c.z[i];
        c.z[i] = keep;
        CHECK_NEAR(c.dz[i], (up - down) / ((double)hu + hd), 2e-4);
    }
    for (int n = 0; n < B; n++) {
        float keep = c.v[n], h = 1e-3f;
        c.v[n] = keep + h;
        s_total(&c, &p);
        double up = c.vcoef * p.value;
        float hu = c.v[n] - keep;
        c.v[n] = keep - h;
        s_total(&c, &p);
        double down = c.vcoef * p.value;
        float hd = keep - c.v[n];
        c.v[n] = keep;
        CHECK_NEAR(c.dv[n], (up - down) / ((double)hu + hd), 2e-4);
    }
    s_free(&c);
}

static void test_finite_differences(void)
{
    s_fd(7, 3, 2, 1);
    s_fd(1, 2, 1, 2);
    s_fd(5, 15, 4, 3);
    s_fd(9, 6, 60, 4); /* logits 60 apart: probabilities underflow, log pi stays finite */
}

/* The entropy term alone pushes towards uniform: with beta > 0 and no
 * advantage (ret = value) the gradient lowers the largest logit. */
static void test_entropy_direction(void)
{
    float z[3] = {2, 0, -1}, v[1] = {0.5f}, ret[1] = {0.5f}, probs[3], dz[3], dv[1];
    int act[1] = {0};
    dp_ac_parts_t p;
    dp_ac_loss_forward(probs, z, v, act, ret, 1, 3, 0.1f, 0.5f, &p);
    CHECK_NEAR(p.policy, 0, 0);
    CHECK_NEAR(p.value, 0, 0);
    CHECK(p.entropy > 0 && p.entropy < log(3.0));
    dp_ac_loss_backward(dz, dv, z, v, act, ret, 1, 3, 0.1f, 0.5f);
    CHECK(dz[0] > 0 && dz[2] < 0); /* gradient descent lowers z[0], raises z[2] */
    CHECK_NEAR(dz[0] + dz[1] + dz[2], 0, 1e-7);
    CHECK_NEAR(dv[0], 0, 0);
}

static void test_clip(void)
{
    float g[4] = {3, 4, 0, 0};
    CHECK_NEAR(dp_clip_global_norm(g, 4, 10), 5, 1e-12);
    CHECK(g[0] == 3 && g[1] == 4);
    CHECK_NEAR(dp_clip_global_norm(g, 4, 0), 5, 1e-12); /* 0: no clipping */
    CHECK(g[0] == 3);
    CHECK_NEAR(dp_clip_global_norm(g, 4, 1), 5, 1e-12);
    CHECK_NEAR(sqrt(g[0] * g[0] + g[1] * g[1]), 1, 1e-6);
    CHECK_NEAR(g[0] / g[1], 0.75, 1e-6);
}

/* n-step returns by hand: gamma 0.5, four rewards of 1, bootstrap 8. */
static void test_returns(void)
{
    const float r[4] = {1, 1, 1, 1}, cut[4] = {0, 6, 0, 0};
    float ret[4];
    unsigned char end[4] = {0, 0, 0, 0};
    dp_ac_returns(ret, r, end, cut, 4, 0.5f, 8);
    const float on[4] = {2.375f, 2.75f, 3.5f, 5};
    for (int t = 0; t < 4; t++) CHECK_NEAR(ret[t], on[t], 0);
    end[1] = DP_AC_TERMINATED; /* nothing after step 1 counts for steps 0 and 1 */
    dp_ac_returns(ret, r, end, cut, 4, 0.5f, 8);
    const float term[4] = {1.5f, 1, 3.5f, 5};
    for (int t = 0; t < 4; t++) CHECK_NEAR(ret[t], term[t], 0);
    end[1] = DP_AC_TRUNCATED; /* cut at step 1: its future is the critic's 6 */
    dp_ac_returns(ret, r, end, cut, 4, 0.5f, 8);
    const float trunc[4] = {3, 4, 3.5f, 5};
    for (int t = 0; t < 4; t++) CHECK_NEAR(ret[t], trunc[t], 0);
    end[1] = DP_AC_GOES_ON, end[3] = DP_AC_TERMINATED; /* the bootstrap of a terminated last step is 0 */
    dp_ac_returns(ret, r, end, cut, 4, 0.5f, 8);
    const float last[4] = {1.875f, 1.75f, 1.5f, 1};
    for (int t = 0; t < 4; t++) CHECK_NEAR(ret[t], last[t], 0);
    dp_ac_returns(ret, r, end, cut, 1, 0.99f, 100); /* T = 1, not ended: r + gamma V */
    CHECK_NEAR(ret[0], 1 + 0.99 * 100, 1e-5);
}

static const char *s_py(void)
{
    const char *p = getenv("TORCH_PY");
    return p && p[0] ? p : "/usr/bin/python3";
}

/* The same numbers through PyTorch's autograd (tests/torch_ac.py). */
static void test_matches_pytorch(void)
{
    char cmd[1024], path[256];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' 2>/dev/null", s_py());
    if (system(cmd) != 0) SKIP("no python3-torch ($TORCH_PY)");
    s_case_t c;
    s_make(&c, 6, 5, 3, 9);
    c.beta = 0.05f;
    float loss = dp_ac_loss_forward(c.probs, c.z, c.v, c.act, c.ret, c.B, c.A, c.beta, c.vcoef, NULL);
    dp_ac_loss_backward(c.dz, c.dv, c.z, c.v, c.act, c.ret, c.B, c.A, c.beta, c.vcoef);
    float g[5 * 6 + 6];
    memcpy(g, c.dz, sizeof(float) * 30);
    memcpy(g + 30, c.dv, sizeof(float) * 6);
    double norm = dp_clip_global_norm(g, 36, 0.05);
    snprintf(path, sizeof path, "/tmp/dp-test-ac-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "%d %d %.9g %.9g 0.05\n", c.B, c.A, c.beta, c.vcoef);
    for (int i = 0; i < 30; i++) fprintf(f, "%.9g ", c.z[i]);
    fprintf(f, "\n");
    for (int n = 0; n < 6; n++) fprintf(f, "%.9g %.9g %d\n", c.v[n], c.ret[n], c.act[n]);
    fprintf(f, "%.9g %.17g\n", loss, norm);
    for (int i = 0; i < 36; i++) fprintf(f, "%.9g ", g[i]);
    fprintf(f, "\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' tests/torch_ac.py %s", s_py(), path);
    CHECK_EQ(system(cmd), 0);
    unlink(path);
    s_free(&c);
}

/* The run's account of its episodes (common/episodes.h): the mean of the
 * last 100 (of fewer before 100), and solved only with a full window whose
 * mean reaches the threshold, at the env step of the episode that made it. */
static void test_episodes(void)
{
    dp_episodes_t e;
    dp_episodes_init(&e, 475);
    CHECK_EQ(dp_episodes_mean(&e), 0);
    for (int i = 0; i < 99; i++) dp_episodes_add(&e, 500, (uint64_t)(i + 1) * 500);
    CHECK_NEAR(dp_episodes_mean(&e), 500, 0);
    CHECK_EQ(e.solved_at, -1); /* 99 episodes: no full window yet */
    dp_episodes_add(&e, 500, 50000);
    CHECK_EQ(e.solved_at, 50000);
    dp_episodes_add(&e, 0, 50010); /* the first ring slot replaced: mean 495 */
    CHECK_NEAR(dp_episodes_mean(&e), 495, 1e-9);
    CHECK_EQ(e.solved_at, 50000); /* the first time stays */
    dp_episodes_init(&e, -100); /* acrobot: returns are negative */
    for (int i = 0; i < 100; i++) dp_episodes_add(&e, i < 50 ? -500 : -60, (uint64_t)i + 1);
    CHECK_EQ(e.solved_at, -1); /* mean -280 */
    for (int i = 0; i < 50; i++) dp_episodes_add(&e, -60, (uint64_t)i + 101);
    /* the 141st: 9 of -500 and 91 of -60 left, mean -99.6 (the 140th: -104) */
    CHECK_EQ(e.solved_at, 141);
    dp_episodes_init(&e, NAN); /* the threshold not known yet: counts, never solves */
    for (int i = 0; i < 200; i++) dp_episodes_add(&e, 1e9, 1);
    CHECK_EQ(e.episodes, 200);
    CHECK_EQ(e.solved_at, -1);
}

/* The return curve: a point per stretch of `stride` env steps (the first
 * episode to end in it), at most DP_EPISODES_CURVE; when full, every other
 * point goes and the stride doubles, so any run keeps 32..64 points. */
static void test_episodes_curve(void)
{
    dp_episodes_t e;
    dp_episodes_init(&e, 475);
    dp_episodes_add(&e, 10, 100);
    dp_episodes_add(&e, 20, 200); /* the same stretch [0, 1024): no point */
    dp_episodes_add(&e, 30, 1100);
    CHECK_EQ(e.n_curve, 2);
    CHECK_EQ(e.curve_at[0], 100);
    CHECK_NEAR(e.curve_mean[0], 10, 0);
    CHECK_EQ(e.curve_at[1], 1100);
    CHECK_NEAR(e.curve_mean[1], 20, 1e-12); /* the window's mean then: (10 + 20 + 30) / 3 */
    dp_episodes_init(&e, 475);
    uint64_t at = 0;
    for (int i = 0; i < 100000; i++) {
        at += 37;
        dp_episodes_add(&e, (double)i, at);
        CHECK(e.n_curve >= 1 && e.n_curve <= DP_EPISODES_CURVE);
    }
    CHECK(e.n_curve >= DP_EPISODES_CURVE / 2);
    CHECK(e.stride > DP_EPISODES_STRIDE0);
    int ordered = 1;
    for (int k = 1; k < e.n_curve; k++) ordered &= e.curve_at[k] > e.curve_at[k - 1];
    CHECK(ordered);
    CHECK_EQ(e.curve_at[0], 37); /* the first point stays */
    CHECK(e.curve_at[e.n_curve - 1] > at - 2 * e.stride); /* ... and the points reach the end */
}

DP_TESTS(T(test_episodes), T(test_episodes_curve), T(test_finite_differences), T(test_entropy_direction), T(test_clip), T(test_returns),
         T(test_matches_pytorch))
