/* ref: the plain reference kernels — straight loops over the definitions in
 * kernels/ops.h, written to be checked by eye, not to be fast. The fast CPU
 * kernels and the CUDA kernels are tested against these.
 *
 * Conventions: NCHW float32; gradients are written, never accumulated;
 * din may be NULL (not computed). Accumulation is in double so the
 * references are a notch more accurate than what they check. */
#include <math.h>
#include <string.h>

#include "kernels/dropout_mask.h"
#include "kernels/ops.h"

void dp_conv_dims_finish(dp_conv_dims_t *d)
{
    d->OH = (d->H + 2 * d->pad - d->K) / d->stride + 1;
    d->OW = (d->W + 2 * d->pad - d->K) / d->stride + 1;
}

void dp_shortcut_dims_finish(dp_shortcut_dims_t *d)
{
    d->OH = (d->H - 1) / d->stride + 1;
    d->OW = (d->W - 1) / d->stride + 1;
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
    for (int oc = 0; oc < d->OC && db; oc++) {
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

/* The reference in double: p and 1 - p each from exp(-|z|) (no overflow,
 * no cancellation), the loss as PyTorch's BCEWithLogitsLoss writes it. */
float dp_sigmoid_xent_forward_ref(float *probs, const float *logits, const float *bias,
                                  const int *labels, int B)
{
    double loss = 0;
    for (int n = 0; n < B; n++) {
        double z = (double)logits[n] + (bias ? (double)*bias : 0.0);
        double e = exp(-fabs(z)); /* in (0, 1] */
        double big = 1.0 / (1.0 + e), small = e / (1.0 + e);
        probs[2 * n] = (float)(z >= 0 ? small : big);
        probs[2 * n + 1] = (float)(z >= 0 ? big : small);
        if (labels) loss += (z > 0 ? z : 0) - z * labels[n] + log1p(e);
    }
    return (float)(loss / B);
}

void dp_sigmoid_xent_backward_ref(float *dlogits, float *dbias, const float *probs,
                                  const int *labels, int B)
{
    double sum = 0;
    for (int n = 0; n < B; n++) {
        double g = ((double)probs[2 * n + 1] - labels[n]) / B;
        if (dlogits) dlogits[n] = (float)g;
        sum += g;
    }
    if (dbias) *dbias = (float)sum;
}

/* ---- batch norm, shortcut, pooling, dropout ---------------------------- */

void dp_bn_forward_train_ref(float *out, float *mean, float *var, const float *in,
                             const float *w, const float *b, int B, int C, int HW, float eps)
{
    double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) s += in[((size_t)k * C + c) * HW + i];
        double mu = s / n;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                double x = in[((size_t)k * C + c) * HW + i] - mu;
                q += x * x;
            }
        mean[c] = (float)mu;
        var[c] = (float)(q / n);
        double inv = 1.0 / sqrt(q / n + eps);
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                size_t at = ((size_t)k * C + c) * HW + i;
                out[at] = (float)(w[c] * (in[at] - mu) * inv + b[c]);
            }
    }
}

void dp_bn_forward_eval_ref(float *out, const float *in, const float *w, const float *b,
                            const float *rmean, const float *rvar, int B, int C, int HW,
                            float eps)
{
    for (int k = 0; k < B; k++)
        for (int c = 0; c < C; c++) {
            double inv = 1.0 / sqrt((double)rvar[c] + eps);
            for (int i = 0; i < HW; i++) {
                size_t at = ((size_t)k * C + c) * HW + i;
                out[at] = (float)(w[c] * (in[at] - (double)rmean[c]) * inv + b[c]);
            }
        }
}

/* With xh = (x - mean) inv: dw = sum dout xh, db = sum dout,
 * din = w inv (dout - db / n - xh dw / n). */
void dp_bn_backward_ref(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, const float *mean, const float *var, int B, int C,
                        int HW, float eps)
{
    double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double inv = 1.0 / sqrt((double)var[c] + eps), sg = 0, sgx = 0;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                size_t at = ((size_t)k * C + c) * HW + i;
                sg += dout[at];
                sgx += dout[at] * ((in[at] - (double)mean[c]) * inv);
            }
        dw[c] = (float)sgx;
        db[c] = (float)sg;
        if (!din) continue;
        for (int k = 0; k < B; k++)
            for (int i = 0; i < HW; i++) {
                size_t at = ((size_t)k * C + c) * HW + i;
                double xh = (in[at] - (double)mean[c]) * inv;
                din[at] = (float)(w[c] * inv * (dout[at] - sg / n - xh * sgx / n));
            }
    }
}

/* The input element the shortcut puts at output (oc, oy, ox), or -1 (a padded channel). */
static long s_short_src(const dp_shortcut_dims_t *d, int k, int oc, int oy, int ox)
{
    int c = oc - (d->OC - d->C) / 2;
    if (c < 0 || c >= d->C) return -1;
    return (long)((((size_t)k * d->C + c) * d->H + (size_t)oy * d->stride) * d->W +
                  (size_t)ox * d->stride);
}

void dp_shortcut_add_forward_ref(float *out, const float *a, const float *in,
                                 const dp_shortcut_dims_t *d)
{
    for (int k = 0; k < d->B; k++)
        for (int oc = 0; oc < d->OC; oc++)
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    size_t at = (((size_t)k * d->OC + oc) * d->OH + oy) * d->OW + ox;
                    long src = s_short_src(d, k, oc, oy, ox);
                    out[at] = a[at] + (src < 0 ? 0.0f : in[src]);
                }
}

void dp_shortcut_backward_ref(float *din, const float *dout, const dp_shortcut_dims_t *d)
{
    memset(din, 0, (size_t)d->B * d->C * d->H * d->W * sizeof(float));
    for (int k = 0; k < d->B; k++)
        for (int oc = 0; oc < d->OC; oc++)
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    long src = s_short_src(d, k, oc, oy, ox);
                    if (src >= 0)
                        din[src] = dout[(((size_t)k * d->OC + oc) * d->OH + oy) * d->OW + ox];
                }
}

void dp_gap_forward_ref(float *out, const float *in, int B, int C, int HW)
{
    for (size_t pl = 0; pl < (size_t)B * C; pl++) {
        double s = 0;
        for (int i = 0; i < HW; i++) s += in[pl * HW + i];
        out[pl] = (float)(s / HW);
    }
}

void dp_gap_backward_ref(float *din, const float *dout, int B, int C, int HW)
{
    for (size_t pl = 0; pl < (size_t)B * C; pl++)
        for (int i = 0; i < HW; i++) din[pl * HW + i] = dout[pl] / (float)HW;
}

int dp_dropout_keep(unsigned long long seed, unsigned long long step, unsigned long long sample,
                    unsigned long long i, float p)
{
    return dp_dropout_mask(seed, step, sample, i, p); /* kernels/dropout_mask.h: the GPU's too */
}

void dp_dropout_forward_ref(float *out, const float *in, int B, size_t N, float p,
                            unsigned long long seed, unsigned long long step,
                            unsigned long long sample0)
{
    float scale = 1.0f / (1.0f - p);
    for (int k = 0; k < B; k++)
        for (size_t i = 0; i < N; i++)
            out[(size_t)k * N + i] =
                dp_dropout_keep(seed, step, sample0 + (unsigned)k, i, p) ? in[(size_t)k * N + i] * scale : 0.0f;
}

void dp_dropout_backward_ref(float *din, const float *dout, int B, size_t N, float p,
                             unsigned long long seed, unsigned long long step,
                             unsigned long long sample0)
{
    dp_dropout_forward_ref(din, dout, B, N, p, seed, step, sample0);
}

void dp_bn_running_update(float *rm, float *rv, float *nbt, const float *save, long n,
                          long n_last, int groups, int C, float momentum)
{
    float inv = 1.0f / (float)groups, keep = 1.0f - momentum;
    for (int c = 0; c < C; c++) {
        float am = 0.0f, av = 0.0f;
        for (int g = 0; g < groups; g++) {
            const float *sv = save + (size_t)2 * C * g;
            long k = g == groups - 1 ? n_last : n;
            float unb = k > 1 ? sv[C + c] * ((float)k / (float)(k - 1)) : sv[C + c];
            am += keep * rm[c] + momentum * sv[c];
            av += keep * rv[c] + momentum * unb;
        }
        rm[c] = groups == 1 ? am : am * inv;
        rv[c] = groups == 1 ? av : av * inv;
    }
    *nbt += 1.0f;
}
