/* ref: the plain reference kernels — straight loops over the definitions in
 * kernels/ops.h, written to be checked by eye, not to be fast. The fast CPU
 * kernels and the CUDA kernels are tested against these.
 *
 * Conventions: NCHW float32; gradients are written, never accumulated;
 * din may be NULL (not computed). Accumulation is in double so the
 * references are a notch more accurate than what they check. */
#include <math.h>
#include <string.h>

#include "kernels/ops.h"

void dp_conv_dims_finish(dp_conv_dims_t *d)
{
    d->OH = (d->H + 2 * d->pad - d->K) / d->stride + 1;
    d->OW = (d->W + 2 * d->pad - d->K) / d->stride + 1;
}

void dp_pool_dims_finish(dp_pool_dims_t *d)
{
    d->OH = (d->H - d->K) / d->stride + 1;
    d->OW = (d->W - d->K) / d->stride + 1;
}

/* Input pixel (b, c, y, x) with zero outside the image. */
static float s_at(const float *in, const dp_conv_dims_t *d, int b, int c, int y, int x)
{
    if (y < 0 || y >= d->H || x < 0 || x >= d->W) return 0.0f;
    return in[(((size_t)b * d->C + c) * d->H + y) * d->W + x];
}

void dp_conv2d_forward_ref(float *out, const float *in, const float *w, const float *b,
                           const dp_conv_dims_t *d)
{
    int K = d->K;
    for (int n = 0; n < d->B; n++)
        for (int oc = 0; oc < d->OC; oc++)
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    double acc = b ? b[oc] : 0.0;
                    for (int c = 0; c < d->C; c++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int y = oy * d->stride - d->pad + ky;
                                int x = ox * d->stride - d->pad + kx;
                                acc += (double)s_at(in, d, n, c, y, x) *
                                       w[(((size_t)oc * d->C + c) * K + ky) * K + kx];
                            }
                    out[(((size_t)n * d->OC + oc) * d->OH + oy) * d->OW + ox] = (float)acc;
                }
}

void dp_conv2d_backward_ref(float *din, float *dw, float *db, const float *dout,
                            const float *in, const float *w, const dp_conv_dims_t *d)
{
    int K = d->K;
    /* db[oc] = sum over batch and positions of dout */
    for (int oc = 0; oc < d->OC; oc++) {
        double acc = 0;
        for (int n = 0; n < d->B; n++)
            for (int i = 0; i < d->OH * d->OW; i++)
                acc += dout[((size_t)n * d->OC + oc) * d->OH * d->OW + i];
        db[oc] = (float)acc;
    }
    /* dw[oc,c,ky,kx] = sum over n, oy, ox of dout[n,oc,oy,ox] * in[n,c,y,x] */
    for (int oc = 0; oc < d->OC; oc++)
        for (int c = 0; c < d->C; c++)
            for (int ky = 0; ky < K; ky++)
                for (int kx = 0; kx < K; kx++) {
                    double acc = 0;
                    for (int n = 0; n < d->B; n++)
                        for (int oy = 0; oy < d->OH; oy++)
                            for (int ox = 0; ox < d->OW; ox++) {
                                int y = oy * d->stride - d->pad + ky;
                                int x = ox * d->stride - d->pad + kx;
                                acc += (double)dout[(((size_t)n * d->OC + oc) * d->OH + oy) *
                                                        d->OW + ox] *
                                       s_at(in, d, n, c, y, x);
                            }
                    dw[(((size_t)oc * d->C + c) * K + ky) * K + kx] = (float)acc;
                }
    if (!din) return;
    /* din[n,c,y,x] = sum over the (oc, ky, kx) whose window covers (y, x) */
    for (int n = 0; n < d->B; n++)
        for (int c = 0; c < d->C; c++)
            for (int y = 0; y < d->H; y++)
                for (int x = 0; x < d->W; x++) {
                    double acc = 0;
                    for (int oc = 0; oc < d->OC; oc++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int ty = y + d->pad - ky, tx = x + d->pad - kx;
                                if (ty < 0 || tx < 0 || ty % d->stride || tx % d->stride)
                                    continue;
                                int oy = ty / d->stride, ox = tx / d->stride;
                                if (oy >= d->OH || ox >= d->OW) continue;
                                acc += (double)dout[(((size_t)n * d->OC + oc) * d->OH + oy) *
                                                        d->OW + ox] *
                                       w[(((size_t)oc * d->C + c) * K + ky) * K + kx];
                            }
                    din[(((size_t)n * d->C + c) * d->H + y) * d->W + x] = (float)acc;
                }
}

void dp_relu_forward_ref(float *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void dp_relu_backward_ref(float *din, const float *dout, const float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

void dp_maxpool_forward_ref(float *out, const float *in, const dp_pool_dims_t *d)
{
    for (int n = 0; n < d->B; n++)
        for (int c = 0; c < d->C; c++) {
            const float *src = in + ((size_t)n * d->C + c) * d->H * d->W;
            float *dst = out + ((size_t)n * d->C + c) * d->OH * d->OW;
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    float m = -INFINITY;
                    for (int ky = 0; ky < d->K; ky++)
                        for (int kx = 0; kx < d->K; kx++) {
                            float v = src[(oy * d->stride + ky) * d->W + ox * d->stride + kx];
                            if (v > m) m = v;
                        }
                    dst[oy * d->OW + ox] = m;
                }
        }
}

void dp_maxpool_backward_ref(float *din, const float *dout, const float *in, const float *out,
                             const dp_pool_dims_t *d)
{
    memset(din, 0, (size_t)d->B * d->C * d->H * d->W * sizeof(float));
    for (int n = 0; n < d->B; n++)
        for (int c = 0; c < d->C; c++) {
            size_t plane = (size_t)n * d->C + c;
            const float *src = in + plane * d->H * d->W;
            float *dst = din + plane * d->H * d->W;
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    float m = out[plane * d->OH * d->OW + oy * d->OW + ox];
                    /* the first window element equal to the max takes it all */
                    int found = 0;
                    for (int ky = 0; ky < d->K && !found; ky++)
                        for (int kx = 0; kx < d->K && !found; kx++) {
                            int i = (oy * d->stride + ky) * d->W + ox * d->stride + kx;
                            if (src[i] == m) {
                                dst[i] += dout[plane * d->OH * d->OW + oy * d->OW + ox];
                                found = 1;
                            }
                        }
                }
        }
}

void dp_fc_forward_ref(float *out, const float *in, const float *w, const float *b, int B,
                       int IN, int OUT)
{
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) {
            double acc = b ? b[o] : 0.0;
            for (int i = 0; i < IN; i++)
                acc += (double)in[(size_t)n * IN + i] * w[(size_t)o * IN + i];
            out[(size_t)n * OUT + o] = (float)acc;
        }
}

void dp_fc_backward_ref(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int B, int IN, int OUT)
{
    for (int o = 0; o < OUT; o++) {
        double acc = 0;
        for (int n = 0; n < B; n++) acc += dout[(size_t)n * OUT + o];
        db[o] = (float)acc;
        for (int i = 0; i < IN; i++) {
            double a = 0;
            for (int n = 0; n < B; n++)
                a += (double)dout[(size_t)n * OUT + o] * in[(size_t)n * IN + i];
            dw[(size_t)o * IN + i] = (float)a;
        }
    }
    if (!din) return;
    for (int n = 0; n < B; n++)
        for (int i = 0; i < IN; i++) {
            double acc = 0;
            for (int o = 0; o < OUT; o++)
                acc += (double)dout[(size_t)n * OUT + o] * w[(size_t)o * IN + i];
            din[(size_t)n * IN + i] = (float)acc;
        }
}

float dp_softmax_xent_forward_ref(float *probs, const float *logits, const int *labels, int B,
                                  int classes)
{
    double loss = 0;
    for (int n = 0; n < B; n++) {
        const float *z = logits + (size_t)n * classes;
        float *p = probs + (size_t)n * classes;
        double mx = z[0], sum = 0;
        for (int k = 1; k < classes; k++)
            if (z[k] > mx) mx = z[k];
        for (int k = 0; k < classes; k++) sum += exp((double)z[k] - mx);
        for (int k = 0; k < classes; k++) p[k] = (float)(exp((double)z[k] - mx) / sum);
        /* -log p[label], from the logits so it stays finite when p underflows */
        loss += log(sum) - ((double)z[labels[n]] - mx);
    }
    return (float)(loss / B);
}

void dp_softmax_xent_backward_ref(float *dlogits, const float *probs, const int *labels, int B,
                                  int classes)
{
    for (int n = 0; n < B; n++)
        for (int k = 0; k < classes; k++)
            dlogits[(size_t)n * classes + k] =
                (probs[(size_t)n * classes + k] - (k == labels[n] ? 1.0f : 0.0f)) / B;
}
