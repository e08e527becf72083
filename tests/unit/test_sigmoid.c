/* test_sigmoid: the binary head (model spec "sigmoid"; kernels/ops.h
 * dp_sigmoid_xent_forward, backward):
 *  - the kernels' loss against the plain definition, -log sigmoid(z) for
 *    label 1 and -log(1 - sigmoid(z)) for 0, and their gradients of the
 *    logits and the bias against central differences of it, the fast
 *    kernels and the double references alike; a logit of +-80 stays finite
 *    (the stable form) and its probabilities are exact 0 / 1, not NaN
 *  - the CPU backend's ops are the kernels
 *  - the whole net, "embed:1 sigmoid" (the bias and the embedding's output)
 *    and "fc:4 tanh fc:1 sigmoid", against central differences of its
 *    evaluated loss
 *  - the same against PyTorch (tests/torch_sigmoid.py, $TORCH_PY, default
 *    Debian's /usr/bin/python3; skipped without torch): the fc model's file
 *    loads with load_state_dict(strict=True) into nn.Linear(.., 1) layers
 *    whose BCEWithLogitsLoss and gradients are Downpour's; logistic
 *    regression's head is BCEWithLogitsLoss(x + bias, y)
 *  - FTRL-Proximal's rows (kernels/row_optim.c, the row table) against
 *    McMahan et al. 2013's Algorithm 1 written out here literally: state z
 *    and n only, each weight computed from them when a sample is predicted,
 *    sigma from n before and after, over 40 samples (each a batch of one,
 *    as the algorithm takes them) of sparse features with repeated keys,
 *    with l1 that zeroes some weights and l2; the predictions too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "server/core/rows.h"
#include "worker/exec/net.h"
#include "tests/test.h"

#define B_MAX 16

/* The mean loss from the definition, in double: no stable form, so that a
 * kernel's rewriting of it is checked, not copied. */
static double s_bce(const double *z, double bias, const int *y, int B)
{
    double loss = 0;
    for (int n = 0; n < B; n++) {
        double p = 1.0 / (1.0 + exp(-(z[n] + bias)));
        loss -= y[n] ? log(p) : log(1.0 - p);
    }
    return loss / B;
}

/* The kernels (fast or reference) on logits z with bias: loss, the
 * logits' gradient g and the bias's *gb, checked against s_bce and its
 * central differences. */
static void s_check_kernel(int ref, const float *z, float bias, const int *y, int B)
{
    float probs[2 * B_MAX], g[B_MAX], gb = NAN;
    float loss = ref ? dp_sigmoid_xent_forward_ref(probs, z, &bias, y, B)
                     : dp_sigmoid_xent_forward(probs, z, &bias, y, B);
    if (ref)
        dp_sigmoid_xent_backward_ref(g, &gb, probs, y, B);
    else
        dp_sigmoid_xent_backward(g, &gb, probs, y, B);
    double x[B_MAX], b = bias, h = 1e-4;
    for (int n = 0; n < B; n++) x[n] = z[n];
    double want = s_bce(x, b, y, B);
    CHECK_NEAR(loss, want, 1e-6 * (1 + fabs(want)));
    double sum = 0;
    for (int n = 0; n < B; n++) {
        CHECK_NEAR(probs[2 * n] + probs[2 * n + 1], 1.0, 1e-6);
        CHECK_NEAR(probs[2 * n + 1], 1.0 / (1.0 + exp(-(x[n] + b))), 1e-7);
        double keep = x[n];
        x[n] = keep + h;
        double up = s_bce(x, b, y, B);
        x[n] = keep - h;
        double down = s_bce(x, b, y, B);
        x[n] = keep;
        double fd = (up - down) / (2 * h);
        if (fabs(g[n] - fd) > 1e-6 + 1e-4 * fabs(fd))
            fprintf(stderr, "  %s: dlogit[%d] %.8g, finite difference %.8g\n", ref ? "ref" : "fast",
                    n, g[n], fd);
        CHECK(fabs(g[n] - fd) <= 1e-6 + 1e-4 * fabs(fd));
        sum += fd;
    }
    double fdb = (s_bce(x, b + h, y, B) - s_bce(x, b - h, y, B)) / (2 * h);
    CHECK_NEAR(gb, fdb, 1e-6 + 1e-4 * fabs(fdb));
    CHECK_NEAR(gb, sum, 1e-5); /* the bias's gradient is the logits' sum */
    /* no bias pointer: as a bias of 0 */
    float p0[2 * B_MAX], g0[B_MAX];
    float l0 = dp_sigmoid_xent_forward(p0, z, NULL, y, B);
    for (int n = 0; n < B; n++) x[n] = z[n];
    CHECK_NEAR(l0, s_bce(x, 0, y, B), 1e-6 * (1 + l0));
    dp_sigmoid_xent_backward(g0, NULL, p0, y, B);
    CHECK_NEAR(g0[0], (1.0 / (1.0 + exp(-x[0])) - y[0]) / B, 1e-7);
}

static void test_loss_and_gradient(void)
{
    dp_rng_t r;
    dp_rng_seed(&r, 3);
    float z[B_MAX];
    int y[B_MAX];
    for (int n = 0; n < B_MAX; n++) {
        z[n] = 8.0f * dp_rng_uniform(&r) - 4.0f;
        y[n] = dp_rng_uniform(&r) < 0.5f;
    }
    for (int ref = 0; ref < 2; ref++) {
        s_check_kernel(ref, z, 0.3f, y, B_MAX);
        s_check_kernel(ref, z, -1.7f, y, 5);
    }
    /* the stable form: confident logits give a finite loss about the logit
     * when wrong, about 0 when right, and exact probabilities */
    float big[4] = {80, -80, 80, -80}, probs[8], g[4], gb;
    int yy[4] = {1, 0, 0, 1};
    for (int ref = 0; ref < 2; ref++) {
        float loss = ref ? dp_sigmoid_xent_forward_ref(probs, big, NULL, yy, 4)
                         : dp_sigmoid_xent_forward(probs, big, NULL, yy, 4);
        CHECK_NEAR(loss, (0 + 0 + 80 + 80) / 4.0, 1e-4);
        CHECK(probs[1] == 1.0f && probs[0] < 1e-30f && probs[3] < 1e-30f && probs[2] == 1.0f);
        dp_sigmoid_xent_backward(g, &gb, probs, yy, 4);
        CHECK(g[0] == 0.0f && g[2] == 0.25f && g[3] == -0.25f);
        CHECK_NEAR(gb, 0.0, 1e-7);
    }
    /* labels NULL: the probabilities only */
    CHECK_EQ(dp_sigmoid_xent_forward(probs, big, NULL, NULL, 4), 0.0f);
    CHECK_EQ(probs[1], 1.0f);
}

/* The CPU backend's table reaches the kernels. */
static void test_backend_ops(void)
{
    char err[DP_ERR_LEN] = "";
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    if (!be) return;
    float z[3] = {0.5f, -2.0f, 3.0f}, bias = 0.25f, p1[6], p2[6], l1 = NAN, g1[3], g2[3], b1, b2;
    int y[3] = {1, 0, 0};
    CHECK(be->ops->sigmoid_xent_forward && be->ops->sigmoid_xent_backward);
    be->ops->sigmoid_xent_forward(be, 3, p1, &l1, z, &bias, y);
    float l2 = dp_sigmoid_xent_forward(p2, z, &bias, y, 3);
    CHECK(l1 == l2 && memcmp(p1, p2, sizeof p1) == 0);
    be->ops->sigmoid_xent_backward(be, 3, g1, &b1, p1, y);
    dp_sigmoid_xent_backward(g2, &b2, p2, y, 3);
    CHECK(b1 == b2 && memcmp(g1, g2, sizeof g1) == 0);
    dp_backend_destroy(&be);
}

/* spec on inputs of C x 1 x 1 through dp_net: every parameter's gradient
 * and the input's (an embedding's output) against central differences of
 * the evaluated loss, in float (h 1e-2, so tolerances of 2e-3). */
static void s_check_net(const char *spec, int C)
{
    char err[DP_ERR_LEN] = "";
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, spec, C, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    int B = 6, y[6] = {1, 0, 0, 1, 1, 0}, ok;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    size_t n = m.n_floats, nx = (size_t)B * m.in_c;
    float *w = dp_malloc(n * sizeof(float)), *g = dp_malloc(n * sizeof(float));
    float x[6 * 8], dx[6 * 8];
    dp_model_init_params(&m, w, 11);
    if (m.embed_dim) w[0] = 0.4f; /* the bias away from its 0 */
    dp_rng_t r;
    dp_rng_seed(&r, 4);
    for (size_t i = 0; i < nx; i++) x[i] = 2.0f * dp_rng_uniform(&r) - 1.0f;
    dp_net_set_params(&net, w);
    float loss = dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, g);
    if (m.embed_dim) dp_net_get_input_grad(&net, dx, B);
    CHECK(isfinite(loss) && loss > 0);
    float h = 1e-2f;
    int bad = 0;
    for (size_t i = 0; i < n + (m.embed_dim ? nx : 0); i++) {
        float *v = i < n ? &w[i] : &x[i - n], keep = *v;
        *v = keep + h;
        dp_net_set_params(&net, w);
        double up = dp_net_evaluate(&net, x, y, B, &ok);
        *v = keep - h;
        dp_net_set_params(&net, w);
        double down = dp_net_evaluate(&net, x, y, B, &ok);
        *v = keep;
        double fd = (up - down) / (2 * h), got = i < n ? g[i] : dx[i - n];
        if (fabs(got - fd) > 2e-3 + 2e-3 * fabs(fd) && bad++ < 3)
            fprintf(stderr, "  %s: %s %zu: gradient %.6g, finite difference %.6g\n", spec,
                    i < n ? "float" : "input", i < n ? i : i - n, got, fd);
    }
    CHECK_EQ(bad, 0);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(w), free(g);
}

static void test_net_gradients(void)
{
    s_check_net("embed:1 sigmoid", 1);
    s_check_net("embed:3 tanh fc:1 sigmoid", 3);
    s_check_net("fc:4 tanh fc:1 sigmoid", 6);
}

/* ---- FTRL-Proximal, McMahan et al. 2013, Algorithm 1 --------------------- */

#define FT_KEYS 12

/* Algorithm 1's state: z and n per coordinate (a key here), nothing else. */
typedef struct {
    double z[FT_KEYS], n[FT_KEYS];
} s_ftrl_ref_t;

/* w_{t,i} from (z_i, n_i): 0 if |z_i| <= l1, else
 * -((beta + sqrt(n_i)) / alpha + l2)^-1 (z_i - sgn(z_i) l1). */
static double s_ftrl_ref_w(const s_ftrl_ref_t *r, int i, double a, double b, double l1, double l2)
{
    double z = r->z[i];
    if (fabs(z) <= l1) return 0;
    return -(z - (z > 0 ? l1 : -l1)) / ((b + sqrt(r->n[i])) / a + l2);
}

static void test_ftrl_algorithm1(void)
{
    const double alpha = 0.3, beta = 1.0, l1 = 1.0, l2 = 0.5;
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 1, DP_ROW_FTRL);
    c.optim.lr = (float)alpha;
    c.optim.ftrl_beta = (float)beta;
    c.optim.l1 = (float)l1;
    c.optim.l2 = (float)l2;
    char err[DP_ERR_LEN] = "";
    dp_rows_t *t = dp_rows_new(&c, err);
    CHECK(t != NULL);
    if (!t) return;
    s_ftrl_ref_t ref;
    memset(&ref, 0, sizeof ref);
    dp_rng_t r;
    dp_rng_seed(&r, 21);
    int zeros = 0, nonzero = 0;
    for (int s = 0; s < 40; s++) {
        /* a sample: 3 distinct keys of 12 (the low ones more often), values
         * in [0.5, 1.5), its label from a planted rule */
        uint64_t keys[3];
        double x[3], planted = 0;
        for (int j = 0; j < 3; j++) {
            int k;
            do {
                k = (int)(FT_KEYS * dp_rng_uniform(&r) * dp_rng_uniform(&r));
            } while ((j > 0 && keys[0] == (uint64_t)k) || (j > 1 && keys[1] == (uint64_t)k));
            keys[j] = (uint64_t)k;
            x[j] = 0.5 + dp_rng_uniform(&r);
            planted += (k % 3 == 0 ? 1.0 : -0.7) * x[j];
        }
        int y = dp_rng_uniform(&r) < 1.0 / (1.0 + exp(-planted));
        /* Algorithm 1: the weights from (z, n), the prediction */
        double wr[3], dot = 0;
        for (int j = 0; j < 3; j++) dot += (wr[j] = s_ftrl_ref_w(&ref, (int)keys[j], alpha, beta, l1, l2)) * x[j];
        double p_ref = 1.0 / (1.0 + exp(-dot));
        /* Downpour: the rows as a worker pulls them, the head's p, the
         * rows' gradient g_i = (p - y) x_i pushed */
        float w[3], logit = 0, probs[2], dlogit, g[3];
        CHECK(dp_rows_pull(t, keys, 3, 1, w, err) >= 0);
        for (int j = 0; j < 3; j++) {
            CHECK_NEAR(w[j], wr[j], 1e-6);
            logit += w[j] * (float)x[j];
        }
        dp_sigmoid_xent_forward(probs, &logit, NULL, &y, 1);
        dp_sigmoid_xent_backward(&dlogit, NULL, probs, &y, 1);
        CHECK_NEAR(probs[1], p_ref, 1e-6);
        for (int j = 0; j < 3; j++) g[j] = dlogit * (float)x[j];
        CHECK_EQ(dp_rows_push(t, (uint64_t)s + 1, keys, 3, 1, g, err), 3);
        /* Algorithm 1's update of each i in I */
        for (int j = 0; j < 3; j++) {
            int i = (int)keys[j];
            double gi = (p_ref - y) * x[j];
            double sigma = (sqrt(ref.n[i] + gi * gi) - sqrt(ref.n[i])) / alpha;
            ref.z[i] += gi - sigma * wr[j];
            ref.n[i] += gi * gi;
        }
    }
    for (int i = 0; i < FT_KEYS; i++) {
        uint64_t k = (uint64_t)i;
        float w;
        CHECK(dp_rows_pull(t, &k, 1, 1, &w, err) >= 0);
        double want = s_ftrl_ref_w(&ref, i, alpha, beta, l1, l2);
        CHECK_NEAR(w, want, 1e-6);
        zeros += ref.n[i] > 0 && want == 0;
        nonzero += want != 0;
    }
    CHECK(zeros > 0 && nonzero > 0); /* l1 held some seen keys at exactly 0, not all */
    dp_rows_destroy(&t);
}

static const char *s_py(void)
{
    const char *p = getenv("TORCH_PY");
    return p && p[0] ? p : "/usr/bin/python3";
}

/* Logistic regression's head: the embedding's outputs x, the bias, its
 * loss and gradients into dir/lr.safetensors. */
static void s_write_lr(const char *dir, char *err)
{
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, "embed:1 sigmoid", 1, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    enum { B = 9 };
    int y[B] = {1, 1, 0, 1, 0, 0, 0, 1, 1};
    float x[B] = {0.3f, -1.2f, 2.5f, 0.0f, -0.7f, 4.0f, -3.0f, 1.1f, 9.0f}, yf[B], dx[B];
    float bias = -0.35f, dbias = NAN;
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    dp_net_set_params(&net, &bias);
    float loss = dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, &dbias);
    dp_net_get_input_grad(&net, dx, B);
    for (int b = 0; b < B; b++) yf[b] = (float)y[b];
    int64_t sb[1] = {B}, s1[1] = {1};
    dp_st_tensor_t t[6] = {{"x", x, 1, sb},        {"y", yf, 1, sb},   {"bias", &bias, 1, s1},
                           {"loss", &loss, 1, s1}, {"dx", dx, 1, sb},  {"dbias", &dbias, 1, s1}};
    char path[512];
    snprintf(path, sizeof path, "%s/lr.safetensors", dir);
    CHECK_EQ(dp_safetensors_write(path, t, 6, NULL, err), 0);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
}

static void test_matches_pytorch(void)
{
    char cmd[1024], dir[256], path[512], err[DP_ERR_LEN] = "";
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' 2>/dev/null", s_py());
    if (system(cmd) != 0) SKIP("no python3-torch ($TORCH_PY)");
    snprintf(dir, sizeof dir, "/tmp/dp-test-sigmoid-%d", (int)getpid());
    CHECK_EQ(mkdir(dir, 0755), 0);
    dp_model_t m;
    CHECK_EQ(dp_model_parse(&m, "fc:4 tanh fc:1 sigmoid", 6, 1, 1, err), 0);
    dp_backend_t *be = NULL;
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    dp_net_t net;
    enum { B = 8 };
    CHECK_EQ(dp_net_init(&net, &m, be, B, err), 0);
    size_t n = m.n_floats;
    float *w = dp_malloc(n * sizeof(float)), *g = dp_malloc(n * sizeof(float));
    float x[B * 6], yf[B], p1[B];
    int y[B] = {1, 0, 0, 1, 1, 1, 0, 1}, ok;
    dp_model_init_params(&m, w, 5);
    dp_rng_t r;
    dp_rng_seed(&r, 6);
    for (int i = 0; i < B * 6; i++) x[i] = 4.0f * dp_rng_uniform(&r) - 2.0f;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_EQ(dp_checkpoint_save(path, &m, w, 0, 0, NULL, err), 0);
    dp_net_set_params(&net, w);
    dp_net_evaluate(&net, x, y, B, &ok);
    for (int b = 0; b < B; b++) p1[b] = net.h_probs[2 * b + 1], yf[b] = (float)y[b];
    float loss = dp_net_train_step(&net, x, y, B);
    dp_net_get_grads(&net, g);
    dp_st_tensor_t t[4 + DP_MAX_PARAMS];
    int64_t sx[2] = {B, 6}, sb[1] = {B}, s1[1] = {1}, shapes[8][DP_PARAM_MAX_DIMS];
    char names[8][DP_PARAM_NAME_LEN + 8];
    int k = 0;
    t[k++] = (dp_st_tensor_t){"x", x, 2, sx};
    t[k++] = (dp_st_tensor_t){"y", yf, 1, sb};
    t[k++] = (dp_st_tensor_t){"loss", &loss, 1, s1};
    t[k++] = (dp_st_tensor_t){"p1", p1, 1, sb};
    for (int i = 0; i < m.n_params && i < 8; i++) {
        const dp_param_t *p = &m.params[i];
        for (int d = 0; d < p->ndim; d++) shapes[i][d] = p->shape[d];
        snprintf(names[i], sizeof names[i], "grad.%s", p->name);
        t[k++] = (dp_st_tensor_t){names[i], g + p->offset, p->ndim, shapes[i]};
    }
    snprintf(path, sizeof path, "%s/step.safetensors", dir);
    CHECK_EQ(dp_safetensors_write(path, t, k, NULL, err), 0);
    s_write_lr(dir, err);
    snprintf(cmd, sizeof cmd, "'%s' tests/torch_sigmoid.py '%s' >&2", s_py(), dir);
    CHECK_EQ(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "  cannot remove %s\n", dir);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    free(w), free(g);
}

DP_TESTS(T(test_loss_and_gradient), T(test_backend_ops), T(test_net_gradients), T(test_ftrl_algorithm1),
         T(test_matches_pytorch))
