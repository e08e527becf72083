/* norm: the fast CPU versions of batch norm, the residual shortcut, global
 * average pooling, dropout and the gradient add (kernels/ops.h). All are
 * memory-bound, so "fast" means: one pass where the reference takes three,
 * float sums over DP_LANES independent partials (which the compiler turns
 * into vector adds on every ISA path: the code is the same on each, so the
 * avx2 and avx512 paths give the same bits), and channels or planes split
 * over our threads when the work pays for waking them. A channel's sums
 * never cross threads, so the result does not depend on the thread count.
 * Batch norm also runs with the relu after it as one op (dp_bn_relu_*):
 * the same loops with relu's rule applied on the way out (forward) or in
 * (backward), so the bits are those of the two ops in turn, and a pass
 * over bn's output and one over its gradient are saved. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/cpu/cpu.h"

#define DP_HOT __attribute__((optimize("O3")))
#define DP_LANES 16

/* sum of x[0, n) over DP_LANES partials, then the partials in a fixed tree */
static inline float s_sum(const float *x, int n)
{
    float acc[DP_LANES] = {0};
    int i = 0;
    for (; i + DP_LANES <= n; i += DP_LANES)
        for (int l = 0; l < DP_LANES; l++) acc[l] += x[i + l];
    for (; i < n; i++) acc[i % DP_LANES] += x[i];
    for (int w = DP_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* sum of (x - m)^2 over x[0, n) */
static inline float s_sumsq(const float *x, int n, float m)
{
    float acc[DP_LANES] = {0};
    int i = 0;
    for (; i + DP_LANES <= n; i += DP_LANES)
        for (int l = 0; l < DP_LANES; l++) {
            float v = x[i + l] - m;
            acc[l] += v * v;
        }
    for (; i < n; i++) {
        float v = x[i] - m;
        acc[i % DP_LANES] += v * v;
    }
    for (int w = DP_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* sum of g and of g (x - m) over [0, n), g read by LOAD(i) */
#define S_SUM2(LOAD)                                                                      \
    float a[DP_LANES] = {0}, q[DP_LANES] = {0};                                           \
    int i = 0;                                                                            \
    for (; i + DP_LANES <= n; i += DP_LANES)                                              \
        for (int l = 0; l < DP_LANES; l++) {                                              \
            float gi = LOAD(i + l);                                                       \
            a[l] += gi;                                                                   \
            q[l] += gi * (x[i + l] - m);                                                  \
        }                                                                                 \
    for (; i < n; i++) {                                                                  \
        float gi = LOAD(i);                                                               \
        a[i % DP_LANES] += gi;                                                            \
        q[i % DP_LANES] += gi * (x[i] - m);                                               \
    }                                                                                     \
    for (int w = DP_LANES / 2; w > 0; w /= 2)                                             \
        for (int l = 0; l < w; l++) {                                                     \
            a[l] += a[l + w];                                                             \
            q[l] += q[l + w];                                                             \
        }                                                                                 \
    *sg = a[0];                                                                           \
    *sgx = q[0];
#define S_PLAIN(j) g[j]

static inline void s_sum2(const float *g, const float *x, int n, float m, float *sg, float *sgx)
{
    S_SUM2(S_PLAIN)
}

/* a fused relu's mask: the bits dp_relu_backward gives, both values
 * loaded before the choice, so it is a blend (a conditional load of g,
 * y > 0 ? g[j] : 0, is not vectorized: 6x slower) */
static inline float s_relu_mask(float g, float y)
{
    return y > 0.0f ? g : 0.0f;
}
/* g masked by y, and kept in gm (the din pass then reads gm and x, two
 * runs, as without the relu: three per channel outgrow a core's L2) */
#define S_RELU(j) s_relu_mask(g[j], y[j])
#define S_RELU_KEEP(j) (gm[j] = s_relu_mask(g[j], y[j]))

static inline void s_sum2_relu(const float *g, const float *y, const float *x, int n, float m,
                               float *sg, float *sgx)
{
    S_SUM2(S_RELU)
}

static inline void s_sum2_relu_keep(float *gm, const float *g, const float *y, const float *x,
                                    int n, float m, float *sg, float *sgx)
{
    S_SUM2(S_RELU_KEEP)
}

/* out = x * k + s over one channel's B runs of HW; relu: then max(0, .),
 * the bits dp_relu_forward gives (-0 and NaN to 0 alike) */
static inline void s_affine(float *out, const float *in, int B, int C, int HW, int c, float k,
                            float s, int relu)
{
    for (int n = 0; n < B; n++) {
        const float *x = in + ((size_t)n * C + c) * HW;
        float *o = out + ((size_t)n * C + c) * HW;
        if (relu)
            for (int i = 0; i < HW; i++) {
                float v = x[i] * k + s;
                o[i] = v > 0.0f ? v : 0.0f;
            }
        else
            for (int i = 0; i < HW; i++) o[i] = x[i] * k + s;
    }
}

/* The training forward, then relu when asked (dp_bn_relu_forward_train). */
static DP_HOT void s_bn_forward_train(float *out, float *mean, float *var, const float *in,
                                      const float *w, const float *b, int B, int C, int HW,
                                      float eps, int relu)
{
    float n = (float)B * (float)HW;
    int nt = dp_cpu_team((double)B * C * HW);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f, q = 0.0f;
        for (int k = 0; k < B; k++) s += s_sum(in + ((size_t)k * C + c) * HW, HW);
        float mu = s / n;
        for (int k = 0; k < B; k++) q += s_sumsq(in + ((size_t)k * C + c) * HW, HW, mu);
        float v = q / n, kk = w[c] / sqrtf(v + eps);
        mean[c] = mu;
        var[c] = v;
        s_affine(out, in, B, C, HW, c, kk, b[c] - mu * kk, relu);
    }
}

void dp_bn_forward_train(float *out, float *mean, float *var, const float *in, const float *w,
                         const float *b, int B, int C, int HW, float eps)
{
    s_bn_forward_train(out, mean, var, in, w, b, B, C, HW, eps, 0);
}

void dp_bn_relu_forward_train(float *out, float *mean, float *var, const float *in,
                              const float *w, const float *b, int B, int C, int HW, float eps)
{
    s_bn_forward_train(out, mean, var, in, w, b, B, C, HW, eps, 1);
}

static DP_HOT void s_bn_forward_eval(float *out, const float *in, const float *w, const float *b,
                                     const float *rmean, const float *rvar, int B, int C, int HW,
                                     float eps, int relu)
{
    int nt = dp_cpu_team((double)B * C * HW / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < C; c++) {
        float kk = w[c] / sqrtf(rvar[c] + eps);
        s_affine(out, in, B, C, HW, c, kk, b[c] - rmean[c] * kk, relu);
    }
}

void dp_bn_forward_eval(float *out, const float *in, const float *w, const float *b,
                        const float *rmean, const float *rvar, int B, int C, int HW, float eps)
{
    s_bn_forward_eval(out, in, w, b, rmean, rvar, B, C, HW, eps, 0);
}

void dp_bn_relu_forward_eval(float *out, const float *in, const float *w, const float *b,
                             const float *rmean, const float *rvar, int B, int C, int HW,
                             float eps)
{
    s_bn_forward_eval(out, in, w, b, rmean, rvar, B, C, HW, eps, 1);
}

/* The backward; y not NULL: a fused relu's output, dout the gradient wrt
 * it (masked here as dp_relu_backward would, before the sums). */
static DP_HOT void s_bn_backward(float *din, float *dw, float *db, const float *dout,
                                 const float *y, const float *in, const float *w,
                                 const float *mean, const float *var, int B, int C, int HW,
                                 float eps)
{
    float n = (float)B * (float)HW;
    int nt = dp_cpu_team((double)B * C * HW * 2);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int c = 0; c < C; c++) {
        float inv = 1.0f / sqrtf(var[c] + eps), m = mean[c], sg = 0.0f, sgx = 0.0f;
        for (int k = 0; k < B; k++) {
            float a, q;
            size_t at = ((size_t)k * C + c) * HW;
            /* with the relu and a din, the relu's gradient goes to din,
             * read back below where dout is */
            if (y && din)
                s_sum2_relu_keep(din + at, dout + at, y + at, in + at, HW, m, &a, &q);
            else if (y)
                s_sum2_relu(dout + at, y + at, in + at, HW, m, &a, &q);
            else
                s_sum2(dout + at, in + at, HW, m, &a, &q);
            sg += a;
            sgx += q;
        }
        sgx *= inv; /* sum of dout * xhat */
        dw[c] = sgx;
        db[c] = sg;
        if (!din) continue;
        /* din = w inv (g - sg/n - xh sgx/n), xh = (x - m) inv */
        float k1 = w[c] * inv, k2 = -k1 * inv * sgx / n, k3 = -k1 * sg / n - k2 * m;
        for (int k = 0; k < B; k++) {
            size_t at = ((size_t)k * C + c) * HW;
            const float *g = dout + at, *x = in + at;
            float *o = din + at;
            if (y) /* in place: o holds the relu's gradient (a loop of its own:
                    * o == g would fail the vectorizer's overlap check) */
                for (int i = 0; i < HW; i++) o[i] = o[i] * k1 + x[i] * k2 + k3;
            else
                for (int i = 0; i < HW; i++) o[i] = g[i] * k1 + x[i] * k2 + k3;
        }
    }
}

void dp_bn_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                    const float *w, const float *mean, const float *var, int B, int C, int HW,
                    float eps)
{
    s_bn_backward(din, dw, db, dout, NULL, in, w, mean, var, B, C, HW, eps);
}

void dp_bn_relu_backward(float *din, float *dw, float *db, const float *dout, const float *out,
                         const float *in, const float *w, const float *mean, const float *var,
                         int B, int C, int HW, float eps)
{
    s_bn_backward(din, dw, db, dout, out, in, w, mean, var, B, C, HW, eps);
}

DP_HOT void dp_shortcut_add_forward(float *out, const float *a, const float *in,
                                    const dp_shortcut_dims_t *d)
{
    int OC = d->OC, OH = d->OH, OW = d->OW, S = d->stride, lo = (d->OC - d->C) / 2;
    int planes = d->B * OC;
    int nt = dp_cpu_team((double)planes * OH * OW / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        int k = pl / OC, c = pl % OC - lo;
        const float *x = a + (size_t)pl * OH * OW;
        float *o = out + (size_t)pl * OH * OW;
        if (c < 0 || c >= d->C) {
            if (o != x) memcpy(o, x, (size_t)OH * OW * sizeof(float));
            continue;
        }
        const float *src = in + ((size_t)k * d->C + c) * d->H * d->W;
        if (S == 1) {
            for (int i = 0; i < OH * OW; i++) o[i] = x[i] + src[i];
            continue;
        }
        for (int oy = 0; oy < OH; oy++) {
            const float *r = src + (size_t)oy * S * d->W;
            for (int ox = 0; ox < OW; ox++) o[oy * OW + ox] = x[oy * OW + ox] + r[ox * S];
        }
    }
}

DP_HOT void dp_shortcut_backward(float *din, const float *dout, const dp_shortcut_dims_t *d)
{
    int OC = d->OC, OH = d->OH, OW = d->OW, S = d->stride, lo = (d->OC - d->C) / 2, H = d->H,
        W = d->W;
    int planes = d->B * d->C;
    int nt = dp_cpu_team((double)planes * H * W / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        int k = pl / d->C, c = pl % d->C;
        const float *g = dout + ((size_t)k * OC + c + lo) * OH * OW;
        float *o = din + (size_t)pl * H * W;
        if (S == 1) {
            memcpy(o, g, (size_t)H * W * sizeof(float));
            continue;
        }
        memset(o, 0, (size_t)H * W * sizeof(float));
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) o[(size_t)oy * S * W + ox * S] = g[oy * OW + ox];
    }
}

DP_HOT void dp_gap_forward(float *out, const float *in, int B, int C, int HW)
{
    int planes = B * C;
    int nt = dp_cpu_team((double)planes * HW / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) out[pl] = s_sum(in + (size_t)pl * HW, HW) / (float)HW;
}

DP_HOT void dp_gap_backward(float *din, const float *dout, int B, int C, int HW)
{
    int planes = B * C;
    int nt = dp_cpu_team((double)planes * HW / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        float g = dout[pl] / (float)HW;
        float *o = din + (size_t)pl * HW;
        for (int i = 0; i < HW; i++) o[i] = g;
    }
}

DP_HOT void dp_dropout_forward(float *out, const float *in, int B, size_t N, float p,
                               unsigned long long seed, unsigned long long step,
                               unsigned long long sample0)
{
    float scale = 1.0f / (1.0f - p);
    int nt = dp_cpu_team((double)B * N * 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int k = 0; k < B; k++) {
        const float *x = in + (size_t)k * N;
        float *o = out + (size_t)k * N;
        for (size_t i = 0; i < N; i++) {
            float v = x[i] * scale;
            o[i] = dp_dropout_keep(seed, step, sample0 + (unsigned)k, i, p) ? v : 0.0f;
        }
    }
}

void dp_dropout_backward(float *din, const float *dout, int B, size_t N, float p,
                         unsigned long long seed, unsigned long long step,
                         unsigned long long sample0)
{
    dp_dropout_forward(din, dout, B, N, p, seed, step, sample0);
}

DP_HOT void dp_vec_add(float *dst, const float *src, size_t n)
{
    int nt = dp_cpu_team((double)n / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}
