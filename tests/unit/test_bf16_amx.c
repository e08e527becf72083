/* test_bf16_amx: the AMX bf16 path (kernels/cpu/bf16_amx.h).
 *
 * The kernel's body (kernels/cpu/bf16_amx_body.h) is compiled here a second
 * time against a scalar model of the tile instructions, so its packing,
 * tiling and tails run on every CPU; the real instructions run only where
 * dp_bf16_amx_enable succeeds (a skip names what is missing elsewhere).
 *
 * Reference: ops.h's fp32 _ref kernels (double sums) on operands rounded
 * with dp_bf16_round. A product of two bf16 is exact in fp32, so the
 * kernel differs from that reference only by the order and rounding of
 * its fp32 sums. n terms summed in fp32 in any order are off by at most
 * gamma_{n-1} sum|terms|, gamma_k = k u / (1 - k u), u = 2^-24 (Higham,
 * Accuracy and Stability of Numerical Algorithms, 4.2), which is below
 * n u for these n; the bound checked is (n + 2) u sum|terms|, the 2 for
 * the reference's own rounding to fp32 and slack, with sum|terms| the
 * reference run on the operands' absolute values (the bias, added
 * unrounded, counted as a term). The operands, uniform in [-1, 1), keep
 * every sum far from fp32's denormals, which TDPBF16PS flushes. A bug (a
 * pair swapped, a tail dropped, a stride off) moves a result by about a
 * term, far beyond the bound. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/rng.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"
#include "tests/test.h"

/* ---- the scalar model of the tile instructions --------------------------
 * Per thread, as the hardware's tile state is: 8 tiles of 16 rows x 64
 * bytes and the configuration ldtilecfg gave them. What the hardware
 * faults on (#UD, #GP) aborts here with one line. Intel SDM vol. 2,
 * LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TILERELEASE, TDPBF16PS. */
typedef struct {
    int configured;
    int rows[8], colsb[8];
    uint8_t t[8][16][64];
} m_state_t;
static _Thread_local m_state_t m_s;

static void m_fault(const char *what)
{
    fprintf(stderr, "amx model: %s (the hardware faults)\n", what);
    abort();
}

/* LDTILECFG: palette 1 (8 tiles, 16 rows, 64 bytes a row), start_row 0
 * (this kernel is never restarted), reserved bytes 0, and per tile rows
 * and bytes a row both zero or both within the palette; the tiles are
 * zeroed. */
static void m_loadconfig(const void *cfg)
{
    const uint8_t *b = cfg;
    if (b[0] != 1) m_fault("ldtilecfg: palette_id is not 1");
    if (b[1] != 0) m_fault("ldtilecfg: start_row is not 0");
    for (int i = 2; i < 16; i++)
        if (b[i]) m_fault("ldtilecfg: a reserved byte is not 0");
    for (int i = 32; i < 48; i++)
        if (b[i]) m_fault("ldtilecfg: colsb of a tile past the 8th is not 0");
    for (int i = 56; i < 64; i++)
        if (b[i]) m_fault("ldtilecfg: rows of a tile past the 8th is not 0");
    memset(&m_s, 0, sizeof m_s);
    for (int t = 0; t < 8; t++) {
        m_s.colsb[t] = b[16 + 2 * t] | b[17 + 2 * t] << 8;
        m_s.rows[t] = b[48 + t];
        if (m_s.colsb[t] > 64 || m_s.rows[t] > 16 || !m_s.colsb[t] != !m_s.rows[t])
            m_fault("ldtilecfg: a tile's shape is outside palette 1");
    }
    m_s.configured = 1;
}

static void m_release(void) { memset(&m_s, 0, sizeof m_s); }

static void m_tile(int t)
{
    if (!m_s.configured) m_fault("a tile instruction before ldtilecfg");
    if (t < 0 || t > 7 || !m_s.rows[t]) m_fault("a tile the configuration leaves out");
}

static void m_zero(int t)
{
    m_tile(t);
    memset(m_s.t[t], 0, sizeof m_s.t[t]);
}

/* TILELOADD: rows[t] rows of colsb[t] bytes, stride bytes apart; the rest
 * of the tile is zero. */
static void m_loadd(int t, const void *base, long stride)
{
    m_zero(t);
    for (int r = 0; r < m_s.rows[t]; r++)
        memcpy(m_s.t[t][r], (const uint8_t *)base + r * stride, (size_t)m_s.colsb[t]);
}

static void m_stored(int t, void *base, long stride)
{
    m_tile(t);
    for (int r = 0; r < m_s.rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, m_s.t[t][r], (size_t)m_s.colsb[t]);
}

/* DAZ on an input, FTZ on an output: a denormal fp32 is a zero of its sign. */
static float m_flush(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

static float m_bf16(int t, int row, int i)
{
    uint16_t h;
    memcpy(&h, &m_s.t[t][row][2 * i], sizeof h);
    return m_flush(dp_bf16_to_f32(h));
}

static float m_f32(int t, int row, int i)
{
    float x;
    memcpy(&x, &m_s.t[t][row][4 * i], sizeof x);
    return x;
}

/* TDPBF16PS c, a, b, as the Operation section of the SDM's entry gives it
 * (Intel SDM vol. 2, "TDPBF16PS: Dot Product of BF16 Tiles Accumulated
 * into Packed Single Precision Tile"; felixcloutier.com/x86/tdpbf16ps
 * reproduces it): per row m of c, two fp32 accumulators per column n,
 * zeroed, temp[2n] for the pairs' first products and temp[2n + 1] for
 * their second, each "FP32 FMA with DAZ=FTZ=1, RNE rounding" over k in
 * order; then "tmpf32 := temp1.fp32[2*n] + temp1.fp32[2*n+1]" and
 * c[m][n] := c[m][n] + tmpf32, DAZ, FTZ, RNE again. MXCSR plays no part
 * (C's default rounding is RNE). The shape checks are its #UD list. */
static void m_dpbf16ps(int c, int a, int b)
{
    m_tile(c);
    m_tile(a);
    m_tile(b);
    if (m_s.colsb[c] % 4 || m_s.colsb[a] % 4 || m_s.colsb[b] % 4)
        m_fault("tdpbf16ps: a tile's row is not whole dwords");
    if (m_s.colsb[a] / 4 != m_s.rows[b] || m_s.colsb[c] != m_s.colsb[b] ||
        m_s.rows[c] != m_s.rows[a])
        m_fault("tdpbf16ps: the tiles' shapes do not multiply");
    int K = m_s.colsb[a] / 4, N = m_s.colsb[c] / 4;
    for (int m = 0; m < m_s.rows[c]; m++) {
        float temp[32] = {0};
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                temp[2 * n] = m_flush(fmaf(m_bf16(a, m, 2 * k), m_bf16(b, k, 2 * n), temp[2 * n]));
                temp[2 * n + 1] =
                    m_flush(fmaf(m_bf16(a, m, 2 * k + 1), m_bf16(b, k, 2 * n + 1), temp[2 * n + 1]));
            }
        for (int n = 0; n < N; n++) {
            float sum = m_flush(temp[2 * n] + temp[2 * n + 1]);
            float out = m_flush(m_flush(m_f32(c, m, n)) + sum);
            memcpy(&m_s.t[c][m][4 * n], &out, sizeof out);
        }
    }
}

#define AMX_LOADCONFIG(cfg) m_loadconfig(cfg)
#define AMX_RELEASE() m_release()
#define AMX_ZERO(t) m_zero(t)
#define AMX_LOADD(t, base, stride) m_loadd(t, base, (long)(stride))
#define AMX_STORED(t, base, stride) m_stored(t, base, (long)(stride))
#define AMX_DPBF16PS(c, a, b) m_dpbf16ps(c, a, b)
#include "kernels/cpu/bf16_amx_body.h"

static const dp_bf16_ops_t s_model = {
    .name = "amx (model)",
    .conv_forward = s_amx_conv_forward,
    .conv_backward = s_amx_conv_backward,
    .fc_forward = s_amx_fc_forward,
    .fc_backward = s_amx_fc_backward,
};

/* ---- operands, references, the bound ------------------------------------ */

static dp_rng_t s_rng;

/* n floats uniform in [-1, 1) */
static float *t_rand(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = 2.0f * dp_rng_uniform(&s_rng) - 1.0f;
    return p;
}

/* x rounded to bf16 (abs: and its absolute value), a new array */
static float *t_bf16(const float *x, size_t n, int abs)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = abs ? fabsf(dp_bf16_round(x[i])) : dp_bf16_round(x[i]);
    return p;
}

/* |got - want| <= (terms + 2) 2^-24 mag elementwise (the file's header says
 * why); prints the first few misses and the worst; one check. */
static void t_check_bound(const char *what, const float *got, const float *want, const float *mag,
                          size_t n, double terms)
{
    size_t bad = 0, worst_i = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - (double)want[i]);
        double tol = (terms + 2) * 0x1p-24 * mag[i];
        if (!(diff <= tol)) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (bound %.3g)\n", what, i, got[i],
                        want[i], tol);
            bad++;
        }
        if (diff > worst || diff != diff) {
            worst = diff;
            worst_i = i;
        }
    }
    t_checks++;
    if (bad) {
        t_failures++;
        fprintf(stderr, "  %s: %zu of %zu outside the bound; worst |diff| %.3g at %zu\n", what,
                bad, n, worst, worst_i);
    }
}

/* The same bits (the NULL-output variants, the thread counts, twice) */
static void t_check_bits(const char *what, const float *a, const float *b, size_t n)
{
    t_checks++;
    if (memcmp(a, b, n * sizeof *a) == 0) return;
    t_failures++;
    size_t i = 0;
    while (memcmp(a + i, b + i, sizeof *a) == 0) i++;
    fprintf(stderr, "  %s: bits differ first at %zu: %.9g vs %.9g\n", what, i, a[i], b[i]);
}

/* ---- one shape through every pass ------------------------------------- */

typedef struct {
    int B, C, H, W, OC, K, pad, stride;
} t_conv_shape_t;

/* B 1 and 3; C 1, 3, 17, 33; OC 1, 10, 33; K 1, 3, 5; stride 1, 2; pad 0,
 * 1, 2; H != W: K = C K K and the positions P = OH OW fall on and off
 * whole tiles (K 1, 27, 153, 825; P 2 to 80). */
static const t_conv_shape_t s_conv_shapes[] = {
    {1, 1, 5, 7, 1, 1, 0, 1},   {3, 3, 9, 6, 10, 3, 1, 1},  {1, 17, 7, 10, 33, 3, 1, 2},
    {3, 33, 6, 5, 10, 5, 2, 1}, {1, 3, 11, 8, 33, 5, 2, 2}, {3, 1, 6, 9, 10, 3, 0, 2},
    {1, 33, 4, 3, 1, 1, 0, 2},  {3, 17, 5, 6, 33, 3, 2, 1}, {3, 33, 8, 10, 33, 1, 1, 1},
};

static void t_conv_fwd(const dp_bf16_ops_t *ops, const dp_conv_dims_t *d, const char *shape,
                       const float *in, const float *w, const float *b)
{
    size_t nin = (size_t)d->B * d->C * d->H * d->W, nw = (size_t)d->OC * d->C * d->K * d->K;
    size_t nout = (size_t)d->B * d->OC * d->OH * d->OW;
    float *rin = t_bf16(in, nin, 0), *rw = t_bf16(w, nw, 0), *ain = t_bf16(in, nin, 1);
    float *aw = t_bf16(w, nw, 1);
    float *ab_exact = malloc((size_t)d->OC * sizeof *ab_exact);
    for (int i = 0; i < d->OC; i++) ab_exact[i] = fabsf(b[i]); /* b is added unrounded */
    float *got = malloc(nout * sizeof *got), *want = malloc(nout * sizeof *want);
    float *mag = malloc(nout * sizeof *mag);
    char what[160];
    for (int bias = 0; bias < 2; bias++) {
        ops->conv_forward(got, in, w, bias ? b : NULL, d);
        dp_conv2d_forward_ref(want, rin, rw, bias ? b : NULL, d);
        dp_conv2d_forward_ref(mag, ain, aw, bias ? ab_exact : NULL, d);
        snprintf(what, sizeof what, "%s conv forward%s %s", ops->name, bias ? "" : " (b NULL)",
                 shape);
        t_check_bound(what, got, want, mag, nout, (double)d->C * d->K * d->K + 1);
    }
    free(rin), free(rw), free(ain), free(aw), free(ab_exact);
    free(got), free(want), free(mag);
}

static void t_conv_bwd(const dp_bf16_ops_t *ops, const dp_conv_dims_t *d, const char *shape,
                       const float *in, const float *w, const float *dout)
{
    size_t nin = (size_t)d->B * d->C * d->H * d->W, nw = (size_t)d->OC * d->C * d->K * d->K;
    size_t P = (size_t)d->OH * d->OW, nout = (size_t)d->B * d->OC * P;
    float *rin = t_bf16(in, nin, 0), *rw = t_bf16(w, nw, 0), *rdout = t_bf16(dout, nout, 0);
    float *ain = t_bf16(in, nin, 1), *aw = t_bf16(w, nw, 1), *adout = t_bf16(dout, nout, 1);
    float *din = malloc(nin * sizeof *din), *dw = malloc(nw * sizeof *dw);
    float *db = malloc((size_t)d->OC * sizeof *db), *dw2 = malloc(nw * sizeof *dw2);
    float *wdin = malloc(nin * sizeof *wdin), *wdw = malloc(nw * sizeof *wdw);
    float *wdb = malloc((size_t)d->OC * sizeof *wdb), *mdin = malloc(nin * sizeof *mdin);
    float *mdw = malloc(nw * sizeof *mdw), *mdb = malloc((size_t)d->OC * sizeof *mdb);
    ops->conv_backward(din, dw, db, dout, in, w, d);
    dp_conv2d_backward_ref(wdin, wdw, wdb, rdout, rin, rw, d);
    dp_conv2d_backward_ref(mdin, mdw, mdb, adout, ain, aw, d);
    for (int oc = 0; oc < d->OC; oc++) { /* db sums dout itself, unrounded */
        double s = 0, m = 0;
        for (int n = 0; n < d->B; n++)
            for (size_t p = 0; p < P; p++) {
                s += dout[((size_t)n * d->OC + oc) * P + p];
                m += fabs(dout[((size_t)n * d->OC + oc) * P + p]);
            }
        wdb[oc] = (float)s;
        mdb[oc] = (float)m;
    }
    char what[160];
    snprintf(what, sizeof what, "%s conv din %s", ops->name, shape);
    t_check_bound(what, din, wdin, mdin, nin, (double)d->OC * d->K * d->K);
    snprintf(what, sizeof what, "%s conv dw %s", ops->name, shape);
    t_check_bound(what, dw, wdw, mdw, nw, (double)d->B * P);
    snprintf(what, sizeof what, "%s conv db %s", ops->name, shape);
    t_check_bound(what, db, wdb, mdb, (size_t)d->OC, (double)d->B * P);
    /* ops.h's NULL din and db: dw's bits the same */
    ops->conv_backward(NULL, dw2, NULL, dout, in, w, d);
    snprintf(what, sizeof what, "%s conv dw (din, db NULL) %s", ops->name, shape);
    t_check_bits(what, dw2, dw, nw);
    free(rin), free(rw), free(rdout), free(ain), free(aw), free(adout);
    free(din), free(dw), free(db), free(dw2), free(wdin), free(wdw), free(wdb);
    free(mdin), free(mdw), free(mdb);
}

static void t_conv_case(const dp_bf16_ops_t *ops, const t_conv_shape_t *s)
{
    dp_conv_dims_t d = {.B = s->B, .C = s->C, .H = s->H, .W = s->W, .OC = s->OC, .K = s->K,
                        .pad = s->pad, .stride = s->stride};
    dp_conv_dims_finish(&d);
    char shape[96];
    snprintf(shape, sizeof shape, "B%d C%d %dx%d OC%d K%d pad %d stride %d", d.B, d.C, d.H, d.W,
             d.OC, d.K, d.pad, d.stride);
    float *in = t_rand((size_t)d.B * d.C * d.H * d.W);
    float *w = t_rand((size_t)d.OC * d.C * d.K * d.K), *b = t_rand((size_t)d.OC);
    float *dout = t_rand((size_t)d.B * d.OC * d.OH * d.OW);
    t_conv_fwd(ops, &d, shape, in, w, b);
    t_conv_bwd(ops, &d, shape, in, w, dout);
    free(in), free(w), free(b), free(dout);
}

/* fc: B 1 and 3, IN 1, 17, 1000, OUT 1, 10, 33 */
static const int s_fc_shapes[][3] = {
    {1, 1, 1},   {3, 17, 10}, {1, 1000, 33}, {3, 1, 33},   {1, 17, 1},
    {3, 1000, 10}, {3, 17, 33}, {1, 1000, 1},  {3, 1, 10},
};

static void t_fc_case(const dp_bf16_ops_t *ops, int B, int IN, int OUT)
{
    size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN, nout = (size_t)B * OUT;
    float *in = t_rand(nin), *w = t_rand(nw), *b = t_rand((size_t)OUT), *dout = t_rand(nout);
    float *rin = t_bf16(in, nin, 0), *rw = t_bf16(w, nw, 0), *rdout = t_bf16(dout, nout, 0);
    float *ain = t_bf16(in, nin, 1), *aw = t_bf16(w, nw, 1), *adout = t_bf16(dout, nout, 1);
    float *ab = malloc((size_t)OUT * sizeof *ab), *adout_exact = malloc(nout * sizeof *ab);
    for (int o = 0; o < OUT; o++) ab[o] = fabsf(b[o]);
    for (size_t i = 0; i < nout; i++) adout_exact[i] = fabsf(dout[i]);
    float *got = malloc(nout * sizeof *got), *want = malloc(nout * sizeof *got);
    float *mag = malloc(nout * sizeof *got), *din = malloc(nin * sizeof *din);
    float *wdin = malloc(nin * sizeof *din), *mdin = malloc(nin * sizeof *din);
    float *dw = malloc(nw * sizeof *dw), *wdw = malloc(nw * sizeof *dw), *mdw = malloc(nw * sizeof *dw);
    float *dw2 = malloc(nw * sizeof *dw), *db = malloc((size_t)OUT * sizeof *db);
    float *wdb = malloc((size_t)OUT * sizeof *db), *mdb = malloc((size_t)OUT * sizeof *db);
    char what[160];
    for (int bias = 0; bias < 2; bias++) {
        ops->fc_forward(got, in, w, bias ? b : NULL, B, IN, OUT);
        dp_fc_forward_ref(want, rin, rw, bias ? b : NULL, B, IN, OUT);
        dp_fc_forward_ref(mag, ain, aw, bias ? ab : NULL, B, IN, OUT);
        snprintf(what, sizeof what, "%s fc forward%s B%d IN %d OUT %d", ops->name,
                 bias ? "" : " (b NULL)", B, IN, OUT);
        t_check_bound(what, got, want, mag, nout, IN + 1.0);
    }
    ops->fc_backward(din, dw, db, dout, in, w, B, IN, OUT);
    dp_fc_backward_ref(wdin, wdw, wdb, rdout, rin, rw, B, IN, OUT);
    dp_fc_backward_ref(mdin, mdw, mdb, adout, ain, aw, B, IN, OUT);
    snprintf(what, sizeof what, "%s fc din B%d IN %d OUT %d", ops->name, B, IN, OUT);
    t_check_bound(what, din, wdin, mdin, nin, OUT);
    snprintf(what, sizeof what, "%s fc dw B%d IN %d OUT %d", ops->name, B, IN, OUT);
    t_check_bound(what, dw, wdw, mdw, nw, B);
    /* db sums dout itself, unrounded */
    dp_fc_backward_ref(wdin, dw2, wdb, dout, rin, rw, B, IN, OUT);
    dp_fc_backward_ref(mdin, dw2, mdb, adout_exact, ain, aw, B, IN, OUT);
    snprintf(what, sizeof what, "%s fc db B%d IN %d OUT %d", ops->name, B, IN, OUT);
    t_check_bound(what, db, wdb, mdb, (size_t)OUT, B);
    /* ops.h's NULL din (and db): dw's bits the same */
    ops->fc_backward(NULL, dw2, NULL, dout, in, w, B, IN, OUT);
    snprintf(what, sizeof what, "%s fc dw (din, db NULL) B%d IN %d OUT %d", ops->name, B, IN,
             OUT);
    t_check_bits(what, dw2, dw, nw);
    free(in), free(w), free(b), free(dout), free(rin), free(rw), free(rdout);
    free(ain), free(aw), free(adout), free(ab), free(adout_exact), free(got), free(want);
    free(mag), free(din), free(wdin), free(mdin), free(dw), free(wdw), free(mdw), free(dw2);
    free(db), free(wdb), free(mdb);
}

/* ---- the tests ---------------------------------------------------------- */

/* One TDPBF16PS of the model on a 1 x 4 bf16 A, a 2 x 1-pair B and a 1 x 1
 * C holding dest: what the SDM's pseudo-code gives. */
static float t_model_dp(const float a[4], const float b[4], float dest)
{
    uint8_t cfg[64] = {1};
    cfg[16 + 0] = 4, cfg[48 + 0] = 1; /* C: 1 row of 1 fp32 */
    cfg[16 + 2] = 8, cfg[48 + 1] = 1; /* A: 1 row of 4 bf16 */
    cfg[16 + 4] = 4, cfg[48 + 2] = 2; /* B: 2 rows of 1 pair */
    uint16_t ah[4], bh[4];
    for (int i = 0; i < 4; i++) {
        memcpy(&ah[i], (const uint8_t *)&a[i] + 2, 2); /* the top half: exact for these */
        memcpy(&bh[i], (const uint8_t *)&b[i] + 2, 2);
    }
    float out;
    m_loadconfig(cfg);
    m_loadd(0, &dest, 4);
    m_loadd(1, ah, 8);
    m_loadd(2, bh, 4);
    m_dpbf16ps(0, 1, 2);
    m_stored(0, &out, 4);
    m_release();
    return out;
}

/* The model against results worked by hand from the SDM: the pairs'
 * order, the two accumulators and their rounding, DAZ and FTZ. */
static void test_model_tdpbf16ps(void)
{
    /* a0 b0 + a1 b1 (+ a2 b2 + a3 b3): 1*3 + 2*5, not 1*5 + 2*3 */
    CHECK(t_model_dp((float[]){1, 2, 0, 0}, (float[]){3, 5, 0, 0}, 0.5f) == 13.5f);
    CHECK(t_model_dp((float[]){1, 2, 4, 8}, (float[]){3, 5, 0.5f, 0.25f}, 0) == 17.0f);
    /* even products 2^24 then 1: 2^24 + 1 rounds to 2^24 (a tie, to even);
     * odd ones -2^24 then 0; their sum 0. A sum in k order would give 1. */
    CHECK(t_model_dp((float[]){0x1p12f, -0x1p12f, 1, 0}, (float[]){0x1p12f, 0x1p12f, 1, 0}, 0) ==
          0.0f);
    /* DAZ: bf16 0x0001 (2^-133) times 2^100 is 2^-33 exactly, but the input is a denormal */
    CHECK(t_model_dp((float[]){0x1p-133f, 0, 0, 0}, (float[]){0x1p100f, 0, 0, 0}, 0) == 0.0f);
    /* FTZ: 2^-70 squared is 2^-140, an fp32 denormal */
    CHECK(t_model_dp((float[]){0x1p-70f, 0, 0, 0}, (float[]){0x1p-70f, 0, 0, 0}, 0) == 0.0f);
    CHECK(t_model_dp((float[]){0x1p-60f, 0, 0, 0}, (float[]){0x1p-60f, 0, 0, 0}, 0) == 0x1p-120f);
}

static void test_model_conv(void)
{
    dp_rng_seed(&s_rng, 58);
    for (size_t i = 0; i < sizeof s_conv_shapes / sizeof s_conv_shapes[0]; i++)
        t_conv_case(&s_model, &s_conv_shapes[i]);
}

static void test_model_fc(void)
{
    dp_rng_seed(&s_rng, 59);
    for (size_t i = 0; i < sizeof s_fc_shapes / sizeof s_fc_shapes[0]; i++)
        t_fc_case(&s_model, s_fc_shapes[i][0], s_fc_shapes[i][1], s_fc_shapes[i][2]);
}

/* Every pass of one conv and one fc shape (with work enough for
 * dp_cpu_team's second thread) into out, in order. */
static void t_all_passes(const dp_bf16_ops_t *ops, float *out, const float *x, size_t *n)
{
    dp_conv_dims_t d = {.B = 2, .C = 16, .H = 12, .W = 11, .OC = 20, .K = 3, .pad = 1, .stride = 1};
    dp_conv_dims_finish(&d);
    int B = 5, IN = 300, OUT = 45;
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
    size_t nout = (size_t)d.B * d.OC * d.OH * d.OW, o = 0;
    const float *in = x, *w = x + nin, *dout = w + nw, *b = dout + nout;
    ops->conv_forward(out + o, in, w, b, &d);
    o += nout;
    ops->conv_backward(out + o, out + o + nin, out + o + nin + nw, dout, in, w, &d);
    o += nin + nw + (size_t)d.OC;
    ops->fc_forward(out + o, x, x + (size_t)B * IN, b, B, IN, OUT);
    o += (size_t)B * OUT;
    ops->fc_backward(out + o, out + o + (size_t)B * IN, out + o + (size_t)B * IN + (size_t)OUT * IN,
                     x + 7, x, x + (size_t)B * IN, B, IN, OUT);
    o += (size_t)B * IN + (size_t)OUT * IN + OUT;
    *n = o;
}

/* The same bits twice and for one and two threads (each C tile is one
 * thread's, its K in order; the sums outside the tiles in a fixed order). */
static void t_deterministic(const dp_bf16_ops_t *ops)
{
    dp_rng_seed(&s_rng, 60);
    float *x = t_rand(200000);
    size_t cap = 400000, n1, n2;
    float *a = calloc(cap, sizeof *a), *b = calloc(cap, sizeof *b);
    char what[96];
    dp_cpu_set_threads(2);
    CHECK_EQ(dp_cpu_team(2.0 * 16 * 20 * 9 * 12 * 11), 2); /* the conv splits */
    CHECK_EQ(dp_cpu_team(5.0 * 300 * 45), 2);              /* and so does the fc */
    for (int threads = 1; threads <= 2; threads++) {
        dp_cpu_set_threads(threads);
        t_all_passes(ops, b, x, &n2);
        if (threads == 1) {
            t_all_passes(ops, a, x, &n1);
            CHECK(n1 == n2 && n1 <= cap);
        }
        snprintf(what, sizeof what, "%s, %d thread%s against 1 thread", ops->name, threads,
                 threads > 1 ? "s" : "");
        t_check_bits(what, b, a, n1);
    }
    dp_cpu_set_threads(0);
    free(x), free(a), free(b);
}

static void test_model_deterministic(void) { t_deterministic(&s_model); }

/* The real instructions, where this CPU and kernel run them: else the
 * test skips, naming what is missing. */
#define T_NEED_AMX()                                                           \
    do {                                                                       \
        char t_why[DP_ERR_LEN];                                                \
        if (dp_bf16_amx_enable(t_why) != 0) SKIP(t_why);                       \
    } while (0)

/* dp_bf16_amx_enable agrees with GCC's own reading of the CPU (whose AMX
 * features also need XCR0's tile state), fails only on the permission
 * where both see AMX, gives one line, and the same answer twice. */
static void test_amx_enable(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    int have = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
               __builtin_cpu_supports("avx512f");
    char why[DP_ERR_LEN] = "", again[DP_ERR_LEN] = "";
    int rc = dp_bf16_amx_enable(why);
    CHECK_EQ(dp_bf16_amx_enable(again), rc);
    if (!have) CHECK_EQ(rc, -1);
    if (have) CHECK(rc == 0 || strstr(why, "arch_prctl"));
    if (rc != 0) {
        fprintf(stderr, "  (this CPU: %s)\n", why);
        CHECK(strncmp(why, "bf16 amx: ", 10) == 0 && !strchr(why, '\n'));
        CHECK_STR(again, why);
    }
#else
    SKIP("AMX is x86-64's");
#endif
}

static void test_amx_conv(void)
{
#if defined(__x86_64__)
    T_NEED_AMX();
    dp_rng_seed(&s_rng, 58);
    for (size_t i = 0; i < sizeof s_conv_shapes / sizeof s_conv_shapes[0]; i++)
        t_conv_case(&dp_bf16_amx, &s_conv_shapes[i]);
#else
    SKIP("AMX is x86-64's");
#endif
}

static void test_amx_fc(void)
{
#if defined(__x86_64__)
    T_NEED_AMX();
    dp_rng_seed(&s_rng, 59);
    for (size_t i = 0; i < sizeof s_fc_shapes / sizeof s_fc_shapes[0]; i++)
        t_fc_case(&dp_bf16_amx, s_fc_shapes[i][0], s_fc_shapes[i][1], s_fc_shapes[i][2]);
#else
    SKIP("AMX is x86-64's");
#endif
}

static void test_amx_deterministic(void)
{
#if defined(__x86_64__)
    T_NEED_AMX();
    t_deterministic(&dp_bf16_amx);
#else
    SKIP("AMX is x86-64's");
#endif
}

/* The real instructions give the model's bits: the model reads the SDM
 * right (a failure here with the other amx tests passing says the model,
 * not the kernel, is off). */
static void test_amx_matches_model(void)
{
#if defined(__x86_64__)
    T_NEED_AMX();
    dp_rng_seed(&s_rng, 61);
    float *x = t_rand(200000);
    size_t cap = 400000, n1, n2;
    float *a = calloc(cap, sizeof *a), *b = calloc(cap, sizeof *b);
    t_all_passes(&s_model, a, x, &n1);
    t_all_passes(&dp_bf16_amx, b, x, &n2);
    CHECK(n1 == n2);
    t_check_bits("amx against the model", b, a, n1);
    free(x), free(a), free(b);
#else
    SKIP("AMX is x86-64's");
#endif
}

DP_TESTS(T(test_model_tdpbf16ps), T(test_model_conv), T(test_model_fc),
         T(test_model_deterministic), T(test_amx_enable), T(test_amx_conv), T(test_amx_fc),
         T(test_amx_deterministic), T(test_amx_matches_model))
