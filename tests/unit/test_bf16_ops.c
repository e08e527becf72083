/* test_bf16_ops: the bf16 passes (kernels/cpu/bf16_ops.h).
 *
 * - dp_bf16_from_f32 against a table (ties both ways, NaN, infinities,
 *   overflow, subnormals), and the avx512_bf16 path's vector packer bit for
 *   bit against it (an fp32 subnormal gives a signed zero there, as
 *   vcvtneps2bf16 does);
 * - the reference (bf16_ref.h) against ops.h's fp32 references: on
 *   operands that are bf16 values the products are the same and only the
 *   order of the sums differs; on general ones bf16's rounding shows, and is
 *   bounded;
 * - the avx512_bf16 kernel, compiled here from bf16_avx512_body.h against a
 *   scalar model of its intrinsics (Intel's pseudo-code, below), against the
 *   reference on awkward shapes, all passes, NULL b/db/din; bit for bit
 *   the fp32 chains it documents (built here element by element); its bits
 *   the same twice and for 1 and 2 threads;
 * - where this CPU has AVX512_BF16: the model against the instructions, and
 *   the real kernel against the reference and the model; else a skip naming
 *   the missing feature;
 * - DP_CPU_BF16's choice and refusals, and the features isa.c reports
 *   against /proc/cpuinfo's flags.
 *
 * Tolerances. Two fp32 sums of the same n exact products in two orders
 * differ by at most 2 n u S (u = 2^-24, S the sum of the products' absolute
 * values, computed here by ops.h's references on |operands|), so kernel and
 * reference are held to n 2^-23 S per element. bf16 keeps 8 significant
 * bits: an operand rounded to it moves by at most 2^-8 of itself (half an
 * ulp), a product of two by at most 2^-7 + 2^-16, so the bf16 reference is
 * held to (2^-7 + 2^-16 + n 2^-23) S of the fp32 one. */
#include <math.h>
#include <stdint.h>

#include "common/bf16.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/bf16_ops.h"
#include "kernels/cpu/bf16_ref.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "tests/test.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* ---- the scalar model of the intrinsics bf16_avx512_body.h uses ---- */

typedef union {
    float f[16];
    uint32_t u[16];
} m_v512;
typedef struct {
    uint16_t h[16];
} m_v256;

/* vdpbf16ps reads subnormal inputs as zero and writes a subnormal result
 * as zero (of its sign): DAZ and FTZ whatever MXCSR says. The result is
 * flushed when it is subnormal after rounding (x86 detects tininess after
 * rounding; a sum within half an ulp below 2^-126 that rounds up to it is
 * the one case where the two readings differ, and no test here makes it). */
static float m_daz(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

/* VDPBF16PS, per the SDM: for each fp32 lane i, with DAZ, FTZ and
 * round-to-nearest-even, srcdest += a.bf16[2i+1] * b.bf16[2i+1] (one
 * fused multiply-add), then srcdest += a.bf16[2i] * b.bf16[2i]. (NaN
 * payloads are not modelled: a NaN stays a NaN.) */
static m_v512 m_dpbf16_ps(m_v512 acc, m_v512 a, m_v512 b)
{
    for (int i = 0; i < 16; i++) {
        float s = m_daz(acc.f[i]);
        float ahi = m_daz(dp_bf16_to_f32((dp_bf16_t)(a.u[i] >> 16)));
        float bhi = m_daz(dp_bf16_to_f32((dp_bf16_t)(b.u[i] >> 16)));
        float alo = m_daz(dp_bf16_to_f32((dp_bf16_t)(a.u[i] & 0xffffu)));
        float blo = m_daz(dp_bf16_to_f32((dp_bf16_t)(b.u[i] & 0xffffu)));
        s = m_daz(fmaf(ahi, bhi, s));
        s = m_daz(fmaf(alo, blo, s));
        acc.f[i] = s;
    }
    return acc;
}

/* VCVTNEPS2BF16's convert_fp32_to_bfloat16, per the SDM: zero or
 * subnormal -> zero of its sign; infinity -> its top half; NaN -> its top
 * half, quiet bit set; else round to nearest even by integer addition. */
static uint16_t m_cvt1(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(u >> 16);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static m_v256 m_cvtneps_pbh(m_v512 v)
{
    m_v256 r;
    for (int i = 0; i < 16; i++) r.h[i] = m_cvt1(v.f[i]);
    return r;
}

static m_v512 m_cvtepu16_epi32(m_v256 h)
{
    m_v512 r;
    for (int i = 0; i < 16; i++) r.u[i] = h.h[i];
    return r;
}

static m_v512 m_slli16(m_v512 x)
{
    for (int i = 0; i < 16; i++) x.u[i] <<= 16;
    return x;
}

static m_v512 m_or(m_v512 x, m_v512 y)
{
    for (int i = 0; i < 16; i++) x.u[i] |= y.u[i];
    return x;
}

static m_v512 m_zero(void)
{
    m_v512 r;
    memset(&r, 0, sizeof r);
    return r;
}

/* Masked load and store: lanes outside the mask are not touched (the
 * instructions suppress their faults; here ASan sees any lane read). */
static m_v512 m_maskz_loadu(uint16_t m, const float *p)
{
    m_v512 r = m_zero();
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) r.f[i] = p[i];
    return r;
}

static void m_mask_storeu(float *p, uint16_t m, m_v512 v)
{
    for (int i = 0; i < 16; i++)
        if (m >> i & 1) p[i] = v.f[i];
}

static m_v512 m_loadu_si512(const void *p)
{
    m_v512 r;
    memcpy(&r, p, sizeof r);
    return r;
}

static void m_storeu_si512(void *p, m_v512 v)
{
    memcpy(p, &v, sizeof v);
}

static m_v512 m_set1_epi32(uint32_t u)
{
    m_v512 r;
    for (int i = 0; i < 16; i++) r.u[i] = u;
    return r;
}

#define S(name) s_##name##_model
#define BV m_v512
#define BI m_v512
#define BH m_v256
#define BM uint16_t
#define BF_ZERO() m_zero()
#define BF_MLOAD(m, p) m_maskz_loadu(m, p)
#define BF_MSTORE(m, p, v) m_mask_storeu(p, m, v)
#define BF_LOADI(p) m_loadu_si512(p)
#define BF_STOREI(p, v) m_storeu_si512(p, v)
#define BF_SET1I(u) m_set1_epi32(u)
#define BF_DP(acc, a, b) m_dpbf16_ps(acc, a, b)
#define BF_CVT(v) m_cvtneps_pbh(v)
#define BF_WIDEN(h) m_cvtepu16_epi32(h)
#define BF_SHL16(x) m_slli16(x)
#define BF_OR(x, y) m_or(x, y)
#include "kernels/cpu/bf16_avx512_body.h"

static const dp_bf16_ops_t s_model = {
    .name = "avx512_bf16 (modelled)",
    .conv_forward = S(conv_forward),
    .conv_backward = S(conv_backward),
    .fc_forward = S(fc_forward),
    .fc_backward = S(fc_backward),
};

/* ---- helpers ---- */

static dp_rng_t s_rng;

/* n floats uniform in [-1, 1), rounded to bf16 when exact; NULL for n 0. */
static float *s_rand(size_t n, int exact)
{
    float *p = dp_aligned_alloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float x = 2.0f * dp_rng_uniform(&s_rng) - 1.0f;
        p[i] = exact ? dp_bf16_round(x) : x;
    }
    return p;
}

static float *s_nan(size_t n)
{
    float *p = dp_aligned_alloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* |x| of x's bf16 values (the operands of the products), for the bounds. */
static float *s_abs(const float *x, size_t n)
{
    if (!x) return NULL;
    float *p = dp_aligned_alloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = fabsf(dp_bf16_round(x[i]));
    return p;
}

/* Held to |got - want| <= (rel + terms 2^-23) S[i] each (the header says
 * why); counts as one check. Returns how many elements differ by more
 * than the reordering of fp32 sums alone explains (terms 2^-23 S). */
static size_t s_near(const char *what, const float *got, const float *want, const float *S,
                     size_t n, double rel, int terms)
{
    size_t bad = 0, beyond = 0;
    double order = terms * ldexp(1.0, -23);
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        if (!(diff <= (rel + order) * S[i] + 1e-37)) {
            if (bad < 4)
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (bound %.3g)\n", what, i, got[i],
                        want[i], (rel + order) * S[i]);
            bad++;
        }
        if (!(diff <= order * S[i] + 1e-37)) beyond++;
    }
    t_checks++;
    if (bad) {
        t_failures++;
        fprintf(stderr, "  %s: %zu of %zu out of bounds\n", what, bad, n);
    }
    return beyond;
}

static int s_same(const char *what, const float *x, const float *y, size_t n)
{
    t_checks++;
    if (n == 0 || memcmp(x, y, n * sizeof *x) == 0) return 1;
    t_failures++;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof *x) != 0) {
            fprintf(stderr, "  %s: bits differ first at %zu: %.9g vs %.9g\n", what, i, x[i], y[i]);
            break;
        }
    return 0;
}

/* ops.h's fp32 references as a table. */
static const dp_bf16_ops_t s_fp32 = {
    .name = "fp32 reference",
    .conv_forward = dp_conv2d_forward_ref,
    .conv_backward = dp_conv2d_backward_ref,
    .fc_forward = dp_fc_forward_ref,
    .fc_backward = dp_fc_backward_ref,
};

/* ---- the chains the kernel documents, one scalar element at a time ----
 *
 * bf16_avx512_body.h promises each output is one fp32 chain: from its
 * start (DAZ'd), for each pair p of K ascending, a fused add of the
 * k = 2p + 1 product and then of the k = 2p one (DAZ, FTZ), a zero pair
 * past K. These loops build each chain from its definition, without the
 * kernel's packing or tiles, so the modelled kernel must give their bits. */

static float s_op(float x)
{
    return m_daz(dp_bf16_round(x));
}

/* start + sum of a[k sa] b[k sb], k < n, as the kernel's chain */
static float s_chain(float start, const float *a, size_t sa, const float *b, size_t sb, int n)
{
    float s = m_daz(start);
    for (int k = 0; k < n; k += 2) {
        float ahi = k + 1 < n ? s_op(a[(k + 1) * sa]) : 0.0f;
        float bhi = k + 1 < n ? s_op(b[(k + 1) * sb]) : 0.0f;
        s = m_daz(fmaf(ahi, bhi, s));
        s = m_daz(fmaf(s_op(a[k * sa]), s_op(b[k * sb]), s));
    }
    return s;
}

/* col[r, p] of image n (im2col), r = (c, ky, kx), p = (oy, ox) */
static float s_col(const float *in, const dp_conv_dims_t *d, int n, int r, int p)
{
    int c = r / (d->K * d->K), ky = r / d->K % d->K, kx = r % d->K;
    int y = p / d->OW * d->stride - d->pad + ky, x = p % d->OW * d->stride - d->pad + kx;
    if (y < 0 || y >= d->H || x < 0 || x >= d->W) return 0.0f;
    return in[(((size_t)n * d->C + c) * d->H + y) * d->W + x];
}

static void s_chain_conv_forward(float *out, const float *in, const float *w, const float *b,
                                 const dp_conv_dims_t *d)
{
    int R = d->C * d->K * d->K, P = d->OH * d->OW;
    float *x = dp_aligned_alloc((size_t)R * sizeof *x);
    for (int n = 0; n < d->B; n++)
        for (int p = 0; p < P; p++) {
            for (int r = 0; r < R; r++) x[r] = s_col(in, d, n, r, p);
            for (int oc = 0; oc < d->OC; oc++)
                out[((size_t)n * d->OC + oc) * P + p] =
                    s_chain(b ? b[oc] : 0.0f, w + (size_t)oc * R, 1, x, 1, R);
        }
    free(x);
}

/* dw: a chain per image, each going on from the last (pairs padded per
 * image); din: col2im, in r then p order, of dcol[r, p] = a chain over oc;
 * db: plain fp32 sums, images then positions. */
static void s_chain_conv_backward(float *din, float *dw, float *db, const float *dout,
                                  const float *in, const float *w, const dp_conv_dims_t *d)
{
    int R = d->C * d->K * d->K, P = d->OH * d->OW, OC = d->OC;
    float *x = dp_aligned_alloc((size_t)P * sizeof *x);
    for (int oc = 0; oc < OC && db; oc++) {
        float acc = 0.0f;
        for (int n = 0; n < d->B; n++)
            for (int p = 0; p < P; p++) acc += dout[((size_t)n * OC + oc) * P + p];
        db[oc] = acc;
    }
    for (int oc = 0; oc < OC; oc++)
        for (int r = 0; r < R; r++) {
            float s = 0.0f;
            for (int n = 0; n < d->B; n++) {
                for (int p = 0; p < P; p++) x[p] = s_col(in, d, n, r, p);
                s = s_chain(s, dout + ((size_t)n * OC + oc) * P, 1, x, 1, P);
            }
            dw[(size_t)oc * R + r] = s;
        }
    free(x);
    for (int n = 0; n < d->B && din; n++) {
        float *img = din + (size_t)n * d->C * d->H * d->W;
        memset(img, 0, (size_t)d->C * d->H * d->W * sizeof *img);
        for (int r = 0; r < R; r++)
            for (int p = 0; p < P; p++) {
                int c = r / (d->K * d->K), ky = r / d->K % d->K, kx = r % d->K;
                int y = p / d->OW * d->stride - d->pad + ky;
                int xx = p % d->OW * d->stride - d->pad + kx;
                if (y < 0 || y >= d->H || xx < 0 || xx >= d->W) continue;
                img[((size_t)c * d->H + y) * d->W + xx] +=
                    s_chain(0.0f, w + r, (size_t)R, dout + (size_t)n * OC * P + p, (size_t)P, OC);
            }
    }
}

static void s_chain_fc_forward(float *out, const float *in, const float *w, const float *b, int B,
                               int IN, int OUT)
{
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++)
            out[(size_t)n * OUT + o] =
                s_chain(b ? b[o] : 0.0f, in + (size_t)n * IN, 1, w + (size_t)o * IN, 1, IN);
}

static void s_chain_fc_backward(float *din, float *dw, float *db, const float *dout,
                                const float *in, const float *w, int B, int IN, int OUT)
{
    for (int o = 0; o < OUT; o++) {
        float acc = 0.0f;
        for (int n = 0; n < B; n++) acc += dout[(size_t)n * OUT + o];
        if (db) db[o] = acc;
        for (int i = 0; i < IN; i++)
            dw[(size_t)o * IN + i] = s_chain(0.0f, dout + o, (size_t)OUT, in + i, (size_t)IN, B);
    }
    for (int n = 0; n < B && din; n++)
        for (int i = 0; i < IN; i++)
            din[(size_t)n * IN + i] =
                s_chain(0.0f, dout + (size_t)n * OUT, 1, w + i, (size_t)IN, OUT);
}

static const dp_bf16_ops_t s_chains = {
    .name = "documented chains",
    .conv_forward = s_chain_conv_forward,
    .conv_backward = s_chain_conv_backward,
    .fc_forward = s_chain_fc_forward,
    .fc_backward = s_chain_fc_backward,
};

typedef struct {
    int B, C, H, W, OC, K, pad, stride;
} s_shape_t;

/* What a case compares: got's table against want's, operands exact bf16
 * or not, bound rel (above), bias/db and din present or NULL. */
typedef struct {
    const dp_bf16_ops_t *got, *want;
    int exact, with_b, with_din;
    double rel;
    int bits;      /* compare bit for bit instead */
    size_t beyond; /* out: elements past reordering alone */
} s_case_t;

/* got against want, as the case says */
static void s_cmp(s_case_t *c, const char *what, const float *got, const float *want,
                  const float *S, size_t n, int terms)
{
    if (c->bits)
        s_same(what, got, want, n);
    else
        c->beyond += s_near(what, got, want, S, n, c->rel, terms);
}

/* The three conv passes of c->got against c->want on shape sh, outputs
 * poisoned with NaN first so an element left unwritten shows. */
static void s_conv_case(s_case_t *c, s_shape_t sh)
{
    dp_conv_dims_t d = {sh.B, sh.C, sh.H, sh.W, sh.OC, sh.K, sh.pad, sh.stride, 0, 0};
    dp_conv_dims_finish(&d);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nw = (size_t)d.OC * d.C * d.K * d.K;
    size_t nout = (size_t)d.B * d.OC * d.OH * d.OW;
    int fails = t_failures;
    float *in = s_rand(nin, c->exact), *w = s_rand(nw, c->exact);
    float *b = c->with_b ? s_rand((size_t)d.OC, 0) : NULL, *dout = s_rand(nout, c->exact);
    float *ain = s_abs(in, nin), *aw = s_abs(w, nw), *adout = s_abs(dout, nout);
    float *ab = c->with_b ? s_abs(b, (size_t)d.OC) : NULL;
    float *S_out = s_nan(nout), *S_din = s_nan(nin), *S_dw = s_nan(nw), *S_db = s_nan(d.OC);
    dp_conv2d_forward_ref(S_out, ain, aw, ab, &d);
    dp_conv2d_backward_ref(S_din, S_dw, S_db, adout, ain, aw, &d);
    float *g[4], *r[4]; /* out, din, dw, db: got, want */
    size_t len[4] = {nout, nin, nw, (size_t)d.OC};
    for (int i = 0; i < 4; i++) g[i] = s_nan(len[i]), r[i] = s_nan(len[i]);
    c->got->conv_forward(g[0], in, w, b, &d);
    c->want->conv_forward(r[0], in, w, b, &d);
    c->got->conv_backward(c->with_din ? g[1] : NULL, g[2], c->with_b ? g[3] : NULL, dout, in, w,
                          &d);
    c->want->conv_backward(c->with_din ? r[1] : NULL, r[2], c->with_b ? r[3] : NULL, dout, in, w,
                           &d);
    int P = d.OH * d.OW, R = d.C * d.K * d.K;
    s_cmp(c, "conv forward", g[0], r[0], S_out, nout, R + 1);
    s_cmp(c, "conv dw", g[2], r[2], S_dw, nw, d.B * P);
    if (c->with_din)
        s_cmp(c, "conv din", g[1], r[1], S_din, nin, d.OC * d.K * d.K);
    else
        s_same("conv din untouched (NULL)", g[1], r[1], nin); /* both still NaN: compare bits */
    if (c->with_b) s_cmp(c, "conv db", g[3], r[3], S_db, (size_t)d.OC, d.B * P);
    if (t_failures != fails)
        fprintf(stderr, "  ^ %s vs %s: B %d C %d H %d W %d OC %d K %d pad %d stride %d%s%s\n",
                c->got->name, c->want->name, sh.B, sh.C, sh.H, sh.W, sh.OC, sh.K, sh.pad,
                sh.stride, c->with_b ? "" : ", no bias", c->with_din ? "" : ", din NULL");
    float *all[] = {in, w, b, dout, ain, aw, ab, adout, S_out, S_din, S_dw, S_db,
                    g[0], g[1], g[2], g[3], r[0], r[1], r[2], r[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* fc forward and backward of c->got against c->want, as s_conv_case. */
static void s_fc_case(s_case_t *c, int B, int IN, int OUT)
{
    size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN, nout = (size_t)B * OUT;
    int fails = t_failures;
    float *in = s_rand(nin, c->exact), *w = s_rand(nw, c->exact), *dout = s_rand(nout, c->exact);
    float *b = c->with_b ? s_rand((size_t)OUT, 0) : NULL;
    float *ain = s_abs(in, nin), *aw = s_abs(w, nw), *adout = s_abs(dout, nout);
    float *ab = c->with_b ? s_abs(b, (size_t)OUT) : NULL;
    float *S_out = s_nan(nout), *S_din = s_nan(nin), *S_dw = s_nan(nw), *S_db = s_nan(OUT);
    dp_fc_forward_ref(S_out, ain, aw, ab, B, IN, OUT);
    dp_fc_backward_ref(S_din, S_dw, S_db, adout, ain, aw, B, IN, OUT);
    float *g[4], *r[4];
    size_t len[4] = {nout, nin, nw, (size_t)OUT};
    for (int i = 0; i < 4; i++) g[i] = s_nan(len[i]), r[i] = s_nan(len[i]);
    c->got->fc_forward(g[0], in, w, b, B, IN, OUT);
    c->want->fc_forward(r[0], in, w, b, B, IN, OUT);
    c->got->fc_backward(c->with_din ? g[1] : NULL, g[2], g[3], dout, in, w, B, IN, OUT);
    c->want->fc_backward(c->with_din ? r[1] : NULL, r[2], r[3], dout, in, w, B, IN, OUT);
    s_cmp(c, "fc forward", g[0], r[0], S_out, nout, IN + 1);
    s_cmp(c, "fc dw", g[2], r[2], S_dw, nw, B);
    s_cmp(c, "fc db", g[3], r[3], S_db, (size_t)OUT, B);
    if (c->with_din)
        s_cmp(c, "fc din", g[1], r[1], S_din, nin, OUT);
    else
        s_same("fc din untouched (NULL)", g[1], r[1], nin);
    if (t_failures != fails)
        fprintf(stderr, "  ^ %s vs %s: fc B %d IN %d OUT %d%s%s\n", c->got->name, c->want->name, B,
                IN, OUT, c->with_b ? "" : ", no bias", c->with_din ? "" : ", din NULL");
    float *all[] = {in, w, b, dout, ain, aw, ab, adout, S_out, S_din, S_dw, S_db,
                    g[0], g[1], g[2], g[3], r[0], r[1], r[2], r[3]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Awkward shapes: B 1 and 3; C 1, 3, 17; OC 1, 10, 33; K 1, 3, 5; stride
 * 1, 2; pad 0, 1, 2; H != W; odd R = C K K and odd positions (pairs padded
 * with a zero), OC and positions off the 4 x 32 tile. */
static const s_shape_t s_shapes[] = {
    {1, 1, 5, 4, 1, 1, 0, 1},   {3, 3, 7, 5, 10, 3, 1, 1},  {1, 17, 6, 9, 33, 3, 1, 2},
    {3, 1, 8, 6, 33, 5, 2, 1},  {1, 3, 9, 7, 10, 5, 2, 2},  {3, 17, 5, 6, 1, 3, 0, 1},
    {1, 17, 4, 7, 10, 1, 0, 2}, {3, 3, 6, 5, 33, 3, 2, 2},  {1, 1, 7, 3, 10, 5, 1, 1},
    {3, 17, 3, 4, 33, 5, 2, 1}, {1, 3, 5, 6, 1, 1, 1, 2},   {3, 1, 11, 13, 10, 3, 1, 1},
};
#define S_NSHAPES (int)(sizeof s_shapes / sizeof s_shapes[0])

static const int s_fc_in[] = {1, 17, 1000}, s_fc_out[] = {1, 10, 33};

/* Every conv shape and fc size through c, with bias/din present and (every
 * other shape) absent. */
static void s_all_cases(s_case_t *c)
{
    for (int i = 0; i < S_NSHAPES; i++) {
        c->with_b = i % 2 == 0, c->with_din = i % 3 != 2;
        s_conv_case(c, s_shapes[i]);
    }
    for (int B = 1; B <= 3; B += 2)
        for (int i = 0; i < 3; i++)
            for (int o = 0; o < 3; o++) {
                c->with_b = (i + o) % 2 == 0, c->with_din = B == 3 || o != 1;
                s_fc_case(c, B, s_fc_in[i], s_fc_out[o]);
            }
}

/* ---- conversions ---- */

static void test_convert_table(void)
{
    static const struct {
        uint32_t f;
        uint16_t h;
    } t[] = {
        {0x00000000, 0x0000}, {0x80000000, 0x8000}, {0x3f800000, 0x3f80}, /* zeros, 1 */
        {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82},                       /* ties to even */
        {0xbf808000, 0xbf80}, {0xbf818000, 0xbf82},                       /* negative ties */
        {0x3f807fff, 0x3f80}, {0x3f808001, 0x3f81},                       /* either side of one */
        {0x3f7fffff, 0x3f80},                                             /* carry to the binade */
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80},                       /* infinities */
        {0x7f7fffff, 0x7f80}, {0x7f7f8000, 0x7f80}, {0x7f7f7fff, 0x7f7f}, /* overflow, largest */
        {0x7fc00000, 0x7fc0}, {0x7f800001, 0x7fc0},                       /* NaN, quieted */
        {0xff810000, 0xffc1}, {0x7fff0000, 0x7fff},                       /* sign, payload kept */
        {0x00000001, 0x0000}, {0x00008000, 0x0000}, {0x00018000, 0x0002}, /* subnormals */
        {0x00010000, 0x0001}, {0x007fffff, 0x0080}, {0x807fffff, 0x8080}, /* up to normal */
        {0x00400000, 0x0040},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        float x;
        memcpy(&x, &t[i].f, sizeof x);
        if (dp_bf16_from_f32(x) != t[i].h)
            fprintf(stderr, "  0x%08x -> 0x%04x, want 0x%04x\n", t[i].f, dp_bf16_from_f32(x),
                    t[i].h);
        CHECK_EQ(dp_bf16_from_f32(x), t[i].h);
        if (!isnan(x)) CHECK_EQ(dp_bf16_from_f32(dp_bf16_round(x)), t[i].h); /* idempotent */
    }
}

/* The vector packer (bf16_avx512_body.h's pairs, on the modelled
 * instructions) bit for bit against dp_bf16_from_f32 on 4,096 random bit
 * patterns and the table's edges: pair j = (from(lo[j]), from(hi[j])),
 * but an fp32 subnormal gives a zero of its sign. */
static void test_vector_packer(void)
{
    dp_rng_seed(&s_rng, 58);
    static const uint32_t edge[] = {0x3f808000, 0x3f818000, 0x7f7fffff, 0x7f800001, 0xff810000,
                                    0x00000001, 0x80018000, 0x007fffff, 0x00800000, 0xff800000};
    int bad = 0;
    for (int round = 0; round < 4096 / 32 + 1; round++) {
        uint32_t bits[32];
        for (int i = 0; i < 32; i++)
            bits[i] = round == 0 ? edge[i % 10] ^ (i >= 10 ? 0x80000000u : 0)
                                 : (uint32_t)dp_rng_next(&s_rng);
        m_v512 lo, hi;
        memcpy(lo.u, bits, sizeof lo.u);
        memcpy(hi.u, bits + 16, sizeof hi.u);
        m_v512 got = S(pairs)(lo, hi);
        for (int j = 0; j < 16; j++)
            for (int half = 0; half < 2; half++) {
                float x = half ? hi.f[j] : lo.f[j];
                uint16_t want = fpclassify(x) == FP_SUBNORMAL ? (signbit(x) ? 0x8000 : 0)
                                                              : dp_bf16_from_f32(x);
                uint16_t g = (uint16_t)(half ? got.u[j] >> 16 : got.u[j] & 0xffffu);
                if (g != want && bad++ < 4)
                    fprintf(stderr, "  lane %d %s: 0x%08x -> 0x%04x, want 0x%04x\n", j,
                            half ? "hi" : "lo", half ? hi.u[j] : lo.u[j], g, want);
            }
    }
    CHECK_EQ(bad, 0);
}

/* The model's vdpbf16ps: the odd pair first (a sum that cancels only in
 * that order), DAZ on a subnormal operand, FTZ on a subnormal result. */
static void test_model_dp(void)
{
    m_v512 acc = m_set1_epi32(0), a = m_zero(), b = m_zero();
    for (int j = 0; j < 16; j++) acc.f[j] = 1.0f;
    /* lane 0: hi = -1 * 1, lo = 2^-30 * 1: (1 - 1) + 2^-30 = 2^-30, while
     * the other order gives (1 + 2^-30) - 1 = 0 */
    a.u[0] = (uint32_t)dp_bf16_from_f32(-1.0f) << 16 | dp_bf16_from_f32(0x1p-30f);
    b.u[0] = (uint32_t)dp_bf16_from_f32(1.0f) << 16 | dp_bf16_from_f32(1.0f);
    /* lanes 1, 5, 6: a subnormal bf16 (0x0001, 2^-133) times 2^100, as
     * a's low half, a's high half, b's low half, reads as 0 (else 2^-33) */
    acc.f[1] = acc.f[5] = acc.f[6] = 0.0f;
    a.u[1] = 0x0001, b.u[1] = dp_bf16_from_f32(0x1p100f);
    a.u[5] = 0x0001u << 16, b.u[5] = (uint32_t)dp_bf16_from_f32(0x1p100f) << 16;
    a.u[6] = dp_bf16_from_f32(0x1p100f), b.u[6] = 0x0001;
    /* lane 7: a subnormal acc (2^-140) reads as 0: 0 + 2^-126 * 1 (the
     * high pair's: the low one's would come after FTZ flushed the acc) */
    acc.f[7] = 0x1p-140f;
    a.u[7] = (uint32_t)dp_bf16_from_f32(0x1p-126f) << 16;
    b.u[7] = (uint32_t)dp_bf16_from_f32(1.0f) << 16;
    /* lane 2: acc 0, 2^-70 * 2^-70 = 2^-140 is subnormal: written as 0 */
    acc.f[2] = 0.0f;
    a.u[2] = b.u[2] = dp_bf16_from_f32(0x1p-70f);
    /* lane 3: 1.5 * 2 + 0.25 * 4 on 1 = 5 */
    a.u[3] = (uint32_t)dp_bf16_from_f32(1.5f) << 16 | dp_bf16_from_f32(0.25f);
    b.u[3] = (uint32_t)dp_bf16_from_f32(2.0f) << 16 | dp_bf16_from_f32(4.0f);
    m_v512 r = m_dpbf16_ps(acc, a, b);
    CHECK(r.f[0] == 0x1p-30f);
    CHECK(r.f[1] == 0.0f && r.f[5] == 0.0f && r.f[6] == 0.0f);
    CHECK(r.f[7] == 0x1p-126f);
    CHECK(r.f[2] == 0.0f);
    CHECK(r.f[3] == 5.0f);
    CHECK(r.f[4] == 1.0f); /* zero operands leave a lane as it was */
}

/* ---- the reference against fp32's ---- */

/* On bf16 values every product is the fp32 one: only the order of the
 * sums (float here, double there) differs. */
static void test_ref_exact_operands(void)
{
    dp_rng_seed(&s_rng, 1);
    s_case_t c = {.got = &dp_bf16_ref, .want = &s_fp32, .exact = 1, .rel = 0};
    s_all_cases(&c);
    CHECK_EQ(c.beyond, 0);
}

/* On general operands bf16's rounding shows (past what reordering
 * explains, somewhere) and stays within 2^-7 + 2^-16 of S. */
static void test_ref_general_operands(void)
{
    dp_rng_seed(&s_rng, 2);
    s_case_t c = {.got = &dp_bf16_ref, .want = &s_fp32, .exact = 0,
                  .rel = ldexp(1.0, -7) + ldexp(1.0, -16)};
    s_all_cases(&c);
    if (c.beyond == 0) fprintf(stderr, "  the bf16 reference rounds nothing\n");
    CHECK(c.beyond > 0);
}

/* ---- the avx512_bf16 kernel, modelled ---- */

static void test_model_against_ref(void)
{
    dp_rng_seed(&s_rng, 3);
    s_case_t c = {.got = &s_model, .want = &dp_bf16_ref, .exact = 0, .rel = 0};
    s_all_cases(&c);
    CHECK_EQ(c.beyond, 0);
}

/* The modelled kernel gives the bits of the chains it documents, on every
 * shape: its packing, tiles and tails change no sum's order. */
static void test_model_bits(void)
{
    dp_rng_seed(&s_rng, 6);
    s_case_t c = {.got = &s_model, .want = &s_chains, .exact = 0, .bits = 1};
    s_all_cases(&c);
}

/* One run of every pass of ops on fixed operands (a conv of 3 images, 17
 * channels, 33 filters; an fc 1000 -> 33 at batch 3: big enough for two
 * threads), outputs in o (5 conv + 4 fc arrays, each NaN-poisoned). */
enum { S_DET_N = 9 };
static void s_det_run(const dp_bf16_ops_t *ops, float *o[S_DET_N], size_t len[S_DET_N])
{
    dp_conv_dims_t d = {3, 17, 10, 9, 33, 3, 1, 1, 0, 0};
    dp_conv_dims_finish(&d);
    int B = 3, IN = 1000, OUT = 33;
    size_t sz[S_DET_N] = {(size_t)d.B * d.OC * d.OH * d.OW, (size_t)d.B * d.C * d.H * d.W,
                          (size_t)d.OC * d.C * 9, (size_t)d.OC, (size_t)d.B * d.OC * d.OH * d.OW,
                          (size_t)B * OUT, (size_t)B * IN, (size_t)OUT * IN, (size_t)OUT};
    dp_rng_seed(&s_rng, 4);
    float *in = s_rand(sz[1], 0), *w = s_rand(sz[2], 0), *b = s_rand(sz[3], 0);
    float *dout = s_rand(sz[0], 0), *fin = s_rand(sz[6], 0), *fw = s_rand(sz[7], 0);
    float *fb = s_rand(sz[8], 0), *fdout = s_rand(sz[5], 0);
    for (int i = 0; i < S_DET_N; i++) o[i] = s_nan(sz[i]), len[i] = sz[i];
    ops->conv_forward(o[0], in, w, b, &d);
    ops->conv_backward(o[1], o[2], o[3], dout, in, w, &d);
    ops->conv_forward(o[4], o[1], w, NULL, &d); /* a second layer on din, no bias */
    ops->fc_forward(o[5], fin, fw, fb, B, IN, OUT);
    ops->fc_backward(o[6], o[7], o[8], fdout, fin, fw, B, IN, OUT);
    float *all[] = {in, w, b, dout, fin, fw, fb, fdout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* The same bits twice with 1 thread and twice with 2, and (each output one
 * chain, whatever thread computes it: bf16_avx512_body.h) the same bits
 * for both counts. */
static void test_model_determinism(void)
{
    int keep = dp_cpu_threads();
    float *o[2][2][S_DET_N];
    size_t len[S_DET_N];
    for (int t = 0; t < 2; t++) {
        dp_cpu_set_threads(t + 1);
        CHECK_EQ(dp_cpu_team(1e9), t + 1); /* the split really happens */
        for (int run = 0; run < 2; run++) s_det_run(&s_model, o[t][run], len);
    }
    dp_cpu_set_threads(keep);
    for (int i = 0; i < S_DET_N; i++) {
        char what[64];
        snprintf(what, sizeof what, "output %d, 1 thread, twice", i);
        s_same(what, o[0][0][i], o[0][1][i], len[i]);
        snprintf(what, sizeof what, "output %d, 2 threads, twice", i);
        s_same(what, o[1][0][i], o[1][1][i], len[i]);
        snprintf(what, sizeof what, "output %d, 1 and 2 threads", i);
        s_same(what, o[0][0][i], o[1][0][i], len[i]);
        for (int k = 0; k < 4; k++) free(o[k / 2][k % 2][i]);
    }
}

/* ---- the instructions themselves, where this CPU has them ---- */

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512bf16"))) static void s_cpu_dp(float *out, const float *acc,
                                                                  const uint32_t *a,
                                                                  const uint32_t *b)
{
    __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a),
                                (__m512bh)_mm512_loadu_si512(b));
    _mm512_storeu_ps(out, r);
}

__attribute__((target("avx512f,avx512bf16"))) static void s_cpu_cvt(uint16_t *out, const float *x)
{
    __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x));
    _mm256_storeu_si256((__m256i *)out, h);
}
#endif

/* A random finite bf16: sign, exponent anywhere (subnormals included),
 * mantissa. */
static uint16_t s_rand_bf16(void)
{
    uint16_t h = (uint16_t)dp_rng_next(&s_rng);
    if ((h & 0x7f80) == 0x7f80) h ^= 0x0100; /* no Inf / NaN */
    return h;
}

/* The model of vdpbf16ps and vcvtneps2bf16 bit for bit against the CPU,
 * on random operands over the whole exponent range and near-cancelling
 * sums. */
static void test_model_matches_cpu(void)
{
    if (!dp_cpu_has_avx512_bf16()) SKIP("this CPU has no AVX512_BF16: the model stands alone");
#if defined(__x86_64__) || defined(__i386__)
    dp_rng_seed(&s_rng, 5);
    int bad = 0;
    for (int round = 0; round < 20000; round++) {
        m_v512 acc, a, b;
        for (int j = 0; j < 16; j++) {
            a.u[j] = (uint32_t)s_rand_bf16() << 16 | s_rand_bf16();
            b.u[j] = (uint32_t)s_rand_bf16() << 16 | s_rand_bf16();
            uint32_t u = (uint32_t)dp_rng_next(&s_rng);
            if ((u & 0x7f800000u) == 0x7f800000u) u ^= 0x00800000u;
            acc.u[j] = u;
            if (round % 2) { /* acc = -(hi product): the low product decides */
                float p = dp_bf16_to_f32((dp_bf16_t)(a.u[j] >> 16)) *
                          dp_bf16_to_f32((dp_bf16_t)(b.u[j] >> 16));
                acc.f[j] = isfinite(p) ? -p : 1.0f;
            }
        }
        m_v512 want = m_dpbf16_ps(acc, a, b), got;
        s_cpu_dp(got.f, acc.f, a.u, b.u);
        for (int j = 0; j < 16; j++)
            if (got.u[j] != want.u[j] && !(isnan(got.f[j]) && isnan(want.f[j])) && bad++ < 4)
                fprintf(stderr, "  dp lane %d: acc 0x%08x a 0x%08x b 0x%08x: cpu 0x%08x, "
                        "model 0x%08x\n", j, acc.u[j], a.u[j], b.u[j], got.u[j], want.u[j]);
        uint16_t h[16];
        m_v512 x;
        for (int j = 0; j < 16; j++) x.u[j] = (uint32_t)dp_rng_next(&s_rng);
        s_cpu_cvt(h, x.f);
        m_v256 wh = m_cvtneps_pbh(x);
        for (int j = 0; j < 16; j++)
            if (h[j] != wh.h[j] && bad++ < 4)
                fprintf(stderr, "  cvt 0x%08x: cpu 0x%04x model 0x%04x\n", x.u[j], h[j], wh.h[j]);
    }
    CHECK_EQ(bad, 0);
#endif
}

/* The real kernel against the reference, and bit for bit against the
 * chains it documents and its model. */
static void test_cpu_kernel(void)
{
    if (!dp_cpu_has_avx512_bf16()) SKIP("this CPU has no AVX512_BF16: the real kernel cannot run");
#if defined(__x86_64__) || defined(__i386__)
    dp_rng_seed(&s_rng, 3);
    s_case_t c = {.got = &dp_bf16_avx512, .want = &dp_bf16_ref, .exact = 0, .rel = 0};
    s_all_cases(&c);
    CHECK_EQ(c.beyond, 0);
    s_case_t bits = {.got = &dp_bf16_avx512, .want = &s_chains, .exact = 0, .bits = 1};
    s_all_cases(&bits);
    float *o[2][S_DET_N];
    size_t len[S_DET_N];
    s_det_run(&dp_bf16_avx512, o[0], len);
    s_det_run(&s_model, o[1], len);
    for (int i = 0; i < S_DET_N; i++) {
        s_same("the CPU's kernel and its model", o[0][i], o[1][i], len[i]);
        free(o[0][i]);
        free(o[1][i]);
    }
#endif
}

/* ---- the choice of path ---- */

static void test_choose(void)
{
    char why[DP_ERR_LEN];
    const char *f = "avx512f, avx2, fma, no avx512_bf16, no amx_bf16";
    CHECK(dp_bf16_ops_choose(NULL, 0, 0, f, why) == NULL);
    CHECK_STR(why, "bf16 needs AVX512_BF16 or AMX; this CPU has neither");
    CHECK(dp_bf16_ops_choose("", 0, 0, f, why) == NULL);
    CHECK_STR(why, "bf16 needs AVX512_BF16 or AMX; this CPU has neither");
#if defined(__x86_64__) || defined(__i386__)
    CHECK(dp_bf16_ops_choose(NULL, 1, 0, f, why) == &dp_bf16_avx512);
    CHECK_STR(dp_bf16_avx512.name, "avx512_bf16");
    /* forced, any case, also on a CPU with AMX (to test both there) */
    CHECK(dp_bf16_ops_choose("AVX512_bf16", 1, 0, f, why) == &dp_bf16_avx512);
    CHECK(dp_bf16_ops_choose("avx512_bf16", 1, 1, f, why) == &dp_bf16_avx512);
#endif
    /* AMX goes first, never vdpbf16ps at half its fp32 rate: the amx table
     * where Linux grants this process the tile data, else its refusal */
    char amx_why[DP_ERR_LEN] = "";
    int amx_ok = dp_bf16_amx_enable(amx_why) == 0;
    const dp_bf16_ops_t *first = dp_bf16_ops_choose(NULL, 1, 1, f, why);
    CHECK(amx_ok ? first != NULL && strcmp(first->name, "amx") == 0 : first == NULL);
    if (!amx_ok) CHECK_STR(why, amx_why);
    CHECK(dp_bf16_ops_choose("avx512_bf16", 0, 1, "F", why) == NULL);
    CHECK_STR(why, "DP_CPU_BF16=avx512_bf16: this CPU cannot run the avx512_bf16 path (it has: "
                   "F); set DP_CPU_BF16 to one it can run or unset it");
    CHECK(dp_bf16_ops_choose("amx", 1, 0, "F", why) == NULL);
    CHECK_STR(why, "DP_CPU_BF16=amx: this CPU cannot run the amx path (it has: F); set "
                   "DP_CPU_BF16 to one it can run or unset it");
    CHECK(dp_bf16_ops_choose("avx2", 1, 1, "F", why) == NULL);
    CHECK_STR(why, "DP_CPU_BF16=avx2: unknown path (expected amx or avx512_bf16; this CPU has: F)");
    /* this CPU, through the environment */
    const char *keep = getenv("DP_CPU_BF16");
    char saved[64] = "";
    if (keep) snprintf(saved, sizeof saved, "%s", keep);
    unsetenv("DP_CPU_BF16");
    const dp_bf16_ops_t *native = dp_bf16_ops_native(why);
    if (!dp_cpu_has_avx512_bf16() && !dp_cpu_has_amx_bf16()) {
        CHECK(native == NULL);
        CHECK_STR(why, "bf16 needs AVX512_BF16 or AMX; this CPU has neither");
        setenv("DP_CPU_BF16", "avx512_bf16", 1);
        CHECK(dp_bf16_ops_native(why) == NULL);
        const char *head = "DP_CPU_BF16=avx512_bf16: this CPU cannot run the avx512_bf16 path";
        CHECK(strncmp(why, head, strlen(head)) == 0);
        CHECK(strstr(why, dp_cpu_isa_features()) != NULL);
    } else if (!dp_cpu_has_amx_bf16()) {
        CHECK(native != NULL && strcmp(native->name, "avx512_bf16") == 0);
    } else {
        CHECK(native == NULL || strcmp(native->name, "amx") == 0);
        if (!native) CHECK(strncmp(why, "bf16 amx: arch_prctl", 20) == 0);
    }
    if (keep) setenv("DP_CPU_BF16", saved, 1);
    else unsetenv("DP_CPU_BF16");
}

/* isa.c's bf16 features against the kernel's own reading of CPUID
 * (/proc/cpuinfo's flags, which Linux also clears for state it does not
 * enable), and the features line saying the same. */
static void test_isa_features(void)
{
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp) SKIP("no /proc/cpuinfo to check the features against");
    char line[8192];
    int avx512f = 0, bf16 = 0, amx_bf16 = 0, amx_tile = 0, seen = 0;
    while (!seen && fgets(line, sizeof line, fp)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        seen = 1;
        for (char *tok = strtok(strchr(line, ':') + 1, " \n"); tok; tok = strtok(NULL, " \n")) {
            avx512f |= strcmp(tok, "avx512f") == 0;
            bf16 |= strcmp(tok, "avx512_bf16") == 0;
            amx_bf16 |= strcmp(tok, "amx_bf16") == 0;
            amx_tile |= strcmp(tok, "amx_tile") == 0;
        }
    }
    fclose(fp);
    if (!seen) SKIP("/proc/cpuinfo has no flags line");
    fprintf(stderr, "  CPU: %s\n", dp_cpu_isa_features());
    CHECK_EQ(dp_cpu_has_avx512_bf16(), avx512f && bf16);
    CHECK_EQ(dp_cpu_has_amx_bf16(), amx_bf16 && amx_tile);
    const char *feat = dp_cpu_isa_features();
    CHECK_EQ(strstr(feat, "no avx512_bf16") == NULL, dp_cpu_has_avx512_bf16());
    CHECK_EQ(strstr(feat, "no amx_bf16") == NULL, dp_cpu_has_amx_bf16());
    CHECK(strstr(feat, "avx512_bf16") != NULL && strstr(feat, "amx_bf16") != NULL);
}

DP_TESTS(T(test_convert_table), T(test_vector_packer), T(test_model_dp),
         T(test_ref_exact_operands), T(test_ref_general_operands), T(test_model_against_ref),
         T(test_model_bits), T(test_model_determinism), T(test_model_matches_cpu), T(test_cpu_kernel),
         T(test_choose), T(test_isa_features))
