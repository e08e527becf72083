/* ops: the CPU kernels, float32, NCHW, any batch size.
 *
 * Each op has a fast version (dp_<op>_<pass>, used by default) and a plain
 * reference (dp_<op>_<pass>_ref: loops a reader can check by eye) that the
 * fast one and the CUDA twins are tested against. The CUDA kernels in
 * kernels/cuda take the same parameters in the same order.
 *
 * Dimensions: B = batch, C = input channels, H, W = input height and width,
 * OC = output channels, K = kernel size, OH, OW = output height and width,
 * IN / OUT = fc features. Outputs come first in every signature.
 *
 * Gradients are written, never accumulated: dw, db, din are overwritten.
 * din may be NULL when the input gradient is not needed (the first layer). */
#ifndef DP_OPS_H
#define DP_OPS_H

#include <stddef.h>

typedef struct {
    int B, C, H, W;   /* input */
    int OC, K;        /* filters: OC x C x K x K */
    int pad, stride;  /* zero padding on each side, stride (both axes) */
    int OH, OW;       /* (H + 2 pad - K) / stride + 1, likewise W */
} dp_conv_dims_t;

typedef struct {
    int B, C, H, W;   /* input */
    int K, stride;    /* window K x K, moved by stride */
    int OH, OW;       /* (H - K) / stride + 1: trailing rows/cols left out */
} dp_pool_dims_t;

/* Fill OH, OW from the rest. */
void dp_conv_dims_finish(dp_conv_dims_t *d);
void dp_pool_dims_finish(dp_pool_dims_t *d);

/* Threads the fast CPU kernels use (default: all cores). */
void dp_cpu_set_threads(int n);
int dp_cpu_threads(void);

/* out[B,OC,OH,OW] = conv(in[B,C,H,W], w[OC,C,K,K]) + b[OC] */
void dp_conv2d_forward(float *out, const float *in, const float *w, const float *b,
                       const dp_conv_dims_t *d);
void dp_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, const dp_conv_dims_t *d);

/* out = max(0, in); din = dout where out > 0, else 0. In place allowed. */
void dp_relu_forward(float *out, const float *in, size_t n);
void dp_relu_backward(float *din, const float *dout, const float *out, size_t n);

/* Max over each window; the gradient goes to the first maximum in row-major
 * scan order of the window. din[B,C,H,W] is fully written (zeros elsewhere). */
void dp_maxpool_forward(float *out, const float *in, const dp_pool_dims_t *d);
void dp_maxpool_backward(float *din, const float *dout, const float *in, const float *out,
                         const dp_pool_dims_t *d);

/* out[B,OUT] = in[B,IN] w[OUT,IN]^T + b[OUT] */
void dp_fc_forward(float *out, const float *in, const float *w, const float *b, int B, int IN,
                   int OUT);
void dp_fc_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                    const float *w, int B, int IN, int OUT);

/* probs[B,classes] = softmax(logits); returns the mean cross-entropy over
 * the batch. labels[b] in [0, classes). */
float dp_softmax_xent_forward(float *probs, const float *logits, const int *labels, int B,
                              int classes);
/* dlogits = (probs - onehot(labels)) / B: the gradient of the mean loss. */
void dp_softmax_xent_backward(float *dlogits, const float *probs, const int *labels, int B,
                              int classes);

/* The plain references. */
void dp_conv2d_forward_ref(float *out, const float *in, const float *w, const float *b,
                           const dp_conv_dims_t *d);
void dp_conv2d_backward_ref(float *din, float *dw, float *db, const float *dout,
                            const float *in, const float *w, const dp_conv_dims_t *d);
void dp_relu_forward_ref(float *out, const float *in, size_t n);
void dp_relu_backward_ref(float *din, const float *dout, const float *out, size_t n);
void dp_maxpool_forward_ref(float *out, const float *in, const dp_pool_dims_t *d);
void dp_maxpool_backward_ref(float *din, const float *dout, const float *in, const float *out,
                             const dp_pool_dims_t *d);
void dp_fc_forward_ref(float *out, const float *in, const float *w, const float *b, int B,
                       int IN, int OUT);
void dp_fc_backward_ref(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int B, int IN, int OUT);
float dp_softmax_xent_forward_ref(float *probs, const float *logits, const int *labels, int B,
                                  int classes);
void dp_softmax_xent_backward_ref(float *dlogits, const float *probs, const int *labels, int B,
                                  int classes);

#endif
