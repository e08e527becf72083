/* ops_fast: the fast CPU versions of the light ops — relu, tanh, max-pool, fully
 * connected (sgemm), softmax + cross-entropy. Same results as the references
 * in ref.c up to float rounding; max-pool picks the same element (the first
 * maximum in row-major window order) so its gradient lands in the same
 * place. Elementwise loops split over threads only when large. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/ops.h"
#include "kernels/cpu/cpu.h"

#define DP_HOT __attribute__((optimize("O3")))

DP_HOT void dp_relu_forward(float *out, const float *in, size_t n)
{
    int nt = dp_cpu_team((double)n / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

DP_HOT void dp_tanh_forward(float *out, const float *in, size_t n)
{
    int nt = dp_cpu_team((double)n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = tanhf(in[i]);
}

DP_HOT void dp_tanh_backward(float *din, const float *dout, const float *out, size_t n)
{
    int nt = dp_cpu_team((double)n / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * (1.0f - out[i] * out[i]);
}

DP_HOT void dp_relu_backward(float *din, const float *dout, const float *out, size_t n)
{
    int nt = dp_cpu_team((double)n / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    /* both loads unconditional, so the compiler makes it a blend, not a branch
     * (a branch on the sign mispredicts half the time: 40x slower) */
    for (size_t i = 0; i < n; i++) {
        float g = dout[i], o = out[i];
        din[i] = o > 0.0f ? g : 0.0f;
    }
}

DP_HOT void dp_maxpool_forward(float *out, const float *in, const dp_pool_dims_t *d)
{
    int planes = d->B * d->C, H = d->H, W = d->W, OH = d->OH, OW = d->OW, K = d->K,
        S = d->stride;
    int nt = dp_cpu_team((double)planes * OH * OW * K * K / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        const float *src = in + (size_t)pl * H * W;
        float *dst = out + (size_t)pl * OH * OW;
        if (K == 2 && S == 2) {
            for (int oy = 0; oy < OH; oy++) {
                const float *r0 = src + (size_t)2 * oy * W, *r1 = r0 + W;
                for (int ox = 0; ox < OW; ox++) {
                    float m = -INFINITY;
                    if (r0[2 * ox] > m) m = r0[2 * ox];
                    if (r0[2 * ox + 1] > m) m = r0[2 * ox + 1];
                    if (r1[2 * ox] > m) m = r1[2 * ox];
                    if (r1[2 * ox + 1] > m) m = r1[2 * ox + 1];
                    dst[oy * OW + ox] = m;
                }
            }
            continue;
        }
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                const float *win = src + (size_t)oy * S * W + ox * S;
                float m = -INFINITY;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++)
                        if (win[ky * W + kx] > m) m = win[ky * W + kx];
                dst[oy * OW + ox] = m;
            }
    }
}

DP_HOT void dp_maxpool_backward(float *din, const float *dout, const float *in, const float *out,
                                const dp_pool_dims_t *d)
{
    int planes = d->B * d->C, H = d->H, W = d->W, OH = d->OH, OW = d->OW, K = d->K,
        S = d->stride;
    int nt = dp_cpu_team((double)planes * H * W / 4);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        const float *src = in + (size_t)pl * H * W;
        const float *g = dout + (size_t)pl * OH * OW;
        const float *mx = out + (size_t)pl * OH * OW;
        float *dst = din + (size_t)pl * H * W;
        if (K == 2 && S == 2) {
            /* Windows tile the plane: write each window's four cells without
             * branches (which element is the max is a coin toss for the
             * predictor), then zero the leftover row / column. */
            for (int oy = 0; oy < OH; oy++) {
                const float *r0 = src + (size_t)2 * oy * W, *r1 = r0 + W;
                float *d0 = dst + (size_t)2 * oy * W, *d1 = d0 + W;
                for (int ox = 0; ox < OW; ox++) {
                    float m = mx[oy * OW + ox], gv = g[oy * OW + ox];
                    int e0 = r0[2 * ox] == m, e1 = r0[2 * ox + 1] == m;
                    int e2 = r1[2 * ox] == m, e3 = r1[2 * ox + 1] == m;
                    /* first maximum in scan order, without branches */
                    int n0 = !e0, n1 = !e1, n2 = !e2;
                    int t1 = n0 & e1, t2 = n0 & n1 & e2, t3 = n0 & n1 & n2 & e3;
                    d0[2 * ox] = e0 ? gv : 0.0f;
                    d0[2 * ox + 1] = t1 ? gv : 0.0f;
                    d1[2 * ox] = t2 ? gv : 0.0f;
                    d1[2 * ox + 1] = t3 ? gv : 0.0f;
                }
                if (W > 2 * OW) {
                    d0[W - 1] = 0.0f;
                    d1[W - 1] = 0.0f;
                }
            }
            if (H > 2 * OH) memset(dst + (size_t)(H - 1) * W, 0, (size_t)W * sizeof(float));
            continue;
        }
        memset(dst, 0, (size_t)H * W * sizeof(float));
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float m = mx[oy * OW + ox];
                size_t base = (size_t)oy * S * W + ox * S;
                /* first element equal to the max, row-major; windows may overlap */
                for (int j = 0; j < K * K; j++) {
                    size_t i = base + (size_t)(j / K) * W + j % K;
                    if (src[i] == m) {
                        dst[i] += g[oy * OW + ox];
                        break;
                    }
                }
            }
    }
}

void dp_fc_forward(float *out, const float *in, const float *w, const float *b, int B, int IN,
                   int OUT)
{
    for (int n = 0; n < B; n++) {
        float *o = out + (size_t)n * OUT;
        if (b)
            memcpy(o, b, (size_t)OUT * sizeof(float));
        else
            memset(o, 0, (size_t)OUT * sizeof(float));
    }
    dp_cpu_sgemm(0, 1, B, OUT, IN, 1.0f, in, IN, w, IN, 1.0f, out, OUT);
}

DP_HOT void dp_fc_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, int B, int IN, int OUT)
{
    for (int o = 0; o < OUT; o++) db[o] = 0.0f;
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) db[o] += dout[(size_t)n * OUT + o];
    /* dw[OUT,IN] = dout^T in */
    dp_cpu_sgemm(1, 0, OUT, IN, B, 1.0f, dout, OUT, in, IN, 0.0f, dw, IN);
    /* din[B,IN] = dout w */
    if (din) dp_cpu_sgemm(0, 0, B, IN, OUT, 1.0f, dout, OUT, w, IN, 0.0f, din, IN);
}

float dp_softmax_xent_forward(float *probs, const float *logits, const int *labels, int B,
                              int classes)
{
    double loss = 0;
    for (int n = 0; n < B; n++) {
        const float *z = logits + (size_t)n * classes;
        float *p = probs + (size_t)n * classes;
        float mx = z[0];
        for (int k = 1; k < classes; k++)
            if (z[k] > mx) mx = z[k];
        float sum = 0.0f;
        for (int k = 0; k < classes; k++) {
            p[k] = expf(z[k] - mx);
            sum += p[k];
        }
        float inv = 1.0f / sum;
        for (int k = 0; k < classes; k++) p[k] *= inv;
        loss += logf(sum) - (z[labels[n]] - mx);
    }
    return (float)(loss / B);
}

void dp_softmax_xent_backward(float *dlogits, const float *probs, const int *labels, int B,
                              int classes)
{
    float inv = 1.0f / B;
    for (int n = 0; n < B; n++) {
        const float *p = probs + (size_t)n * classes;
        float *g = dlogits + (size_t)n * classes;
        for (int k = 0; k < classes; k++) g[k] = p[k] * inv;
        g[labels[n]] -= inv;
    }
}

float dp_sigmoid_xent_forward(float *probs, const float *logits, const float *bias,
                              const int *labels, int B)
{
    float b = bias ? *bias : 0.0f;
    double loss = 0;
    for (int n = 0; n < B; n++) {
        float z = logits[n] + b;
        float e = expf(-fabsf(z)); /* in (0, 1]: neither side overflows */
        float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
        probs[2 * n] = z >= 0 ? small : big;
        probs[2 * n + 1] = z >= 0 ? big : small;
        if (labels) loss += (z > 0 ? z : 0.0f) - z * (float)labels[n] + log1pf(e);
    }
    return (float)(loss / B);
}

void dp_sigmoid_xent_backward(float *dlogits, float *dbias, const float *probs,
                              const int *labels, int B)
{
    float inv = 1.0f / B, sum = 0.0f;
    for (int n = 0; n < B; n++) {
        float g = (probs[2 * n + 1] - (float)labels[n]) * inv;
        if (dlogits) dlogits[n] = g;
        sum += g;
    }
    if (dbias) *dbias = sum;
}
