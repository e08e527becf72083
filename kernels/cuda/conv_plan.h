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
    /* bn on cuDNN (bn_cudnn.c); what the training forward leaves for the
     * backward lives here, as cuDNN's reserve space must */
    cudnnTensorDescriptor_t bn_x;              /* bn: [B,C,H,W], B set per call */
    cudnnTensorDescriptor_t bn_p;              /* bn: [1,C,1,1] scale, bias, statistics */
    cudnnBatchNormOps_t bn_relu_ops;           /* bn + relu: BN_ACTIVATION where cuDNN takes
                                                * it, else BN (the relu ours) */
    cudnnBatchNormOps_t bn_add_ops;            /* bn + add + relu: BN_ADD_ACTIVATION, or BN */
    void *d_bn_reserve;                        /* bn: cuDNN's reserve space, at max_batch */
    size_t bn_reserve_bytes;
    float *d_bn_saved;                         /* bn: cuDNN's saved mean, inverse deviation [2C] */
    int bn_fwd;                                /* the last training forward: 0 ours, else
                                                * 1 + the cuDNN ops it ran */
    const float *bn_bias;                      /* its bias (BN_ACTIVATION's backward reads it) */
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
    cudaStream_t side;                         /* copy_side's (the communication thread's) */
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
    float *d_bn_dy;                            /* bn + relu's backward: the relu's gradient,
                                                * for the largest bn at max_batch */
    int bn_own;                                /* DP_CUDA_BN=own: no cuDNN batch norm */
    cudnnActivationDescriptor_t relu;          /* cuDNN's ReLU, for its fused batch norm */
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

/* ---- batch norm on cuDNN (bn_cudnn.c) ---------------------------------- */

/* Bn layer L's descriptors, reserve space and saved statistics for batches
 * up to max_batch; the workspace its calls need into *ws_need (the
 * planner's one workspace is shared). -1 with err. */
int dp_cuda_bn_plan(dp_cuda_t *cx, dp_cuda_layer_t *L, int max_batch, size_t *ws_need, char *err);
void dp_cuda_bn_free(dp_cuda_layer_t *L);
/* The training forward of bn layer L (relu: then the ReLU, d_out its
 * output; d_z not NULL: d_z added before the ReLU) on cuDNN, with kernels/backend.h's bn_forward semantics for one
 * ghost batch (G == B): d_save gets the mean and the biased variance, the
 * running statistics PyTorch's update, *d_nbt one more. 0, or -1 when
 * cuDNN does not take this call (DP_CUDA_BN=own, ghost batches, a single
 * value per channel) and nothing was queued: the caller runs ours. */
int dp_cuda_bn_forward_train(dp_cuda_t *cx, dp_cuda_layer_t *L, int B, int G, int relu,
                             float *d_out, const float *d_in, const float *d_z, const float *d_w,
                             const float *d_b, float *d_rm, float *d_rv, float *d_nbt,
                             float *d_save);
/* The backward of the forward above (relu: d_dout is the gradient wrt the
 * ReLU's output d_out; d_dz not NULL: the added tensor's gradient written
 * there). 0, or -1 (nothing queued) when the layer's last training forward
 * was not cuDNN's, or another op, or d_din is NULL: the caller runs ours,
 * from d_save. */
int dp_cuda_bn_backward(dp_cuda_t *cx, dp_cuda_layer_t *L, int B, int relu, float *d_din,
                        float *d_dz, float *d_dw, float *d_db, const float *d_dout,
                        const float *d_out, const float *d_in, const float *d_w);

#endif
