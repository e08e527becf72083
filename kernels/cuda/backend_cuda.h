/* backend_cuda.h: private header of the CUDA backend, shared by the C backend
 * (backend_cuda.c: cuDNN, cuBLAS, memory, planning) and our own kernels
 * (ops_gpu.cu). Nothing outside kernels/cuda includes it.
 *
 * Dimensions, as in kernels/ops.h: B = batch, C = channels, H, W = input height
 * and width, OC = output channels, K = kernel, OH, OW = output height and
 * width, S = positions per channel (OH * OW for a conv output, 1 for fc),
 * IN / OUT = fc features. NCHW float32; pointers named d_* live on the GPU.
 *
 * The _gpu kernels take the CPU kernels' parameters in the same order
 * (outputs first) plus the stream they are queued on; they are asynchronous
 * and check the launch with cudaGetLastError(). Gradients are written, never
 * accumulated.
 *
 * Error checks: DP_CUDA_CHECK / DP_CUDNN_CHECK / DP_CUBLAS_CHECK (one shape,
 * DP_STATUS_CHECK) print file:line, the call and the library's error
 * string, then abort: they guard
 * ops that cannot return an error (a failing kernel leaves the CUDA context
 * unusable anyway). Fallible setup paths use the *_TRY twins, which fill err
 * and jump to the function's `fail:` label. */
#ifndef DP_BACKEND_CUDA_H
#define DP_BACKEND_CUDA_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "kernels/ops.h"
#include "kernels/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Prints "<where>: file:line: call: what" to stderr and aborts. */
void dp_cuda_fatal(const char *file, int line, const char *call, const char *what)
    __attribute__((noreturn));

/* The one shape of every status check: a call returning a status of `type`
 * that is `ok` on success and described by what(status); `text` is the call
 * as written (stringized by the caller, before any macro expansion). */
#define DP_STATUS_CHECK(type, ok, what, call, text)                            \
    do {                                                                       \
        type dp_s_ = (call);                                                   \
        if (dp_s_ != (ok)) dp_cuda_fatal(__FILE__, __LINE__, text, what(dp_s_)); \
    } while (0)

#define DP_CUDA_CHECK(call) DP_STATUS_CHECK(cudaError_t, cudaSuccess, cudaGetErrorString, call, #call)

/* After every kernel launch: launch errors now, not at the next sync. */
#define DP_CUDA_LAUNCHED() DP_CUDA_CHECK(cudaGetLastError())

/* ---- our own kernels (ops_gpu.cu) ------------------------------------- */

/* d_out = max(0, d_in); in place allowed. */
void dp_relu_forward_gpu(float *d_out, const float *d_in, size_t n, cudaStream_t st);
/* d_din = d_dout where d_out > 0, else 0; in place (d_din == d_dout) allowed. */
void dp_relu_backward_gpu(float *d_din, const float *d_dout, const float *d_out, size_t n,
                          cudaStream_t st);

/* d_out = tanh(d_in); d_din = d_dout (1 - d_out^2). */
void dp_tanh_forward_gpu(float *d_out, const float *d_in, size_t n, cudaStream_t st);
void dp_tanh_backward_gpu(float *d_din, const float *d_dout, const float *d_out, size_t n,
                          cudaStream_t st);

/* Max over each K x K window moved by stride; no padding. */
void dp_maxpool_forward_gpu(float *d_out, const float *d_in, const dp_pool_dims_t *d,
                            cudaStream_t st);
/* d_din[B,C,H,W] fully written: each window's gradient goes to the FIRST
 * element (row-major) of the window equal to its max, as the CPU reference
 * does; zeros elsewhere. One thread per input element gathers from the
 * windows covering it, so overlapping windows need no atomics and the result
 * is deterministic. */
void dp_maxpool_backward_gpu(float *d_din, const float *d_dout, const float *d_in,
                             const float *d_out, const dp_pool_dims_t *d, cudaStream_t st);

/* d_out[B,C,S] = d_b[C] broadcast (before a GEMM / conv with beta = 1). */
void dp_bias_fill_gpu(float *d_out, const float *d_b, int B, int C, int S, cudaStream_t st);
/* d_db[C] = sum over b, s of d_dout[B,C,S]; deterministic (fixed tree). */
void dp_bias_backward_gpu(float *d_db, const float *d_dout, int B, int C, int S,
                          cudaStream_t st);

/* d_probs[B,classes] = softmax(d_logits); *d_loss = mean cross-entropy
 * (one float on the device, summed in a fixed order). Labels outside
 * [0, classes) make the loss NaN rather than read out of bounds. */
void dp_softmax_xent_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                                 const int *d_labels, int B, int classes, cudaStream_t st);
/* d_dlogits = (d_probs - onehot(d_labels)) / B. */
void dp_softmax_xent_backward_gpu(float *d_dlogits, const float *d_probs, const int *d_labels,
                                  int B, int classes, cudaStream_t st);
/* The binary head (kernels/ops.h dp_sigmoid_xent_forward, backward): one
 * block, the loss summed in a fixed order; d_bias / d_dbias NULL: none,
 * d_dlogits NULL: only the bias's gradient. A label other than 0 or 1
 * makes the loss NaN. */
void dp_sigmoid_xent_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                                 const float *d_bias, const int *d_labels, int B,
                                 cudaStream_t st);
void dp_sigmoid_xent_backward_gpu(float *d_dlogits, float *d_dbias, const float *d_probs,
                                  const int *d_labels, int B, cudaStream_t st);

/* The actor-critic head (kernels/ops.h dp_ac_loss_forward, backward), in
 * double per row as there; the loss summed in a fixed order. d_action
 * NULL: the policy alone, *d_loss untouched. An action out of range makes
 * the loss NaN rather than read out of bounds. */
void dp_ac_loss_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                            const float *d_value, const int *d_action, const float *d_ret, int B,
                            int A, float beta, float vcoef, cudaStream_t st);
void dp_ac_loss_backward_gpu(float *d_dlogits, float *d_dvalue, const float *d_logits,
                             const float *d_value, const int *d_action, const float *d_ret, int B,
                             int A, float beta, float vcoef, cudaStream_t st);

/* dp_optim_step (kernels/optim.h) on device memory, for every optimizer. */
void dp_optim_step_gpu(const dp_optim_conf_t *c, float lr, float *d_w, const float *d_g,
                       float *d_state, size_t n, long t, cudaStream_t st);

/* ---- the residual networks' layers (resnet_gpu.cu) --------------------- */

/* Batch norm of x[B,C,HW] in training by ghost batches of G samples (the
 * last may be shorter): each group's mean and biased variance into d_save
 * (2 C floats a group, mean then variance), then out normalised by them.
 * kernels/ops.h's dp_bn_forward_train per group. */
void dp_bn_forward_train_gpu(float *d_out, float *d_save, const float *d_in, const float *d_w,
                             const float *d_b, int B, int G, int C, int HW, float eps,
                             cudaStream_t st);
/* Evaluation: normalised by the running statistics; relu: then the ReLU,
 * in the same pass (the fused bn_relu op's evaluation). */
void dp_bn_forward_eval_gpu(float *d_out, const float *d_in, const float *d_w, const float *d_b,
                            const float *d_rm, const float *d_rv, int B, int C, int HW, float eps,
                            int relu, cudaStream_t st);
/* After cuDNN's training forward (bn_cudnn.c): d_saved's mean and inverse
 * deviation [2C] as d_save's mean and biased variance, and *d_nbt += 1. */
void dp_bn_cudnn_saved_gpu(float *d_save, float *d_nbt, const float *d_saved, int C, float eps,
                           cudaStream_t st);
/* dp_bn_running_update (kernels/ops.h) on the device, the same float
 * expression. */
void dp_bn_running_update_gpu(float *d_rm, float *d_rv, float *d_nbt, const float *d_save,
                              long n, long n_last, int groups, int C, float momentum,
                              cudaStream_t st);
/* The backward of the training forward, group by group: d_dw, d_db the
 * groups' sums added in group order; d_din may be NULL. d_sums: scratch of
 * 2 C groups doubles. */
void dp_bn_backward_gpu(float *d_din, float *d_dw, float *d_db, const float *d_dout,
                        const float *d_in, const float *d_w, const float *d_save, double *d_sums,
                        int B, int G, int C, int HW, float eps, cudaStream_t st);
/* out = a + shortcut(in); din = shortcut^T(dout), fully written. */
void dp_shortcut_add_forward_gpu(float *d_out, const float *d_a, const float *d_in,
                                 const dp_shortcut_dims_t *d, cudaStream_t st);
void dp_shortcut_backward_gpu(float *d_din, const float *d_dout, const dp_shortcut_dims_t *d,
                              cudaStream_t st);
/* Global average pooling and its gradient. */
void dp_gap_forward_gpu(float *d_out, const float *d_in, int B, int C, int HW, cudaStream_t st);
void dp_gap_backward_gpu(float *d_din, const float *d_dout, int B, int C, int HW,
                         cudaStream_t st);
/* Inverted dropout of x[B,N] by kernels/dropout_mask.h's mask (the
 * backward: the same call on the gradient). */
void dp_dropout_gpu(float *d_out, const float *d_in, int B, size_t N, float p,
                    unsigned long long seed, unsigned long long step, unsigned long long sample0,
                    cudaStream_t st);
/* d_dst[0, n) += d_src[0, n). */
void dp_vec_add_gpu(float *d_dst, const float *d_src, size_t n, cudaStream_t st);
/* The obsnorm layer (obs_norm_gpu.cu): dp_obs_norm_forward, then with
 * train dp_obs_norm_update, in place, the same bits. */
void dp_obs_norm_gpu(float *d_out, const float *d_in, float *d_mean, float *d_var,
                     float *d_count, int B, int F, int train, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
