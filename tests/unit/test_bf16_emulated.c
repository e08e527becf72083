/* test_bf16_emulated: the "emulated" bf16 path (kernels/cpu/bf16_emulated.h)
 * and the CPU backend in bf16.
 *  - each pass of dp_bf16_emulated equals ops.h's _ref on the operands
 *    rounded as bf16_ops.h says (forward: in, w; din: dout, w; dw: dout,
 *    in; the bias's gradient on dout unrounded), to the fp32 sums' order,
 *    on awkward shapes, on every CPU kernel path; and differs from the
 *    reference on the unrounded operands by more than that (the rounding
 *    happened)
 *  - the backend made in bf16 under DP_TEST_BF16=emulated names its path
 *    and its conv and fc ops give the table's bits (not fp32's); prepare
 *    in bf16 runs; without the hook bf16 is refused with one line on this
 *    CPU (skipped where it has a native path), on cuda always; a bad
 *    precision name is refused */
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/bf16_emulated.h"
#include "kernels/ops.h"
#include "tests/test.h"
#include "tests/cpu_paths.h"

/* the fp32 sums' order against the reference's double sums */
#define S_TOL 2e-5

static dp_rng_t s_rng;

static float *s_rand(size_t n)
{
    float *p = dp_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = 2.0f * dp_rng_uniform(&s_rng) - 1.0f;
    return p;
}

static float *s_rounded(const float *x, size_t n)
{
    float *r = dp_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) r[i] = dp_bf16_round(x[i]);
    return r;
}

/* 1 when some element of a and b differ by more than the tolerance. */
static int s_apart(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        if (d < 0) d = -d;
        if (d > S_TOL + S_TOL * (b[i] < 0 ? -b[i] : b[i])) return 1;
    }
    return 0;
}

/* The shapes: odd sizes, stride 2, a 1x1, a 5x5 with pad 2, one long
 * enough for the direct SIMD kernels (C K K >= 64, OC 16) and threads. */
static const dp_conv_dims_t s_shapes[] = {
    {.B = 3, .C = 5, .H = 7, .W = 9, .OC = 6, .K = 3, .pad = 1, .stride = 2},
    {.B = 2, .C = 7, .H = 5, .W = 5, .OC = 3, .K = 1, .pad = 0, .stride = 1},
    {.B = 1, .C = 3, .H = 11, .W = 6, .OC = 5, .K = 5, .pad = 2, .stride = 1},
    {.B = 4, .C = 8, .H = 12, .W = 10, .OC = 16, .K = 3, .pad = 1, .stride = 1},
};

static void s_conv_shape(dp_conv_dims_t d)
{
    dp_conv_dims_finish(&d);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
    size_t nout = (size_t)d.B * d.OC * d.OH * d.OW;
    float *in = s_rand(nin), *w = s_rand(nw), *b = s_rand((size_t)d.OC), *dout = s_rand(nout);
    float *rin = s_rounded(in, nin), *rw = s_rounded(w, nw), *rout = s_rounded(dout, nout);
    float *out = dp_malloc(nout * 4), *want = dp_malloc(nout * 4), *plain = dp_malloc(nout * 4);
    dp_bf16_emulated.conv_forward(out, in, w, b, &d);
    dp_conv2d_forward_ref(want, rin, rw, b, &d);
    dp_conv2d_forward_ref(plain, in, w, b, &d);
    CHECK_CLOSE("conv forward", out, want, nout, S_TOL, S_TOL);
    CHECK(s_apart(out, plain, nout));
    float *din = dp_malloc(nin * 4), *dw = dp_malloc(nw * 4), *db = dp_malloc((size_t)d.OC * 4);
    float *wdin = dp_malloc(nin * 4), *wdw = dp_malloc(nw * 4), *wdb = dp_malloc((size_t)d.OC * 4);
    float *pdin = dp_malloc(nin * 4), *pdw = dp_malloc(nw * 4);
    dp_bf16_emulated.conv_backward(din, dw, db, dout, in, w, &d);
    dp_conv2d_backward_ref(wdin, wdw, NULL, rout, rin, rw, &d);
    dp_conv2d_backward_ref(pdin, pdw, wdb, dout, in, w, &d); /* db: dout as it is */
    CHECK_CLOSE("conv din", din, wdin, nin, S_TOL, S_TOL);
    CHECK_CLOSE("conv dw", dw, wdw, nw, S_TOL, S_TOL);
    CHECK_CLOSE("conv db", db, wdb, (size_t)d.OC, S_TOL, S_TOL);
    CHECK(s_apart(din, pdin, nin) && s_apart(dw, pdw, nw));
    /* the first layer's: no din, and no db (a conv before a batch norm) */
    memset(dw, 0, nw * 4);
    dp_bf16_emulated.conv_backward(NULL, dw, NULL, dout, in, w, &d);
    CHECK_CLOSE("conv dw without din", dw, wdw, nw, S_TOL, S_TOL);
    float *all[] = {in, w, b, dout, rin, rw, rout, out, want, plain, din, dw, db, wdin, wdw, wdb, pdin, pdw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static void s_conv_all(void)
{
    for (size_t i = 0; i < sizeof s_shapes / sizeof *s_shapes; i++) s_conv_shape(s_shapes[i]);
}

static void test_conv_matches_ref(void)
{
    dp_rng_seed(&s_rng, 58);
    t_each_cpu_path(s_conv_all);
}

static void s_fc_shape(int B, int IN, int OUT)
{
    size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN, nout = (size_t)B * OUT;
    float *in = s_rand(nin), *w = s_rand(nw), *b = s_rand((size_t)OUT), *dout = s_rand(nout);
    float *rin = s_rounded(in, nin), *rw = s_rounded(w, nw), *rout = s_rounded(dout, nout);
    float *out = dp_malloc(nout * 4), *want = dp_malloc(nout * 4);
    dp_bf16_emulated.fc_forward(out, in, w, b, B, IN, OUT);
    dp_fc_forward_ref(want, rin, rw, b, B, IN, OUT);
    CHECK_CLOSE("fc forward", out, want, nout, S_TOL, S_TOL);
    float *din = dp_malloc(nin * 4), *dw = dp_malloc(nw * 4), *db = dp_malloc((size_t)OUT * 4);
    float *wdin = dp_malloc(nin * 4), *wdw = dp_malloc(nw * 4), *wdb = dp_malloc((size_t)OUT * 4);
    float *sink = dp_malloc((size_t)OUT * 4), *pdin = dp_malloc(nin * 4), *pdw = dp_malloc(nw * 4);
    dp_bf16_emulated.fc_backward(din, dw, db, dout, in, w, B, IN, OUT);
    dp_fc_backward_ref(wdin, wdw, sink, rout, rin, rw, B, IN, OUT);
    dp_fc_backward_ref(pdin, pdw, wdb, dout, in, w, B, IN, OUT); /* db: dout as it is */
    CHECK_CLOSE("fc din", din, wdin, nin, S_TOL, S_TOL);
    CHECK_CLOSE("fc dw", dw, wdw, nw, S_TOL, S_TOL);
    CHECK_CLOSE("fc db", db, wdb, (size_t)OUT, S_TOL, S_TOL);
    if (nw > 16) CHECK(s_apart(dw, pdw, nw));
    float *all[] = {in, w, b, dout, rin, rw, rout, out, want, din, dw, db, wdin, wdw, wdb, sink, pdin, pdw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static void test_fc_matches_ref(void)
{
    dp_rng_seed(&s_rng, 59);
    s_fc_shape(3, 37, 11);
    s_fc_shape(1, 1, 1);
    s_fc_shape(17, 300, 33); /* the threaded GEMM */
}

/* A small conv + fc model. */
static void s_model(dp_model_t *m)
{
    char err[DP_ERR_LEN];
    int rc = dp_model_parse(m, "conv3x3:16 relu fc:7 softmax", 3, 9, 9, err);
    CHECK_EQ(rc, 0);
}

static void test_backend_in_bf16(void)
{
    dp_rng_seed(&s_rng, 60);
    char err[DP_ERR_LEN] = "";
    static dp_model_t m;
    s_model(&m);
    setenv("DP_TEST_BF16", "emulated", 1);
    dp_backend_t *be = NULL, *fp = NULL;
    CHECK_EQ(dp_backend_new_in(&be, "cpu", DP_PRECISION_BF16, err), 0);
    CHECK_EQ(dp_backend_new_in(&fp, "cpu", DP_PRECISION_FP32, err), 0);
    unsetenv("DP_TEST_BF16");
    if (!be || !fp) return;
    CHECK_STR(be->precision, "bf16 (emulated)");
    CHECK_STR(fp->precision, "fp32");
    enum { B = 4 };
    CHECK_EQ(be->ops->prepare(be, &m, B, err), 0);
    const dp_layer_t *conv = &m.layers[0], *fc = &m.layers[2];
    dp_conv_dims_t d;
    dp_conv_dims_of(&d, conv, B);
    size_t nin = (size_t)B * 3 * 81, nw = (size_t)16 * 27, nout = (size_t)B * 16 * d.OH * d.OW;
    float *in = s_rand(nin), *w = s_rand(nw), *b = s_rand(16), *dout = s_rand(nout);
    float *got = dp_malloc(nout * 4), *want = dp_malloc(nout * 4), *f32 = dp_malloc(nout * 4);
    be->ops->conv_forward(be, conv, B, got, in, w, b);
    dp_bf16_emulated.conv_forward(want, in, w, b, &d);
    fp->ops->conv_forward(fp, conv, B, f32, in, w, b);
    CHECK_CLOSE("backend conv forward: the table's bits", got, want, nout, 0, 0);
    CHECK(memcmp(got, f32, nout * 4) != 0);
    float *dw = dp_malloc(nw * 4), *wdw = dp_malloc(nw * 4), *db = dp_malloc(64), *wdb = dp_malloc(64);
    be->ops->conv_backward(be, conv, B, NULL, dw, db, dout, in, w);
    dp_bf16_emulated.conv_backward(NULL, wdw, wdb, dout, in, w, &d);
    CHECK_CLOSE("backend conv dw: the table's bits", dw, wdw, nw, 0, 0);
    int IN = fc->in_c * fc->in_h * fc->in_w, OUT = fc->out_c;
    float *fin = s_rand((size_t)B * IN), *fw = s_rand((size_t)OUT * IN), *fo = dp_malloc(B * OUT * 4);
    float *fwant = dp_malloc(B * OUT * 4), *fdin = dp_malloc((size_t)B * IN * 4);
    float *fwdin = dp_malloc((size_t)B * IN * 4), *fdw = dp_malloc((size_t)OUT * IN * 4);
    float *fdb = dp_malloc(OUT * 4);
    be->ops->fc_forward(be, fc, B, fo, fin, fw, b);
    dp_bf16_emulated.fc_forward(fwant, fin, fw, b, B, IN, OUT);
    CHECK_CLOSE("backend fc forward: the table's bits", fo, fwant, (size_t)B * OUT, 0, 0);
    be->ops->fc_backward(be, fc, B, fdin, fdw, fdb, fo, fin, fw);
    dp_bf16_emulated.fc_backward(fwdin, fdw, fdb, fo, fin, fw, B, IN, OUT);
    CHECK_CLOSE("backend fc din: the table's bits", fdin, fwdin, (size_t)B * IN, 0, 0);
    float *all[] = {in, w, b, dout, got, want, f32, dw, wdw, db, wdb, fin, fw, fo, fwant, fdin, fwdin, fdw, fdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    dp_backend_destroy(&be);
    dp_backend_destroy(&fp);
}

static void test_refusals(void)
{
    char err[DP_ERR_LEN] = "", why[DP_ERR_LEN] = "";
    dp_backend_t *be = NULL;
    dp_precision_t p = DP_PRECISION_FP32;
    unsetenv("DP_TEST_BF16");
    if (dp_bf16_ops_native(why) == NULL) { /* this CPU has no native path: refused */
        CHECK_EQ(dp_backend_new_in(&be, "cpu", DP_PRECISION_BF16, err), -1);
        CHECK(be == NULL);
        CHECK(strstr(err, "--precision bf16: ") == err && strstr(err, why) && !strchr(err, '\n'));
        CHECK_EQ(dp_precision_check("cpu:staged", DP_PRECISION_BF16, err), -1);
    } else {
        fprintf(stderr, "  (this CPU runs bf16 natively: its refusal is not tested here)\n");
    }
    CHECK_EQ(dp_precision_check("cuda:0", DP_PRECISION_BF16, err), -1);
    CHECK(strstr(err, "CUDA") != NULL);
    CHECK_EQ(dp_precision_check("cuda:0", DP_PRECISION_FP32, err), 0);
    CHECK_EQ(dp_precision_parse("fp16", &p, err), -1);
    CHECK(strstr(err, "fp16") != NULL);
    CHECK_EQ(dp_precision_parse("bf16", &p, err), 0);
    CHECK_EQ(p, DP_PRECISION_BF16);
    CHECK_STR(dp_precision_name(p), "bf16");
    setenv("DP_TEST_BF16", "native", 1); /* only "emulated" picks the emulation */
    CHECK(dp_bf16_ops_select(why) != &dp_bf16_emulated);
    unsetenv("DP_TEST_BF16");
}

DP_TESTS(T(test_conv_matches_ref), T(test_fc_matches_ref), T(test_backend_in_bf16),
         T(test_refusals))
