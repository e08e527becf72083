/* test_optim: optimizer update rules against PyTorch's values and a double
 * reference, schedules, parsing, and that stepping a vector in pieces is
 * bit-identical to stepping it whole (what sharding relies on). */
#include "common/rng.h"
#include "common/util.h"
#include "kernels/optim.h"
#include "tests/test.h"


static dp_optim_conf_t s_conf(dp_optim_kind_t k)
{
    dp_optim_conf_t c;
    dp_optim_conf_default(&c);
    c.kind = k;
    c.lr = k == DP_OPT_ADAM ? 0.01f : 0.1f;
    c.weight_decay = 0.01f;
    return c;
}

/* w0 and three gradients; expected values from torch 1.13 (torch.optim.SGD
 * with momentum / nesterov, Adam, Adagrad, RMSprop (alpha 0.99); weight_decay
 * 0.01, eps 1e-8). */
static const float s_w0[4] = {0.5f, -1.25f, 2.0f, 0.0f};
static const float s_g[3][4] = {
    {0.1f, -0.2f, 0.3f, -0.4f}, {0.05f, 0.5f, -0.25f, 1.0f}, {-0.3f, 0.0f, 0.2f, 0.1f}};
static const float s_torch[DP_OPT_KINDS][4] = { /* in dp_optim_kind_t order */
    {0.513526499f, -1.27624369f, 1.96904099f, -0.0699799508f},
    {0.490640402f, -1.28381956f, 1.9350785f, -0.0916519463f},
    {0.505163431f, -1.30670142f, 1.91072822f, -0.152490631f},
    {0.483841896f, -1.2472012f, 1.98505414f, 0.00158243906f},
    {0.447167993f, -1.23936939f, 1.90991104f, -0.00210409705f},
    {0.0433825254f, -1.14857888f, 1.12371397f, -0.0231942832f},
};
/* torch.optim.RMSprop with A3C's eps 0.1, all else as above (torch 1.13). */
static const float s_torch_rms_a3c[4] = {0.581408381f, -1.38478518f, 1.77301288f, -0.243849844f};

static void test_matches_torch(void)
{
    for (int k = 0; k < DP_OPT_KINDS; k++) {
        dp_optim_conf_t c = s_conf((dp_optim_kind_t)k);
        float w[4], state[8] = {0};
        memcpy(w, s_w0, sizeof w);
        for (int t = 0; t < 3; t++) dp_optim_step(&c, c.lr, w, s_g[t], state, 4, t + 1);
        /* RMSprop's first step is lr * g / sqrt((1 - alpha) g^2) = 10 lr sign(g):
         * its weights are differences of terms near 1, and 1 - alpha rounds
         * to 0.00999999 here (1 - 0.99f) but to 0.01f in torch (a Python
         * double): 2e-7 apart after three steps, as Adam's (1 - b2) is. */
        double atol = k == DP_OPT_RMSPROP ? 5e-7 : 1e-7;
        CHECK_CLOSE(dp_optim_kind_name((dp_optim_kind_t)k), w, s_torch[k], 4, atol, 1e-6);
    }
    dp_optim_conf_t c = s_conf(DP_OPT_RMSPROP);
    c.eps = 0.1f;
    float w[4], state[4] = {0};
    memcpy(w, s_w0, sizeof w);
    for (int t = 0; t < 3; t++) dp_optim_step(&c, c.lr, w, s_g[t], state, 4, t + 1);
    CHECK_CLOSE("rmsprop, eps 0.1", w, s_torch_rms_a3c, 4, 1e-7, 1e-6);
}

/* The header's formulas, in double. */
static void s_ref_step(const dp_optim_conf_t *c, double lr, double *w, const double *g,
                       double *s1, double *s2, size_t n, long t)
{
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] + (double)c->weight_decay * w[i];
        double mu = c->momentum, b1 = c->beta1, b2 = c->beta2, eps = c->eps;
        switch (c->kind) {
        case DP_OPT_SGD: w[i] -= lr * gi; break;
        case DP_OPT_MOMENTUM:
            s1[i] = mu * s1[i] + gi;
            w[i] -= lr * s1[i];
            break;
        case DP_OPT_NESTEROV:
            s1[i] = mu * s1[i] + gi;
            w[i] -= lr * (gi + mu * s1[i]);
            break;
        case DP_OPT_ADAM:
            s1[i] = b1 * s1[i] + (1 - b1) * gi;
            s2[i] = b2 * s2[i] + (1 - b2) * gi * gi;
            w[i] -= lr * (s1[i] / (1 - pow(b1, t))) / (sqrt(s2[i] / (1 - pow(b2, t))) + eps);
            break;
        case DP_OPT_ADAGRAD:
            s1[i] += gi * gi;
            w[i] -= lr * gi / (sqrt(s1[i]) + eps);
            break;
        case DP_OPT_RMSPROP:
            s1[i] = (double)c->alpha * s1[i] + (1 - (double)c->alpha) * gi * gi;
            w[i] -= lr * gi / (sqrt(s1[i]) + eps);
            break;
        }
    }
}

static void test_matches_double_reference(void)
{
    enum { N = 257, STEPS = 6 };
    dp_rng_t rng;
    for (int k = 0; k < DP_OPT_KINDS; k++) {
        dp_optim_conf_t c = s_conf((dp_optim_kind_t)k);
        c.weight_decay = 1e-3f;
        float w[N], g[N], state[2 * N] = {0}, wf[N];
        double wd[N], gd[N], s1[N] = {0}, s2[N] = {0};
        dp_rng_seed(&rng, 11 + (uint64_t)k);
        for (int i = 0; i < N; i++) wd[i] = w[i] = dp_rng_uniform(&rng) * 2 - 1;
        for (int t = 1; t <= STEPS; t++) {
            for (int i = 0; i < N; i++) gd[i] = g[i] = (dp_rng_uniform(&rng) * 2 - 1) * 0.5f;
            float lr = c.lr * (1.0f - 0.1f * (float)t);
            dp_optim_step(&c, lr, w, g, state, N, t);
            s_ref_step(&c, lr, wd, gd, s1, s2, N, t);
        }
        for (int i = 0; i < N; i++) wf[i] = (float)wd[i];
        CHECK_CLOSE(dp_optim_kind_name((dp_optim_kind_t)k), w, wf, N, 1e-6, 1e-5);
    }
}

static void test_hand_values(void)
{
    /* sgd: 1 - 0.1 * (0.5 + 0.1 * 1) = 0.94 */
    dp_optim_conf_t c = s_conf(DP_OPT_SGD);
    c.weight_decay = 0.1f;
    float w = 1.0f, g = 0.5f;
    dp_optim_step(&c, 0.1f, &w, &g, NULL, 1, 1);
    CHECK_NEAR(w, 0.94, 1e-7);
    /* momentum 0.9, lr 1: v = 1 then 1.9; w = 0 - 1 - 1.9 */
    c = s_conf(DP_OPT_MOMENTUM);
    c.weight_decay = 0;
    float v = 0;
    w = 0;
    g = 1;
    dp_optim_step(&c, 1.0f, &w, &g, &v, 1, 1);
    CHECK_NEAR(v, 1.0, 0);
    dp_optim_step(&c, 1.0f, &w, &g, &v, 1, 2);
    CHECK_NEAR(v, 1.9, 1e-7);
    CHECK_NEAR(w, -2.9, 1e-6);
    /* nesterov: step 1 w -= 1 + 0.9 * 1 */
    c.kind = DP_OPT_NESTEROV;
    v = 0;
    w = 0;
    dp_optim_step(&c, 1.0f, &w, &g, &v, 1, 1);
    CHECK_NEAR(w, -1.9, 1e-7);
    /* adam's first step moves by lr * g / (|g| + eps) ~ lr * sign(g) */
    c = s_conf(DP_OPT_ADAM);
    c.weight_decay = 0;
    float st[2] = {0, 0};
    w = 3;
    g = -0.02f;
    dp_optim_step(&c, 0.01f, &w, &g, st, 1, 1);
    CHECK_NEAR(w, 3.01, 1e-6);
    CHECK_NEAR(st[0], -0.002, 1e-9);
    CHECK_NEAR(st[1], 0.001 * 0.0004, 1e-10); /* (1 - 0.999f) is 0.00099998713 */
    /* adagrad: s = 4, w -= 0.5 * 2 / 2 */
    c = s_conf(DP_OPT_ADAGRAD);
    c.weight_decay = 0;
    float s = 0;
    w = 0;
    g = 2;
    dp_optim_step(&c, 0.5f, &w, &g, &s, 1, 1);
    CHECK_NEAR(s, 4, 0);
    CHECK_NEAR(w, -0.5, 1e-7);
    /* rmsprop, alpha 0.75, eps 0.1 (A3C's), wd 0.5, lr 0.5, w = 1, g = 1.5:
     * g' = 1.5 + 0.5 = 2; s = 0.25 * 4 = 1; w = 1 - 0.5 * 2 / 1.1.
     * Step 2, g = -2.5: g' = -2.5 + 0.5 * w; s = 0.75 + 0.25 g'^2. */
    c = s_conf(DP_OPT_RMSPROP);
    c.alpha = 0.75f;
    c.eps = 0.1f;
    c.weight_decay = 0.5f;
    s = 0;
    w = 1;
    g = 1.5f;
    dp_optim_step(&c, 0.5f, &w, &g, &s, 1, 1);
    CHECK_NEAR(s, 1, 1e-7);
    double w1 = 1 - 0.5 * 2 / 1.1;
    CHECK_NEAR(w, w1, 1e-6);
    g = -2.5f;
    dp_optim_step(&c, 0.5f, &w, &g, &s, 1, 2);
    double g2 = -2.5 + 0.5 * w1, s2 = 0.75 * 1 + 0.25 * g2 * g2;
    CHECK_NEAR(s, s2, 1e-6);
    CHECK_NEAR(w, w1 - 0.5 * g2 / (sqrt(s2) + 0.1), 1e-6);
    /* the defaults: PyTorch's alpha 0.99 and lr 0.01 */
    dp_optim_conf_default(&c);
    CHECK_NEAR(c.alpha, 0.99, 1e-7);
    c.kind = DP_OPT_RMSPROP;
    CHECK_NEAR(dp_optim_base_lr(&c), 0.01, 1e-9);
}

/* Stepping [0, a) and [a, n) with their own state equals stepping [0, n). */
static void test_pieces_equal_whole(void)
{
    enum { N = 1001, A = 389, STEPS = 5 };
    dp_rng_t rng;
    for (int k = 0; k < DP_OPT_KINDS; k++) {
        dp_optim_conf_t c = s_conf((dp_optim_kind_t)k);
        int sp = dp_optim_state_per_param(c.kind);
        float *w = dp_malloc(N * sizeof(float)), *w2 = dp_malloc(N * sizeof(float));
        float *g = dp_malloc(N * sizeof(float));
        float *st = dp_calloc(2 * N, sizeof(float));
        float *st_a = dp_calloc(2 * A, sizeof(float)), *st_b = dp_calloc(2 * (N - A), sizeof(float));
        dp_rng_seed(&rng, 99);
        for (int i = 0; i < N; i++) w[i] = w2[i] = dp_rng_uniform(&rng) - 0.5f;
        for (int t = 1; t <= STEPS; t++) {
            for (int i = 0; i < N; i++) g[i] = dp_rng_uniform(&rng) - 0.5f;
            dp_optim_step(&c, c.lr, w, g, st, N, t);
            dp_optim_step(&c, c.lr, w2, g, st_a, A, t);
            dp_optim_step(&c, c.lr, w2 + A, g + A, st_b, N - A, t);
        }
        CHECK(memcmp(w, w2, N * sizeof(float)) == 0);
        /* State [n] then [n]: the pieces' halves are the whole's slices. */
        for (int j = 0; j < sp; j++) {
            CHECK(memcmp(st + (size_t)j * N, st_a + (size_t)j * A, A * sizeof(float)) == 0);
            CHECK(memcmp(st + (size_t)j * N + A, st_b + (size_t)j * (N - A),
                         (N - A) * sizeof(float)) == 0);
        }
        free(w);
        free(w2);
        free(g);
        free(st);
        free(st_a);
        free(st_b);
    }
}

/* Delay compensation (DC-ASGD) on a few floats, by hand: const lambda
 * 0.5 gives g + 0.5 g*g*(w - w_bak); adaptive lambda0 1 first updates MS
 * = 0.95 MS + 0.05 g*g, then lambda = 1 / sqrt(MS + 1e-7); without w_bak
 * only MS moves; off does nothing. */
static void test_delay_compensation(void)
{
    dp_optim_conf_t c;
    dp_optim_conf_default(&c);
    c.dc = DP_DC_CONST;
    c.dc_lambda = 0.5f;
    const float g[4] = {2, -1, 0.5f, 0}, w[4] = {1, 0, 3, 7}, wb[4] = {0.5f, 1, 3, -7};
    float out[4], ms[4] = {0, 0, 0, 0};
    dp_optim_dc_range(&c, out, g, w, wb, ms, 0, 4);
    CHECK(out[0] == 3.0f);   /* 2 + 0.5 * 4 * 0.5 */
    CHECK(out[1] == -1.5f);  /* -1 + 0.5 * 1 * -1 */
    CHECK(out[2] == 0.5f);   /* w = w_bak: nothing to compensate */
    CHECK(out[3] == 0.0f);   /* g = 0 */
    CHECK(ms[0] == 0 && ms[1] == 0); /* const keeps no MS */
    c.dc = DP_DC_ADAPTIVE;
    c.dc_lambda = 1.0f;
    const float ga[2] = {2, 2}, wa[2] = {1.25f, 1.25f}, wba[2] = {1, 1};
    float msa[2] = {0, 0}, outa[2];
    dp_optim_dc_range(&c, outa, ga, wa, wba, msa, 0, 1);
    CHECK_NEAR(msa[0], 0.2, 1e-7);                 /* 0.05 * 4 */
    CHECK_NEAR(outa[0], 4.2360674185, 1e-6);       /* 2 + 4 * 0.25 / sqrt(0.2 + 1e-7) */
    dp_optim_dc_range(&c, outa, ga, wa, wba, msa, 0, 1);
    CHECK_NEAR(msa[0], 0.39, 1e-6);                /* 0.95 * 0.2 + 0.2, in float */
    CHECK_NEAR(outa[0], 3.6012813328, 1e-6);       /* 2 + 1 / sqrt(0.39 + 1e-7) */
    outa[1] = -99;
    dp_optim_dc_range(&c, outa, ga, wa, NULL, msa, 1, 2); /* no w_bak: MS only */
    CHECK_NEAR(msa[1], 0.2, 1e-7);
    CHECK(outa[1] == -99);
    c.dc = DP_DC_OFF;
    dp_optim_dc_range(&c, outa, ga, wa, wba, msa, 0, 2);
    CHECK(outa[1] == -99 && fabsf(msa[1] - 0.2f) < 1e-7f); /* off: nothing moved */
    /* in place (out = g) and in pieces: the same bits as at once */
    enum { N = 301, A = 117 };
    float *gw = dp_malloc(N * sizeof(float)), *g1 = dp_malloc(N * sizeof(float));
    float *g2 = dp_malloc(N * sizeof(float)), *ww = dp_malloc(N * sizeof(float));
    float *wbk = dp_malloc(N * sizeof(float));
    float *m1 = dp_calloc(N, sizeof(float)), *m2 = dp_calloc(N, sizeof(float));
    dp_rng_t rng;
    dp_rng_seed(&rng, 5);
    for (int i = 0; i < N; i++) {
        gw[i] = dp_rng_uniform(&rng) - 0.5f;
        ww[i] = dp_rng_uniform(&rng) - 0.5f;
        wbk[i] = dp_rng_uniform(&rng) - 0.5f;
    }
    c.dc = DP_DC_ADAPTIVE;
    c.dc_lambda = 2.0f;
    memcpy(g2, gw, N * sizeof(float));
    dp_optim_dc_range(&c, g1, gw, ww, wbk, m1, 0, N);
    dp_optim_dc_range(&c, g2, g2, ww, wbk, m2, 0, A);
    dp_optim_dc_range(&c, g2, g2, ww, wbk, m2, A, N);
    CHECK(memcmp(g1, g2, N * sizeof(float)) == 0);
    CHECK(memcmp(m1, m2, N * sizeof(float)) == 0);
    free(gw);
    free(g1);
    free(g2);
    free(ww);
    free(wbk);
    free(m1);
    free(m2);
}

static void test_state_sizes(void)
{
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_SGD), 0);
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_MOMENTUM), 1);
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_NESTEROV), 1);
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_ADAM), 2);
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_ADAGRAD), 1);
    CHECK_EQ(dp_optim_state_per_param(DP_OPT_RMSPROP), 1);
}

static void test_defaults_and_parsing(void)
{
    dp_optim_conf_t c;
    char err[DP_ERR_LEN] = "";
    dp_optim_conf_default(&c);
    /* adam with its own default lr, unless --lr is given */
    CHECK_EQ(c.kind, DP_OPT_ADAM);
    CHECK_NEAR(c.lr, 0, 0);
    CHECK_NEAR(dp_optim_base_lr(&c), 0.0015, 1e-9);
    CHECK_NEAR(dp_optim_lr_at(&c, 100), 0.0015, 1e-9);
    c.kind = DP_OPT_MOMENTUM;
    CHECK_NEAR(dp_optim_base_lr(&c), 0.05, 1e-9);
    c.kind = DP_OPT_ADAGRAD;
    CHECK_NEAR(dp_optim_base_lr(&c), 0.01, 1e-9);
    c.lr = 0.2f;
    CHECK_NEAR(dp_optim_base_lr(&c), 0.2, 1e-7);
    dp_optim_conf_default(&c);
    CHECK_NEAR(c.momentum, 0.9, 1e-7);
    CHECK_NEAR(c.beta1, 0.9, 1e-7);
    CHECK_NEAR(c.beta2, 0.999, 1e-7);
    CHECK_NEAR(c.eps, 1e-8, 1e-15);
    CHECK_EQ(c.schedule, DP_LR_CONSTANT);
    for (int k = 0; k < DP_OPT_KINDS; k++) {
        CHECK_EQ(dp_optim_parse_kind(&c, dp_optim_kind_name((dp_optim_kind_t)k), err), 0);
        CHECK_EQ(c.kind, (dp_optim_kind_t)k);
    }
    CHECK_STR(dp_optim_kind_name(DP_OPT_NESTEROV), "nesterov");
    CHECK_STR(dp_optim_kind_name(DP_OPT_RMSPROP), "rmsprop");
    CHECK_EQ(dp_optim_parse_kind(&c, "adagrad", err), 0);
    CHECK_EQ(dp_optim_parse_kind(&c, "lamb", err), -1);
    CHECK(strstr(err, "lamb") != NULL);
    CHECK(strstr(err, "rmsprop") != NULL); /* the list names every optimizer */
    CHECK_EQ(c.kind, DP_OPT_ADAGRAD); /* unchanged */

    CHECK_EQ(dp_optim_parse_schedule(&c, "step:100:0.5", err), 0);
    CHECK_EQ(c.schedule, DP_LR_STEP);
    CHECK_EQ(c.step_size, 100);
    CHECK_NEAR(c.gamma, 0.5, 0);
    CHECK_EQ(dp_optim_parse_schedule(&c, "cosine:2000", err), 0);
    CHECK_EQ(c.schedule, DP_LR_COSINE);
    CHECK_EQ(c.total_steps, 2000);
    CHECK_EQ(dp_optim_parse_schedule(&c, "constant", err), 0);
    CHECK_EQ(c.schedule, DP_LR_CONSTANT);
    const char *bad[] = {"", "step", "step:100", "step:0:0.5", "step:-5:0.5", "step:10:x",
                         "step:10:0.5x", "step:10:-1", "cosine", "cosine:", "cosine:0",
                         "cosine:10:1", "linear", "constant2", "step: 10:0.5", "step:10:0x1p3",
                         "step:10:nan", "cosine:+5", "cosine:5 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK_EQ(dp_optim_parse_schedule(&c, bad[i], err), -1);
        CHECK(strstr(err, "schedule") != NULL);
    }
    CHECK_EQ(c.schedule, DP_LR_CONSTANT);
}

static void test_schedules(void)
{
    dp_optim_conf_t c;
    dp_optim_conf_default(&c);
    c.lr = 0.2f;
    CHECK_NEAR(dp_optim_lr_at(&c, 0), 0.2, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 123456), 0.2, 1e-7);
    CHECK_EQ(dp_optim_parse_schedule(&c, "step:10:0.5", NULL), 0);
    CHECK_NEAR(dp_optim_lr_at(&c, 0), 0.2, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 9), 0.2, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 10), 0.1, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 29), 0.05, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 30), 0.025, 1e-7);
    CHECK_EQ(dp_optim_parse_schedule(&c, "cosine:100", NULL), 0);
    CHECK_NEAR(dp_optim_lr_at(&c, 0), 0.2, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 50), 0.1, 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 25), 0.1 * (1 + cos(M_PI / 4)), 1e-7);
    CHECK_NEAR(dp_optim_lr_at(&c, 100), 0.0, 1e-9);
    CHECK_NEAR(dp_optim_lr_at(&c, 250), 0.0, 1e-9);
}

/* Delayed Nesterov (the outer optimizer of asynchronous local SGD): one
 * float by hand over a round of 2, and N steps of the same gradient equal
 * one nesterov step by it, round after round, momentum carried. */
static void test_delayed_nesterov(void)
{
    dp_optim_conf_t c;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_optim_outer("nesterov", 0, 0.9f, 5, &c, err), 0); /* plain: no period */
    CHECK(c.kind == DP_OPT_NESTEROV && c.lr == 0.7f && c.schedule == DP_LR_CONSTANT);
    CHECK_EQ(c.period, 0);
    CHECK_STR(dp_optim_outer_name(&c), "nesterov");
    CHECK_EQ(dp_optim_state_floats(&c), 1);
    c.period = 2;
    CHECK_EQ(dp_optim_state_floats(&c), 2);
    float w = 1.0f, st[2] = {0, 0}, g1 = 0.5f, g2 = 0.3f;
    dp_optim_step(&c, 0.7f, &w, &g1, st, 1, 1); /* w -= 0.35 * 0.5; d = 0.5 */
    CHECK_NEAR(w, 0.825, 1e-6);
    CHECK_NEAR(st[1], 0.5, 1e-7);
    CHECK(st[0] == 0.0f);
    dp_optim_step(&c, 0.7f, &w, &g2, st, 1, 2); /* w -= 0.35 * 0.3; v = 0.4; w -= 0.7 * 0.9 * 0.4 */
    CHECK_NEAR(w, 0.825 - 0.105 - 0.252, 1e-6);
    CHECK_NEAR(st[0], 0.4, 1e-7);
    CHECK(st[1] == 0.0f);
    /* 3 rounds of N = 4 pushes of one gradient against plain nesterov */
    enum { n = 37, N = 4 };
    float wa[n], wb[n], sa[2 * n] = {0}, sb[n] = {0}, g[n];
    for (int i = 0; i < n; i++) wa[i] = wb[i] = 0.1f * (float)(i - 18);
    dp_optim_conf_t plain = c;
    plain.period = 0;
    c.period = N;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < n; i++) g[i] = 0.01f * (float)((i * 7 + r * 3) % 11) - 0.05f;
        for (int k = 1; k <= N; k++) dp_optim_step(&c, 0.7f, wa, g, sa, n, r * N + k);
        dp_optim_step(&plain, 0.7f, wb, g, sb, n, r + 1);
    }
    for (int i = 0; i < n; i++) CHECK_NEAR(wa[i], wb[i], 1e-6);
    for (int i = 0; i < n; i++) CHECK_NEAR(sa[i], sb[i], 1e-6);
    CHECK_EQ(dp_optim_outer("adam", 0, 0.9f, 2, &c, err), -1);
    CHECK_STR(err, "--outer-optimizer 'adam': sgd, nesterov or delayed-nesterov");
    CHECK_EQ(dp_optim_outer(NULL, 0, 0.9f, 2, &c, err), 0);
    CHECK(c.kind == DP_OPT_SGD && c.lr == 1.0f && c.period == 0);
    CHECK_EQ(dp_optim_outer("delayed-nesterov", 0, 0.9f, 3, &c, err), 0);
    CHECK(c.kind == DP_OPT_NESTEROV && c.lr == 0.5f && c.period == 3); /* its own default lr */
    CHECK_STR(dp_optim_outer_name(&c), "delayed-nesterov");
    CHECK_EQ(dp_optim_outer("delayed-nesterov", 0, 0.9f, 1, &c, err), 0); /* N = 1: the plain rule */
    CHECK(c.period == 0 && c.lr == 0.7f);                                 /* and its lr */
    CHECK_EQ(dp_optim_outer("delayed-nesterov", 0.25f, 0.9f, 3, &c, err), 0);
    CHECK(c.lr == 0.25f); /* a given lr is the lr */
}

/* Liu et al. 2024 (arXiv 2401.09135), Algorithm 3, "Delayed Nesterov
 * Update", with its momentum activation c at the paper's default 0,
 * written as the paper gives it, in doubles, for one parameter theta:
 *     Delta <- Delta + g_t
 *     if t mod N == 0:  m <- beta m + Delta / N;  theta <- theta - eta (g_t / N + beta m);  Delta <- 0
 *     else:             theta <- theta - eta g_t / N
 * against the kernel's delayed-nesterov over 11 steps of different
 * gradients (N = 3: three turns and a round left open), and plain
 * nesterov (momentum every step) against its own textbook rule; the two
 * part after the first step. */
static double s_dn_reference(double *theta, double *m, double *delta, double g, double eta,
                             double beta, int N, long t)
{
    *delta += g;
    if (t % N == 0) {
        *m = beta * *m + *delta / N;
        *theta -= eta * (g / N + beta * *m);
        *delta = 0;
    } else {
        *theta -= eta * g / N;
    }
    return *theta;
}

static void test_delayed_nesterov_paper(void)
{
    enum { n = 5, N = 3, T = 11 };
    const double eta = 0.7, beta = 0.9;
    dp_optim_conf_t dn, plain;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_optim_outer("delayed-nesterov", 0, 0.9f, N, &dn, err), 0);
    CHECK_EQ(dp_optim_outer("nesterov", 0, 0.9f, N, &plain, err), 0);
    float w[n], st[2 * n] = {0}, wp[n], sp[n] = {0}, g[n];
    double theta[n], m[n] = {0}, delta[n] = {0}, tp[n], mp[n] = {0};
    for (int i = 0; i < n; i++) w[i] = wp[i] = (float)(theta[i] = tp[i] = 0.25 * (i - 2));
    double worst = 0;
    int parted = 0;
    for (long t = 1; t <= T; t++) {
        for (int i = 0; i < n; i++) g[i] = (float)(0.0625 * (double)((i * 5 + t * 3) % 7) - 0.1875);
        dp_optim_step(&dn, 0.7f, w, g, st, n, t);
        dp_optim_step(&plain, 0.7f, wp, g, sp, n, t);
        for (int i = 0; i < n; i++) {
            double r = s_dn_reference(&theta[i], &m[i], &delta[i], g[i], eta, beta, N, t);
            mp[i] = beta * mp[i] + g[i]; /* plain nesterov: v = mu v + g; w -= lr (g + mu v) */
            tp[i] -= eta * (g[i] + beta * mp[i]);
            double e = fabs((double)w[i] - r);
            worst = e > worst ? e : worst;
            CHECK_NEAR(wp[i], tp[i], 1e-5);
            if (t > 1 && fabs(r - tp[i]) > 1e-3) parted = 1;
        }
    }
    CHECK(worst <= 1e-5);
    if (worst > 1e-5) fprintf(stderr, "  delayed-nesterov: worst |kernel - paper| %g\n", worst);
    for (int i = 0; i < n; i++) CHECK_NEAR(st[i], m[i], 1e-5); /* the momentum buffer too */
    CHECK(parted); /* the delayed rule is not the plain one */
}

/* dp_optim_step_from against copying the from-vectors in and stepping in
 * place, bit for bit: every optimizer (and delayed Nesterov on and off its
 * turn), each of the four cases (w apart or in place, state apart or in
 * place), a sub-range [lo, hi) of awkward length, 4 steps; the from-vectors
 * untouched, and the floats outside [lo, hi) of the written ones too. */
static void test_step_from_equals_copy_then_step(void)
{
    enum { N = 1031, LO = 5, HI = 1028, STEPS = 4 };
    dp_rng_t rng;
    for (int k = 0; k <= DP_OPT_KINDS; k++) {
        dp_optim_conf_t c = s_conf(k < DP_OPT_KINDS ? (dp_optim_kind_t)k : DP_OPT_NESTEROV);
        if (k == DP_OPT_KINDS) c.period = 3; /* delayed Nesterov: turns at t = 3 */
        size_t sf = (size_t)dp_optim_state_floats(&c);
        for (int apart = 0; apart < 4; apart++) {
            int w_apart = apart & 1, st_apart = apart & 2;
            float *w_ref = dp_malloc(N * sizeof(float)), *g = dp_malloc(N * sizeof(float));
            float *st_ref = dp_calloc(2 * N, sizeof(float));
            float *w_a = dp_malloc(N * sizeof(float)), *w_b = dp_malloc(N * sizeof(float));
            float *st_a = dp_calloc(2 * N, sizeof(float)), *st_b = dp_calloc(2 * N, sizeof(float));
            dp_rng_seed(&rng, 7 + (uint64_t)k);
            for (int i = 0; i < N; i++) w_ref[i] = w_a[i] = dp_rng_uniform(&rng) - 0.5f;
            for (int t = 1; t <= STEPS; t++) {
                for (int i = 0; i < N; i++) g[i] = dp_rng_uniform(&rng) - 0.5f;
                /* from a (or in a), into b (or a): the written vectors
                 * hold a marker, which only [lo, hi) may lose */
                for (int i = 0; i < N; i++) w_b[i] = 99.0f;
                for (size_t i = 0; i < 2 * (size_t)N; i++) st_b[i] = 77.0f;
                float *w_to = w_apart ? w_b : w_a, *st_to = st_apart ? st_b : st_a;
                float *w_keep = dp_malloc(N * sizeof(float)), *st_keep = dp_malloc(2 * N * sizeof(float));
                memcpy(w_keep, w_a, N * sizeof(float));
                memcpy(st_keep, st_a, 2 * N * sizeof(float));
                dp_optim_step_from(&c, c.lr, w_to, w_a, g, sf ? st_to : NULL, sf ? st_a : NULL, N,
                                   LO, HI, t);
                dp_optim_step_range(&c, c.lr, w_ref, g, st_ref, N, LO, HI, t);
                CHECK(memcmp(w_to + LO, w_ref + LO, (HI - LO) * sizeof(float)) == 0);
                for (size_t v = 0; v < sf; v++)
                    CHECK(memcmp(st_to + v * N + LO, st_ref + v * N + LO, (HI - LO) * sizeof(float)) == 0);
                if (w_apart) {
                    CHECK(memcmp(w_a, w_keep, N * sizeof(float)) == 0);
                    CHECK(w_b[LO - 1] == 99.0f && w_b[HI] == 99.0f);
                    memcpy(w_a + LO, w_b + LO, (HI - LO) * sizeof(float)); /* the next step's from */
                }
                if (st_apart && sf) {
                    CHECK(memcmp(st_a, st_keep, 2 * N * sizeof(float)) == 0);
                    CHECK(st_b[LO - 1] == 77.0f && st_b[(sf - 1) * N + HI] == 77.0f);
                    for (size_t v = 0; v < sf; v++)
                        memcpy(st_a + v * N + LO, st_b + v * N + LO, (HI - LO) * sizeof(float));
                }
                free(w_keep);
                free(st_keep);
            }
            free(w_ref);
            free(g);
            free(st_ref);
            free(w_a);
            free(w_b);
            free(st_a);
            free(st_b);
        }
    }
}

DP_TESTS(T(test_matches_torch), T(test_delayed_nesterov), T(test_delayed_nesterov_paper), T(test_matches_double_reference), T(test_hand_values), T(test_delay_compensation),
         T(test_pieces_equal_whole), T(test_step_from_equals_copy_then_step), T(test_state_sizes),
         T(test_defaults_and_parsing), T(test_schedules))
