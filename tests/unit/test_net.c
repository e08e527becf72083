/* test_net: the executor as a whole (the whole network's gradient against
 * finite differences, on every CPU kernel path this machine supports; loss
 * falling under SGD) and the data order that the sync-equals-standalone
 * guarantee rests on. */
#include <math.h>
#include <string.h>

#include "common/dataset.h"
#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "worker/exec/data.h"
#include "worker/exec/net.h"
#include "tests/test.h"
#include "tests/cpu_paths.h"


static void s_random(float *x, size_t n, dp_rng_t *r, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (2 * dp_rng_uniform(r) - 1) * scale;
}

/* Every parameter's gradient of a whole tiny network (or every step-th one)
 * against central differences of the loss the executor computes; returns how
 * many differ. */
static int s_gradient_check(const char *spec, size_t step)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 2, 9, 7, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    int B = 3;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 11);
    float *params = dp_malloc(m.n_floats * sizeof(float));
    float *grads = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 5);
    size_t in = (size_t)B * 2 * 9 * 7;
    float *x = dp_malloc(in * sizeof(float));
    s_random(x, in, &r, 1.0f);
    int y[3] = {0, 2, 1};
    dp_net_set_params(&net, params);
    dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, grads);
    int bad = 0, ok = 0;
    double worst = 0;
    const float eps = 1e-3f;
    for (size_t i = 0; i < m.n_floats; i += step) {
        float keep = params[i];
        int c;
        params[i] = keep + eps;
        dp_net_set_params(&net, params);
        double up = dp_net_evaluate(&net, x, y, B, &c);
        params[i] = keep - eps;
        dp_net_set_params(&net, params);
        double down = dp_net_evaluate(&net, x, y, B, &c);
        params[i] = keep;
        double fd = (up - down) / (2 * eps);
        double d = fabs(fd - grads[i]);
        /* float loss, piecewise-linear relu/max: a loose but telling bound */
        if (d > 2e-3 + 5e-2 * fabs(fd)) {
            if (bad < 5) fprintf(stderr, "  param %zu: backprop %.6g finite diff %.6g\n", i, grads[i], fd);
            bad++;
        } else {
            ok++;
        }
        if (d > worst) worst = d;
    }
    CHECK(ok > 0);
    fprintf(stderr, "  %s: %d of %d gradients off, worst |diff| %.3g\n", spec, bad, bad + ok,
            worst);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params);
    free(grads);
    free(x);
    return bad;
}

static void s_network_gradients(void)
{
    fprintf(stderr, "  %s path:\n", dp_cpu_isa_name(dp_cpu_isa()));
    /* one thread: thousands of tiny steps, where waking a second thread on a
     * busy machine costs more than the step (test_kernels covers 1-3) */
    dp_cpu_set_threads(1);
    /* Smooth layers only: every gradient must agree. */
    CHECK_EQ(s_gradient_check("conv3x3:4 conv3x3:5:valid fc:6 fc:3 softmax", 1), 0);
    /* With relu and max-pool, a kink crossed by +-eps spoils a few finite
     * differences (the kernel tests check those ops exactly); a wrong
     * backward would spoil most. */
    CHECK(s_gradient_check("conv3x3:4 relu maxpool2 conv3x3:5:valid relu fc:6 relu fc:3 softmax",
                           1) <= 348 * 3 / 100);
    /* conv2 wide enough for our SIMD kernels (patches of 72 floats, 32
     * channels: our GEMM forward on both SIMD paths, the sparse backward
     * behind the max-pool); every 7th of its 2,683 parameters. */
    CHECK(s_gradient_check("conv3x3:8 relu maxpool2 conv3x3:32 relu maxpool2 fc:3 softmax", 7) <=
          384 * 3 / 100);
    dp_cpu_set_threads(0);
}

static void test_network_gradient_matches_finite_differences(void)
{
    t_each_cpu_path(s_network_gradients);
}

/* A model with an embedding: the training step's gradient wrt its batch
 * (the embedding's output, dp_net_get_input_grad) against central
 * differences of the training step's loss (batch norm by the batch's
 * statistics) in each input float, on dev; returns how many differ. A
 * model without one (on 5 x 1 x 1) must have no such gradient. */
static int s_input_gradient_check(const char *dev, const char *spec)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 5, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, dev, err), 0);
    dp_net_t net;
    int B = 4, D = m.embed_dim;
    CHECK_EQ(dp_net_init(&net, &m, be, B + 2, err), 0); /* a batch below max_batch */
    CHECK((net.d_dx != NULL) == (D > 0));
    if (D == 0) { /* nothing asks for the batch's gradient */
        dp_net_fini(&net);
        dp_backend_destroy(&be);
        return 0;
    }
    dp_rng_t r;
    dp_rng_seed(&r, 3);
    float *params = dp_malloc((m.n_floats + 1) * sizeof(float));
    dp_model_init_params(&m, params, 9);
    dp_net_set_params(&net, params);
    float x[4 * 8], dx[4 * 8];
    s_random(x, (size_t)B * D, &r, 1.0f);
    int y[4] = {1, 0, 0, 1};
    dp_net_train_step(&net, x, y, B);
    dp_net_get_input_grad(&net, dx, B);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < B * D; i++) {
        const float eps = 1e-3f, keep = x[i];
        x[i] = keep + eps;
        double up = dp_net_train_step(&net, x, y, B);
        x[i] = keep - eps;
        double down = dp_net_train_step(&net, x, y, B);
        x[i] = keep;
        double fd = (up - down) / (2 * eps), d = fabs(fd - dx[i]);
        if (d > 2e-3 + 5e-2 * fabs(fd)) {
            if (bad < 5) fprintf(stderr, "  %s x[%d]: backprop %.6g finite diff %.6g\n", spec, i, dx[i], fd);
            bad++;
        }
        if (d > worst) worst = d;
    }
    fprintf(stderr, "  %s on %s: %d of %d input gradients off, worst |diff| %.3g\n", spec, dev, bad,
            B * D, worst);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params);
    return bad;
}

static void test_input_gradient(void)
{
    static const char *devs[2] = {"cpu", "cpu:staged"};
    for (int k = 0; k < 2; k++) {
        /* softmax first: logistic regression, no dense parameters at all */
        CHECK_EQ(s_input_gradient_check(devs[k], "embed:2 softmax"), 0);
        CHECK_EQ(s_input_gradient_check(devs[k], "embed:5 fc:4 tanh fc:3 softmax"), 0);
        CHECK_EQ(s_input_gradient_check(devs[k], "embed:8 tanh fc:6 bn tanh fc:2 softmax"), 0);
    }
    CHECK_EQ(s_input_gradient_check("cpu", "fc:4 tanh fc:2 softmax"), 0);
}

/* The actor-critic surrogate whose true gradient A3C's is: the loss of
 * kernels/ops.h with the advantage frozen at adv0 in the policy term (the
 * estimator holds it constant), from the policy and value dp_net_act gives. */
static double s_ac_surrogate(dp_net_t *net, const float *x, const int *act, const float *ret,
                             const double *adv0, int B, double beta)
{
    int A = net->m->classes;
    float probs[64 * 8], value[8];
    dp_net_act(net, x, B, probs, value);
    double L = 0;
    for (int n = 0; n < B; n++) {
        double h = 0, a = (double)ret[n] - value[n];
        for (int k = 0; k < A; k++) h -= probs[n * A + k] * log(probs[n * A + k]);
        L += -adv0[n] * log(probs[n * A + act[n]]) + DP_AC_VALUE_COEF * a * a - beta * h;
    }
    return L / B;
}

/* An actor-critic network (ac:A): every parameter's gradient of a training
 * step, entropy and value terms in, against central differences of the
 * surrogate above; returns how many differ. The policy and value heads both
 * read the trunk, so its gradient is the sum of both. */
static int s_ac_gradient_check(const char *spec, int c, int h, int w, float beta)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, c, h, w, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    enum { B = 5 };
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    net.ac_entropy = beta;
    dp_rng_t r;
    dp_rng_seed(&r, 12);
    float *params = dp_malloc(m.n_floats * sizeof(float));
    float *grads = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 6);
    size_t in = (size_t)B * c * h * w;
    float *x = dp_malloc(in * sizeof(float));
    s_random(x, in, &r, 1.0f);
    int act[B];
    float ret[B];
    for (int b = 0; b < B; b++) act[b] = (int)dp_rng_below(&r, (uint64_t)m.classes);
    s_random(ret, B, &r, 2.0f);
    dp_net_set_params(&net, params);
    float loss = dp_net_train_step_ac(&net, x, act, ret, B);
    CHECK(isfinite(loss));
    dp_net_get_grads(&net, grads);
    double adv0[B];
    float probs[64 * B], value[B];
    dp_net_act(&net, x, B, probs, value);
    for (int b = 0; b < B; b++) adv0[b] = (double)ret[b] - value[b];
    int bad = 0;
    double worst = 0;
    const float eps = 1e-3f;
    for (size_t i = 0; i < m.n_floats; i++) {
        float keep = params[i];
        params[i] = keep + eps;
        dp_net_set_params(&net, params);
        double up = s_ac_surrogate(&net, x, act, ret, adv0, B, beta);
        params[i] = keep - eps;
        dp_net_set_params(&net, params);
        double down = s_ac_surrogate(&net, x, act, ret, adv0, B, beta);
        params[i] = keep;
        double fd = (up - down) / (2 * eps), d = fabs(fd - grads[i]);
        if (d > 1e-3 + 2e-2 * fabs(fd)) { /* smooth layers only: every one must agree */
            if (bad < 5) fprintf(stderr, "  param %zu: backprop %.6g finite diff %.6g\n", i, grads[i], fd);
            bad++;
        }
        if (d > worst) worst = d;
    }
    fprintf(stderr, "  %s (beta %g): %d of %zu gradients off, worst |diff| %.3g\n", spec, beta,
            bad, m.n_floats, worst);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params), free(grads), free(x);
    return bad;
}

static void s_ac_gradients(void)
{
    dp_cpu_set_threads(1);
    CHECK_EQ(s_ac_gradient_check("fc:6 tanh fc:5 tanh ac:3", 4, 1, 1, 0.01f), 0);
    CHECK_EQ(s_ac_gradient_check("fc:6 tanh fc:5 tanh ac:3", 4, 1, 1, 0.5f), 0); /* entropy weighs */
    CHECK_EQ(s_ac_gradient_check("conv3x3:3 tanh fc:4 tanh ac:2", 2, 5, 4, 0.01f), 0);
    CHECK_EQ(s_ac_gradient_check("ac:4", 6, 1, 1, 0.01f), 0); /* no trunk: the input's boundary */
    dp_cpu_set_threads(0);
}

static void test_ac_gradients_match_finite_differences(void)
{
    t_each_cpu_path(s_ac_gradients);
}

/* Acting (dp_net_act) on a head with no trunk, by hand: pi = softmax(Wp x
 * + bp), V = Wv x + bv; and the probabilities a training step leaves are
 * those. */
static void test_ac_act(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "ac:3", 4, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, 2, err), 0);
    float *p = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, p, 3);
    dp_net_set_params(&net, p);
    const float x[8] = {0.5f, -1, 2, 0.25f, -0.3f, 0.1f, 0, 1};
    float probs[6], value[2];
    dp_net_act(&net, x, 2, probs, value);
    const float *Wp = p + dp_model_find_param(&m, "policy.weight")->offset;
    const float *bp = p + dp_model_find_param(&m, "policy.bias")->offset;
    const float *Wv = p + dp_model_find_param(&m, "value.weight")->offset;
    const float *bv = p + dp_model_find_param(&m, "value.bias")->offset;
    for (int b = 0; b < 2; b++) {
        double z[3], mx = -1e30, s = 0, v = bv[0];
        for (int k = 0; k < 3; k++) {
            z[k] = bp[k];
            for (int j = 0; j < 4; j++) z[k] += (double)Wp[k * 4 + j] * x[b * 4 + j];
            if (z[k] > mx) mx = z[k];
        }
        for (int k = 0; k < 3; k++) s += exp(z[k] - mx);
        for (int k = 0; k < 3; k++) CHECK_NEAR(probs[b * 3 + k], exp(z[k] - mx) / s, 1e-6);
        for (int j = 0; j < 4; j++) v += (double)Wv[j] * x[b * 4 + j];
        CHECK_NEAR(value[b], v, 1e-6);
    }
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(p);
}

/* A separable synthetic problem: the class is the brightest quadrant. */
static void s_quadrant_batch(dp_rng_t *r, float *x, int *y, int B)
{
    for (int b = 0; b < B; b++) {
        int cls = (int)dp_rng_below(r, 3);
        y[b] = cls;
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) {
                int q = (i >= 4) * 2 + (j >= 4);
                x[b * 64 + i * 8 + j] = 0.2f * dp_rng_uniform(r) + (q == cls ? 0.8f : 0.0f);
            }
    }
}

static void test_loss_falls_under_sgd(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 1, 8, 8, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    int B = 16;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    float *params = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 3);
    dp_net_set_params(&net, params);
    float *v = be->ops->alloc(be, m.n_floats * sizeof(float));
    dp_optim_conf_t opt;
    dp_optim_conf_default(&opt);
    opt.kind = DP_OPT_MOMENTUM;
    dp_rng_t r;
    dp_rng_seed(&r, 4);
    float x[16 * 64];
    int y[16];
    double first = 0, last = 0;
    for (int step = 0; step < 150; step++) {
        s_quadrant_batch(&r, x, y, B);
        float loss = dp_net_train_step(&net, x, y, B);
        be->ops->optim_step(be, &opt, 0.05f, net.d_params, net.d_grads, v, m.n_floats, step + 1);
        if (step < 10) first += loss / 10;
        if (step >= 140) last += loss / 10;
    }
    fprintf(stderr, "  loss %.4f -> %.4f\n", first, last);
    CHECK(last < first * 0.3);
    int correct = 0;
    s_quadrant_batch(&r, x, y, B);
    dp_net_evaluate(&net, x, y, B, &correct);
    CHECK(correct >= 14);
    be->ops->release(be, v);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params);
}

/* R workers at batch b, step t, cover exactly what one worker at batch R*b
 * covers at step t, in the same order. */
static void test_global_batch_order(void)
{
    int n = 1000, b = 7, R = 3;
    int one[21], part[7];
    for (long step = 0; step < 100; step += 13) {
        dp_data_batch_indices(n, R * b, 0, 1, 42, step, one);
        for (int rank = 0; rank < R; rank++) {
            dp_data_batch_indices(n, b, rank, R, 42, step, part);
            CHECK(memcmp(part, one + rank * b, sizeof part) == 0);
        }
    }
    /* One epoch visits no sample twice; a new epoch reshuffles. */
    long spe = dp_data_steps_per_epoch(n, b, R);
    CHECK_EQ(spe, 1000 / 21);
    char *seen = calloc((size_t)n, 1);
    int dup = 0;
    for (long step = 0; step < spe; step++)
        for (int rank = 0; rank < R; rank++) {
            dp_data_batch_indices(n, b, rank, R, 42, step, part);
            for (int i = 0; i < b; i++) dup += seen[part[i]]++ > 0;
        }
    CHECK_EQ(dup, 0);
    free(seen);
    int e0[7], e1[7];
    dp_data_batch_indices(n, b, 0, R, 42, 0, e0);
    dp_data_batch_indices(n, b, 0, R, 42, spe, e1);
    CHECK(memcmp(e0, e1, sizeof e0) != 0);
}

/* The prefetch thread hands out the same batches the rule says. */
static void test_batcher_matches_rule(void)
{
    dp_dataset_t ds = {0};
    snprintf(ds.name, sizeof ds.name, "synthetic");
    ds.n = 50;
    ds.c = 1;
    ds.h = 2;
    ds.w = 2;
    ds.classes = 10;
    ds.pixels = dp_malloc(50 * 4);
    ds.labels = dp_malloc(50);
    for (int i = 0; i < 50; i++) {
        for (int k = 0; k < 4; k++) ds.pixels[i * 4 + k] = (uint8_t)(i * 5 % 256);
        ds.labels[i] = (uint8_t)(i % 10);
    }
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    dp_batcher_t bt;
    char err[DP_ERR_LEN];
    CHECK_EQ(dp_batcher_init(&bt, &ds, be, 4, 1, 2, 9, 20, err), 0);
    dp_batch_t b;
    long step, count = 0;
    int idx[4];
    while ((step = dp_batcher_next(&bt, &b)) >= 0) {
        CHECK_EQ(step, count);
        dp_data_batch_indices(50, 4, 1, 2, 9, step, idx);
        for (int i = 0; i < 4; i++) {
            CHECK_EQ(b.y[i], idx[i] % 10);
            CHECK_NEAR(b.x[i * 4], (idx[i] * 5 % 256) / 255.0, 1e-6);
        }
        /* and the same batch staged on the device */
        CHECK(b.d_x != b.x && memcmp(b.d_x, b.x, 4 * 4 * sizeof(float)) == 0);
        CHECK(memcmp(b.d_y, b.y, 4 * sizeof(int)) == 0);
        count++;
    }
    CHECK_EQ(count, 20);
    dp_batcher_fini(&bt);
    dp_batcher_fini(&bt);  /* safe twice */
    /* Too little data for one global batch: a clear error. */
    CHECK_EQ(dp_batcher_init(&bt, &ds, be, 30, 0, 2, 9, 5, err), -1);
    CHECK(strstr(err, "fewer than one global batch") != NULL);
    dp_backend_destroy(&be);
    dp_dataset_fini(&ds);
}

/* The step on a staged batch with its gradient copied out layer by layer
 * gives what the plain step and a download give, bit for bit. */
static void test_train_step_device_copies_grads(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 2, 9, 7, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    int B = 5;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 12);
    size_t in = (size_t)B * 2 * 9 * 7, nf = m.n_floats;
    float *params = dp_malloc(nf * sizeof(float)), *g1 = dp_malloc(nf * sizeof(float));
    float *g2 = be->ops->host_alloc(be, nf * sizeof(float));
    float *x = dp_malloc(in * sizeof(float)), *d_x = be->ops->alloc(be, in * sizeof(float));
    int y[5] = {0, 2, 1, 1, 0}, *d_y = be->ops->alloc(be, sizeof y);
    s_random(x, in, &r, 1.0f);
    for (size_t i = 0; i < nf; i++) g2[i] = NAN; /* every element must be written */
    dp_model_init_params(&m, params, 6);
    dp_net_set_params(&net, params);
    float l1 = dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, g1);
    be->ops->stage_upload(be, d_x, x, in * sizeof(float));
    be->ops->stage_upload(be, d_y, y, sizeof y);
    memset(net.d_grads, 0, nf * sizeof(float));
    float l2 = dp_net_train_step_device(&net, d_x, d_y, B, g2);
    CHECK_EQ(l1, l2);
    CHECK(memcmp(g1, g2, nf * sizeof(float)) == 0);
    be->ops->release(be, d_x), be->ops->release(be, d_y), be->ops->host_release(be, g2);
    free(params), free(g1), free(x);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

/* The on_grads hook (the push in parts): what it hands over is final (the
 * floats then are those after the step), every float of the vector once;
 * a chain's runs come from the end of the vector down, one after the other
 * (a ResNet's too: its layers' parameters lie in the order of its layers).
 * On cpu:staged (a device's paths) the runs are those of the step's host
 * copy, whose copies are made only when waited for: a run handed over
 * before its wait would show as NaN there. */
typedef struct {
    const float *from;    /* where the runs handed over lie: d_grads, or h_grads */
    float *copy;          /* each run's floats when handed over */
    unsigned char *seen;  /* times each float was handed over */
    size_t next;          /* where a run must end to follow the one before */
    int in_order, calls;
} s_hook_t;

static void s_hook(void *arg, size_t off, size_t n)
{
    s_hook_t *h = arg;
    memcpy(h->copy + off, h->from + off, n * sizeof(float));
    for (size_t i = off; i < off + n; i++) h->seen[i]++;
    h->in_order &= off + n == h->next;
    h->next = off;
    h->calls++;
}

static void s_hook_case(const char *dev, const char *spec, int c, int hw)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, c, hw, hw, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, dev, err), 0);
    dp_net_t net;
    int B = 4, host = be->host_memory;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 3);
    size_t in = (size_t)B * c * hw * hw, nf = m.n_floats;
    float *params = dp_malloc(nf * sizeof(float)), *x = dp_malloc(in * sizeof(float));
    float *grads = dp_malloc(nf * sizeof(float)), *h_grads = be->ops->host_alloc(be, nf * sizeof(float));
    float *d_x = be->ops->alloc(be, in * sizeof(float));
    int y[4] = {0, 1, 2, 1}, *d_y = be->ops->alloc(be, sizeof y);
    s_random(x, in, &r, 1.0f);
    be->ops->upload(be, d_x, x, in * sizeof(float));
    be->ops->upload(be, d_y, y, sizeof y);
    dp_model_init_params(&m, params, 6);
    dp_net_set_params(&net, params);
    s_hook_t h = {host ? net.d_grads : h_grads, dp_calloc(nf, sizeof(float)), dp_calloc(nf, 1),
                  nf, 1, 0};
    net.on_grads = s_hook;
    net.on_grads_arg = &h;
    for (size_t i = 0; i < nf; i++) h_grads[i] = NAN; /* a run handed over early shows */
    be->ops->upload(be, net.d_grads, h_grads, nf * sizeof(float));
    dp_net_train_step_device(&net, d_x, d_y, B, host ? NULL : h_grads);
    dp_net_get_grads(&net, grads);
    int once = 1;
    for (size_t i = 0; i < nf; i++) once &= h.seen[i] == 1;
    CHECK(once);
    CHECK(memcmp(h.copy, grads, nf * sizeof(float)) == 0);
    CHECK(h.in_order && h.next == 0);
    CHECK(h.calls > 1);
    /* evaluation runs no backward: no call */
    int ok = 0, calls = h.calls;
    dp_net_evaluate(&net, x, y, B, &ok);
    CHECK_EQ(h.calls, calls);
    if (!host) { /* a device's step without a host copy hands nothing over */
        dp_net_train_step_device(&net, d_x, d_y, B, NULL);
        CHECK_EQ(h.calls, calls);
    }
    be->ops->release(be, d_x), be->ops->release(be, d_y), be->ops->host_release(be, h_grads);
    free(h.copy), free(h.seen), free(params), free(x), free(grads);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

/* The on_params hook (the pull in parts): called before each layer with
 * parameters with where its floats end, in ascending order, n_floats once
 * a pass; it delivers the floats as a pull would, and the step equals a
 * step on the whole vector set before, bit for bit (loss, gradient, a bn's
 * running statistics). torn_at: the hook delivers a stale snapshot's
 * floats until that call, then writes the whole vector anew and says 1
 * (a torn pull), and the forward starts over; the step is still the exact
 * one. */
typedef struct {
    dp_net_t *net;
    float *to;            /* where the pull lands: d_params, or a device's h_pull */
    const float *params, *stale;
    size_t had;           /* floats delivered so far */
    int calls, in_order, torn_at, finals;
} s_pull_hook_t;

static dp_pull_status_t s_pull_hook(void *arg, size_t end)
{
    s_pull_hook_t *h = arg;
    size_t nf = h->net->m->n_floats;
    h->calls++;
    if (h->calls == h->torn_at) {
        memcpy(h->to, h->params, nf * sizeof(float));
        h->had = nf;
        h->stale = h->params; /* from now on the right snapshot */
        return DP_PULL_TORN;
    }
    h->in_order &= end >= h->had || h->had == nf;
    if (end > h->had) {
        memcpy(h->to + h->had, h->stale + h->had, (end - h->had) * sizeof(float));
        h->had = end;
    }
    h->finals += end == nf;
    return DP_PULL_OK;
}

static void s_pull_hook_case(const char *dev, const char *spec, int c, int hw, int torn_at)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, c, hw, hw, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, dev, err), 0);
    dp_net_t net, ref;
    int B = 4;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    CHECK_EQ(dp_net_init(&ref, &m, be, B, err), 0);
    dp_rng_t r;
    dp_rng_seed(&r, 4);
    size_t in = (size_t)B * c * hw * hw, nf = m.n_floats;
    float *params = dp_malloc(nf * sizeof(float)), *stale = dp_malloc(nf * sizeof(float));
    float *x = dp_malloc(in * sizeof(float));
    int y[4] = {2, 0, 1, 1};
    s_random(x, in, &r, 1.0f);
    dp_model_init_params(&m, params, 8);
    for (size_t i = 0; i < nf; i++) stale[i] = torn_at ? params[i] * 0.5f + 0.25f : params[i];
    dp_net_set_params(&ref, params);
    float want = dp_net_train_step(&ref, x, y, B);
    /* a layer run before its floats shows (on a device: one run before its upload) */
    float *nan = dp_malloc(nf * sizeof(float)), *got_g = dp_malloc(nf * sizeof(float));
    float *want_g = dp_malloc(nf * sizeof(float)), *got_p = dp_malloc(nf * sizeof(float));
    float *want_p = dp_malloc(nf * sizeof(float));
    for (size_t i = 0; i < nf; i++) nan[i] = NAN;
    dp_net_set_params(&net, nan);
    float *h_pull = be->host_memory ? NULL : be->ops->host_alloc(be, nf * sizeof(float));
    if (h_pull) memcpy(h_pull, nan, nf * sizeof(float));
    net.h_pull = h_pull;
    s_pull_hook_t h = {&net, h_pull ? h_pull : net.d_params, params, stale, 0, 0, 1, torn_at, 0};
    net.on_params = s_pull_hook;
    net.on_params_arg = &h;
    float got = dp_net_train_step(&net, x, y, B);
    CHECK(memcmp(&got, &want, sizeof got) == 0);
    dp_net_get_grads(&net, got_g), dp_net_get_grads(&ref, want_g);
    dp_net_get_params(&net, got_p), dp_net_get_params(&ref, want_p);
    CHECK(memcmp(got_g, want_g, nf * sizeof(float)) == 0);
    CHECK(memcmp(got_p, want_p, nf * sizeof(float)) == 0);
    CHECK(h.in_order);
    CHECK_EQ(net.pull_status, DP_PULL_OK);
    CHECK_EQ(h.finals, 1);
    CHECK(h.calls > 2);
    int ok = 0, calls = h.calls;
    dp_net_evaluate(&net, x, y, B, &ok); /* evaluation pulls nothing */
    CHECK_EQ(h.calls, calls);
    if (h_pull) { /* a device's net without h_pull calls no hook */
        net.h_pull = NULL;
        dp_net_train_step(&net, x, y, B);
        CHECK_EQ(h.calls, calls);
        be->ops->host_release(be, h_pull);
    }
    free(params), free(stale), free(x), free(nan), free(got_g), free(want_g), free(got_p),
        free(want_p);
    dp_net_fini(&net);
    dp_net_fini(&ref);
    dp_backend_destroy(&be);
}

static void test_on_params_hook(void)
{
    const char *resnet = "conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu "
                         "res:b( conv3x3:8:s2 bn relu conv3x3:8 bn ) relu gap fc:3 softmax";
    /* cpu, and cpu:staged: a device's paths (each run uploaded as the hook returns it) */
    for (int k = 0; k < 2; k++) {
        const char *dev = k ? "cpu:staged" : "cpu";
        s_pull_hook_case(dev, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 2, 8, 0);
        s_pull_hook_case(dev, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 2, 8, 3);
        s_pull_hook_case(dev, resnet, 3, 8, 0);
        s_pull_hook_case(dev, resnet, 3, 8, 5); /* after bn layers stepped their statistics */
    }
}

/* A hook that fails the pull (DP_PULL_FAILED) at its call fail_at stops the
 * step there: the hook is not called again, no later layer's forward runs
 * (the softmax's output keeps what it held), no backward (no on_grads, the
 * gradient keeps what it held), and the step says so. */
typedef struct {
    int calls, fail_at, grads;
} s_fail_hook_t;

static dp_pull_status_t s_fail_hook(void *arg, size_t end)
{
    (void)end;
    s_fail_hook_t *h = arg;
    return ++h->calls == h->fail_at ? DP_PULL_FAILED : DP_PULL_OK;
}

static void s_fail_grads(void *arg, size_t off, size_t n)
{
    (void)off, (void)n;
    ((s_fail_hook_t *)arg)->grads++;
}

static void s_pull_fail_case(const char *dev, int fail_at)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 2, 8, 8, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, dev, err), 0);
    dp_net_t net;
    int B = 4, y[4] = {2, 0, 1, 1};
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    size_t nf = m.n_floats, in = (size_t)B * 2 * 8 * 8, out = (size_t)B * m.classes;
    float *params = dp_malloc(nf * sizeof(float)), *x = dp_calloc(in, sizeof(float));
    float *mark = dp_malloc(nf * sizeof(float)), *got = dp_malloc(nf * sizeof(float));
    for (size_t i = 0; i < nf; i++) mark[i] = 7.0f;
    dp_model_init_params(&m, params, 8);
    dp_net_set_params(&net, params);
    be->ops->upload(be, net.d_grads, mark, nf * sizeof(float));
    be->ops->upload(be, net.d_act[m.n_layers], mark, out * sizeof(float));
    float *h_pull = be->host_memory ? NULL : be->ops->host_alloc(be, nf * sizeof(float));
    if (h_pull) memcpy(h_pull, params, nf * sizeof(float));
    float *h_grads = be->host_memory ? NULL : be->ops->host_alloc(be, nf * sizeof(float));
    net.h_pull = h_pull;
    s_fail_hook_t h = {0, fail_at, 0};
    net.on_params = s_fail_hook;
    net.on_params_arg = &h;
    net.on_grads = s_fail_grads;
    net.on_grads_arg = &h;
    float loss = dp_net_train_step_device(&net, net.d_act[0], net.d_labels, B, h_grads);
    CHECK_EQ(net.pull_status, DP_PULL_FAILED);
    CHECK(isnan(loss));
    CHECK_EQ(h.calls, fail_at); /* not called again: no later layer asked for its floats */
    CHECK_EQ(h.grads, 0);       /* no backward */
    be->ops->download(be, got, net.d_act[m.n_layers], out * sizeof(float));
    for (size_t i = 0; i < out; i++) CHECK(got[i] == 7.0f); /* the softmax did not run */
    dp_net_get_grads(&net, got);
    for (size_t i = 0; i < nf; i++) CHECK(got[i] == 7.0f);
    /* the next step, with a hook that does not fail, is a whole one */
    h = (s_fail_hook_t){0, 0, 0};
    be->ops->upload(be, net.d_labels, y, sizeof y);
    loss = dp_net_train_step_device(&net, net.d_act[0], net.d_labels, B, h_grads);
    CHECK_EQ(net.pull_status, DP_PULL_OK);
    CHECK(isfinite(loss));
    CHECK(h.grads > 0);
    if (h_pull) be->ops->host_release(be, h_pull);
    if (h_grads) be->ops->host_release(be, h_grads);
    free(params), free(x), free(mark), free(got);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

static void test_on_params_fails(void)
{
    for (int k = 0; k < 2; k++) {
        const char *dev = k ? "cpu:staged" : "cpu";
        s_pull_fail_case(dev, 1); /* the first layer's floats */
        s_pull_fail_case(dev, 2); /* fc:16's, after the convolution ran */
        s_pull_fail_case(dev, 3); /* fc:3's, the end of the vector: the forward's last call */
    }
}

static void test_on_grads_hook(void)
{
    for (int k = 0; k < 2; k++) {
        const char *dev = k ? "cpu:staged" : "cpu";
        s_hook_case(dev, "conv3x3:4 relu maxpool2 fc:16 relu fc:3 softmax", 2, 8);
        s_hook_case(dev, "conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu "
                    "res:b( conv3x3:8:s2 bn relu conv3x3:8 bn ) relu gap fc:3 softmax", 3, 8);
    }
}

/* Residual networks: every trainable gradient against central differences
 * of the training loss (batch statistics: dp_net_train_step's own loss,
 * the running statistics it moves reset by each dp_net_set_params), and
 * the state floats of d_grads holding the new running statistics. */
static int s_train_gradient_check(const char *spec, size_t step, int B)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 2, 9, 7, err), 0);
    if (err[0]) fprintf(stderr, "  %s\n", err);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    net.seed = 3;
    net.step = 17;
    dp_rng_t r;
    dp_rng_seed(&r, 11);
    float *params = dp_malloc(m.n_floats * sizeof(float));
    float *grads = dp_malloc(m.n_floats * sizeof(float));
    float *after = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 5);
    for (int i = 0; i < m.n_params; i++) /* bn's affine away from 1 and 0 */
        if (strstr(m.params[i].name, "bn") && m.params[i].trainable)
            for (size_t j = 0; j < m.params[i].count; j++)
                params[m.params[i].offset + j] += 0.3f * (2 * dp_rng_uniform(&r) - 1);
    size_t in = (size_t)B * 2 * 9 * 7;
    float *x = dp_malloc(in * sizeof(float));
    s_random(x, in, &r, 1.0f);
    int y[8] = {0, 2, 1, 1, 0, 2, 2, 1};
    dp_net_set_params(&net, params);
    dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, grads);
    dp_net_get_params(&net, after);
    int bad = 0, ok = 0;
    for (int i = 0; i < m.n_params; i++) {
        const dp_param_t *p = &m.params[i];
        if (p->trainable) continue;
        /* a push carries the new value there; the counter counted one batch */
        CHECK(memcmp(grads + p->offset, after + p->offset, p->count * sizeof(float)) == 0);
        if (strstr(p->name, "num_batches_tracked")) CHECK_EQ(after[p->offset], 1.0f);
    }
    const float eps = 1e-3f;
    for (size_t i = 0; i < m.n_floats; i += step) {
        int trainable = 1;
        for (int k = 0; k < m.n_params; k++)
            if (i >= m.params[k].offset && i < m.params[k].offset + m.params[k].count)
                trainable = m.params[k].trainable;
        if (!trainable) continue;
        float keep = params[i];
        params[i] = keep + eps;
        dp_net_set_params(&net, params);
        double up = dp_net_train_step(&net, x, y, B);
        params[i] = keep - eps;
        dp_net_set_params(&net, params);
        double down = dp_net_train_step(&net, x, y, B);
        params[i] = keep;
        double fd = (up - down) / (2 * eps), d = fabs(fd - grads[i]);
        if (d > 2e-3 + 5e-2 * fabs(fd)) {
            if (bad < 5) fprintf(stderr, "  param %zu: backprop %.6g finite diff %.6g\n", i, grads[i], fd);
            bad++;
        } else {
            ok++;
        }
    }
    CHECK(ok > 0);
    fprintf(stderr, "  %s: %d of %d gradients off\n", spec, bad, bad + ok);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params), free(grads), free(after), free(x);
    return bad;
}

static void s_resnet_gradients(void)
{
    fprintf(stderr, "  %s path:\n", dp_cpu_isa_name(dp_cpu_isa()));
    dp_cpu_set_threads(1);
    /* smooth: bn, option-A (4 -> 6 channels, stride 2) and identity
     * shortcuts, gap, a 1x1 stride-2 conv, 1-D bn; every gradient agrees */
    CHECK_EQ(s_train_gradient_check("conv3x3:4 bn res( conv3x3:4 bn ) res( conv3x3:6:s2 bn "
                                    "conv3x3:6 bn ) gap fc:5 bn fc:3 softmax", 1, 4), 0);
    CHECK_EQ(s_train_gradient_check("conv3x3:4 bn res:b( conv3x3:8:s2 bn ) conv1x1:3:s2:p0 gap "
                                    "fc:3 softmax", 1, 3), 0);
    CHECK_EQ(s_train_gradient_check("conv3x3:3 dropout:0.3 fc:6 dropout:0.5 fc:3 softmax", 1, 3), 0);
    /* with relus, as the presets are: a kink spoils a few */
    CHECK(s_train_gradient_check("conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu "
                                 "res( conv3x3:8:s2 bn relu conv3x3:8 bn ) relu gap fc:3 softmax",
                                 1, 4) <= 20);
    dp_cpu_set_threads(0);
}

static void test_resnet_gradients_match_finite_differences(void)
{
    t_each_cpu_path(s_resnet_gradients);
}

/* One net on the plain cpu backend, one on a copy of its ops without the
 * fused bn + relu: a few SGD steps (ghost batches of 2 in a batch of 5),
 * then an evaluation, must give the same bits; `fused` pairs must have
 * been fused in the first (a count the spec fixes). */
static void s_fused_case(const char *spec, int fused)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 2, 9, 7, err), 0);
    dp_backend_t *be = NULL, *apart = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    CHECK_EQ(dp_backend_new(&apart, "cpu", err), 0);
    dp_backend_ops_t ops = *apart->ops;
    ops.bn_relu_forward = NULL, ops.bn_relu_backward = NULL;
    apart->ops = &ops;
    enum { B = 5 };
    dp_net_t net[2];
    CHECK_EQ(dp_net_init(&net[0], &m, be, B, err), 0);
    CHECK_EQ(dp_net_init(&net[1], &m, apart, B, err), 0);
    int pairs = 0, none = 0, unstored = 0;
    for (int i = 0; i < m.n_layers; i++) pairs += net[0].fuse[i], none += net[1].fuse[i];
    CHECK_EQ(pairs, fused);
    CHECK_EQ(none, 0);
    /* a fused bn's own output has no buffer; every other boundary has one */
    for (int i = 1; i <= m.n_layers; i++) {
        unstored += net[0].d_act[i] == NULL;
        CHECK_EQ(net[0].d_act[i] == NULL, net[0].fuse[i - 1]);
        CHECK(net[1].d_act[i] != NULL);
    }
    CHECK_EQ(unstored, fused);
    CHECK(net[0].n_pool <= net[1].n_pool);
    size_t n = m.n_floats, in = (size_t)B * 2 * 9 * 7;
    float *w[2], *g[2], *x = dp_malloc(in * sizeof(float));
    dp_rng_t r;
    dp_rng_seed(&r, 6);
    s_random(x, in, &r, 1.0f);
    int y[B] = {0, 2, 1, 1, 2}, ok[2];
    float loss[2];
    for (int k = 0; k < 2; k++) {
        w[k] = dp_malloc(n * sizeof(float)), g[k] = dp_malloc(n * sizeof(float));
        dp_model_init_params(&m, w[k], 3);
        net[k].ghost = 2;
        for (int step = 0; step < 3; step++) {
            dp_net_set_params(&net[k], w[k]);
            loss[k] = dp_net_train_step(&net[k], x, y, B);
            dp_net_get_grads(&net[k], g[k]);
            dp_net_get_params(&net[k], w[k]); /* the running statistics */
            for (size_t j = 0; j < n; j++) w[k][j] -= 0.1f * g[k][j];
        }
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    CHECK(memcmp(g[0], g[1], n * sizeof(float)) == 0);
    CHECK(memcmp(w[0], w[1], n * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) {
        dp_net_set_params(&net[k], w[k]);
        loss[k] = dp_net_evaluate(&net[k], x, y, B, &ok[k]);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) dp_net_fini(&net[k]), free(w[k]), free(g[k]);
    dp_backend_destroy(&be);
    dp_backend_destroy(&apart);
    free(x);
}

/* Batch norm and the relu after it as one op (the cpu backend's bn_relu
 * ops, worker/exec/net.c's plan): the same bits as the two apart, in a
 * residual network, with bn first (no input gradient), and not fused
 * where bn's output has a second reader (the shortcut). */
static void test_bn_relu_fused(void)
{
    s_fused_case("conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu "
                 "res:b( conv3x3:8:s2 bn relu conv3x3:8 bn ) relu gap fc:3 softmax", 3);
    s_fused_case("bn relu conv3x3:4 bn relu gap fc:3 softmax", 2);
    s_fused_case("conv3x3:4 bn res( relu conv3x3:4 bn relu ) gap fc:3 softmax", 1);
}

/* A backend's bn_add_relu ops (the CPU has none: the CUDA backend's
 * shape), made of the cpu backend's bn, the add and the relu in the order
 * the executor runs them apart, so a net that fuses the end of a block
 * must give the bits of one that does not. */
static void s_bar_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                          float *d_out, const float *d_in, const float *d_z, const float *d_w,
                          const float *d_b, float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    size_t n = (size_t)B * dp_layer_out_size(l);
    float *t = dp_malloc(n * sizeof(float));
    be->ops->bn_forward(be, l, B, G, train, t, d_in, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
    for (size_t i = 0; i < n; i++) t[i] = t[i] + d_z[i];
    be->ops->relu_forward(be, n, d_out, t);
    free(t);
}

static void s_bar_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                           float *d_dz, float *d_dw, float *d_db, const float *d_dout,
                           const float *d_out, const float *d_in, const float *d_w,
                           const float *d_save)
{
    size_t n = (size_t)B * dp_layer_out_size(l);
    float *t = dp_malloc(n * sizeof(float));
    be->ops->relu_backward(be, n, t, d_dout, d_out);
    if (d_dz) memcpy(d_dz, t, n * sizeof(float));
    be->ops->bn_backward(be, l, B, G, d_din, d_dw, d_db, t, d_in, d_w, d_save);
    free(t);
}

/* The end of a residual block as one op (bn_add_relu, worker/exec/net.c's
 * plan) on the cpu backend given the ops above: the plain cpu's bits,
 * every identity block's end fused and its two inner boundaries unstored,
 * option A's end (a strided, padded shortcut) and a block whose bn input
 * has a second reader not; ghost batches and not. */
static void test_bn_add_relu_fused(void)
{
    const char *spec = "conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu "
                       "res( conv3x3:8:s2 bn relu conv3x3:8 bn ) relu "
                       "res( conv3x3:8 bn relu conv3x3:8 bn ) relu gap fc:3 softmax";
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 2, 9, 7, err), 0);
    dp_backend_t *be = NULL, *fz = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    CHECK_EQ(dp_backend_new(&fz, "cpu", err), 0);
    dp_backend_ops_t ops = *fz->ops;
    ops.bn_add_relu_forward = s_bar_forward, ops.bn_add_relu_backward = s_bar_backward;
    fz->ops = &ops;
    enum { B = 5 };
    dp_net_t net[2];
    CHECK_EQ(dp_net_init(&net[0], &m, be, B, err), 0);
    CHECK_EQ(dp_net_init(&net[1], &m, fz, B, err), 0);
    int ends = 0, pairs = 0, unstored = 0;
    for (int i = 0; i < m.n_layers; i++) {
        ends += net[1].fuse[i] == 2, pairs += net[1].fuse[i] == 1;
        CHECK(net[0].fuse[i] < 2);
    }
    CHECK_EQ(ends, 2); /* the first and the third block's ends; option A's not */
    CHECK_EQ(pairs, 4);
    for (int i = 1; i <= m.n_layers; i++) unstored += net[1].d_act[i] == NULL;
    CHECK_EQ(unstored, 2 * ends + pairs);
    size_t n = m.n_floats, in = (size_t)B * 2 * 9 * 7;
    float *w[2], *g[2], *x = dp_malloc(in * sizeof(float));
    dp_rng_t r;
    dp_rng_seed(&r, 8);
    s_random(x, in, &r, 1.0f);
    int y[B] = {2, 0, 1, 1, 0}, ok[2];
    float loss[2];
    for (int k = 0; k < 2; k++) {
        w[k] = dp_malloc(n * sizeof(float)), g[k] = dp_malloc(n * sizeof(float));
        dp_model_init_params(&m, w[k], 5);
        for (int step = 0; step < 4; step++) {
            net[k].ghost = step % 2 ? 2 : 0;
            dp_net_set_params(&net[k], w[k]);
            loss[k] = dp_net_train_step(&net[k], x, y, B);
            dp_net_get_grads(&net[k], g[k]);
            dp_net_get_params(&net[k], w[k]);
            for (size_t j = 0; j < n; j++) w[k][j] -= 0.1f * g[k][j];
        }
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    CHECK(memcmp(g[0], g[1], n * sizeof(float)) == 0);
    CHECK(memcmp(w[0], w[1], n * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) {
        dp_net_set_params(&net[k], w[k]);
        loss[k] = dp_net_evaluate(&net[k], x, y, B, &ok[k]);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    CHECK_EQ(ok[0], ok[1]);
    for (int k = 0; k < 2; k++) dp_net_fini(&net[k]), free(w[k]), free(g[k]);
    dp_backend_destroy(&be);
    dp_backend_destroy(&fz);
    free(x);
}

/* Ghost batches: one step at batch 2G with --bn-ghost-batch G is the mean
 * of two nets' steps at batch G (the gradient and the running statistics
 * as the sync servers average two workers' pushes). */
static void test_bn_ghost_batch(void)
{
    const char *spec = "conv3x3:4 bn relu res( conv3x3:4 bn relu conv3x3:4 bn ) relu gap fc:3 softmax";
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, spec, 2, 9, 7, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    int G = 3;
    dp_net_t big, small;
    CHECK_EQ(dp_net_init(&big, &m, be, 2 * G, err), 0);
    CHECK_EQ(dp_net_init(&small, &m, be, G, err), 0);
    big.ghost = G;
    size_t n = m.n_floats, in = (size_t)G * 2 * 9 * 7;
    float *params = dp_malloc(n * sizeof(float)), *g = dp_malloc(n * sizeof(float));
    float *h0 = dp_malloc(n * sizeof(float)), *h1 = dp_malloc(n * sizeof(float));
    float *x = dp_malloc(2 * in * sizeof(float));
    dp_rng_t r;
    dp_rng_seed(&r, 4);
    s_random(x, 2 * in, &r, 1.0f);
    int y[6] = {0, 1, 2, 2, 1, 0};
    dp_model_init_params(&m, params, 9);
    dp_net_set_params(&big, params);
    float loss = dp_net_train_step(&big, x, y, 2 * G);
    dp_net_get_grads(&big, g);
    dp_net_set_params(&small, params);
    float l0 = dp_net_train_step(&small, x, y, G);
    dp_net_get_grads(&small, h0);
    dp_net_set_params(&small, params);
    float l1 = dp_net_train_step(&small, x + in, y + G, G);
    dp_net_get_grads(&small, h1);
    CHECK_NEAR(loss, (l0 + l1) / 2, 1e-5);
    int off = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (h0[i] + h1[i]) * 0.5f; /* the sync server's sum, times 1 / R */
        if (fabs(g[i] - want) > 1e-5 + 1e-4 * fabs(want)) off++;
    }
    CHECK_EQ(off, 0);
    dp_net_fini(&big);
    dp_net_fini(&small);
    dp_backend_destroy(&be);
    free(params), free(g), free(h0), free(h1), free(x);
}

/* Evaluation normalises by the running statistics, not the batch's: a batch
 * of one sample evaluates as it does inside a larger batch. */
static void test_bn_eval_uses_running_stats(void)
{
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, "resnet20", 1, 12, 12, err), 0);
    CHECK_STR(m.spec, "resnet20");
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    CHECK_EQ(dp_net_init(&net, &m, be, 4, err), 0);
    float *params = dp_malloc(m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 1);
    dp_rng_t r;
    dp_rng_seed(&r, 2);
    float x[4 * 144];
    s_random(x, 4 * 144, &r, 1.0f);
    int y[4] = {1, 2, 3, 4}, c = 0;
    dp_net_set_params(&net, params);
    dp_net_train_step(&net, x, y, 4); /* running statistics move off 0 / 1 */
    float l4 = dp_net_evaluate(&net, x, y, 4, &c);
    float l1 = dp_net_evaluate(&net, x + 3 * 144, y + 3, 1, &c);
    float l3 = dp_net_evaluate(&net, x, y, 3, &c);
    CHECK_NEAR(l4, (3 * l3 + l1) / 4, 1e-5);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(params);
}

/* --augment: each sample is its image shifted by (dy, dx) in [-4, 4]
 * within zero padding and maybe mirrored; the draw depends on seed, step
 * and the sample's place only (the same call twice: the same bits; another
 * step: another draw), over many samples every shift and both mirrors
 * occur; the padding is the normalised 0 pixel. The prefetch thread of
 * worker rank 1 hands out exactly gather + augment at sample0 = batch. */
static void test_augment(void)
{
    enum { H = 6, W = 5, B = 400 };
    dp_dataset_t ds = {0};
    snprintf(ds.name, sizeof ds.name, "synthetic");
    ds.n = B, ds.c = 1, ds.h = H, ds.w = W, ds.classes = 10;
    ds.pixels = dp_malloc((size_t)B * H * W);
    ds.labels = dp_calloc(B, 1);
    for (int i = 0; i < B * H * W; i++) ds.pixels[i] = (uint8_t)(1 + i % (H * W)); /* never 0 */
    float mean = 0.25f, sd = 0.5f;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_dataset_set_normalize(&ds, &mean, &sd, err), 0);
    float pad = dp_dataset_zero(&ds, 0);
    int *idx = dp_malloc(B * sizeof *idx);
    for (int i = 0; i < B; i++) idx[i] = i;
    float *x = dp_malloc((size_t)B * H * W * sizeof *x), *x0 = dp_malloc((size_t)B * H * W * sizeof *x);
    float *again = dp_malloc((size_t)B * H * W * sizeof *x), tmp[H * W];
    dp_dataset_gather(&ds, idx, B, x0, NULL);
    memcpy(x, x0, (size_t)B * H * W * sizeof *x);
    dp_data_augment(&ds, x, B, 7, 3, 100, tmp);
    int seen[9][9][2] = {{{0}}}, explained = 0;
    for (int b = 0; b < B; b++) {
        const float *in = x0 + (size_t)b * H * W, *out = x + (size_t)b * H * W;
        int found = 0;
        for (int dy = -4; dy <= 4 && !found; dy++)
            for (int dx = -4; dx <= 4 && !found; dx++)
                for (int f = 0; f < 2 && !found; f++) {
                    int same = 1;
                    for (int i = 0; i < H && same; i++)
                        for (int j = 0; j < W && same; j++) {
                            int si = i + dy, sj = (f ? W - 1 - j : j) + dx;
                            float want = si >= 0 && si < H && sj >= 0 && sj < W ? in[si * W + sj] : pad;
                            same = out[i * W + j] == want;
                        }
                    if (same) found = 1, seen[dy + 4][dx + 4][f]++;
                }
        explained += found;
    }
    CHECK_EQ(explained, B);
    int cells = 0;
    for (int a = 0; a < 9; a++)
        for (int c = 0; c < 9; c++) cells += (seen[a][c][0] > 0) + (seen[a][c][1] > 0);
    CHECK(cells > 120); /* 162 cells, 400 draws: about 147 expected */
    memcpy(again, x0, (size_t)B * H * W * sizeof *x);
    dp_data_augment(&ds, again, B, 7, 3, 100, tmp);
    CHECK(memcmp(again, x, (size_t)B * H * W * sizeof *x) == 0);
    memcpy(again, x0, (size_t)B * H * W * sizeof *x);
    dp_data_augment(&ds, again, B, 7, 4, 100, tmp);
    CHECK(memcmp(again, x, (size_t)B * H * W * sizeof *x) != 0);
    /* sample 100 + b of the call at sample0 100 is sample b of one at 100 + b */
    memcpy(again, x0 + 5 * H * W, H * W * sizeof *x);
    dp_data_augment(&ds, again, 1, 7, 3, 105, tmp);
    CHECK(memcmp(again, x + 5 * H * W, H * W * sizeof *x) == 0);

    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    dp_batcher_t bt;
    CHECK_EQ(dp_batcher_init_at(&bt, &ds, be, 4, 1, 2, 9, 0, 6, 1, err), 0);
    dp_batch_t bb;
    long step;
    int bi[4], differs = 0;
    float want[4 * H * W];
    while ((step = dp_batcher_next(&bt, &bb)) >= 0) {
        dp_data_batch_indices(B, 4, 1, 2, 9, step, bi);
        dp_dataset_gather(&ds, bi, 4, want, NULL);
        differs |= memcmp(want, bb.x, sizeof want) != 0;
        dp_data_augment(&ds, want, 4, 9, step, 4, tmp);
        CHECK(memcmp(want, bb.x, sizeof want) == 0);
    }
    CHECK(differs); /* it did augment */
    dp_batcher_fini(&bt);
    dp_backend_destroy(&be);
    free(idx);
    free(x);
    free(x0);
    free(again);
    dp_dataset_fini(&ds);
}

DP_TESTS(T(test_network_gradient_matches_finite_differences), T(test_loss_falls_under_sgd),
         T(test_ac_gradients_match_finite_differences), T(test_ac_act),
         T(test_train_step_device_copies_grads), T(test_global_batch_order),
         T(test_batcher_matches_rule), T(test_resnet_gradients_match_finite_differences),
         T(test_bn_ghost_batch), T(test_bn_eval_uses_running_stats), T(test_bn_relu_fused), T(test_bn_add_relu_fused),
         T(test_augment), T(test_on_grads_hook), T(test_on_params_hook),
         T(test_on_params_fails), T(test_input_gradient))
