/* test_kernels: the CPU kernels of kernels/ops.h.
 *
 * - every fast forward against its reference on awkward shapes (batch 1 and
 *   3, 13x11 images, 5 channels, kernels 1/3/5, pad 0/1/2, stride 1/2, pools
 *   with leftover rows), outputs poisoned with NaN first so a skipped
 *   element shows;
 * - every backward (fast and reference) against central finite differences
 *   of loss = sum(out * r) computed by double-precision loops written here;
 * - fast backward against reference backward, on dense gradients and on
 *   mostly-zero ones (the sparse path the conv takes behind a max-pool);
 * - softmax-xent loss and gradient, relu / max-pool backward and ties,
 *   din == NULL, 1 to 3 threads (uneven splits of the batch);
 * - batch norm and relu as one op (dp_bn_relu_*): the bits of the two in turn;
 * - the conv tests once per kernel path this CPU supports (avx512, avx2,
 *   generic: kernels/cpu/isa.h), the avx2 and avx512 paths bit for bit
 *   equal, and DP_CPU_ISA's choice and refusals;
 * - batch norm (training, evaluation, 2-D and 1-D), the residual shortcut
 *   (identity, option A), global average pooling and dropout: fast against
 *   reference, backwards against finite differences; convolution without bias. */
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/env.h"
#include "kernels/ops.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "tests/test.h"
#include "tests/cpu_paths.h"

static dp_rng_t s_rng;
static int s_rng_ready;

static float *s_rand(size_t n, float lo, float hi)
{
    if (!s_rng_ready) {
        dp_rng_seed(&s_rng, 12345);
        s_rng_ready = 1;
    }
    float *p = dp_aligned_alloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * dp_rng_uniform(&s_rng);
    return p;
}

static float *s_nan(size_t n)
{
    float *p = dp_aligned_alloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static void s_poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* Zero out all but about `keep` of the entries (the max-pool-behind case). */
static void s_sparsify(float *p, size_t n, float keep)
{
    for (size_t i = 0; i < n; i++)
        if (dp_rng_uniform(&s_rng) >= keep) p[i] = 0.0f;
}

/* ---- double-precision forwards for finite differences ------------------ */

/* The outputs a finite difference has to recompute: loss = sum(out * r) is
 * linear in each input, weight and bias, and a change to one of them reaches
 * only the outputs of its window; the others add the same terms on both sides
 * of the difference. A window per variable keeps the double-precision loops
 * small enough for the big cases under ASan. */
typedef struct {
    int n0, n1, oc0, oc1, oy0, oy1, ox0, ox1; /* [lo, hi) */
} s_conv_window_t;

static s_conv_window_t s_conv_all(const dp_conv_dims_t *d)
{
    return (s_conv_window_t){0, d->B, 0, d->OC, 0, d->OH, 0, d->OW};
}

/* The outputs that read input element i (a superset: rows and columns whose
 * taps could cover it). */
static s_conv_window_t s_conv_window_in(const dp_conv_dims_t *d, size_t i)
{
    int x = (int)(i % (size_t)d->W), y = (int)(i / (size_t)d->W % (size_t)d->H);
    int n = (int)(i / ((size_t)d->W * d->H * d->C));
    s_conv_window_t win = s_conv_all(d);
    win.n0 = n, win.n1 = n + 1;
    int lo_y = (y + d->pad - d->K + 1) / d->stride, lo_x = (x + d->pad - d->K + 1) / d->stride;
    win.oy0 = lo_y > 0 ? lo_y : 0, win.ox0 = lo_x > 0 ? lo_x : 0;
    int hi_y = (y + d->pad) / d->stride + 1, hi_x = (x + d->pad) / d->stride + 1;
    win.oy1 = hi_y < d->OH ? hi_y : d->OH, win.ox1 = hi_x < d->OW ? hi_x : d->OW;
    return win;
}

/* The outputs of weight i's (or bias i's) output channel. */
static s_conv_window_t s_conv_window_oc(const dp_conv_dims_t *d, size_t i, size_t per_oc)
{
    s_conv_window_t win = s_conv_all(d);
    win.oc0 = (int)(i / per_oc), win.oc1 = win.oc0 + 1;
    return win;
}

/* sum((conv(in, w) + b) * r) over the window's outputs, all in double */
static double s_conv_loss(const double *in, const double *w, const double *b, const float *r,
                          const dp_conv_dims_t *d, s_conv_window_t win)
{
    double loss = 0;
    int K = d->K;
    for (int n = win.n0; n < win.n1; n++)
        for (int oc = win.oc0; oc < win.oc1; oc++)
            for (int oy = win.oy0; oy < win.oy1; oy++)
                for (int ox = win.ox0; ox < win.ox1; ox++) {
                    double acc = b[oc];
                    for (int c = 0; c < d->C; c++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int y = oy * d->stride - d->pad + ky;
                                int x = ox * d->stride - d->pad + kx;
                                if (y < 0 || y >= d->H || x < 0 || x >= d->W) continue;
                                acc += in[((n * d->C + c) * d->H + y) * d->W + x] *
                                       w[((oc * d->C + c) * K + ky) * K + kx];
                            }
                    loss += acc * r[((n * d->OC + oc) * d->OH + oy) * d->OW + ox];
                }
    return loss;
}

static double *s_to_double(const float *p, size_t n)
{
    double *q = dp_malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) q[i] = p[i];
    return q;
}

/* Central difference of f at x[i] (restored afterwards). */
#define FD(expr, x, i, h)                                                      \
    ({                                                                         \
        double t_keep = (x)[i];                                                \
        (x)[i] = t_keep + (h);                                                 \
        double t_plus = (expr);                                                \
        (x)[i] = t_keep - (h);                                                 \
        double t_minus = (expr);                                               \
        (x)[i] = t_keep;                                                       \
        (t_plus - t_minus) / (2 * (h));                                        \
    })

/* Check grad[idx] == finite difference for `count` random indices (all when
 * count >= n); expr may use fd_i, the index being checked. */
#define CHECK_FD(name, grad, x, n, count, expr)                                \
    do {                                                                       \
        int t_bad = 0;                                                         \
        size_t t_n = (size_t)(n), t_c = (size_t)(count);                       \
        for (size_t t_k = 0; t_k < (t_c < t_n ? t_c : t_n); t_k++) {           \
            size_t fd_i = t_c >= t_n ? t_k : dp_rng_below(&s_rng, (uint32_t)t_n); \
            double t_fd = FD(expr, x, fd_i, 1e-3);                             \
            double t_g = (grad)[fd_i];                                         \
            if (!(fabs(t_g - t_fd) <= 1e-3 + 1e-3 * fabs(t_fd))) {             \
                if (t_bad++ < 3)                                               \
                    fprintf(stderr, "  %s[%zu]: grad %.7g, finite difference %.7g\n", name, \
                            fd_i, t_g, t_fd);                                  \
            }                                                                  \
        }                                                                      \
        CHECK_EQ(t_bad, 0);                                                    \
    } while (0)

/* ---- conv -------------------------------------------------------------- */

typedef struct {
    int B, C, H, W, OC, K, pad, stride;
} s_conv_case_t;

static const s_conv_case_t s_conv_cases[] = {
    {1, 5, 13, 11, 3, 3, 1, 1}, {3, 5, 13, 11, 4, 5, 2, 1}, {3, 5, 13, 11, 4, 1, 0, 1},
    {3, 5, 13, 11, 4, 3, 0, 2}, {1, 5, 13, 11, 2, 5, 1, 2}, {3, 5, 13, 11, 3, 3, 2, 1},
    {3, 1, 13, 11, 6, 5, 2, 1}, {2, 5, 13, 11, 3, 1, 1, 2}, {3, 3, 6, 4, 2, 5, 0, 1},
    {3, 5, 13, 11, 64, 3, 1, 2}, {1, 8, 13, 11, 96, 3, 1, 1}, {3, 3, 13, 11, 32, 5, 2, 1},
    /* our GEMM's channel blocks on the avx2 path (16 + 8, 16 + 16 + 8), patches
     * not a multiple of 8 floats, 15 positions, stride 2 */
    {2, 8, 9, 10, 24, 3, 1, 1}, {1, 9, 7, 5, 40, 3, 0, 1}, {3, 3, 11, 9, 16, 5, 2, 2},
    /* resnet20's stride-2 convolutions on 28x28 (even sides) and its 1x1 projection */
    {2, 16, 28, 28, 32, 3, 1, 2}, {8, 32, 14, 14, 64, 3, 1, 2}, {2, 16, 28, 28, 32, 1, 0, 2},
    /* din by the forward kernel on dout (stride 1, C in the channel blocks):
     * resnet20's 3x3 body convolution, unpadded, and K = 5 with pad 1 */
    {2, 16, 14, 14, 16, 3, 1, 1}, {1, 16, 9, 7, 24, 3, 0, 1}, {1, 16, 9, 7, 16, 5, 1, 1},
    /* the direct 3x3 backward (conv.c): dw with patch rows of K*C = 51 and 9
     * floats (masked tails), 17 output channels (spare rows in its tiles);
     * din by the forward on dout with 24 and 16 input channels, dout of 17
     * channels, pad 2 = K - 1 (dout unpadded); stride 2 (dw only); 3 input
     * channels (CKK = 27: the ways before); 512 positions (the forward's
     * outputs through its row buffer, conv.c) */
    {5, 17, 9, 13, 24, 3, 1, 1}, {1, 24, 7, 9, 17, 3, 1, 1}, {5, 3, 13, 7, 16, 3, 1, 2},
    {1, 16, 9, 9, 17, 3, 1, 2}, {5, 24, 13, 13, 24, 3, 1, 1}, {2, 16, 8, 7, 48, 3, 2, 1},
    {1, 8, 16, 32, 24, 3, 1, 1},
};
#define N_CONV (int)(sizeof s_conv_cases / sizeof s_conv_cases[0])

static dp_conv_dims_t s_dims(const s_conv_case_t *c)
{
    dp_conv_dims_t d = {.B = c->B, .C = c->C, .H = c->H, .W = c->W, .OC = c->OC, .K = c->K,
                        .pad = c->pad, .stride = c->stride};
    dp_conv_dims_finish(&d);
    return d;
}

static void test_conv_dims(void)
{
    dp_conv_dims_t d = {.B = 1, .C = 1, .H = 28, .W = 28, .OC = 32, .K = 5, .pad = 2, .stride = 1};
    dp_conv_dims_finish(&d);
    CHECK_EQ(d.OH, 28);
    CHECK_EQ(d.OW, 28);
    dp_conv_dims_t e = {.B = 1, .C = 1, .H = 13, .W = 11, .OC = 1, .K = 3, .pad = 0, .stride = 2};
    dp_conv_dims_finish(&e);
    CHECK_EQ(e.OH, 6);
    CHECK_EQ(e.OW, 5);
    dp_pool_dims_t p = {.B = 1, .C = 1, .H = 13, .W = 11, .K = 3, .stride = 3};
    dp_pool_dims_finish(&p);
    CHECK_EQ(p.OH, 4);
    CHECK_EQ(p.OW, 3);
}

static void s_conv_forward_vs_ref(void)
{
    for (int threads = 1; threads <= 3; threads++) {
        dp_cpu_set_threads(threads);
        CHECK_EQ(dp_cpu_threads(), threads);
        for (int ci = 0; ci < N_CONV; ci++) {
            dp_conv_dims_t d = s_dims(&s_conv_cases[ci]);
            size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
            size_t nout = (size_t)d.B * d.OC * d.OH * d.OW;
            float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -1, 1), *b = s_rand(d.OC, -1, 1);
            float *got = s_nan(nout), *want = s_nan(nout);
            dp_conv2d_forward_ref(want, in, w, b, &d);
            dp_conv2d_forward(got, in, w, b, &d);
            char what[96];
            snprintf(what, sizeof what, "conv case %d threads %d path %s", ci, threads,
                     dp_cpu_isa_name(dp_cpu_isa()));
            CHECK_CLOSE(what, got, want, nout, 1e-4, 1e-4);
            /* no bias */
            s_poison(got, nout);
            dp_conv2d_forward_ref(want, in, w, NULL, &d);
            dp_conv2d_forward(got, in, w, NULL, &d);
            CHECK_CLOSE(what, got, want, nout, 1e-4, 1e-4);
            free(in), free(w), free(b), free(got), free(want);
        }
    }
    dp_cpu_set_threads(0);
}

static void test_conv_forward_vs_ref(void)
{
    t_each_cpu_path(s_conv_forward_vs_ref);
}

/* Backward of the reference and of the fast kernel, both against finite
 * differences and each other; `keep` < 1 zeroes most of dout. */
static void s_conv_backward_case(const s_conv_case_t *cc, float keep, int with_fd)
{
    dp_conv_dims_t d = s_dims(cc);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
    size_t nout = (size_t)d.B * d.OC * d.OH * d.OW;
    float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -1, 1), *b = s_rand(d.OC, -1, 1);
    float *r = s_rand(nout, -1, 1);
    s_sparsify(r, nout, keep);
    /* loss = sum(out * r), so dout = r */
    float *din_ref = s_nan(nin), *dw_ref = s_nan(nw), *db_ref = s_nan(d.OC);
    float *din = s_nan(nin), *dw = s_nan(nw), *db = s_nan(d.OC);
    dp_conv2d_backward_ref(din_ref, dw_ref, db_ref, r, in, w, &d);
    dp_conv2d_backward(din, dw, db, r, in, w, &d);
    CHECK_CLOSE("conv din fast vs ref", din, din_ref, nin, 1e-4, 1e-4);
    CHECK_CLOSE("conv dw fast vs ref", dw, dw_ref, nw, 1e-4, 1e-4);
    CHECK_CLOSE("conv db fast vs ref", db, db_ref, d.OC, 1e-4, 1e-4);
    if (with_fd) {
        double *xin = s_to_double(in, nin), *xw = s_to_double(w, nw), *xb = s_to_double(b, d.OC);
        size_t per_oc = nw / (size_t)d.OC;
#define LOSS_IN s_conv_loss(xin, xw, xb, r, &d, s_conv_window_in(&d, fd_i))
#define LOSS_W s_conv_loss(xin, xw, xb, r, &d, s_conv_window_oc(&d, fd_i, per_oc))
#define LOSS_B s_conv_loss(xin, xw, xb, r, &d, s_conv_window_oc(&d, fd_i, 1))
        CHECK_FD("conv din ref", din_ref, xin, nin, 40, LOSS_IN);
        CHECK_FD("conv dw ref", dw_ref, xw, nw, 40, LOSS_W);
        CHECK_FD("conv db ref", db_ref, xb, (size_t)d.OC, d.OC, LOSS_B);
        CHECK_FD("conv din fast", din, xin, nin, 40, LOSS_IN);
        CHECK_FD("conv dw fast", dw, xw, nw, 40, LOSS_W);
        CHECK_FD("conv db fast", db, xb, (size_t)d.OC, d.OC, LOSS_B);
#undef LOSS_IN
#undef LOSS_W
#undef LOSS_B
        free(xin), free(xw), free(xb);
    }
    /* din == NULL: dw and db still right */
    s_poison(dw, nw);
    s_poison(db, d.OC);
    dp_conv2d_backward(NULL, dw, db, r, in, w, &d);
    CHECK_CLOSE("conv dw (din NULL)", dw, dw_ref, nw, 1e-4, 1e-4);
    CHECK_CLOSE("conv db (din NULL)", db, db_ref, d.OC, 1e-4, 1e-4);
    s_poison(dw_ref, nw);
    dp_conv2d_backward_ref(NULL, dw_ref, db_ref, r, in, w, &d);
    CHECK_CLOSE("conv dw ref (din NULL)", dw_ref, dw, nw, 1e-4, 1e-4);
    free(in), free(w), free(b), free(r), free(din_ref), free(dw_ref), free(db_ref);
    free(din), free(dw), free(db);
}

static void s_conv_backward_dense(void)
{
    for (int ci = 0; ci < N_CONV; ci++) {
        dp_cpu_set_threads(1 + ci % 3);
        s_conv_backward_case(&s_conv_cases[ci], 1.0f, 1);
    }
    dp_cpu_set_threads(0);
}

static void test_conv_backward_dense(void)
{
    t_each_cpu_path(s_conv_backward_dense);
}

static void s_conv_backward_sparse(void)
{
    for (int ci = 0; ci < N_CONV; ci++) {
        dp_cpu_set_threads(1 + ci % 3);
        s_conv_backward_case(&s_conv_cases[ci], 0.2f, ci % 2 == 0);
        s_conv_backward_case(&s_conv_cases[ci], 0.0f, 0); /* all-zero gradient */
    }
    dp_cpu_set_threads(0);
}

static void test_conv_backward_sparse(void)
{
    t_each_cpu_path(s_conv_backward_sparse);
}

/* The default model's conv2 at batch 8: the shape the fast path is tuned for. */
static void s_conv_default_shape(void)
{
    s_conv_case_t c = {8, 32, 14, 14, 64, 5, 2, 1};
    dp_cpu_set_threads(2);
    dp_conv_dims_t d = s_dims(&c);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.OC * d.OH * d.OW;
    size_t nw = (size_t)d.OC * d.C * d.K * d.K;
    float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -0.1f, 0.1f), *b = s_rand(d.OC, -1, 1);
    float *got = s_nan(nout), *want = s_nan(nout);
    dp_conv2d_forward_ref(want, in, w, b, &d);
    dp_conv2d_forward(got, in, w, b, &d);
    CHECK_CLOSE("conv2 forward", got, want, nout, 1e-4, 1e-4);
    free(got), free(want), free(in), free(w), free(b);
    s_conv_backward_case(&c, 0.25f, 0);
    s_conv_backward_case(&c, 1.0f, 0);
    dp_cpu_set_threads(0);
}

static void test_conv_default_shape(void)
{
    t_each_cpu_path(s_conv_default_shape);
}

/* The avx2 and avx512 paths chain the same FMAs in the same order (the
 * kernels are one source, conv_simd.h): the same bits, forward and backward,
 * dense and sparse. */
static void test_conv_paths_bitwise_equal(void)
{
    unsigned both = (1u << DP_CPU_ISA_AVX2) | (1u << DP_CPU_ISA_AVX512);
    if ((dp_cpu_isa_supported() & both) != both) SKIP("this CPU has no AVX-512: one SIMD path");
    s_conv_case_t cs[] = {{8, 32, 14, 14, 64, 5, 2, 1}, {3, 3, 13, 11, 32, 5, 2, 1},
                          {4, 16, 14, 14, 16, 3, 1, 1}}; /* the direct 3x3 backward */
    dp_cpu_isa_t keep = dp_cpu_isa();
    dp_cpu_set_threads(2);
    for (int ci = 0; ci < 3; ci++) {
        dp_conv_dims_t d = s_dims(&cs[ci]);
        size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.OC * d.OH * d.OW;
        size_t nw = (size_t)d.OC * d.C * d.K * d.K, n = nout + nin + nw + d.OC;
        float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -0.1f, 0.1f), *b = s_rand(d.OC, -1, 1);
        float *g = s_rand(nout, -1, 1), *res[2];
        s_sparsify(g, nout / 2, 0.25f); /* first half sparse, second dense */
        for (int k = 0; k < 2; k++) {
            dp_cpu_isa_set(k ? DP_CPU_ISA_AVX512 : DP_CPU_ISA_AVX2);
            float *r = res[k] = s_nan(n);
            dp_conv2d_forward(r, in, w, b, &d);
            dp_conv2d_backward(r + nout, r + nout + nin, r + nout + nin + nw, g, in, w, &d);
        }
        CHECK(memcmp(res[0], res[1], n * sizeof(float)) == 0);
        free(in), free(w), free(b), free(g), free(res[0]), free(res[1]);
    }
    dp_cpu_isa_set(keep);
    dp_cpu_set_threads(0);
}

/* DP_CONV_DIRECT=0|1|2 through the kernels' env reader. */
static void s_conv_direct_set(int level)
{
    char err[DP_ERR_LEN] = "", v[8];
    snprintf(v, sizeof v, "%d", level);
    setenv("DP_CONV_DIRECT", v, 1);
    CHECK_EQ(dp_conv_env(err), 0);
    unsetenv("DP_CONV_DIRECT");
}

/* The direct ways against the ones before them (DP_CONV_DIRECT=0): the
 * forward reading patches in place gives colT's bits (same FMAs, same
 * order), and so does the flat forward (2; 1 leaves it out) where it runs
 * ("same" stride-1 convolutions: planes of 63 positions, ending mid-vector;
 * 1x1; 1024 positions, planes 4 KB apart; 5x5; a 1x1 image); the direct
 * backward (3x3, dense dout, a SIMD path) is taken where the rule says
 * (dp_conv2d_backward_ways, asked: its bits may or may not differ from the
 * GEMM's, depending on the BLAS kernel), and both are the reference's to
 * the usual tolerance; its din by the flat forward has the bits of its din
 * by the forward on a padded copy; where a way is not direct, and for the
 * seed CNN's conv2 (5x5) and a 3-channel 3x3 (resnet's first), every bit is
 * kept. */
static void s_conv_direct_vs_before(void)
{
    const s_conv_case_t cs[] = {{3, 16, 9, 7, 32, 3, 1, 1},  {2, 24, 7, 9, 64, 3, 1, 2},
                                {2, 16, 32, 32, 32, 3, 1, 1}, {4, 32, 14, 14, 64, 5, 2, 1},
                                {2, 3, 13, 7, 16, 3, 1, 1},   {2, 16, 1, 1, 48, 3, 1, 1},
                                {2, 64, 5, 3, 16, 1, 0, 1},   {3, 32, 8, 8, 48, 3, 1, 1},
                                {1, 48, 4, 6, 64, 3, 1, 1}};
    int ncase = (int)(sizeof cs / sizeof cs[0]);
    int simd = dp_cpu_isa() != DP_CPU_ISA_GENERIC;
    for (int ci = 0; ci < ncase; ci++) {
        dp_cpu_set_threads(1 + ci % 2);
        dp_conv_dims_t d = s_dims(&cs[ci]);
        /* 3x3 with CKK >= 64 (the others have C % 16 == 0) */
        int new_dw = simd && d.K == 3 && d.C * 9 >= 64, new_din = new_dw && d.stride == 1;
        size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.OC * d.OH * d.OW;
        size_t nw = (size_t)d.OC * d.C * d.K * d.K, n = nout + nin + nw + d.OC;
        float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -1, 1), *b = s_rand(d.OC, -1, 1);
        float *g = s_rand(nout, -1, 1), *ref = s_nan(n), *res[3];
        dp_conv2d_forward_ref(ref, in, w, b, &d);
        dp_conv2d_backward_ref(ref + nout, ref + nout + nin, ref + nout + nin + nw, g, in, w, &d);
        for (int k = 0; k < 3; k++) {
            s_conv_direct_set(k);
            int ways[2];
            dp_conv2d_backward_ways(&d, &ways[0], &ways[1]);
            CHECK_EQ(ways[0], k && new_dw);
            CHECK_EQ(ways[1], k && new_din);
            float *r = res[k] = s_nan(n);
            dp_conv2d_forward(r, in, w, b, &d);
            dp_conv2d_backward(r + nout, r + nout + nin, r + nout + nin + nw, g, in, w, &d);
            CHECK_CLOSE(k ? "direct vs ref" : "before vs ref", r, ref, n, 1e-4, 1e-4);
        }
        /* (48 channels: OpenBLAS's bits at 0 on avx512, its block being 32) */
        if (d.OC % 32 == 0) CHECK(memcmp(res[0], res[1], nout * sizeof(float)) == 0);
        CHECK(memcmp(res[2], res[1], n * sizeof(float)) == 0); /* the flat forward's bits */
        /* the direct ways again: the same bits (no scheduling in the sums) */
        float *again = s_nan(n);
        dp_conv2d_forward(again, in, w, b, &d);
        dp_conv2d_backward(again + nout, again + nout + nin, again + nout + nin + nw, g, in, w, &d);
        CHECK(memcmp(again, res[2], n * sizeof(float)) == 0);
        free(again);
        int same_dw = memcmp(res[0] + nout + nin, res[1] + nout + nin, nw * sizeof(float)) == 0;
        if (!new_dw) CHECK(same_dw);
        /* din direct only at stride 1; at stride 2 the GEMM + col2im as before */
        int same_din = memcmp(res[0] + nout, res[1] + nout, nin * sizeof(float)) == 0;
        if (!new_din) CHECK(same_din);
        free(in), free(w), free(b), free(g), free(ref), free(res[0]), free(res[1]), free(res[2]);
    }
    dp_cpu_set_threads(0);
}

/* The flat forward kernel itself (conv_simd.h), wherever conv.c would take
 * it or not, against the forward kernel on a padded HWC copy: every bit, on
 * shapes its tiles and masks find awkward (a 1x1 and a 1-row image, planes
 * ending mid-vector and mid-tile, 5x5 and 1x1 filters, 17 and 8 input
 * channels, bias or none, planes spaced out as conv.c's copy does). */
static void test_conv_flat_kernel(void)
{
    if (!(dp_cpu_isa_supported() & (1u << DP_CPU_ISA_AVX512))) SKIP("this CPU has no AVX-512");
    const dp_conv_simd_t *k = &dp_conv_simd_avx512;
    /* (OC in 16s: the forward kernel's vectors) */
    const s_conv_case_t cs[] = {{1, 16, 1, 1, 16, 3, 1, 1}, {1, 16, 1, 9, 32, 3, 1, 1},
                                {1, 17, 5, 7, 48, 3, 1, 1}, {1, 32, 14, 14, 64, 5, 2, 1},
                                {1, 64, 3, 5, 16, 1, 0, 1}, {1, 16, 32, 32, 16, 3, 1, 1},
                                {1, 8, 6, 11, 48, 3, 1, 1}};
    for (int ci = 0; ci < (int)(sizeof cs / sizeof cs[0]); ci++) {
        dp_conv_dims_t d = s_dims(&cs[ci]);
        size_t HW = (size_t)d.H * d.W, CKK = (size_t)d.C * d.K * d.K;
        size_t nout = (size_t)d.OC * HW, ld = HW + 16 * (ci % 2);
        float *in = s_rand((size_t)d.C * ld, -1, 1), *wt = s_rand(CKK * d.OC, -1, 1);
        float *b = s_rand(d.OC, -1, 1), *want = s_nan(nout), *got = s_nan(nout);
        float *plain = dp_malloc((size_t)d.C * HW * sizeof(float));
        float *pin = dp_malloc((size_t)d.C * (d.H + 2 * d.pad) * (d.W + 2 * d.pad) * sizeof(float));
        uint32_t *masks = dp_malloc(k->flat_mask_count(&d) * sizeof(uint32_t));
        for (int c = 0; c < d.C; c++) memcpy(plain + c * HW, in + c * ld, HW * sizeof(float));
        k->flat_masks(masks, &d);
        for (int bias = 0; bias < 2; bias++) {
            k->pad_hwc(pin, plain, &d);
            k->fwd(want, HW, pin, &d, wt, bias ? b : NULL);
            k->fwd_flat(got, in, ld, &d, wt, bias ? b : NULL, masks);
            CHECK(memcmp(got, want, nout * sizeof(float)) == 0);
        }
        free(in), free(wt), free(b), free(want), free(got), free(plain), free(pin), free(masks);
    }
}

static void test_conv_direct_vs_before(void)
{
    t_each_cpu_path(s_conv_direct_vs_before);
}

/* DP_CPU_ISA: empty picks the best path the CPU has; a known path the CPU
 * lacks and an unknown value are refused with a line naming the variable. */
static void test_isa_choose(void)
{
    char err[DP_ERR_LEN] = "";
    unsigned all = (1u << DP_CPU_ISA_COUNT) - 1, no512 = all & ~(1u << DP_CPU_ISA_AVX512);
    dp_cpu_isa_t isa = DP_CPU_ISA_COUNT;
    CHECK_EQ(dp_cpu_isa_choose(NULL, all, &isa, err), 0);
    CHECK_EQ(isa, DP_CPU_ISA_AVX512);
    CHECK_EQ(dp_cpu_isa_choose("", no512, &isa, err), 0);
    CHECK_EQ(isa, DP_CPU_ISA_AVX2);
    CHECK_EQ(dp_cpu_isa_choose(NULL, 1u << DP_CPU_ISA_GENERIC, &isa, err), 0);
    CHECK_EQ(isa, DP_CPU_ISA_GENERIC);
    for (int i = 0; i < DP_CPU_ISA_COUNT; i++) {
        CHECK_EQ(dp_cpu_isa_choose(dp_cpu_isa_name((dp_cpu_isa_t)i), all, &isa, err), 0);
        CHECK_EQ(isa, i);
    }
    CHECK_EQ(dp_cpu_isa_choose("AVX2", all, &isa, err), 0);
    CHECK_EQ(isa, DP_CPU_ISA_AVX2);
    CHECK_EQ(dp_cpu_isa_choose("avx512", no512, &isa, err), -1);
    CHECK(strstr(err, "DP_CPU_ISA=avx512") && strstr(err, "cannot run the avx512 path"));
    CHECK_EQ(dp_cpu_isa_choose("sse2", all, &isa, err), -1);
    CHECK(strstr(err, "DP_CPU_ISA=sse2: unknown path") != NULL);
    CHECK(dp_cpu_isa_supported() & (1u << DP_CPU_ISA_GENERIC));
    CHECK(dp_cpu_isa_supported() & (1u << dp_cpu_isa()));
    fprintf(stderr, "  CPU: %s; paths tested here: %s; default %s\n", dp_cpu_isa_features(),
            t_cpu_paths(), dp_cpu_isa_name(dp_cpu_isa()));
}

/* A refused DP_CPU_ISA stops a program that links the kernels before it
 * does anything (read first in main: kernels/env.h; here the harness's
 * t_env): one line on stderr, exit status 2. */
static void test_isa_refused_before_main(void)
{
    char self[4096], cmd[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "DP_CPU_ISA=bogus '%s' -t test_threads 2>&1", self);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char line[512] = "", extra[512];
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    int more = fgets(extra, sizeof extra, p) != NULL;
    int st = pclose(p);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    CHECK(strstr(line, "test_kernels: DP_CPU_ISA=bogus: unknown path") != NULL);
    CHECK(!more); /* one line, and test_threads never ran */
}

/* ---- fc ---------------------------------------------------------------- */

static double s_fc_loss(const double *in, const double *w, const double *b, const float *r,
                        int B, int IN, int OUT)
{
    double loss = 0;
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) {
            double acc = b[o];
            for (int i = 0; i < IN; i++) acc += in[n * IN + i] * w[o * IN + i];
            loss += acc * r[n * OUT + o];
        }
    return loss;
}

static void test_fc(void)
{
    static const int shapes[][3] = {{1, 7, 5}, {3, 300, 70}, {3, 13, 1}, {5, 64, 33}};
    for (int si = 0; si < 4; si++) {
        int B = shapes[si][0], IN = shapes[si][1], OUT = shapes[si][2];
        dp_cpu_set_threads(1 + si % 2);
        float *in = s_rand((size_t)B * IN, -1, 1), *w = s_rand((size_t)OUT * IN, -1, 1);
        float *b = s_rand(OUT, -1, 1), *r = s_rand((size_t)B * OUT, -1, 1);
        float *got = s_nan((size_t)B * OUT), *want = s_nan((size_t)B * OUT);
        dp_fc_forward_ref(want, in, w, b, B, IN, OUT);
        dp_fc_forward(got, in, w, b, B, IN, OUT);
        CHECK_CLOSE("fc forward", got, want, (size_t)B * OUT, 1e-4, 1e-4);
        s_poison(got, (size_t)B * OUT);
        dp_fc_forward_ref(want, in, w, NULL, B, IN, OUT);
        dp_fc_forward(got, in, w, NULL, B, IN, OUT);
        CHECK_CLOSE("fc forward no bias", got, want, (size_t)B * OUT, 1e-4, 1e-4);

        float *din = s_nan((size_t)B * IN), *dw = s_nan((size_t)OUT * IN), *db = s_nan(OUT);
        float *din_r = s_nan((size_t)B * IN), *dw_r = s_nan((size_t)OUT * IN), *db_r = s_nan(OUT);
        dp_fc_backward_ref(din_r, dw_r, db_r, r, in, w, B, IN, OUT);
        dp_fc_backward(din, dw, db, r, in, w, B, IN, OUT);
        CHECK_CLOSE("fc din", din, din_r, (size_t)B * IN, 1e-4, 1e-4);
        CHECK_CLOSE("fc dw", dw, dw_r, (size_t)OUT * IN, 1e-4, 1e-4);
        CHECK_CLOSE("fc db", db, db_r, OUT, 1e-4, 1e-4);
        double *xin = s_to_double(in, (size_t)B * IN), *xw = s_to_double(w, (size_t)OUT * IN);
        double *xb = s_to_double(b, OUT);
        size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN;
        CHECK_FD("fc din ref", din_r, xin, nin, 40, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        CHECK_FD("fc dw ref", dw_r, xw, nw, 40, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        CHECK_FD("fc db ref", db_r, xb, (size_t)OUT, OUT, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        CHECK_FD("fc din", din, xin, nin, 40, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        CHECK_FD("fc dw", dw, xw, nw, 40, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        CHECK_FD("fc db", db, xb, (size_t)OUT, OUT, s_fc_loss(xin, xw, xb, r, B, IN, OUT));
        /* din NULL */
        s_poison(dw, nw);
        s_poison(db, OUT);
        dp_fc_backward(NULL, dw, db, r, in, w, B, IN, OUT);
        CHECK_CLOSE("fc dw (din NULL)", dw, dw_r, nw, 1e-4, 1e-4);
        CHECK_CLOSE("fc db (din NULL)", db, db_r, OUT, 1e-4, 1e-4);
        free(xin), free(xw), free(xb), free(in), free(w), free(b), free(r), free(got), free(want);
        free(din), free(dw), free(db), free(din_r), free(dw_r), free(db_r);
    }
    dp_cpu_set_threads(0);
}

/* ---- tanh -------------------------------------------------------------- */

/* Against tanh in double (within float rounding), the backward against
 * finite differences of it, both in place too, on an odd size above the
 * threading threshold and large inputs (saturation: 1 - out^2 -> 0). */
static void test_tanh(void)
{
    size_t n = 100003;
    float *in = s_rand(n, -4, 4), *dout = s_rand(n, -1, 1);
    in[1] = 30.0f, in[2] = -30.0f, in[3] = 0.0f;
    float *got = s_nan(n), *dg = s_nan(n);
    dp_tanh_forward(got, in, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += fabs(got[i] - tanh((double)in[i])) > 2e-7;
    CHECK_EQ(bad, 0);
    CHECK(got[1] == 1.0f && got[2] == -1.0f && got[3] == 0.0f);
    dp_tanh_backward(dg, dout, got, n);
    bad = 0;
    for (size_t i = 0; i < n; i += 97) {
        double h = 1e-4, x = in[i];
        double fd = (tanh(x + h) - tanh(x - h)) / (2 * h) * dout[i];
        bad += fabs(fd - dg[i]) > 1e-5 + 1e-4 * fabs(fd);
    }
    CHECK_EQ(bad, 0);
    CHECK(dg[1] == 0.0f);
    float *inplace = s_rand(n, -4, 4);
    memcpy(inplace, in, n * sizeof(float));
    dp_tanh_forward(inplace, inplace, n);
    CHECK_CLOSE("tanh in place", inplace, got, n, 0, 0);
    dp_tanh_backward(inplace, dout, inplace, n);
    CHECK_CLOSE("tanh backward in place", inplace, dg, n, 0, 0);
    free(in), free(dout), free(got), free(dg), free(inplace);
}

/* ---- relu -------------------------------------------------------------- */

static void test_relu(void)
{
    size_t n = 100003; /* odd, above the threading threshold */
    float *in = s_rand(n, -1, 1), *dout = s_rand(n, -1, 1);
    in[0] = 0.0f; /* relu'(0) = 0 by the ops.h rule (out > 0) */
    float *got = s_nan(n), *want = s_nan(n);
    dp_relu_forward_ref(want, in, n);
    dp_relu_forward(got, in, n);
    CHECK_CLOSE("relu forward", got, want, n, 0, 0);
    CHECK(want[0] == 0.0f);
    float *dg = s_nan(n), *dw = s_nan(n);
    dp_relu_backward_ref(dw, dout, want, n);
    dp_relu_backward(dg, dout, want, n);
    CHECK_CLOSE("relu backward", dg, dw, n, 0, 0);
    CHECK(dw[0] == 0.0f);
    /* finite differences, away from the kink */
    int bad = 0;
    for (int k = 0; k < 200; k++) {
        size_t i = dp_rng_below(&s_rng, (uint32_t)n);
        if (fabsf(in[i]) < 1e-2f) continue;
        double h = 1e-3, x = in[i];
        double fd = ((x + h > 0 ? x + h : 0) - (x - h > 0 ? x - h : 0)) / (2 * h) * dout[i];
        if (fabs(fd - dg[i]) > 1e-5 * (1 + fabs(fd))) bad++;
    }
    CHECK_EQ(bad, 0);
    /* in place */
    float *x = s_rand(n, -1, 1), *y = s_nan(n);
    dp_relu_forward_ref(y, x, n);
    dp_relu_forward(x, x, n);
    CHECK_CLOSE("relu in place", x, y, n, 0, 0);
    float *g = s_rand(n, -1, 1), *gw = s_nan(n);
    dp_relu_backward_ref(gw, g, y, n);
    dp_relu_backward(g, g, y, n);
    CHECK_CLOSE("relu backward in place", g, gw, n, 0, 0);
    free(in), free(dout), free(got), free(want), free(dg), free(dw), free(x), free(y), free(g);
    free(gw);
}

/* ---- max-pool ---------------------------------------------------------- */

static double s_pool_loss(const double *in, const float *r, const dp_pool_dims_t *d)
{
    double loss = 0;
    for (int pl = 0; pl < d->B * d->C; pl++)
        for (int oy = 0; oy < d->OH; oy++)
            for (int ox = 0; ox < d->OW; ox++) {
                double m = -INFINITY;
                for (int ky = 0; ky < d->K; ky++)
                    for (int kx = 0; kx < d->K; kx++) {
                        double v = in[(pl * d->H + oy * d->stride + ky) * d->W + ox * d->stride + kx];
                        if (v > m) m = v;
                    }
                loss += m * r[(pl * d->OH + oy) * d->OW + ox];
            }
    return loss;
}

static void test_maxpool(void)
{
    static const int cases[][6] = {/* B, C, H, W, K, stride */
                                   {1, 5, 13, 11, 2, 2}, {3, 5, 13, 11, 3, 3}, {3, 5, 13, 11, 3, 2},
                                   {3, 5, 13, 11, 2, 1}, {3, 5, 12, 10, 2, 2}, {64, 8, 28, 28, 2, 2}};
    for (int ci = 0; ci < 6; ci++) {
        dp_pool_dims_t d = {.B = cases[ci][0], .C = cases[ci][1], .H = cases[ci][2],
                            .W = cases[ci][3], .K = cases[ci][4], .stride = cases[ci][5]};
        dp_pool_dims_finish(&d);
        dp_cpu_set_threads(1 + ci % 2);
        size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.C * d.OH * d.OW;
        float *in = s_rand(nin, -1, 1), *r = s_rand(nout, -1, 1);
        /* distinct values 0.01 apart: finite differences (h = 1e-3) never
         * cross a kink where two window elements swap */
        int *perm = dp_malloc(nin * sizeof(int));
        for (size_t i = 0; i < nin; i++) perm[i] = (int)i;
        dp_rng_shuffle(&s_rng, perm, (int)nin);
        for (size_t i = 0; i < nin; i++) in[i] = 0.01f * (float)(perm[i] - (int)nin / 2);
        free(perm);
        float *got = s_nan(nout), *want = s_nan(nout);
        dp_maxpool_forward_ref(want, in, &d);
        dp_maxpool_forward(got, in, &d);
        CHECK_CLOSE("maxpool forward", got, want, nout, 0, 0);
        float *dg = s_nan(nin), *dr = s_nan(nin);
        dp_maxpool_backward_ref(dr, r, in, want, &d);
        dp_maxpool_backward(dg, r, in, want, &d);
        CHECK_CLOSE("maxpool backward", dg, dr, nin, 1e-6, 1e-6);
        if (nin < 5000) {
            double *x = s_to_double(in, nin);
            CHECK_FD("maxpool din ref", dr, x, nin, 60, s_pool_loss(x, r, &d));
            CHECK_FD("maxpool din", dg, x, nin, 60, s_pool_loss(x, r, &d));
            free(x);
        }
        free(in), free(r), free(got), free(want), free(dg), free(dr);
    }
    dp_cpu_set_threads(0);
}

/* Ties (relu zeros, equal pixels): the gradient goes to the first maximum in
 * row-major window order, once, and nowhere else. */
static void test_maxpool_ties(void)
{
    dp_pool_dims_t d = {.B = 1, .C = 2, .H = 5, .W = 4, .K = 2, .stride = 2};
    dp_pool_dims_finish(&d);
    float in[40] = {0}, out[8], dout[8], din[40], dref[40];
    in[20 + 5] = 3.0f; /* plane 1, window (0,0): only (1,1) is max */
    in[20 + 6] = 2.0f; /* plane 1, window (0,1): (1,2) = (1,3) = 2 tie */
    in[20 + 7] = 2.0f;
    for (int i = 0; i < 8; i++) dout[i] = (float)(i + 1);
    dp_maxpool_forward(out, in, &d);
    CHECK(out[0] == 0.0f && out[4] == 3.0f && out[5] == 2.0f);
    for (int i = 0; i < 40; i++) din[i] = NAN;
    dp_maxpool_backward(din, dout, in, out, &d);
    dp_maxpool_backward_ref(dref, dout, in, out, &d);
    CHECK_CLOSE("ties fast vs ref", din, dref, 40, 0, 0);
    CHECK(din[0] == 1.0f && din[1] == 0.0f && din[4] == 0.0f); /* all-zero window: first */
    CHECK(din[2] == 2.0f);
    CHECK(din[25] == 5.0f && din[20] == 0.0f);
    CHECK(din[22] == 0.0f && din[26] == 6.0f && din[27] == 0.0f); /* tie: first in scan order */
    CHECK(din[16] == 0.0f && din[39] == 0.0f); /* leftover row */
}

/* ---- softmax + cross-entropy ------------------------------------------- */

static double s_xent(const double *z, const int *labels, int B, int classes)
{
    double loss = 0;
    for (int n = 0; n < B; n++) {
        double mx = z[n * classes], s = 0;
        for (int k = 1; k < classes; k++)
            if (z[n * classes + k] > mx) mx = z[n * classes + k];
        for (int k = 0; k < classes; k++) s += exp(z[n * classes + k] - mx);
        loss += log(s) + mx - z[n * classes + labels[n]];
    }
    return loss / B;
}

static void test_softmax_xent(void)
{
    int B = 5, classes = 10, labels[5] = {0, 9, 3, 3, 7};
    float *z = s_rand((size_t)B * classes, -4, 4);
    z[12] = 80.0f; /* large logit: must not overflow */
    float *p = s_nan((size_t)B * classes), *pr = s_nan((size_t)B * classes);
    float loss = dp_softmax_xent_forward(p, z, labels, B, classes);
    float loss_r = dp_softmax_xent_forward_ref(pr, z, labels, B, classes);
    double *x = s_to_double(z, (size_t)B * classes);
    double want = s_xent(x, labels, B, classes);
    CHECK_NEAR(loss, want, 1e-5 * (1 + fabs(want)));
    CHECK_NEAR(loss_r, want, 1e-5 * (1 + fabs(want)));
    CHECK_CLOSE("softmax probs", p, pr, (size_t)B * classes, 1e-6, 1e-5);
    for (int n = 0; n < B; n++) {
        double s = 0;
        for (int k = 0; k < classes; k++) s += p[n * classes + k];
        CHECK_NEAR(s, 1.0, 1e-5);
    }
    float *g = s_nan((size_t)B * classes), *gr = s_nan((size_t)B * classes);
    dp_softmax_xent_backward(g, p, labels, B, classes);
    dp_softmax_xent_backward_ref(gr, pr, labels, B, classes);
    CHECK_CLOSE("softmax grad fast vs ref", g, gr, (size_t)B * classes, 1e-7, 1e-5);
    CHECK_FD("softmax grad ref", gr, x, (size_t)B * classes, B * classes,
             s_xent(x, labels, B, classes));
    CHECK_FD("softmax grad", g, x, (size_t)B * classes, B * classes, s_xent(x, labels, B, classes));
    /* a confident correct prediction has a loss near 0 */
    float z1[3] = {30, 0, 0}, p1[3];
    int l1 = 0;
    CHECK_NEAR(dp_softmax_xent_forward(p1, z1, &l1, 1, 3), 0.0, 1e-6);
    l1 = 1; /* and a confident wrong one about the logit gap, finite */
    CHECK_NEAR(dp_softmax_xent_forward(p1, z1, &l1, 1, 3), 30.0, 1e-3);
    free(z), free(p), free(pr), free(x), free(g), free(gr);
}

/* ---- batch norm, shortcut, global average pooling, dropout ------------- */

/* sum(bn_train(in) * r) in double: the batch's own statistics */
static double s_bn_loss(const double *in, const double *w, const double *b, const float *r,
                        int B, int C, int HW)
{
    double loss = 0, n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double mu = 0, v = 0;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) mu += in[((size_t)k * C + c) * HW + i];
        mu /= n;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                double x = in[((size_t)k * C + c) * HW + i] - mu;
                v += x * x;
            }
        v /= n;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                size_t at = ((size_t)k * C + c) * HW + i;
                loss += (w[c] * (in[at] - mu) / sqrt(v + 1e-5) + b[c]) * r[at];
            }
    }
    return loss;
}

/* The batch norm tests' shapes (B, C, HW): 2-D (HW > 1) and 1-D (HW 1). */
static const int s_bn_cases[][3] = {{3, 5, 143}, {1, 3, 7}, {4, 6, 1}, {2, 16, 64}, {7, 2, 17}};

/* bn 2-D (HW > 1) and 1-D (HW 1) on awkward shapes, 1 to 3 threads: the
 * training forward and its statistics, the evaluation forward and the
 * backward against the reference, both backwards against finite differences. */
static void test_batchnorm(void)
{
    for (int ci = 0; ci < 5; ci++) {
        dp_cpu_set_threads(1 + ci % 3);
        int B = s_bn_cases[ci][0], C = s_bn_cases[ci][1], HW = s_bn_cases[ci][2];
        size_t n = (size_t)B * C * HW;
        float *in = s_rand(n, -2, 3), *w = s_rand(C, 0.5f, 1.5f), *b = s_rand(C, -1, 1);
        float *r = s_rand(n, -1, 1), *rm = s_rand(C, -1, 1), *rv = s_rand(C, 0.5f, 2);
        float *got = s_nan(n), *want = s_nan(n), *m1 = s_nan(C), *v1 = s_nan(C), *m2 = s_nan(C),
              *v2 = s_nan(C);
        dp_bn_forward_train_ref(want, m1, v1, in, w, b, B, C, HW, 1e-5f);
        dp_bn_forward_train(got, m2, v2, in, w, b, B, C, HW, 1e-5f);
        CHECK_CLOSE("bn train forward", got, want, n, 1e-4, 1e-4);
        CHECK_CLOSE("bn batch mean", m2, m1, C, 1e-5, 1e-5);
        CHECK_CLOSE("bn batch var", v2, v1, C, 1e-5, 1e-5);
        s_poison(got, n);
        dp_bn_forward_eval_ref(want, in, w, b, rm, rv, B, C, HW, 1e-5f);
        dp_bn_forward_eval(got, in, w, b, rm, rv, B, C, HW, 1e-5f);
        CHECK_CLOSE("bn eval forward", got, want, n, 1e-5, 1e-5);
        float *din = s_nan(n), *dw = s_nan(C), *db = s_nan(C);
        float *din_r = s_nan(n), *dw_r = s_nan(C), *db_r = s_nan(C);
        dp_bn_backward_ref(din_r, dw_r, db_r, r, in, w, m1, v1, B, C, HW, 1e-5f);
        dp_bn_backward(din, dw, db, r, in, w, m2, v2, B, C, HW, 1e-5f);
        CHECK_CLOSE("bn din fast vs ref", din, din_r, n, 1e-4, 1e-3);
        CHECK_CLOSE("bn dw fast vs ref", dw, dw_r, C, 1e-4, 1e-4);
        CHECK_CLOSE("bn db fast vs ref", db, db_r, C, 1e-4, 1e-4);
        if (B * HW > 1) {
            double *xi = s_to_double(in, n), *xw = s_to_double(w, C), *xb = s_to_double(b, C);
            CHECK_FD("bn din ref", din_r, xi, n, 40, s_bn_loss(xi, xw, xb, r, B, C, HW));
            CHECK_FD("bn din fast", din, xi, n, 40, s_bn_loss(xi, xw, xb, r, B, C, HW));
            CHECK_FD("bn dw fast", dw, xw, C, C, s_bn_loss(xi, xw, xb, r, B, C, HW));
            CHECK_FD("bn db fast", db, xb, C, C, s_bn_loss(xi, xw, xb, r, B, C, HW));
            free(xi), free(xw), free(xb);
        }
        /* din NULL: the parameter gradients still right */
        s_poison(dw, C);
        dp_bn_backward(NULL, dw, db, r, in, w, m2, v2, B, C, HW, 1e-5f);
        CHECK_CLOSE("bn dw (din NULL)", dw, dw_r, C, 1e-4, 1e-4);
        free(in), free(w), free(b), free(r), free(rm), free(rv), free(got), free(want);
        free(m1), free(v1), free(m2), free(v2), free(din), free(dw), free(db), free(din_r);
        free(dw_r), free(db_r);
    }
    dp_cpu_set_threads(0);
}

/* bn then relu as one op (dp_bn_relu_*) against the two ops in turn, bit
 * for bit, on awkward shapes and 1 to 3 threads: the training forward and
 * its statistics, the evaluation forward, and the backward (dout wrt the
 * relu's output) with din and without. Values a bn output of exactly 0
 * (w 0 in a channel) and ties to the mask's rule included. */
static void test_bn_relu_fused(void)
{
    for (int ci = 0; ci < 5; ci++) {
        dp_cpu_set_threads(1 + ci % 3);
        int B = s_bn_cases[ci][0], C = s_bn_cases[ci][1], HW = s_bn_cases[ci][2];
        size_t n = (size_t)B * C * HW;
        float *in = s_rand(n, -2, 3), *w = s_rand(C, -1.5f, 1.5f), *b = s_rand(C, -1, 1);
        float *r = s_rand(n, -1, 1), *rm = s_rand(C, -1, 1), *rv = s_rand(C, 0.5f, 2);
        w[0] = 0.0f, b[0] = 0.0f; /* channel 0's bn output is all 0: relu's mask is off */
        float *bn = s_nan(n), *want = s_nan(n), *got = s_nan(n);
        float *m1 = s_nan(C), *v1 = s_nan(C), *m2 = s_nan(C), *v2 = s_nan(C);
        dp_bn_forward_train(bn, m1, v1, in, w, b, B, C, HW, 1e-5f);
        dp_relu_forward(want, bn, n);
        dp_bn_relu_forward_train(got, m2, v2, in, w, b, B, C, HW, 1e-5f);
        CHECK(memcmp(got, want, n * sizeof(float)) == 0);
        CHECK(memcmp(m2, m1, C * sizeof(float)) == 0 && memcmp(v2, v1, C * sizeof(float)) == 0);
        s_poison(got, n);
        dp_bn_forward_eval(bn, in, w, b, rm, rv, B, C, HW, 1e-5f);
        dp_relu_forward(bn, bn, n);
        dp_bn_relu_forward_eval(got, in, w, b, rm, rv, B, C, HW, 1e-5f);
        CHECK(memcmp(got, bn, n * sizeof(float)) == 0);
        /* the backward, dout wrt the training forward's relu output `want` */
        float *g = s_nan(n), *din = s_nan(n), *dw = s_nan(C), *db = s_nan(C);
        float *din_f = s_nan(n), *dw_f = s_nan(C), *db_f = s_nan(C);
        dp_relu_backward(g, r, want, n);
        dp_bn_backward(din, dw, db, g, in, w, m1, v1, B, C, HW, 1e-5f);
        dp_bn_relu_backward(din_f, dw_f, db_f, r, want, in, w, m1, v1, B, C, HW, 1e-5f);
        CHECK(memcmp(din_f, din, n * sizeof(float)) == 0);
        CHECK(memcmp(dw_f, dw, C * sizeof(float)) == 0 && memcmp(db_f, db, C * sizeof(float)) == 0);
        s_poison(dw_f, C), s_poison(db_f, C);
        dp_bn_relu_backward(NULL, dw_f, db_f, r, want, in, w, m1, v1, B, C, HW, 1e-5f);
        CHECK(memcmp(dw_f, dw, C * sizeof(float)) == 0 && memcmp(db_f, db, C * sizeof(float)) == 0);
        /* and the pair against the references, as the unfused ops are */
        float *din_r = s_nan(n), *dw_r = s_nan(C), *db_r = s_nan(C);
        dp_relu_backward_ref(g, r, want, n);
        dp_bn_backward_ref(din_r, dw_r, db_r, g, in, w, m1, v1, B, C, HW, 1e-5f);
        CHECK_CLOSE("bn relu din fused vs ref", din_f, din_r, n, 1e-4, 1e-3);
        CHECK_CLOSE("bn relu dw fused vs ref", dw_f, dw_r, C, 1e-4, 1e-4);
        free(in), free(w), free(b), free(r), free(rm), free(rv), free(bn), free(want), free(got);
        free(m1), free(v1), free(m2), free(v2), free(g), free(din), free(dw), free(db);
        free(din_f), free(dw_f), free(db_f), free(din_r), free(dw_r), free(db_r);
    }
    dp_cpu_set_threads(0);
}

/* sum((a + shortcut(in)) * r) in double, for the finite differences */
static double s_short_loss(const double *in, const float *a, const float *r,
                           const dp_shortcut_dims_t *d)
{
    double loss = 0;
    int lo = (d->OC - d->C) / 2;
    for (int k = 0; k < d->B; k++)
        for (int oc = 0; oc < d->OC; oc++)
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    size_t at = (((size_t)k * d->OC + oc) * d->OH + oy) * d->OW + ox;
                    double v = a[at];
                    int c = oc - lo;
                    if (c >= 0 && c < d->C)
                        v += in[(((size_t)k * d->C + c) * d->H + oy * d->stride) * d->W +
                                ox * d->stride];
                    loss += v * r[at];
                }
    return loss;
}

/* Identity and option A (stride 2, channels padded evenly and oddly, odd sides). */
static void test_shortcut(void)
{
    static const int cases[][6] = {/* B, C, H, W, OC, stride */
                                   {2, 4, 5, 7, 4, 1}, {3, 4, 7, 5, 8, 2}, {1, 3, 8, 8, 6, 2},
                                   {2, 2, 9, 6, 5, 2}, {2, 16, 32, 32, 32, 2}};
    for (int ci = 0; ci < 5; ci++) {
        dp_cpu_set_threads(1 + ci % 3);
        dp_shortcut_dims_t d = {.B = cases[ci][0], .C = cases[ci][1], .H = cases[ci][2],
                                .W = cases[ci][3], .OC = cases[ci][4], .stride = cases[ci][5]};
        dp_shortcut_dims_finish(&d);
        CHECK_EQ(d.OH, (d.H + d.stride - 1) / d.stride);
        size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.OC * d.OH * d.OW;
        float *in = s_rand(nin, -1, 1), *a = s_rand(nout, -1, 1), *r = s_rand(nout, -1, 1);
        float *got = s_nan(nout), *want = s_nan(nout), *din = s_nan(nin), *din_r = s_nan(nin);
        dp_shortcut_add_forward_ref(want, a, in, &d);
        dp_shortcut_add_forward(got, a, in, &d);
        CHECK(memcmp(got, want, nout * sizeof(float)) == 0);
        dp_shortcut_backward_ref(din_r, r, &d);
        dp_shortcut_backward(din, r, &d);
        CHECK(memcmp(din, din_r, nin * sizeof(float)) == 0);
        double *xi = s_to_double(in, nin);
        CHECK_FD("shortcut din", din, xi, nin, 60, s_short_loss(xi, a, r, &d));
        /* in place on a (the executor adds into the body's output) */
        memcpy(got, a, nout * sizeof(float));
        dp_shortcut_add_forward(got, got, in, &d);
        CHECK(memcmp(got, want, nout * sizeof(float)) == 0);
        free(xi), free(in), free(a), free(r), free(got), free(want), free(din), free(din_r);
    }
    dp_cpu_set_threads(0);
}

static void test_gap(void)
{
    int B = 3, C = 5, HW = 49;
    size_t n = (size_t)B * C * HW;
    float *in = s_rand(n, -1, 1), *r = s_rand((size_t)B * C, -1, 1);
    float *got = s_nan((size_t)B * C), *want = s_nan((size_t)B * C), *din = s_nan(n),
          *din_r = s_nan(n);
    dp_gap_forward_ref(want, in, B, C, HW);
    dp_gap_forward(got, in, B, C, HW);
    CHECK_CLOSE("gap forward", got, want, (size_t)B * C, 1e-6, 1e-5);
    dp_gap_backward_ref(din_r, r, B, C, HW);
    dp_gap_backward(din, r, B, C, HW);
    CHECK_CLOSE("gap backward", din, din_r, n, 1e-7, 1e-6);
    for (size_t i = 0; i < n; i++) CHECK_NEAR(din[i], r[i / HW] / HW, 1e-7);
    free(in), free(r), free(got), free(want), free(din), free(din_r);
}

/* The mask is a function of (seed, step, sample, element) alone: the fast
 * and reference kernels and any thread count agree bit for bit, the kept
 * fraction is about 1 - p, kept elements scale by 1 / (1 - p), the backward
 * passes the gradient through the same mask, and another step or seed
 * draws another mask. */
static void test_dropout(void)
{
    int B = 4;
    size_t N = 1000, n = (size_t)B * N;
    float p = 0.3f;
    float *in = s_rand(n, 0.5f, 1), *want = s_nan(n), *got = s_nan(n), *g = s_nan(n);
    dp_dropout_forward_ref(want, in, B, N, p, 7, 11, 3);
    for (int t = 1; t <= 3; t++) {
        dp_cpu_set_threads(t);
        s_poison(got, n);
        dp_dropout_forward(got, in, B, N, p, 7, 11, 3);
        CHECK(memcmp(got, want, n * sizeof(float)) == 0);
    }
    dp_cpu_set_threads(0);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != 0.0f) {
            kept++;
            CHECK_NEAR(got[i], in[i] / (1 - p), 1e-6);
        }
        CHECK_EQ(got[i] != 0.0f, dp_dropout_keep(7, 11, 3 + i / N, i % N, p));
    }
    CHECK(kept > n * 0.65 && kept < n * 0.75);
    dp_dropout_backward(g, in, B, N, p, 7, 11, 3);
    CHECK(memcmp(g, want, n * sizeof(float)) == 0);
    dp_dropout_forward(g, in, B, N, p, 7, 12, 3);
    CHECK(memcmp(g, want, n * sizeof(float)) != 0);
    dp_dropout_forward(g, in, B, N, p, 8, 11, 3);
    CHECK(memcmp(g, want, n * sizeof(float)) != 0);
    /* p = 0 keeps everything */
    dp_dropout_forward(g, in, B, N, 0.0f, 7, 11, 3);
    CHECK(memcmp(g, in, n * sizeof(float)) == 0);
    free(in), free(want), free(got), free(g);
}

/* A convolution without bias: db NULL is left alone, dw and din as with one. */
static void test_conv_no_bias(void)
{
    s_conv_case_t cc = {3, 16, 9, 9, 32, 3, 1, 2};
    dp_conv_dims_t d = s_dims(&cc);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
    size_t nout = (size_t)d.B * d.OC * d.OH * d.OW;
    float *in = s_rand(nin, -1, 1), *w = s_rand(nw, -1, 1), *r = s_rand(nout, -1, 1);
    float *din = s_nan(nin), *dw = s_nan(nw), *db = s_nan(d.OC), *din2 = s_nan(nin),
          *dw2 = s_nan(nw);
    dp_conv2d_backward(din, dw, db, r, in, w, &d);
    dp_conv2d_backward(din2, dw2, NULL, r, in, w, &d);
    CHECK(memcmp(din, din2, nin * sizeof(float)) == 0);
    CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0);
    dp_conv2d_backward_ref(din2, dw2, NULL, r, in, w, &d);
    CHECK_CLOSE("conv no-bias ref dw", dw2, dw, nw, 1e-4, 1e-4);
    free(in), free(w), free(r), free(din), free(dw), free(db), free(din2), free(dw2);
}

static void test_vec_add(void)
{
    size_t n = 100003;
    float *a = s_rand(n, -1, 1), *b = s_rand(n, -1, 1), *c = s_nan(n);
    memcpy(c, a, n * sizeof(float));
    dp_vec_add(c, b, n);
    for (size_t i = 0; i < n; i += 97) CHECK_EQ(c[i], a[i] + b[i]);
    free(a), free(b), free(c);
}

static void test_threads(void)
{
    dp_cpu_set_threads(1);
    CHECK_EQ(dp_cpu_threads(), 1);
    dp_cpu_set_threads(0); /* back to all cores */
    CHECK(dp_cpu_threads() >= 1);
    dp_cpu_set_threads(-3);
    CHECK(dp_cpu_threads() >= 1);
}

DP_TESTS(T(test_conv_dims), T(test_conv_forward_vs_ref), T(test_conv_backward_dense),
         T(test_conv_backward_sparse), T(test_conv_default_shape),
         T(test_conv_paths_bitwise_equal), T(test_conv_direct_vs_before), T(test_conv_flat_kernel), T(test_isa_choose), T(test_isa_refused_before_main),
         T(test_fc), T(test_relu), T(test_tanh),
         T(test_maxpool), T(test_maxpool_ties), T(test_softmax_xent), T(test_threads),
         T(test_batchnorm), T(test_bn_relu_fused), T(test_shortcut), T(test_gap), T(test_dropout),
         T(test_conv_no_bias), T(test_vec_add))
