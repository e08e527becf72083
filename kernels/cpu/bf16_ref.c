/* bf16_ref: the bf16 reference (bf16_ref.h). Conventions of ref.c (NCHW,
 * gradients overwritten, b/db/din may be NULL as ops.h allows), but every
 * sum is a float, started at 0 (or at the bias), with the products added
 * one by one in the loop order written here; each product's operands are
 * rounded to bf16 first, so a product is exact in fp32 (8 x 8 bits of
 * mantissa) and the sums are the only roundings. Bias and its gradient
 * are fp32 sums of fp32 values (nothing rounded to bf16). */
#include "kernels/cpu/bf16_ref.h"

#include <stddef.h>

#include "common/bf16.h"

/* The product of x and y as a bf16 kernel forms it. */
static inline float s_mul(float x, float y)
{
    return dp_bf16_round(x) * dp_bf16_round(y);
}

/* Input pixel (n, c, y, x), zero outside the image. */
static float s_at(const float *in, const dp_conv_dims_t *d, int n, int c, int y, int x)
{
    if (y < 0 || y >= d->H || x < 0 || x >= d->W) return 0.0f;
    return in[(((size_t)n * d->C + c) * d->H + y) * d->W + x];
}

/* out[n,oc,oy,ox] = b[oc], then + in * w over c, ky, kx ascending. */
void dp_bf16_conv2d_forward_ref(float *out, const float *in, const float *w, const float *b,
                                const dp_conv_dims_t *d)
{
    int K = d->K;
    for (int n = 0; n < d->B; n++)
        for (int oc = 0; oc < d->OC; oc++)
            for (int oy = 0; oy < d->OH; oy++)
                for (int ox = 0; ox < d->OW; ox++) {
                    float acc = b ? b[oc] : 0.0f;
                    for (int c = 0; c < d->C; c++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int y = oy * d->stride - d->pad + ky;
                                int x = ox * d->stride - d->pad + kx;
                                acc += s_mul(s_at(in, d, n, c, y, x),
                                             w[(((size_t)oc * d->C + c) * K + ky) * K + kx]);
                            }
                    out[(((size_t)n * d->OC + oc) * d->OH + oy) * d->OW + ox] = acc;
                }
}

void dp_bf16_conv_db(float *db, const float *dout, const dp_conv_dims_t *d)
{
    size_t P = (size_t)d->OH * d->OW;
    for (int oc = 0; oc < d->OC; oc++) {
        float acc = 0.0f;
        for (int n = 0; n < d->B; n++)
            for (size_t i = 0; i < P; i++) acc += dout[((size_t)n * d->OC + oc) * P + i];
        db[oc] = acc;
    }
}

void dp_bf16_fc_db(float *db, const float *dout, int B, int OUT)
{
    for (int o = 0; o < OUT; o++) {
        float acc = 0.0f;
        for (int n = 0; n < B; n++) acc += dout[(size_t)n * OUT + o];
        db[o] = acc;
    }
}

/* db[oc]: dout over n, then positions, ascending (fp32, not rounded).
 * dw[oc,c,ky,kx]: dout * in over n, oy, ox ascending.
 * din[n,c,y,x]: dout * w over oc, ky, kx ascending, the (oy, ox) each
 * (ky, kx) reaches (none where the stride skips it). */
void dp_bf16_conv2d_backward_ref(float *din, float *dw, float *db, const float *dout,
                                 const float *in, const float *w, const dp_conv_dims_t *d)
{
    int K = d->K;
    size_t P = (size_t)d->OH * d->OW;
    if (db) dp_bf16_conv_db(db, dout, d);
    for (int oc = 0; oc < d->OC; oc++)
        for (int c = 0; c < d->C; c++)
            for (int ky = 0; ky < K; ky++)
                for (int kx = 0; kx < K; kx++) {
                    float acc = 0.0f;
                    for (int n = 0; n < d->B; n++)
                        for (int oy = 0; oy < d->OH; oy++)
                            for (int ox = 0; ox < d->OW; ox++) {
                                int y = oy * d->stride - d->pad + ky;
                                int x = ox * d->stride - d->pad + kx;
                                acc += s_mul(dout[((size_t)n * d->OC + oc) * P +
                                                  (size_t)oy * d->OW + ox],
                                             s_at(in, d, n, c, y, x));
                            }
                    dw[(((size_t)oc * d->C + c) * K + ky) * K + kx] = acc;
                }
    if (!din) return;
    for (int n = 0; n < d->B; n++)
        for (int c = 0; c < d->C; c++)
            for (int y = 0; y < d->H; y++)
                for (int x = 0; x < d->W; x++) {
                    float acc = 0.0f;
                    for (int oc = 0; oc < d->OC; oc++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int ty = y + d->pad - ky, tx = x + d->pad - kx;
                                if (ty < 0 || tx < 0 || ty % d->stride || tx % d->stride)
                                    continue;
                                int oy = ty / d->stride, ox = tx / d->stride;
                                if (oy >= d->OH || ox >= d->OW) continue;
                                acc += s_mul(dout[((size_t)n * d->OC + oc) * P +
                                                  (size_t)oy * d->OW + ox],
                                             w[(((size_t)oc * d->C + c) * K + ky) * K + kx]);
                            }
                    din[(((size_t)n * d->C + c) * d->H + y) * d->W + x] = acc;
                }
}

/* out[n,o] = b[o], then + in * w over i ascending. */
void dp_bf16_fc_forward_ref(float *out, const float *in, const float *w, const float *b, int B,
                            int IN, int OUT)
{
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) {
            float acc = b ? b[o] : 0.0f;
            for (int i = 0; i < IN; i++)
                acc += s_mul(in[(size_t)n * IN + i], w[(size_t)o * IN + i]);
            out[(size_t)n * OUT + o] = acc;
        }
}

/* db[o]: dout over n ascending (fp32, not rounded); dw[o,i]: dout * in
 * over n ascending; din[n,i]: dout * w over o ascending. */
void dp_bf16_fc_backward_ref(float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w, int B, int IN, int OUT)
{
    if (db) dp_bf16_fc_db(db, dout, B, OUT);
    for (int o = 0; o < OUT; o++) {
        for (int i = 0; i < IN; i++) {
            float a = 0.0f;
            for (int n = 0; n < B; n++)
                a += s_mul(dout[(size_t)n * OUT + o], in[(size_t)n * IN + i]);
            dw[(size_t)o * IN + i] = a;
        }
    }
    if (!din) return;
    for (int n = 0; n < B; n++)
        for (int i = 0; i < IN; i++) {
            float acc = 0.0f;
            for (int o = 0; o < OUT; o++)
                acc += s_mul(dout[(size_t)n * OUT + o], w[(size_t)o * IN + i]);
            din[(size_t)n * IN + i] = acc;
        }
}

const dp_bf16_ops_t dp_bf16_ref = {
    .name = "reference",
    .conv_forward = dp_bf16_conv2d_forward_ref,
    .conv_backward = dp_bf16_conv2d_backward_ref,
    .fc_forward = dp_bf16_fc_forward_ref,
    .fc_backward = dp_bf16_fc_backward_ref,
};
