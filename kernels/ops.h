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

/* A residual block's shortcut from in[B,C,H,W] to [B,OC,OH,OW]: identity
 * (stride 1, OC == C) or He et al.'s option A (every stride-th row and
 * column, the channels zero-padded by (OC - C) / 2 below and the rest
 * above, no parameters: what PyTorch's CIFAR ResNets write as
 * F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, p, p))). */
typedef struct {
    int B, C, H, W;   /* input */
    int OC, stride;   /* OC >= C */
    int OH, OW;       /* (H - 1) / stride + 1, likewise W */
} dp_shortcut_dims_t;

/* Fill OH, OW from the rest. */
void dp_conv_dims_finish(dp_conv_dims_t *d);
void dp_pool_dims_finish(dp_pool_dims_t *d);
void dp_shortcut_dims_finish(dp_shortcut_dims_t *d);

/* Threads the fast CPU kernels use (default: all cores). */
void dp_cpu_set_threads(int n);
int dp_cpu_threads(void);

/* out[B,OC,OH,OW] = conv(in[B,C,H,W], w[OC,C,K,K]) + b[OC]; b and db may be
 * NULL (a convolution without bias: the ones before a batch norm). */
void dp_conv2d_forward(float *out, const float *in, const float *w, const float *b,
                       const dp_conv_dims_t *d);
void dp_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, const dp_conv_dims_t *d);
/* Which ways dp_conv2d_backward takes for d on the current instruction
 * set and DP_CONV_DIRECT (conv.c): *dw, *din 1 for the direct ones, 0 for
 * the GEMM's (the tests ask, instead of inferring it from the bits). */
void dp_conv2d_backward_ways(const dp_conv_dims_t *d, int *dw, int *din);

/* out = max(0, in); din = dout where out > 0, else 0. In place allowed. */
void dp_relu_forward(float *out, const float *in, size_t n);
void dp_relu_backward(float *din, const float *dout, const float *out, size_t n);

/* out = tanh(in); din = dout (1 - out^2). In place allowed. One version:
 * libm's tanhf is the reference (the tests check it in double and by
 * finite differences). */
void dp_tanh_forward(float *out, const float *in, size_t n);
void dp_tanh_backward(float *din, const float *dout, const float *out, size_t n);

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

/* The binary head (sigmoid): one logit a sample, z[b] = logits[b] + *bias
 * (bias NULL: no bias); probs[B,2] = (1 - sigmoid(z), sigmoid(z)), each
 * computed from the side where exp does not overflow; returns the mean of
 * the logistic loss in PyTorch's stable form (BCEWithLogitsLoss):
 * max(z, 0) - z y + log1p(exp(-|z|)), labels[b] in {0, 1}. Labels NULL:
 * probabilities only, loss 0. */
float dp_sigmoid_xent_forward(float *probs, const float *logits, const float *bias,
                              const int *labels, int B);
/* dlogits[b] = (sigmoid(z) - labels[b]) / B, the gradient of the mean loss
 * (dlogits may be NULL); *dbias = their sum (dbias may be NULL). */
void dp_sigmoid_xent_backward(float *dlogits, float *dbias, const float *probs,
                              const int *labels, int B);

/* The actor-critic loss (A3C, A2C) of a batch: logits[B,A] a softmax policy
 * pi, value[B] the critic's estimate, action[B] the actions taken, ret[B]
 * their n-step returns; the batch mean of
 *     -(ret - value) log pi(action) + vcoef (ret - value)^2 - beta H(pi)
 * with the advantage ret - value held constant in the policy term (the
 * policy-gradient estimator; Stable-Baselines3's A2C loss with vf_coef =
 * vcoef, ent_coef = beta). probs[B,A] gets pi, parts (may be NULL) the
 * three batch means unweighted; returns the total. A <= DP_AC_MAX_ACTIONS. */
#define DP_AC_MAX_ACTIONS 64
#define DP_AC_ENTROPY_DEFAULT 0.01f /* beta: --entropy's default */
#define DP_AC_VALUE_COEF 0.5f       /* vcoef, as A3C's and Stable-Baselines3's A2C */
typedef struct {
    double policy, value, entropy;
} dp_ac_parts_t;
float dp_ac_loss_forward(float *probs, const float *logits, const float *value, const int *action,
                         const float *ret, int B, int A, float beta, float vcoef, dp_ac_parts_t *parts);
/* The policy alone (acting, evaluation): probs[B,A] = softmax(logits). */
void dp_ac_policy(float *probs, const float *logits, int B, int A);
/* Its gradient: dlogits[B,A], dvalue[B] (from the logits again: log pi
 * stays finite where pi underflows). */
void dp_ac_loss_backward(float *dlogits, float *dvalue, const float *logits, const float *value,
                         const int *action, const float *ret, int B, int A, float beta, float vcoef);
/* The n-step returns of one environment's segment of T steps (A3C's
 * targets): ret[t] = reward[t] + gamma * next, next being ret[t + 1], or at
 * a step that ended its episode (end[t]): 0 when it terminated
 * (DP_AC_TERMINATED), the critic's value of the state it was cut in,
 * cut_value[t], when the time limit truncated it (DP_AC_TRUNCATED: the
 * state is not terminal, so its future is estimated, not zero); after the
 * last step, bootstrap (the critic's value of the state the segment stopped
 * in; 0 if that step ended its episode). Summed in double, backwards. */
enum { DP_AC_GOES_ON = 0, DP_AC_TERMINATED = 1, DP_AC_TRUNCATED = 2 };
void dp_ac_returns(float *ret, const float *reward, const unsigned char *end, const float *cut_value,
                   int T, float gamma, float bootstrap);
/* Global-norm clipping, as torch.nn.utils.clip_grad_norm_: g scaled by
 * max_norm / (norm + 1e-6) when its L2 norm is above max_norm (> 0).
 * Returns the norm before. */
double dp_clip_global_norm(float *g, size_t n, double max_norm);

/* Observation normalisation (the obsnorm layer, common/model.h): each of an
 * observation's F components by the running mean and variance of every
 * observation the crew trained on, as Stable-Baselines3's VecNormalize
 * does: out = clamp((in - mean) / sqrt(var + eps), -clip, clip). */
#define DP_OBS_NORM_EPS 1e-8f
#define DP_OBS_NORM_CLIP 10.0f
/* The count stops here, so the statistics keep following the observations
 * as the policy changes what it sees (each batch then weighs B / 2^20), and
 * the count stays exact in a float. */
#define DP_OBS_NORM_MAX_COUNT 1048576.0
void dp_obs_norm_forward(float *out, const float *in, const float *mean, const float *var, int B, int F);
/* (mean, var, count) merged with the B observations in (population
 * variance; count += B, at most DP_OBS_NORM_MAX_COUNT). */
void dp_obs_norm_update(float *mean, float *var, float *count, const float *in, int B, int F);

/* Batch normalization of x[B,C,HW] per channel c (PyTorch's BatchNorm1d /
 * BatchNorm2d): out = w[c] (x - mean[c]) / sqrt(var[c] + eps) + b[c].
 * Training: mean and var are the batch's (var biased: divided by B*HW), and
 * are written to mean[C], var[C] for the backward and the running
 * statistics. Evaluation: the running statistics rmean, rvar. */
void dp_bn_forward_train(float *out, float *mean, float *var, const float *in, const float *w,
                         const float *b, int B, int C, int HW, float eps);
void dp_bn_forward_eval(float *out, const float *in, const float *w, const float *b,
                        const float *rmean, const float *rvar, int B, int C, int HW, float eps);
/* Gradient of the training forward (statistics of the batch depend on in). */
void dp_bn_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                    const float *w, const float *mean, const float *var, int B, int C, int HW,
                    float eps);

/* Batch norm and the ReLU after it in one pass (a residual block's bn,
 * relu), the bits of the two ops in turn: out = max(0, bn(x)), so bn's own
 * output is never stored. The backward takes dout, the gradient wrt the
 * ReLU's output out (its mask out > 0), and gives what dp_relu_backward
 * then dp_bn_backward give. */
void dp_bn_relu_forward_train(float *out, float *mean, float *var, const float *in,
                              const float *w, const float *b, int B, int C, int HW, float eps);
void dp_bn_relu_forward_eval(float *out, const float *in, const float *w, const float *b,
                             const float *rmean, const float *rvar, int B, int C, int HW,
                             float eps);
void dp_bn_relu_backward(float *din, float *dw, float *db, const float *dout, const float *out,
                         const float *in, const float *w, const float *mean, const float *var,
                         int B, int C, int HW, float eps);

/* The running statistics after a training batch split in `groups` ghost
 * batches, group g's mean and biased variance at save + 2 C g (mean, then
 * var) over n values a channel (n_last for the last group): each group's PyTorch update
 * r' = (1 - momentum) r + momentum stat (the variance unbiased, times
 * n / (n - 1)), and the counter + 1, then the mean of those values summed in
 * group order times 1 / groups (what a sync server computes from R
 * workers' pushes; groups = 1 is PyTorch's update itself). */
void dp_bn_running_update(float *rm, float *rv, float *nbt, const float *save, long n,
                          long n_last, int groups, int C, float momentum);

/* out = a + shortcut(in) (a: [B,OC,OH,OW]); the shortcut's input gradient
 * din[B,C,H,W] = shortcut^T(dout), fully written. */
void dp_shortcut_add_forward(float *out, const float *a, const float *in,
                             const dp_shortcut_dims_t *d);
void dp_shortcut_backward(float *din, const float *dout, const dp_shortcut_dims_t *d);

/* Global average pooling: out[B,C] = mean of in[B,C,HW] over HW. */
void dp_gap_forward(float *out, const float *in, int B, int C, int HW);
void dp_gap_backward(float *din, const float *dout, int B, int C, int HW);

/* Inverted dropout of x[B,N]: element (b, i) is dropped (0) when
 * dp_dropout_keep(seed, step, sample0 + b, i, p) is 0, else scaled by
 * 1 / (1 - p). The mask is a hash of its coordinates, not a stored array:
 * the backward, a replay and another thread count recompute the same one. */
int dp_dropout_keep(unsigned long long seed, unsigned long long step, unsigned long long sample,
                    unsigned long long i, float p);
void dp_dropout_forward(float *out, const float *in, int B, size_t N, float p,
                        unsigned long long seed, unsigned long long step,
                        unsigned long long sample0);
void dp_dropout_backward(float *din, const float *dout, int B, size_t N, float p,
                         unsigned long long seed, unsigned long long step,
                         unsigned long long sample0);

/* dst[0, n) += src[0, n): gradients of a tensor read twice add. */
void dp_vec_add(float *dst, const float *src, size_t n);

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
float dp_sigmoid_xent_forward_ref(float *probs, const float *logits, const float *bias,
                                  const int *labels, int B);
void dp_sigmoid_xent_backward_ref(float *dlogits, float *dbias, const float *probs,
                                  const int *labels, int B);

void dp_bn_forward_train_ref(float *out, float *mean, float *var, const float *in,
                             const float *w, const float *b, int B, int C, int HW, float eps);
void dp_bn_forward_eval_ref(float *out, const float *in, const float *w, const float *b,
                            const float *rmean, const float *rvar, int B, int C, int HW,
                            float eps);
void dp_bn_backward_ref(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, const float *mean, const float *var, int B, int C,
                        int HW, float eps);
void dp_shortcut_add_forward_ref(float *out, const float *a, const float *in,
                                 const dp_shortcut_dims_t *d);
void dp_shortcut_backward_ref(float *din, const float *dout, const dp_shortcut_dims_t *d);
void dp_gap_forward_ref(float *out, const float *in, int B, int C, int HW);
void dp_gap_backward_ref(float *din, const float *dout, int B, int C, int HW);
void dp_dropout_forward_ref(float *out, const float *in, int B, size_t N, float p,
                            unsigned long long seed, unsigned long long step,
                            unsigned long long sample0);
void dp_dropout_backward_ref(float *din, const float *dout, int B, size_t N, float p,
                             unsigned long long seed, unsigned long long step,
                             unsigned long long sample0);

#endif
