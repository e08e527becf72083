/* test_backend_cpu: the "cpu" backend — its memory calls (zeroed, aligned,
 * copies, the overlap copies), that every layer op gives what the kernel
 * does on dims built by hand from the layer, optim_step against
 * dp_optim_step and a hand computation, prepare's bad input, and the
 * backend picker. */
#include <stdint.h>
#include <string.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/test.h"

static dp_rng_t s_rng;

static void s_fill(float *p, size_t n)
{
    static int seeded;
    if (!seeded) {
        dp_rng_seed(&s_rng, 99);
        seeded = 1;
    }
    for (size_t i = 0; i < n; i++) p[i] = 2.0f * dp_rng_uniform(&s_rng) - 1.0f;
}

static void test_memory(void)
{
    dp_backend_t *be = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_backend_new(&be, "cpu", err), 0);
    CHECK(be != NULL);
    if (!be) return;
    CHECK_STR(be->name, "cpu");
    size_t n = 1000;
    float *d = be->ops->alloc(be, n * sizeof(float));
    CHECK_EQ((uintptr_t)d % 64, 0);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= d[i] == 0.0f;
    CHECK(zero);
    float *h = be->ops->host_alloc(be, n * sizeof(float)), *back = be->ops->host_alloc(be, n * sizeof(float));
    s_fill(h, n);
    be->ops->upload(be, d, h, n * sizeof(float));
    be->ops->synchronize(be);
    be->ops->download(be, back, d, n * sizeof(float));
    CHECK_CLOSE("roundtrip", back, h, n, 0, 0);
    be->ops->upload(be, d, h, 0); /* empty copies are fine */
    be->ops->host_release(be, h);
    be->ops->host_release(be, back);
    be->ops->release(be, d);
    dp_backend_destroy(&be);
    CHECK(be == NULL);
    dp_backend_destroy(&be); /* safe twice */
    CHECK_EQ(dp_backend_new(&be, "tpu:0", err), -1);
    CHECK(strstr(err, "tpu") != NULL);
}

static void test_prepare_bad(void)
{
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(&m, DP_MODEL_DEFAULT_SPEC, 1, 28, 28, err), 0);
    CHECK_EQ(be->ops->prepare(be, &m, 0, err), -1);
    CHECK(strstr(err, "max_batch") != NULL);
    CHECK_EQ(be->ops->prepare(be, &m, 16, err), 0);
    dp_backend_destroy(&be);
}

/* Each op through the backend equals the kernel called directly. */
static void test_ops_match_kernels(void)
{
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    /* stride-3 pool with leftovers, valid and same convs, two fc */
    CHECK_EQ(dp_model_parse(&m, "conv3x3:4 relu maxpool3 conv5x5:6:valid maxpool2 fc:7 relu fc:5 softmax",
                            2, 23, 22, err), 0);
    int B = 3;
    CHECK_EQ(be->ops->prepare(be, &m, B, err), 0);
    size_t big = (size_t)B * 2 * 23 * 22 * 8;
    float *x = be->ops->alloc(be, big * sizeof(float)), *g = be->ops->alloc(be, big * sizeof(float));
    float *y1 = be->ops->alloc(be, big * sizeof(float)), *y2 = dp_aligned_alloc(big * sizeof(float));
    float *a1 = be->ops->alloc(be, big * sizeof(float)), *a2 = dp_aligned_alloc(big * sizeof(float));
    float *b1 = be->ops->alloc(be, big * sizeof(float)), *b2 = dp_aligned_alloc(big * sizeof(float));
    float *c1 = be->ops->alloc(be, big * sizeof(float)), *c2 = dp_aligned_alloc(big * sizeof(float));
    float *params = be->ops->alloc(be, m.n_floats * sizeof(float));
    dp_model_init_params(&m, params, 3);
    s_fill(x, big);
    s_fill(g, big);
    for (int li = 0; li < m.n_layers; li++) {
        const dp_layer_t *l = &m.layers[li];
        size_t nin = (size_t)B * l->in_c * l->in_h * l->in_w;
        size_t nout = (size_t)B * dp_layer_out_size(l);
        const float *w = l->weight >= 0 ? params + m.params[l->weight].offset : NULL;
        const float *b = l->bias >= 0 ? params + m.params[l->bias].offset : NULL;
        if (l->kind == DP_LAYER_CONV) {
            dp_conv_dims_t d = {B, l->in_c, l->in_h, l->in_w, l->out_c, l->k, l->pad, l->stride, 0, 0};
            dp_conv_dims_finish(&d);
            CHECK_EQ(d.OH, l->out_h);
            CHECK_EQ(d.OW, l->out_w);
            be->ops->conv_forward(be, l, B, y1, x, w, b);
            dp_conv2d_forward(y2, x, w, b, &d);
            CHECK_CLOSE(l->name, y1, y2, nout, 0, 0);
            size_t nw = m.params[l->weight].count;
            be->ops->conv_backward(be, l, B, a1, b1, c1, g, x, w);
            dp_conv2d_backward(a2, b2, c2, g, x, w, &d);
            CHECK_CLOSE("conv din", a1, a2, nin, 0, 0);
            CHECK_CLOSE("conv dw", b1, b2, nw, 0, 0);
            CHECK_CLOSE("conv db", c1, c2, (size_t)l->out_c, 0, 0);
            be->ops->conv_backward(be, l, B, NULL, b1, c1, g, x, w);
            CHECK_CLOSE("conv dw, no din", b1, b2, nw, 0, 0);
        } else if (l->kind == DP_LAYER_MAXPOOL) {
            dp_pool_dims_t d = {B, l->in_c, l->in_h, l->in_w, l->k, l->stride, 0, 0};
            dp_pool_dims_finish(&d);
            CHECK_EQ(d.OH, l->out_h);
            be->ops->maxpool_forward(be, l, B, y1, x);
            dp_maxpool_forward(y2, x, &d);
            CHECK_CLOSE("maxpool", y1, y2, nout, 0, 0);
            be->ops->maxpool_backward(be, l, B, a1, g, x, y1);
            dp_maxpool_backward(a2, g, x, y2, &d);
            CHECK_CLOSE("maxpool din", a1, a2, nin, 0, 0);
        } else if (l->kind == DP_LAYER_RELU) {
            be->ops->relu_forward(be, nout, y1, x);
            dp_relu_forward(y2, x, nout);
            CHECK_CLOSE("relu", y1, y2, nout, 0, 0);
            be->ops->relu_backward(be, nout, a1, g, y1);
            dp_relu_backward(a2, g, y2, nout);
            CHECK_CLOSE("relu din", a1, a2, nout, 0, 0);
        } else if (l->kind == DP_LAYER_FC) {
            int IN = l->in_c * l->in_h * l->in_w;
            be->ops->fc_forward(be, l, B, y1, x, w, b);
            dp_fc_forward(y2, x, w, b, B, IN, l->out_c);
            CHECK_CLOSE(l->name, y1, y2, nout, 0, 0);
            be->ops->fc_backward(be, l, B, a1, b1, c1, g, x, w);
            dp_fc_backward(a2, b2, c2, g, x, w, B, IN, l->out_c);
            CHECK_CLOSE("fc din", a1, a2, nin, 0, 0);
            CHECK_CLOSE("fc dw", b1, b2, (size_t)IN * l->out_c, 0, 0);
            CHECK_CLOSE("fc db", c1, c2, (size_t)l->out_c, 0, 0);
        } else if (l->kind == DP_LAYER_SOFTMAX) {
            int labels[3] = {4, 0, 2};
            int *d_labels = be->ops->alloc(be, sizeof labels);
            be->ops->upload(be, d_labels, labels, sizeof labels);
            float l1 = 0;
            be->ops->softmax_xent_forward(be, B, m.classes, y1, &l1, x, d_labels);
            float l2 = dp_softmax_xent_forward(y2, x, labels, B, m.classes);
            CHECK_NEAR(l1, l2, 0);
            CHECK_CLOSE("softmax", y1, y2, nout, 0, 0);
            be->ops->softmax_xent_backward(be, B, m.classes, a1, y1, d_labels);
            dp_softmax_xent_backward(a2, y2, labels, B, m.classes);
            CHECK_CLOSE("softmax grad", a1, a2, nout, 0, 0);
            be->ops->release(be, d_labels);
        }
    }
    be->ops->release(be, x), be->ops->release(be, g), be->ops->release(be, y1), be->ops->release(be, a1);
    be->ops->release(be, b1), be->ops->release(be, c1), be->ops->release(be, params);
    free(y2), free(a2), free(b2), free(c2);
    dp_backend_destroy(&be);
}

/* optim_step is dp_optim_step on the backend's memory: bit for bit, for
 * every optimizer (the rules themselves are tested in test_optim); and a
 * worked momentum example. */
static void test_optim_step(void)
{
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    size_t n = 70001; /* odd */
    for (int k = 0; k < DP_OPT_KINDS; k++) {
        dp_optim_conf_t c;
        dp_optim_conf_default(&c);
        c.kind = (dp_optim_kind_t)k;
        c.weight_decay = 0.01f;
        size_t ns = n * (size_t)dp_optim_state_per_param(c.kind) + 1;
        float *w = be->ops->alloc(be, n * sizeof(float)), *g = be->ops->alloc(be, n * sizeof(float));
        float *st = be->ops->alloc(be, ns * sizeof(float));
        float *w2 = dp_malloc(n * sizeof(float)), *st2 = dp_calloc(ns, sizeof(float));
        s_fill(w, n);
        memcpy(w2, w, n * sizeof(float));
        for (long t = 1; t <= 3; t++) {
            s_fill(g, n);
            be->ops->optim_step(be, &c, 0.01f, w, g, st, n, t);
            dp_optim_step(&c, 0.01f, w2, g, st2, n, t);
        }
        CHECK_CLOSE(dp_optim_kind_name(c.kind), w, w2, n, 0, 0);
        CHECK_CLOSE("state", st, st2, ns, 0, 0);
        be->ops->release(be, w), be->ops->release(be, g), be->ops->release(be, st);
        free(w2), free(st2);
    }
    /* w = 1, g = 0.5, lr 0.1, mu 0.9 */
    dp_optim_conf_t c;
    dp_optim_conf_default(&c);
    c.kind = DP_OPT_MOMENTUM;
    float w = 1.0f, v = 0.0f, g = 0.5f;
    be->ops->optim_step(be, &c, 0.1f, &w, &g, &v, 1, 1); /* v = 0.5, w = 0.95 */
    CHECK_NEAR(v, 0.5, 1e-7);
    CHECK_NEAR(w, 0.95, 1e-7);
    be->ops->optim_step(be, &c, 0.1f, &w, &g, &v, 1, 2); /* v = 0.95, w = 0.855 */
    CHECK_NEAR(v, 0.95, 1e-7);
    CHECK_NEAR(w, 0.855, 1e-6);
    dp_backend_destroy(&be);
}

/* The overlap copies are plain copies on the cpu. */
static void test_copies(void)
{
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    size_t n = 1001;
    float *src = be->ops->host_alloc(be, n * sizeof(float)), *dst = be->ops->host_alloc(be, n * sizeof(float));
    float *d = be->ops->alloc(be, n * sizeof(float));
    s_fill(src, n);
    be->ops->stage_upload(be, d, src, n * sizeof(float));
    be->ops->download_async(be, dst, d, n * sizeof(float));
    be->ops->download_wait(be);
    CHECK_CLOSE("round trip", dst, src, n, 0, 0);
    be->ops->host_release(be, src), be->ops->host_release(be, dst), be->ops->release(be, d);
    dp_backend_destroy(&be);
}

/* cpu:staged: a device's memory model on the CPU's ops. Its download_async
 * copies are made at the wait that covers them, in order, the first n at
 * download_wait_first(n); download_wait makes the rest and starts the
 * count again; upload_async is done when it returns (as the ops are). */
static void test_staged_copies(void)
{
    dp_backend_t *be = NULL;
    char err[DP_ERR_LEN] = "";
    CHECK(dp_backend_new(&be, "cpu:staged", err) == 0);
    CHECK(be && !be->host_memory && strcmp(be->name, "cpu:staged") == 0);
    if (!be) return;
    enum { N = 3, K = 17 };
    float *d = be->ops->alloc(be, N * K * sizeof(float));
    float *h = be->ops->host_alloc(be, N * K * sizeof(float));
    float src[N * K];
    s_fill(src, N * K);
    be->ops->upload_async(be, d, src, sizeof src);
    for (int r = 0; r < 2; r++) { /* twice: the count starts again after download_wait */
        memset(h, 0, N * K * sizeof(float));
        for (int k = 0; k < N; k++) be->ops->download_async(be, h + k * K, d + k * K, K * sizeof(float));
        CHECK(h[0] == 0 && h[K] == 0); /* noted, not made */
        be->ops->download_wait_first(be, 1);
        CHECK_CLOSE("first copy", h, src, K, 0, 0);
        CHECK(h[K] == 0 && h[2 * K] == 0);
        be->ops->download_wait_first(be, 2);
        CHECK_CLOSE("second copy", h + K, src + K, K, 0, 0);
        CHECK(h[2 * K] == 0);
        be->ops->download_wait_first(be, 1); /* already made: nothing again */
        be->ops->download_wait(be);
        CHECK_CLOSE("all copies", h, src, N * K, 0, 0);
    }
    be->ops->download_wait_first(be, 5); /* none queued: no copy, no crash */
    be->ops->host_release(be, h), be->ops->release(be, d);
    dp_backend_destroy(&be);
    CHECK(dp_backend_new(&be, "cpu:stage", err) != 0 && strstr(err, "cpu:staged"));
}

DP_TESTS(T(test_memory), T(test_prepare_bad), T(test_ops_match_kernels),
         T(test_optim_step), T(test_copies), T(test_staged_copies))
