/* bn_cudnn: the CUDA backend's batch norm on cuDNN — the training forward
 * and its backward through cudnnBatchNormalizationForwardTrainingEx /
 * BackwardEx, with the ReLU after it fused (CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
 * or the residual add and the ReLU (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
 * where cuDNN takes them for this layer, else cuDNN's batch norm and our
 * add and ReLU queued behind it.
 *
 * When cuDNN runs a training step: the ghost batch is the batch's own
 * (G == B: cuDNN's running average chains one batch, not the groups'
 * average the ghost batches need) and each channel has more than one value
 * (B * H * W > 1: the unbiased variance of one value divides by zero, where
 * the CPU reference keeps the biased one); DP_CUDA_BN=own turns it off.
 * Otherwise, and in evaluation, our own kernels (resnet_gpu.cu) run.
 *
 * Invariants:
 * - Layout NCHW, float, CUDNN_BATCHNORM_SPATIAL (one mean and variance a
 *   channel over N, H, W). SPATIAL_PERSISTENT is faster in NHWC but "may
 *   overflow for some inputs" (cuDNN's header) and is not used in NCHW.
 * - The forward leaves, per layer, what the backward needs: cuDNN's saved
 *   mean and inverse deviation (d_bn_saved), its reserve space (the ReLU's
 *   mask under BN_ACTIVATION) and the bias pointer (BN_ACTIVATION's
 *   backward reads the bias, which kernels/backend.h's bn_relu_backward
 *   does not pass; the executor's parameters never move). So a backward
 *   differentiates the layer's last training forward, as the executor
 *   runs them; d_save is filled as kernels/backend.h says all the same
 *   (mean, biased variance), and a backward that cannot use cuDNN's state
 *   runs ours from it.
 * - The running statistics: cuDNN's update, runningVar with the unbiased
 *   variance by exponentialAverageFactor = momentum, PyTorch's rule; the
 *   float rounding differs from dp_bn_running_update's (tolerance, not
 *   bits, against the CPU backend).
 * - The legacy batch-norm calls are marked deprecated in cuDNN 9 (the
 *   graph API's norm operations succeed them); they warn only under
 *   CUDNN_WARN_DEPRECATED, which this build does not set. */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cuda/conv_plan.h"

static const float s_one = 1.0f, s_zero = 0.0f;

/* The workspace and reserve space cuDNN wants for ops on L at its x
 * descriptor's batch: the status of the first query that fails. */
static cudnnStatus_t s_sizes(dp_cuda_t *cx, dp_cuda_layer_t *L, cudnnBatchNormOps_t ops,
                             size_t *ws, size_t *reserve)
{
    cudnnActivationDescriptor_t act = ops == CUDNN_BATCHNORM_OPS_BN ? NULL : cx->relu;
    cudnnTensorDescriptor_t z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION ? L->bn_x : NULL;
    size_t fw = 0, bw = 0;
    /* as PyTorch queries them: y's descriptor given, z's only with the add */
    cudnnStatus_t st = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        cx->cudnn, CUDNN_BATCHNORM_SPATIAL, ops, L->bn_x, z, L->bn_x, L->bn_p, act, &fw);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    st = cudnnGetBatchNormalizationBackwardExWorkspaceSize(cx->cudnn, CUDNN_BATCHNORM_SPATIAL, ops,
                                                           L->bn_x, L->bn_x, L->bn_x, z, L->bn_x,
                                                           L->bn_p, act, &bw);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    st = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cx->cudnn, CUDNN_BATCHNORM_SPATIAL,
                                                              ops, act, L->bn_x, reserve);
    *ws = fw > bw ? fw : bw;
    return st;
}

int dp_cuda_bn_plan(dp_cuda_t *cx, dp_cuda_layer_t *L, int max_batch, size_t *ws_need, char *err)
{
    const dp_layer_t *l = &L->layer;
    size_t ws = 0, ws_act = 0, rs = 0, rs_act = 0;
    cudnnStatus_t st;
    *ws_need = 0;
    /* one value a channel at every batch: never cuDNN's (see above) */
    if (cx->bn_own || (size_t)max_batch * l->in_h * l->in_w < 2) return 0;
    if (!cx->relu) {
        DP_CUDNN_TRY(cudnnCreateActivationDescriptor(&cx->relu));
        DP_CUDNN_TRY(cudnnSetActivationDescriptor(cx->relu, CUDNN_ACTIVATION_RELU,
                                                  CUDNN_NOT_PROPAGATE_NAN, 0.0));
    }
    DP_CUDNN_TRY(cudnnCreateTensorDescriptor(&L->bn_x));
    DP_CUDNN_TRY(cudnnCreateTensorDescriptor(&L->bn_p));
    DP_CUDNN_TRY(cudnnSetTensor4dDescriptor(L->bn_x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                            max_batch, l->in_c, l->in_h, l->in_w));
    DP_CUDNN_TRY(cudnnDeriveBNTensorDescriptor(L->bn_p, L->bn_x, CUDNN_BATCHNORM_SPATIAL));
    if ((st = s_sizes(cx, L, CUDNN_BATCHNORM_OPS_BN, &ws, &rs)) != CUDNN_STATUS_SUCCESS) {
        /* a shape cuDNN's batch norm refuses: ours runs it (no bn_x) */
        dp_log_info("%s: %s: cuDNN's batch norm refuses this shape (%s): ours", cx->name,
                    l->name, cudnnGetErrorString(st));
        dp_cuda_bn_free(L);
        return 0;
    }
    /* the fused ReLU (and add) where cuDNN says it takes them (its kernels
     * for them have wanted NHWC and half precision); else ours after
     * cuDNN's batch norm */
    for (int k = 0; k < 2; k++) {
        cudnnBatchNormOps_t want = k ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                     : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
        size_t w = 0, r = 0;
        if (s_sizes(cx, L, want, &w, &r) != CUDNN_STATUS_SUCCESS) want = CUDNN_BATCHNORM_OPS_BN;
        *(k ? &L->bn_add_ops : &L->bn_relu_ops) = want;
        if (want == CUDNN_BATCHNORM_OPS_BN) continue;
        if (w > ws_act) ws_act = w;
        if (r > rs_act) rs_act = r;
    }
    dp_log_debug("%s: %s: cuDNN batch norm, relu %s, add + relu %s", cx->name, l->name,
                 L->bn_relu_ops == CUDNN_BATCHNORM_OPS_BN ? "ours after it" : "fused",
                 L->bn_add_ops == CUDNN_BATCHNORM_OPS_BN ? "ours after it" : "fused");
    L->bn_reserve_bytes = rs > rs_act ? rs : rs_act;
    if (L->bn_reserve_bytes) DP_CUDA_TRY(cudaMalloc(&L->d_bn_reserve, L->bn_reserve_bytes));
    DP_CUDA_TRY(cudaMalloc((void **)&L->d_bn_saved, (size_t)2 * l->in_c * sizeof(float)));
    *ws_need = ws > ws_act ? ws : ws_act;
    return 0;
fail:
    return -1;
}

void dp_cuda_bn_free(dp_cuda_layer_t *L)
{
    if (L->bn_x) cudnnDestroyTensorDescriptor(L->bn_x);
    if (L->bn_p) cudnnDestroyTensorDescriptor(L->bn_p);
    if (L->d_bn_reserve) cudaFree(L->d_bn_reserve);
    if (L->d_bn_saved) cudaFree(L->d_bn_saved);
    L->bn_x = L->bn_p = NULL;
    L->d_bn_reserve = NULL;
    L->d_bn_saved = NULL;
    L->bn_fwd = 0;
}

/* The x descriptor at batch B (host-side: no device work). */
static void s_batch(dp_cuda_layer_t *L, int B)
{
    const dp_layer_t *l = &L->layer;
    DP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(L->bn_x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B,
                                              l->in_c, l->in_h, l->in_w));
}

static cudnnStatus_t s_forward(dp_cuda_t *cx, dp_cuda_layer_t *L, cudnnBatchNormOps_t ops,
                               float *d_out, const float *d_in, const float *d_z,
                               const float *d_w, const float *d_b, float *d_rm, float *d_rv)
{
    const dp_layer_t *l = &L->layer;
    int add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    return cudnnBatchNormalizationForwardTrainingEx(
        cx->cudnn, CUDNN_BATCHNORM_SPATIAL, ops, &s_one, &s_zero, L->bn_x, d_in,
        add ? L->bn_x : NULL, add ? d_z : NULL, L->bn_x, d_out, L->bn_p, d_w, d_b,
        (double)l->momentum, d_rm, d_rv, (double)l->eps, L->d_bn_saved,
        L->d_bn_saved + l->in_c, ops == CUDNN_BATCHNORM_OPS_BN ? NULL : cx->relu, cx->d_ws,
        cx->ws_bytes, L->d_bn_reserve, L->bn_reserve_bytes);
}

int dp_cuda_bn_forward_train(dp_cuda_t *cx, dp_cuda_layer_t *L, int B, int G, int relu,
                             float *d_out, const float *d_in, const float *d_z, const float *d_w,
                             const float *d_b, float *d_rm, float *d_rv, float *d_nbt,
                             float *d_save)
{
    const dp_layer_t *l = &L->layer;
    int C = l->in_c;
    size_t n = (size_t)B * C * l->in_h * l->in_w;
    L->bn_fwd = 0;
    if (cx->bn_own || !L->bn_x || G != B || B < 1 || n / (size_t)C < 2) return -1;
    cudnnBatchNormOps_t *pick = d_z ? &L->bn_add_ops : &L->bn_relu_ops;
    cudnnBatchNormOps_t ops = relu ? *pick : CUDNN_BATCHNORM_OPS_BN;
    s_batch(L, B);
    cudnnStatus_t st = s_forward(cx, L, ops, d_out, d_in, d_z, d_w, d_b, d_rm, d_rv);
    if (st == CUDNN_STATUS_NOT_SUPPORTED && ops != CUDNN_BATCHNORM_OPS_BN) {
        /* the size queries took it, the call does not: ours from now on */
        dp_log_info("%s: %s: cuDNN's fused batch norm + %srelu not supported here (%s); its "
                    "batch norm, then ours", cx->name, l->name, d_z ? "add + " : "",
                    cudnnGetErrorString(st));
        *pick = ops = CUDNN_BATCHNORM_OPS_BN;
        st = s_forward(cx, L, ops, d_out, d_in, d_z, d_w, d_b, d_rm, d_rv);
    }
    if (st != CUDNN_STATUS_SUCCESS)
        dp_cuda_fatal(__FILE__, __LINE__, "cudnnBatchNormalizationForwardTrainingEx",
                      cudnnGetErrorString(st));
    if (relu && ops == CUDNN_BATCHNORM_OPS_BN) {
        if (d_z) dp_vec_add_gpu(d_out, d_z, n, cx->stream);
        dp_relu_forward_gpu(d_out, d_out, n, cx->stream);
    }
    dp_bn_cudnn_saved_gpu(d_save, d_nbt, L->d_bn_saved, C, l->eps, cx->stream);
    L->bn_fwd = 1 + (int)ops;
    L->bn_bias = d_b;
    return 0;
}

int dp_cuda_bn_backward(dp_cuda_t *cx, dp_cuda_layer_t *L, int B, int relu, float *d_din,
                        float *d_dz, float *d_dw, float *d_db, const float *d_dout,
                        const float *d_out, const float *d_in, const float *d_w)
{
    const dp_layer_t *l = &L->layer;
    size_t n = (size_t)B * l->in_c * l->in_h * l->in_w;
    if (!L->bn_fwd || !d_din) return -1;
    cudnnBatchNormOps_t ops = (cudnnBatchNormOps_t)(L->bn_fwd - 1);
    int act = ops != CUDNN_BATCHNORM_OPS_BN, add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    if ((act && !relu) || (act && add != (d_dz != NULL)))
        return -1; /* not the forward's op: ours */
    const float *dy = d_dout;
    if (relu && !act) { /* our relu's (and add's) backward first */
        dp_relu_backward_gpu(cx->d_bn_dy, d_dout, d_out, n, cx->stream);
        dy = cx->d_bn_dy;
        if (d_dz)
            DP_CUDA_CHECK(cudaMemcpyAsync(d_dz, dy, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                          cx->stream));
    }
    s_batch(L, B);
    DP_CUDNN_CHECK(cudnnBatchNormalizationBackwardEx(
        cx->cudnn, CUDNN_BATCHNORM_SPATIAL, ops, &s_one, &s_zero, &s_one, &s_zero, L->bn_x, d_in,
        act ? L->bn_x : NULL, act ? d_out : NULL, L->bn_x, dy, add ? L->bn_x : NULL,
        add ? d_dz : NULL, L->bn_x, d_din, L->bn_p, d_w, act ? L->bn_bias : NULL, d_dw, d_db,
        (double)l->eps, L->d_bn_saved, L->d_bn_saved + l->in_c, act ? cx->relu : NULL,
        cx->d_ws, cx->ws_bytes, L->d_bn_reserve, L->bn_reserve_bytes));
    return 0;
}
