/* conv_plan.h: the CUDA backend's state, shared by its two C files —
 * backend_cuda.c (open, memory, streams and copies, the ops) and
 * conv_plan.c (cuDNN's plans for the conv layers: descriptors, algorithms,
 * the one workspace) — and what the planner offers the ops. Private to
 * kernels/cuda, like backend_cuda.h; C only (cuDNN and cuBLAS types).
 *
 * The checks below are backend_cuda.h's DP_STATUS_CHECK for cuDNN and
 * cuBLAS, and the *_TRY twins of fallible paths, which need `cx` (for its
 * name), `err` and a `fail:` label in the function. */
#ifndef DP_CONV_PLAN_H
#define DP_CONV_PLAN_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_cuda.h"

#define DP_CUDA_PLANS 4                      /* batch sizes cached per conv layer */

#define DP_CUDNN_CHECK(call)                                                   \
    DP_STATUS_CHECK(cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, call, #call)
#define DP_CUBLAS_CHECK(call)                                                  \
    DP_STATUS_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, call, #call)

/* Fallible twins (DP_STATUS_CHECK's shape): fill err, prefixed with the
 * device, and goto fail. */
#define DP_STATUS_TRY(type, ok, what, call, text)                              \
    do {                                                                       \
        type dp_s_ = (call);                                                   \
        if (dp_s_ != (ok)) {                                                   \
            dp_err(err, "%s: %s:%d: %s: %s", cx->name, __FILE__, __LINE__, text, what(dp_s_)); \
            goto fail;                                                         \
        }                                                                      \
    } while (0)
#define DP_CUDA_TRY(call) DP_STATUS_TRY(cudaError_t, cudaSuccess, cudaGetErrorString, call, #call)
#define DP_CUDNN_TRY(call)                                                     \
    DP_STATUS_TRY(cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, call, #call)
#define DP_CUBLAS_TRY(call)                                                    \
    DP_STATUS_TRY(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, call, #call)

/* A conv layer's plan for one batch size. */
typedef struct {
    int B;                                     /* batch the descriptors hold; 0 = free slot */
    unsigned long used;                        /* LRU stamp */
    cudnnTensorDescriptor_t x, y;              /* [B,C,H,W] input, [B,OC,OH,OW] output */
    cudnnConvolutionFwdAlgo_t fwd;             /* chosen algorithms */
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
} dp_cuda_conv_plan_t;

typedef struct {
    int planned;                               /* prepare() saw this layer */
    dp_layer_t layer;                          /* the shapes planned for */
    cudnnFilterDescriptor_t w;                 /* conv: [OC,C,K,K] */
    cudnnConvolutionDescriptor_t conv;         /* conv: pad, stride, math type */
    cudnnTensorDescriptor_t bias;              /* conv: [1,OC,1,1] */
    dp_cuda_conv_plan_t plan[DP_CUDA_PLANS];               /* conv: per batch size */
} dp_cuda_layer_t;

/* Marks of download_async's copies, a ring: waiting on a mark taken again
 * by a later copy waits for that one too (the copies run in order), so a
 * step of more layers than marks is still right, only less overlapped. */
#define DP_CUDA_COPY_MARKS 64

typedef struct {
    int dev;                                   /* CUDA device number */
    char name[16];                             /* "cuda:K" */
    int tf32;                                  /* DP_CUDA_TF32=1 */
    int exact;                                 /* DP_CUDA_ALGOS=exact (default): see s_pick */
    int find;                                  /* DP_CUDA_FIND=1: time the algorithms at prepare */
    cudaStream_t stream;                       /* the compute stream */
    cudaStream_t up;                           /* stage_upload's copies */
    cudaStream_t down;                         /* download_async's copies */
    cudaEvent_t queued;                        /* marks the compute stream for down */
    cudaEvent_t copied[DP_CUDA_COPY_MARKS];          /* down: the end of download_async's copy k,
                                                * at k % DP_CUDA_COPY_MARKS */
    unsigned n_copies;                         /* download_async's since download_wait */
    cudnnHandle_t cudnn;                       /* bound to stream */
    cublasHandle_t cublas;                     /* bound to stream */
    int n_layers;                              /* layers planned by prepare */
    int max_batch;
    dp_cuda_layer_t layers[DP_MAX_LAYERS];
    size_t ws_limit;                           /* cap on the cuDNN workspace */
    void *d_ws;                                /* the one workspace */
    double *d_bn_sums;                         /* batch norm's backward: 2 C doubles per
                                                * ghost batch, for the widest bn at max_batch */
    size_t ws_bytes;                           /* its size */
    unsigned long tick;                        /* LRU clock for plans */
} dp_cuda_t;

/* Plan every layer of m for batches up to max_batch (the conv layers'
 * descriptors and algorithms, the workspace, batch norm's scratch),
 * replacing any earlier plan; -1 with err. */
int dp_cuda_plan_prepare(dp_cuda_t *cx, const dp_model_t *m, int max_batch, char *err);
/* Every plan, the workspace and the scratch freed (safe twice). */
void dp_cuda_plan_free(dp_cuda_t *cx);
/* The prepared layer for l, checked against l's shapes (misuse aborts). */
dp_cuda_layer_t *dp_cuda_layer(dp_cuda_t *cx, const dp_layer_t *l, dp_layer_kind_t kind);
/* Conv layer L's plan for batch B (made now when not cached; aborts on failure). */
dp_cuda_conv_plan_t *dp_cuda_conv_plan(dp_cuda_t *cx, dp_cuda_layer_t *L, int B);

#endif
