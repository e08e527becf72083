/* optim_dev_cuda: the "cuda:K" shard step device (kernels/optim_dev.h) —
 * memory, copies and the snapshot's side stream; the kernels are
 * optim_dev.cu's. Built into the CUDA module (downpour-cuda.so), whose
 * dp_optim_dev_cuda_new kernels/optim_dev.c finds by dlsym.
 *
 * Invariants:
 * - Steps and compensations are queued on one compute stream (non-blocking)
 *   in call order; upload and download are ordered on it too and return
 *   when the host buffer may be reused / is whole.
 * - A snapshot's copy runs on the side stream, after an event recorded on
 *   the compute stream (every step queued before it), and the compute
 *   stream waits for an event recorded after the copy, so a step queued
 *   later never writes what is being copied. snapshot_wait synchronises
 *   the side stream. The host buffer should be page-locked for the copy
 *   to be asynchronous (a pageable one is copied before cudaMemcpyAsync
 *   returns: correct, only slower).
 * - Errors: new fills err and returns -1 (no device, a device that won't
 *   open); the ops cannot return one, so a failing call prints file:line,
 *   the call and CUDA's message, and aborts (dp_cuda_fatal). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/optim_dev.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/optim_dev_gpu.h"

typedef struct {
    int dev;              /* CUDA device number */
    cudaStream_t stream;  /* compute: steps, compensations, uploads, downloads */
    cudaStream_t side;    /* the snapshots' copies */
    cudaEvent_t stepped;  /* on stream: the steps before a snapshot */
    cudaEvent_t copied;   /* on side: a snapshot's copy done */
} s_cx_t;

/* Every entry point: the calling thread may not be the one that opened the
 * device, and cudaSetDevice is per thread. */
static s_cx_t *s_enter(dp_optim_dev_t *dev)
{
    s_cx_t *cx = dev->impl;
    DP_CUDA_CHECK(cudaSetDevice(cx->dev));
    return cx;
}

static void *s_alloc(dp_optim_dev_t *dev, size_t bytes)
{
    s_cx_t *cx = s_enter(dev);
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        fprintf(stderr, "optim_dev: %s: out of GPU memory allocating %zu bytes (%s)\n",
                dev->name, bytes, cudaGetErrorString(e));
        abort();
    }
    DP_CUDA_CHECK(cudaMemsetAsync(d, 0, bytes, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    return d;
}

static void s_release(dp_optim_dev_t *dev, void *d)
{
    if (!d) return;
    s_cx_t *cx = s_enter(dev);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream)); /* nothing queued still uses it */
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->side));
    DP_CUDA_CHECK(cudaFree(d));
}

static void s_upload(dp_optim_dev_t *dev, void *d_dst, const void *src, size_t bytes)
{
    s_cx_t *cx = s_enter(dev);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream)); /* src reusable on return */
}

static void s_download(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes)
{
    s_cx_t *cx = s_enter(dev);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

static void s_copy_out(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes)
{
    s_cx_t *cx = s_enter(dev);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDefault, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

static void s_step(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float lr, float *d_w,
                   const float *d_w_from, const float *d_g, float *d_state,
                   const float *d_state_from, size_t n_all, size_t lo, size_t hi, long t)
{
    s_cx_t *cx = s_enter(dev);
    dp_optim_step_from_gpu(c, lr, d_w, d_w_from, d_g, d_state, d_state_from, n_all, lo, hi, t,
                           cx->stream);
}

static void s_dc(dp_optim_dev_t *dev, const dp_optim_conf_t *c, float *d_out, const float *d_g,
                 const float *d_w, const float *d_w_bak, float *d_ms, size_t lo, size_t hi)
{
    s_cx_t *cx = s_enter(dev);
    dp_optim_dc_range_gpu(c, d_out, d_g, d_w, d_w_bak, d_ms, lo, hi, cx->stream);
}

static void s_snapshot(dp_optim_dev_t *dev, void *dst, const void *d_src, size_t bytes)
{
    s_cx_t *cx = s_enter(dev);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaEventRecord(cx->stepped, cx->stream));
    DP_CUDA_CHECK(cudaStreamWaitEvent(cx->side, cx->stepped, 0));
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->side));
    DP_CUDA_CHECK(cudaEventRecord(cx->copied, cx->side));
    DP_CUDA_CHECK(cudaStreamWaitEvent(cx->stream, cx->copied, 0));
}

static void s_snapshot_wait(dp_optim_dev_t *dev)
{
    s_cx_t *cx = s_enter(dev);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->side));
}

/* Also the failure path of new: whatever was made is undone. */
static void s_destroy(dp_optim_dev_t *dev)
{
    s_cx_t *cx = dev->impl;
    if (cx && cx->stream) {
        cudaSetDevice(cx->dev);
        cudaStreamSynchronize(cx->stream);
        if (cx->side) cudaStreamSynchronize(cx->side);
        if (cx->stepped) cudaEventDestroy(cx->stepped);
        if (cx->copied) cudaEventDestroy(cx->copied);
        if (cx->side) cudaStreamDestroy(cx->side);
        cudaStreamDestroy(cx->stream);
    }
    free(cx);
    free(dev);
}

static const dp_optim_dev_ops_t s_cuda_ops = {
    .alloc = s_alloc,
    .release = s_release,
    .upload = s_upload,
    .download = s_download,
    .copy_out = s_copy_out,
    .step = s_step,
    .dc = s_dc,
    .snapshot = s_snapshot,
    .snapshot_wait = s_snapshot_wait,
    .destroy = s_destroy,
};

/* One setup call: err filled and -1 on failure. */
#define S_TRY(call)                                                            \
    do {                                                                       \
        cudaError_t s_e_ = (call);                                             \
        if (s_e_ != cudaSuccess) {                                             \
            dp_err(err, "%s: %s:%d: %s: %s", dev->name, __FILE__, __LINE__, #call, \
                   cudaGetErrorString(s_e_));                                  \
            goto fail;                                                         \
        }                                                                      \
    } while (0)

int dp_optim_dev_cuda_new(dp_optim_dev_t **out, int device, char *err)
{
    dp_optim_dev_t *dev = dp_calloc(1, sizeof *dev);
    s_cx_t *cx = dp_calloc(1, sizeof *cx);
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int count = 0;
    cudaError_t e;
    *out = NULL;
    dev->ops = &s_cuda_ops;
    dev->impl = cx;
    cx->dev = device;
    snprintf(dev->name, sizeof dev->name, "cuda:%d", device);
    /* the device must exist before anything else touches CUDA */
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        dp_err(err, "%s: no CUDA device: %s (cudaGetDeviceCount)", dev->name,
               cudaGetErrorString(e));
        goto fail;
    }
    if (device < 0 || device >= count) {
        dp_err(err, "%s: no such device (%d CUDA device%s visible; CUDA_VISIBLE_DEVICES=%s)",
               dev->name, count, count == 1 ? "" : "s", vis ? vis : "(unset)");
        goto fail;
    }
    S_TRY(cudaSetDevice(device));
    S_TRY(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    S_TRY(cudaStreamCreateWithFlags(&cx->side, cudaStreamNonBlocking));
    S_TRY(cudaEventCreateWithFlags(&cx->stepped, cudaEventDisableTiming));
    S_TRY(cudaEventCreateWithFlags(&cx->copied, cudaEventDisableTiming));
    *out = dev;
    return 0;
fail:
    s_destroy(dev);
    return -1;
}
