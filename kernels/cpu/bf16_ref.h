/* bf16_ref: the plain reference of the bf16 passes (bf16_ops.h) — ops.h's
 * fp32 references with every product's two operands rounded to bf16
 * (dp_bf16_round) and the products summed in fp32, in the order written
 * beside each function. Loops a reader checks by eye; the native paths
 * (avx512_bf16, amx) are tested against these. Where a path sums in another
 * order, it differs from these by fp32 rounding of the sums alone. */
#ifndef DP_CPU_BF16_REF_H
#define DP_CPU_BF16_REF_H

#include "kernels/cpu/bf16_ops.h"

void dp_bf16_conv2d_forward_ref(float *out, const float *in, const float *w, const float *b,
                                const dp_conv_dims_t *d);
void dp_bf16_conv2d_backward_ref(float *din, float *dw, float *db, const float *dout,
                                 const float *in, const float *w, const dp_conv_dims_t *d);
void dp_bf16_fc_forward_ref(float *out, const float *in, const float *w, const float *b, int B,
                            int IN, int OUT);
void dp_bf16_fc_backward_ref(float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w, int B, int IN, int OUT);

/* The bias gradients of every bf16 path, one definition: fp32 sums of
 * dout, never rounded; conv: db[oc] over images, then positions,
 * ascending; fc: db[o] over the batch ascending. */
void dp_bf16_conv_db(float *db, const float *dout, const dp_conv_dims_t *d);
void dp_bf16_fc_db(float *db, const float *dout, int B, int OUT);

/* The four as a table (name "reference"), so a test loops over tables. */
extern const dp_bf16_ops_t dp_bf16_ref;

#endif
