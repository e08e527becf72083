/* backend_cuda: the "cuda:K" backend (kernels/backend.h) for one GPU —
 * convolutions on cuDNN, fully connected layers on cuBLAS, everything else
 * on our own kernels (ops_gpu.cu); the conv layers' cuDNN plans are
 * conv_plan.c's.
 *
 * Invariants:
 * - Every op is queued on one compute stream (cx->stream, non-blocking) in
 *   call order, so ops see each other's results without events. download()
 *   synchronises that stream; upload() returns once the source buffer may
 *   be reused (see s_upload).
 * - Two copy streams let transfers overlap compute: cx->up carries
 *   stage_upload's batches (called from the batcher's prefetch thread, so
 *   the next batch crosses while this one computes), cx->down carries
 *   download_async's gradient copies, each ordered after the ops queued
 *   before it by an event, so layer L's gradient travels while the layers
 *   below it run backward; a mark after each copy lets the host wait for
 *   the first n (download_wait_first) and send them on. upload_async
 *   queues on the compute stream itself, in order with the ops.
 * - FP32 math by default: cuDNN convolutions run with CUDNN_FMA_MATH and
 *   cuBLAS with CUBLAS_DEFAULT_MATH (no TF32), so results match the CPU
 *   reference to float rounding. DP_CUDA_TF32=1 allows TF32 tensor cores in
 *   both. Convolution algorithms are "exact" (deterministic, no FFT or
 *   Winograd: see s_pick) unless DP_CUDA_ALGOS=fastest takes cuDNN's
 *   first choice.
 * - Errors: open and prepare fill err and return -1; ops cannot return an
 *   error, so a failing CUDA / cuDNN / cuBLAS call prints file:line, the call
 *   and the library's message, and aborts. Misuse (an op on a layer prepare
 *   never saw) aborts the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/env.h"
#include "kernels/cuda/conv_plan.h"

/* ---- error checks ----------------------------------------------------- */

void dp_cuda_fatal(const char *file, int line, const char *call, const char *what)
{
    fprintf(stderr, "cuda backend: %s:%d: %s: %s\n", file, line, call, what);
    fflush(stderr);
    abort();
}

static dp_cuda_t *s_cx(dp_backend_t *be) { return (dp_cuda_t *)be->impl; }

/* Every entry point: the calling thread may not be the one that opened the
 * backend, and cudaSetDevice is per thread. */
static dp_cuda_t *s_enter(dp_backend_t *be)
{
    dp_cuda_t *cx = s_cx(be);
    DP_CUDA_CHECK(cudaSetDevice(cx->dev));
    return cx;
}

static int s_prepare(dp_backend_t *be, const dp_model_t *m, int max_batch, char *err)
{
    return dp_cuda_plan_prepare(s_enter(be), m, max_batch, err);
}

/* ---- memory ------------------------------------------------------------- */

static void *s_alloc(dp_backend_t *be, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError(); /* clear it, so the query below can answer */
        cudaMemGetInfo(&free_b, &total_b);
        fprintf(stderr, "cuda backend: %s: out of GPU memory allocating %zu bytes (%s; %zu of "
                "%zu MiB free)\n", cx->name, bytes, cudaGetErrorString(e), free_b >> 20,
                total_b >> 20);
        abort();
    }
    /* zeroed on our stream, and done before anyone can use it */
    DP_CUDA_CHECK(cudaMemsetAsync(d, 0, bytes, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    return d;
}

static void s_release(dp_backend_t *be, void *d)
{
    dp_cuda_t *cx;
    if (!d) return;
    cx = s_enter(be);
    /* no queued op or copy still uses it */
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->down));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->up));
    DP_CUDA_CHECK(cudaFree(d));
}

/* Ordered after every op queued before, before every op queued after. A
 * pageable source is staged by the runtime before cudaMemcpyAsync returns;
 * a pinned one is read later by the DMA engine, so then we wait for the copy:
 * either way the caller may reuse src on return, as with the CPU backend. */
static void s_upload(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    struct cudaPointerAttributes attr;
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
    DP_CUDA_CHECK(cudaPointerGetAttributes(&attr, src));
    if (attr.type != cudaMemoryTypeUnregistered)
        DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

/* Waits for every op queued before it, then copies. */
static void s_download(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

/* On cx->up, beside the compute stream; waits for its own copy only. */
static void s_stage_upload(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->up));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->up));
}

/* The event marks how far the compute stream was queued: the copy waits for
 * that, not for ops queued later. */
static void s_download_async(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaEventRecord(cx->queued, cx->stream));
    DP_CUDA_CHECK(cudaStreamWaitEvent(cx->down, cx->queued, 0));
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->down));
    DP_CUDA_CHECK(cudaEventRecord(cx->copied[cx->n_copies++ % DP_CUDA_COPY_MARKS], cx->down));
}

static void s_download_wait(dp_backend_t *be)
{
    dp_cuda_t *cx = s_enter(be);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->down));
    cx->n_copies = 0;
}

static void s_download_wait_first(dp_backend_t *be, unsigned n)
{
    dp_cuda_t *cx = s_enter(be);
    if (n > cx->n_copies) n = cx->n_copies;
    if (n) DP_CUDA_CHECK(cudaEventSynchronize(cx->copied[(n - 1) % DP_CUDA_COPY_MARKS]));
}

/* In order with the ops on the compute stream; the DMA engine reads the
 * pinned src later, so it must hold still until the stream drains. */
static void s_upload_async(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (bytes) DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
}

/* A device region's memory (another process's allocation, mapped by CUDA
 * IPC, on this GPU or on another by peer access) to or from ours, in order
 * with the ops on the compute stream. cudaMemcpyDefault: with unified
 * addressing the runtime knows each side's device, so one call is the
 * copy within a device and the peer copy between two (cudaMemcpyPeerAsync's,
 * without naming the devices; staged through the host where peer access
 * is off). Both sides must hold still until the stream drains. */
static void s_copy_peer(dp_backend_t *be, void *dst, const void *src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (bytes) DP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cx->stream));
}

/* On cx->side, beside the compute stream, waited for alone: the
 * communication thread's copies (kernels/backend.h). */
static void s_copy_side(dp_backend_t *be, void *dst, const void *src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cx->side));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->side));
}

static void s_enter_op(dp_backend_t *be)
{
    s_enter(be);
}

static void *s_host_alloc(dp_backend_t *be, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        fprintf(stderr, "cuda backend: %s: cudaMallocHost of %zu bytes: %s\n", cx->name, bytes,
                cudaGetErrorString(e));
        abort();
    }
    memset(p, 0, bytes);
    return p;
}

static void s_host_release(dp_backend_t *be, void *p)
{
    if (!p) return;
    s_enter(be);
    DP_CUDA_CHECK(cudaFreeHost(p));
}

/* A read-only mapping can be registered only with cudaHostRegisterReadOnly
 * (CUDA 11.1 on, where the device says it supports it); without the flag
 * the driver would want write access to the pages. Portable: every device
 * of the process copies from it by DMA. */
static int s_host_register(dp_backend_t *be, void *p, size_t bytes, int read_only, char *err)
{
    dp_cuda_t *cx = s_enter(be);
    unsigned flags = cudaHostRegisterPortable;
    if (read_only) {
        int ro = 0;
        cudaError_t e = cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, cx->dev);
        if (e != cudaSuccess || !ro) {
            cudaGetLastError();
            return dp_err(err, "%s: cannot page-lock a read-only mapping (cudaHostRegisterReadOnly "
                          "not supported here)", cx->name);
        }
        flags |= cudaHostRegisterReadOnly;
    }
    cudaError_t e = cudaHostRegister(p, bytes, flags);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the copies go on from pageable memory */
        return dp_err(err, "%s: cudaHostRegister of %zu bytes%s: %s", cx->name, bytes,
                      read_only ? " (read-only)" : "", cudaGetErrorString(e));
    }
    return 0;
}

/* Memory never registered (its registration failed): nothing to undo. */
static void s_host_unregister(dp_backend_t *be, void *p)
{
    dp_cuda_t *cx = s_enter(be);
    /* no queued copy may still read or write the pages */
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->up));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->side));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->down));
    cudaError_t e = cudaHostUnregister(p);
    if (e == cudaErrorHostMemoryNotRegistered) { /* its registration failed: nothing to undo */
        cudaGetLastError();
        return;
    }
    DP_CUDA_CHECK(e);
}

static void s_synchronize(dp_backend_t *be)
{
    dp_cuda_t *cx = s_enter(be);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

/* ---- layer ops ---------------------------------------------------------- */

static const float s_one = 1.0f, s_zero = 0.0f;

static void s_conv_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                           const float *d_in, const float *d_w, const float *d_b)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer_t *L = dp_cuda_layer(cx, l, DP_LAYER_CONV);
    dp_cuda_conv_plan_t *P = dp_cuda_conv_plan(cx, L, B);
    /* out = b broadcast, then out = conv + 1 * out: the bias costs no extra pass. */
    if (d_b) dp_bias_fill_gpu(d_out, d_b, B, l->out_c, l->out_h * l->out_w, cx->stream);
    DP_CUDNN_CHECK(cudnnConvolutionForward(cx->cudnn, &s_one, P->x, d_in, L->w, d_w, L->conv,
                                           P->fwd, cx->d_ws, cx->ws_bytes,
                                           d_b ? &s_one : &s_zero, P->y, d_out));
}

static void s_conv_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                            float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                            const float *d_w)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer_t *L = dp_cuda_layer(cx, l, DP_LAYER_CONV);
    dp_cuda_conv_plan_t *P = dp_cuda_conv_plan(cx, L, B);
    /* beta = 0 everywhere: gradients are written, not accumulated. */
    if (d_db)
        DP_CUDNN_CHECK(cudnnConvolutionBackwardBias(cx->cudnn, &s_one, P->y, d_dout, &s_zero,
                                                    L->bias, d_db));
    DP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cx->cudnn, &s_one, P->x, d_in, P->y, d_dout,
                                                  L->conv, P->bwd_filter, cx->d_ws,
                                                  cx->ws_bytes, &s_zero, L->w, d_dw));
    if (d_din)
        DP_CUDNN_CHECK(cudnnConvolutionBackwardData(cx->cudnn, &s_one, L->w, d_w, P->y, d_dout,
                                                    L->conv, P->bwd_data, cx->d_ws,
                                                    cx->ws_bytes, &s_zero, P->x, d_din));
}

static void s_relu_forward(dp_backend_t *be, size_t n, float *d_out, const float *d_in)
{
    dp_cuda_t *cx = s_enter(be);
    dp_relu_forward_gpu(d_out, d_in, n, cx->stream);
}

static void s_relu_backward(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                            const float *d_out)
{
    dp_cuda_t *cx = s_enter(be);
    dp_relu_backward_gpu(d_din, d_dout, d_out, n, cx->stream);
}

static void s_tanh_forward(dp_backend_t *be, size_t n, float *d_out, const float *d_in)
{
    dp_cuda_t *cx = s_enter(be);
    dp_tanh_forward_gpu(d_out, d_in, n, cx->stream);
}

static void s_tanh_backward(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                            const float *d_out)
{
    dp_cuda_t *cx = s_enter(be);
    dp_tanh_backward_gpu(d_din, d_dout, d_out, n, cx->stream);
}

static void s_maxpool_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                              const float *d_in)
{
    dp_cuda_t *cx = s_enter(be);
    dp_pool_dims_t d;
    dp_cuda_layer(cx, l, DP_LAYER_MAXPOOL);
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_forward_gpu(d_out, d_in, &d, cx->stream);
}

static void s_maxpool_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                               const float *d_dout, const float *d_in, const float *d_out)
{
    dp_cuda_t *cx = s_enter(be);
    dp_pool_dims_t d;
    dp_cuda_layer(cx, l, DP_LAYER_MAXPOOL);
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_backward_gpu(d_din, d_dout, d_in, d_out, &d, cx->stream);
}

/* cuBLAS is column-major: a row-major [R,C] matrix is a column-major [C,R]
 * one with leading dimension C, i.e. its transpose. So each row-major
 * product below is computed as its transpose. */
static void s_fc_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                         const float *d_in, const float *d_w, const float *d_b)
{
    dp_cuda_t *cx = s_enter(be);
    int IN = l->in_c * l->in_h * l->in_w, OUT = l->out_c;
    if (B < 1) return;
    if (d_b) dp_bias_fill_gpu(d_out, d_b, B, OUT, 1, cx->stream);
    /* out[B,OUT] = in[B,IN] w[OUT,IN]^T  <=>  out^T[OUT,B] = w[OUT,IN] in^T[IN,B]:
     * w is stored as col-major [IN,OUT] (so op T), in as col-major [IN,B]. */
    DP_CUBLAS_CHECK(cublasSgemm(cx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OUT, B, IN, &s_one, d_w, IN,
                                d_in, IN, d_b ? &s_one : &s_zero, d_out, OUT));
}

static void s_fc_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w)
{
    dp_cuda_t *cx = s_enter(be);
    int IN = l->in_c * l->in_h * l->in_w, OUT = l->out_c;
    if (d_db) dp_bias_backward_gpu(d_db, d_dout, B, OUT, 1, cx->stream);
    /* dw[OUT,IN] = dout^T[OUT,B] in[B,IN]  <=>  dw^T[IN,OUT] = in^T[IN,B] dout[B,OUT]:
     * in is col-major [IN,B], dout col-major [OUT,B] (so op T). */
    DP_CUBLAS_CHECK(cublasSgemm(cx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, IN, OUT, B, &s_one, d_in,
                                IN, d_dout, OUT, &s_zero, d_dw, IN));
    /* din[B,IN] = dout[B,OUT] w[OUT,IN]  <=>  din^T[IN,B] = w^T[IN,OUT] dout^T[OUT,B]. */
    if (d_din)
        DP_CUBLAS_CHECK(cublasSgemm(cx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, IN, B, OUT, &s_one,
                                    d_w, IN, d_dout, OUT, &s_zero, d_din, IN));
}

static void s_softmax_xent_forward(dp_backend_t *be, int B, int classes, float *d_probs,
                                   float *d_loss, const float *d_logits, const int *d_labels)
{
    dp_cuda_t *cx = s_enter(be);
    dp_softmax_xent_forward_gpu(d_probs, d_loss, d_logits, d_labels, B, classes, cx->stream);
}

static void s_softmax_xent_backward(dp_backend_t *be, int B, int classes, float *d_dlogits,
                                    const float *d_probs, const int *d_labels)
{
    dp_cuda_t *cx = s_enter(be);
    dp_softmax_xent_backward_gpu(d_dlogits, d_probs, d_labels, B, classes, cx->stream);
}

static void s_obs_norm_forward(dp_backend_t *be, const dp_layer_t *l, int B, int train, float *d_out,
                               const float *d_in, float *d_mean, float *d_var, float *d_count)
{
    dp_cuda_t *cx = s_cx(be);
    dp_obs_norm_gpu(d_out, d_in, d_mean, d_var, d_count, B, (int)dp_layer_out_size(l), train,
                    cx->stream);
}

static void s_sigmoid_xent_forward(dp_backend_t *be, int B, float *d_probs, float *d_loss,
                                   const float *d_logits, const float *d_bias,
                                   const int *d_labels)
{
    dp_cuda_t *cx = s_enter(be);
    dp_sigmoid_xent_forward_gpu(d_probs, d_loss, d_logits, d_bias, d_labels, B, cx->stream);
}

static void s_sigmoid_xent_backward(dp_backend_t *be, int B, float *d_dlogits, float *d_dbias,
                                    const float *d_probs, const int *d_labels)
{
    dp_cuda_t *cx = s_enter(be);
    dp_sigmoid_xent_backward_gpu(d_dlogits, d_dbias, d_probs, d_labels, B, cx->stream);
}

static void s_ac_loss_forward(dp_backend_t *be, int B, int A, float beta, float vcoef,
                              float *d_probs, float *d_loss, const float *d_logits,
                              const float *d_value, const int *d_action, const float *d_ret)
{
    dp_cuda_t *cx = s_enter(be);
    dp_ac_loss_forward_gpu(d_probs, d_loss, d_logits, d_value, d_action, d_ret, B, A, beta, vcoef,
                           cx->stream);
}

static void s_ac_loss_backward(dp_backend_t *be, int B, int A, float beta, float vcoef,
                               float *d_dlogits, float *d_dvalue, const float *d_logits,
                               const float *d_value, const int *d_action, const float *d_ret)
{
    dp_cuda_t *cx = s_enter(be);
    dp_ac_loss_backward_gpu(d_dlogits, d_dvalue, d_logits, d_value, d_action, d_ret, B, A, beta,
                            vcoef, cx->stream);
}

/* The residual networks' layers (resnet_gpu.cu), their semantics those of
 * the CPU backend's (kernels/backend.h). Batch norm's training step goes
 * through cuDNN where bn_cudnn.c takes it (the batch's own statistics,
 * more than one value a channel), else through ours; with relu (the
 * bn_relu ops) the ReLU after it is fused: cuDNN's BN_ACTIVATION, or the
 * ReLU queued right behind the batch norm, its output never stored apart. */

/* relu: the relu after it; d_z (with relu): added before the relu. */
static void s_bn_run(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train, int relu,
                     float *d_out, const float *d_in, const float *d_z, const float *d_w,
                     const float *d_b, float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    dp_cuda_t *cx = s_enter(be);
    int C = l->in_c, HW = l->in_h * l->in_w;
    dp_cuda_layer_t *L = dp_cuda_layer(cx, l, DP_LAYER_BN);
    size_t n = (size_t)B * C * HW;
    if (!train && !d_z) { /* one pass, the relu in it */
        dp_bn_forward_eval_gpu(d_out, d_in, d_w, d_b, d_rm, d_rv, B, C, HW, l->eps, relu,
                               cx->stream);
        return;
    }
    if (!train) { /* with the add between */
        dp_bn_forward_eval_gpu(d_out, d_in, d_w, d_b, d_rm, d_rv, B, C, HW, l->eps, 0,
                               cx->stream);
        dp_vec_add_gpu(d_out, d_z, n, cx->stream);
        dp_relu_forward_gpu(d_out, d_out, n, cx->stream);
        return;
    }
    if (G < 1 || G > B) G = B;
    if (dp_cuda_bn_forward_train(cx, L, B, G, relu, d_out, d_in, d_z, d_w, d_b, d_rm, d_rv,
                                 d_nbt, d_save) == 0)
        return;
    int groups = (B + G - 1) / G;
    long last = B - (long)(groups - 1) * G;
    dp_bn_forward_train_gpu(d_out, d_save, d_in, d_w, d_b, B, G, C, HW, l->eps, cx->stream);
    dp_bn_running_update_gpu(d_rm, d_rv, d_nbt, d_save, (long)G * HW, last * HW, groups, C,
                             l->momentum, cx->stream);
    if (relu && d_z) dp_vec_add_gpu(d_out, d_z, n, cx->stream);
    if (relu) dp_relu_forward_gpu(d_out, d_out, n, cx->stream);
}

static void s_bn_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                         float *d_out, const float *d_in, const float *d_w, const float *d_b,
                         float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    s_bn_run(be, l, B, G, train, 0, d_out, d_in, NULL, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
}

static void s_bn_relu_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                              float *d_out, const float *d_in, const float *d_w, const float *d_b,
                              float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    s_bn_run(be, l, B, G, train, 1, d_out, d_in, NULL, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
}

static void s_bn_add_relu_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                                  float *d_out, const float *d_in, const float *d_z,
                                  const float *d_w, const float *d_b, float *d_rm, float *d_rv,
                                  float *d_nbt, float *d_save)
{
    s_bn_run(be, l, B, G, train, 1, d_out, d_in, d_z, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
}

/* d_out: the fused relu's output (its mask), NULL without one; d_dz (with
 * it): the gradient of what was added before the relu, NULL: none. */
static void s_bn_back(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                      float *d_dz, float *d_dw, float *d_db, const float *d_dout,
                      const float *d_out, const float *d_in, const float *d_w,
                      const float *d_save)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer_t *L = dp_cuda_layer(cx, l, DP_LAYER_BN);
    size_t n = (size_t)B * l->in_c * l->in_h * l->in_w;
    if (B > cx->max_batch) {
        fprintf(stderr, "cuda backend: %s: %s: batch %d above the %d prepared\n", cx->name,
                l->name, B, cx->max_batch);
        abort();
    }
    if (dp_cuda_bn_backward(cx, L, B, d_out != NULL, d_din, d_dz, d_dw, d_db, d_dout, d_out,
                            d_in, d_w) == 0)
        return;
    if (G < 1 || G > B) G = B;
    if (d_out) { /* the relu's backward (the add's: a copy), then bn's */
        dp_relu_backward_gpu(cx->d_bn_dy, d_dout, d_out, n, cx->stream);
        d_dout = cx->d_bn_dy;
        if (d_dz)
            DP_CUDA_CHECK(cudaMemcpyAsync(d_dz, d_dout, n * sizeof(float),
                                          cudaMemcpyDeviceToDevice, cx->stream));
    }
    dp_bn_backward_gpu(d_din, d_dw, d_db, d_dout, d_in, d_w, d_save, cx->d_bn_sums, B, G,
                       l->in_c, l->in_h * l->in_w, l->eps, cx->stream);
}

static void s_bn_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w, const float *d_save)
{
    s_bn_back(be, l, B, G, d_din, NULL, d_dw, d_db, d_dout, NULL, d_in, d_w, d_save);
}

static void s_bn_relu_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                               float *d_dw, float *d_db, const float *d_dout, const float *d_out,
                               const float *d_in, const float *d_w, const float *d_save)
{
    s_bn_back(be, l, B, G, d_din, NULL, d_dw, d_db, d_dout, d_out, d_in, d_w, d_save);
}

static void s_bn_add_relu_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G,
                                   float *d_din, float *d_dz, float *d_dw, float *d_db,
                                   const float *d_dout, const float *d_out, const float *d_in,
                                   const float *d_w, const float *d_save)
{
    s_bn_back(be, l, B, G, d_din, d_dz, d_dw, d_db, d_dout, d_out, d_in, d_w, d_save);
}

static void s_shortcut_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                               const float *d_a, const float *d_src)
{
    dp_cuda_t *cx = s_enter(be);
    dp_shortcut_dims_t d;
    dp_cuda_layer(cx, l, DP_LAYER_ADD);
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_add_forward_gpu(d_out, d_a, d_src, &d, cx->stream);
}

static void s_shortcut_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_dsrc,
                                const float *d_dout)
{
    dp_cuda_t *cx = s_enter(be);
    dp_shortcut_dims_t d;
    dp_cuda_layer(cx, l, DP_LAYER_ADD);
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_backward_gpu(d_dsrc, d_dout, &d, cx->stream);
}

static void s_gap_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                          const float *d_in)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer(cx, l, DP_LAYER_GAP);
    dp_gap_forward_gpu(d_out, d_in, B, l->in_c, l->in_h * l->in_w, cx->stream);
}

static void s_gap_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                           const float *d_dout)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer(cx, l, DP_LAYER_GAP);
    dp_gap_backward_gpu(d_din, d_dout, B, l->in_c, l->in_h * l->in_w, cx->stream);
}

static void s_dropout_forward(dp_backend_t *be, const dp_layer_t *l, int B,
                              unsigned long long seed, unsigned long long step,
                              unsigned long long sample0, float *d_out, const float *d_in)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer(cx, l, DP_LAYER_DROPOUT);
    dp_dropout_gpu(d_out, d_in, B, dp_layer_out_size(l), l->p, seed, step, sample0, cx->stream);
}

static void s_dropout_backward(dp_backend_t *be, const dp_layer_t *l, int B,
                               unsigned long long seed, unsigned long long step,
                               unsigned long long sample0, float *d_din, const float *d_dout)
{
    dp_cuda_t *cx = s_enter(be);
    dp_cuda_layer(cx, l, DP_LAYER_DROPOUT);
    dp_dropout_gpu(d_din, d_dout, B, dp_layer_out_size(l), l->p, seed, step, sample0, cx->stream);
}

static void s_vec_add(dp_backend_t *be, size_t n, float *d_dst, const float *d_src)
{
    dp_cuda_t *cx = s_enter(be);
    dp_vec_add_gpu(d_dst, d_src, n, cx->stream);
}

/* On the compute stream, ordered with the ops around it. */
static void s_copy(dp_backend_t *be, void *d_dst, const void *d_src, size_t bytes)
{
    dp_cuda_t *cx = s_enter(be);
    if (!bytes || d_dst == d_src) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
}

static void s_optim_step(dp_backend_t *be, const dp_optim_conf_t *c, float lr, float *d_w,
                         const float *d_g, float *d_state, size_t n, long t)
{
    dp_cuda_t *cx = s_enter(be);
    dp_optim_step_gpu(c, lr, d_w, d_g, d_state, n, t, cx->stream);
}

/* ---- open / destroy ----------------------------------------------------- */

static void s_destroy(dp_backend_t *be)
{
    dp_cuda_t *cx = s_cx(be);
    if (cx) {
        /* Nothing on the device to free when opening failed early (and no
         * CUDA call on a machine without one). */
        if (cx->stream) {
            cudaSetDevice(cx->dev);
            cudaDeviceSynchronize();
        }
        dp_cuda_plan_free(cx);
        if (cx->cublas) cublasDestroy(cx->cublas);
        if (cx->cudnn) cudnnDestroy(cx->cudnn);
        if (cx->queued) cudaEventDestroy(cx->queued);
        for (int k = 0; k < DP_CUDA_COPY_MARKS; k++)
            if (cx->copied[k]) cudaEventDestroy(cx->copied[k]);
        if (cx->down) cudaStreamDestroy(cx->down);
        if (cx->up) cudaStreamDestroy(cx->up);
        if (cx->side) cudaStreamDestroy(cx->side);
        if (cx->stream) cudaStreamDestroy(cx->stream);
        free(cx);
    }
    free((char *)be->name);
    free(be);
}

static const dp_backend_ops_t s_cuda_ops = {
    .prepare = s_prepare,
    .alloc = s_alloc,
    .release = s_release,
    .upload = s_upload,
    .download = s_download,
    .host_alloc = s_host_alloc,
    .host_release = s_host_release,
    .host_register = s_host_register,
    .host_unregister = s_host_unregister,
    .synchronize = s_synchronize,
    .stage_upload = s_stage_upload,
    .download_async = s_download_async,
    .download_wait_first = s_download_wait_first,
    .upload_async = s_upload_async,
    .copy_peer = s_copy_peer,
    .copy_side = s_copy_side,
    .enter = s_enter_op,
    .download_wait = s_download_wait,
    .conv_forward = s_conv_forward,
    .conv_backward = s_conv_backward,
    .relu_forward = s_relu_forward,
    .relu_backward = s_relu_backward,
    .tanh_forward = s_tanh_forward,
    .tanh_backward = s_tanh_backward,
    .maxpool_forward = s_maxpool_forward,
    .maxpool_backward = s_maxpool_backward,
    .fc_forward = s_fc_forward,
    .fc_backward = s_fc_backward,
    .softmax_xent_forward = s_softmax_xent_forward,
    .softmax_xent_backward = s_softmax_xent_backward,
    .obs_norm_forward = s_obs_norm_forward,
    .sigmoid_xent_forward = s_sigmoid_xent_forward,
    .sigmoid_xent_backward = s_sigmoid_xent_backward,
    .ac_loss_forward = s_ac_loss_forward,
    .ac_loss_backward = s_ac_loss_backward,
    .bn_forward = s_bn_forward,
    .bn_backward = s_bn_backward,
    .bn_relu_forward = s_bn_relu_forward,
    .bn_relu_backward = s_bn_relu_backward,
    .bn_add_relu_forward = s_bn_add_relu_forward,
    .bn_add_relu_backward = s_bn_add_relu_backward,
    .shortcut_forward = s_shortcut_forward,
    .shortcut_backward = s_shortcut_backward,
    .gap_forward = s_gap_forward,
    .gap_backward = s_gap_backward,
    .dropout_forward = s_dropout_forward,
    .dropout_backward = s_dropout_backward,
    .vec_add = s_vec_add,
    .copy = s_copy,
    .optim_step = s_optim_step,
    .destroy = s_destroy,
};

int dp_backend_cuda_new(dp_backend_t **out, int device, char *err)
{
    dp_cuda_t *cx = dp_calloc(1, sizeof *cx);
    dp_backend_t *be = dp_calloc(1, sizeof *be);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    struct cudaDeviceProp prop;
    int count = 0;
    size_t cudnn_ver;
    dp_cuda_knobs_t knobs;
    char e2[DP_ERR_LEN];
    cudaError_t e;

    *out = NULL;
    be->impl = cx;
    cx->dev = device;
    snprintf(cx->name, sizeof cx->name, "cuda:%d", device);
    be->ops = &s_cuda_ops;
    be->name = dp_strdup(cx->name);

    /* The device must exist before anything else touches CUDA. */
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dp_err(err, "%s: no CUDA device: %s (cudaGetDeviceCount)", cx->name,
               cudaGetErrorString(e));
        goto fail;
    }
    if (device < 0 || device >= count) {
        dp_err(err, "%s: no such device (%d CUDA device%s visible; CUDA_VISIBLE_DEVICES=%s)",
               cx->name, count, count == 1 ? "" : "s", vis ? vis : "(unset)");
        goto fail;
    }
    DP_CUDA_TRY(cudaSetDevice(device));
    DP_CUDA_TRY(cudaGetDeviceProperties(&prop, device));

    cudnn_ver = cudnnGetVersion();
    if (cudnn_ver / 10000 != CUDNN_MAJOR) {
        dp_err(err, "%s: cuDNN library %zu does not match the headers built against (%d.%d)",
               cx->name, cudnn_ver, CUDNN_MAJOR, CUDNN_MINOR);
        goto fail;
    }
    /* The knobs (kernels/env.h): checked at the program's start already. */
    if (dp_cuda_knobs(&knobs, e2) != 0) {
        dp_err(err, "%s: %s", cx->name, e2);
        goto fail;
    }
    cx->tf32 = knobs.tf32;
    cx->exact = !knobs.fastest;
    cx->find = knobs.find;
    cx->ws_limit = (size_t)knobs.workspace_mb << 20;
    cx->bn_own = knobs.bn_own;

    DP_CUDA_TRY(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    DP_CUDNN_TRY(cudnnCreate(&cx->cudnn));
    DP_CUDNN_TRY(cudnnSetStream(cx->cudnn, cx->stream));
    DP_CUBLAS_TRY(cublasCreate(&cx->cublas));
    DP_CUBLAS_TRY(cublasSetStream(cx->cublas, cx->stream));
    /* FP32 as written unless TF32 is asked for (cuBLAS's default math never
     * uses TF32 for sgemm; the TF32 mode lets it). */
    DP_CUBLAS_TRY(cublasSetMathMode(cx->cublas, cx->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                         : CUBLAS_DEFAULT_MATH));
    DP_CUDA_TRY(cudaStreamCreateWithFlags(&cx->up, cudaStreamNonBlocking));
    DP_CUDA_TRY(cudaStreamCreateWithFlags(&cx->side, cudaStreamNonBlocking));
    DP_CUDA_TRY(cudaStreamCreateWithFlags(&cx->down, cudaStreamNonBlocking));
    DP_CUDA_TRY(cudaEventCreateWithFlags(&cx->queued, cudaEventDisableTiming));
    for (int k = 0; k < DP_CUDA_COPY_MARKS; k++)
        DP_CUDA_TRY(cudaEventCreateWithFlags(&cx->copied[k], cudaEventDisableTiming));

    dp_log_info("%s: %s (sm_%d%d, %zu MiB), cuDNN %zu, TF32 %s, %s algorithms (%s), batch "
                "norm %s", cx->name, prop.name, prop.major, prop.minor,
                prop.totalGlobalMem >> 20, cudnn_ver, cx->tf32 ? "on" : "off",
                cx->exact ? "exact" : "fastest", cx->find ? "timed at prepare" : "cuDNN's heuristic",
                cx->bn_own ? "ours" : "cuDNN's");
    *out = be;
    return 0;
fail:
    s_destroy(be);
    return -1;
}
