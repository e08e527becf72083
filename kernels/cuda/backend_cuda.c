/* backend_cuda: the "cuda:K" backend (kernels/backend.h) for one GPU —
 * convolutions on cuDNN, fully connected layers on cuBLAS, everything else
 * on our own kernels (ops_gpu.cu).
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
 * - prepare() plans each conv layer once for max_batch: filter and
 *   convolution descriptors, tensor descriptors for the batch, algorithms
 *   within a workspace limit, and ONE workspace sized for the largest need.
 *   Algorithms come from cuDNN's heuristic ranking. DP_CUDA_FIND=1 times
 *   them once with cuDNN's find on scratch buffers instead: on an H200 that
 *   was 8-23% faster at batch 64 and even at 256, but its pick can change
 *   from run to run, and the results bit for bit with it.
 * - A different batch B (an evaluation's last, short batch) gets its own
 *   plan by the heuristic, cached per layer. When its algorithms need a
 *   larger workspace (cuDNN's needs are not monotonic in B: on an H200,
 *   implicit GEMM wanted more at batch 16 than at 256) the workspace grows
 *   once, after the stream has drained. The steady training loop, one batch
 *   size, never calls cudaMalloc.
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

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/env.h"
#include "kernels/cuda/backend_cuda.h"

#define S_PLANS 4                      /* batch sizes cached per conv layer */

/* ---- error checks ----------------------------------------------------- */

void dp_cuda_fatal(const char *file, int line, const char *call, const char *what)
{
    fprintf(stderr, "cuda backend: %s:%d: %s: %s\n", file, line, call, what);
    fflush(stderr);
    abort();
}

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

/* ---- state ------------------------------------------------------------ */

/* A conv layer's plan for one batch size. */
typedef struct {
    int B;                                     /* batch the descriptors hold; 0 = free slot */
    unsigned long used;                        /* LRU stamp */
    cudnnTensorDescriptor_t x, y;              /* [B,C,H,W] input, [B,OC,OH,OW] output */
    cudnnConvolutionFwdAlgo_t fwd;             /* chosen algorithms */
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
} s_conv_plan_t;

typedef struct {
    int planned;                               /* prepare() saw this layer */
    dp_layer_t layer;                          /* the shapes planned for */
    cudnnFilterDescriptor_t w;                 /* conv: [OC,C,K,K] */
    cudnnConvolutionDescriptor_t conv;         /* conv: pad, stride, math type */
    cudnnTensorDescriptor_t bias;              /* conv: [1,OC,1,1] */
    s_conv_plan_t plan[S_PLANS];               /* conv: per batch size */
} s_layer_t;

/* Marks of download_async's copies, a ring: waiting on a mark taken again
 * by a later copy waits for that one too (the copies run in order), so a
 * step of more layers than marks is still right, only less overlapped. */
#define S_COPY_MARKS 64

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
    cudaEvent_t copied[S_COPY_MARKS];          /* down: the end of download_async's copy k,
                                                * at k % S_COPY_MARKS */
    unsigned n_copies;                         /* download_async's since download_wait */
    cudnnHandle_t cudnn;                       /* bound to stream */
    cublasHandle_t cublas;                     /* bound to stream */
    int n_layers;                              /* layers planned by prepare */
    int max_batch;
    s_layer_t layers[DP_MAX_LAYERS];
    size_t ws_limit;                           /* cap on the cuDNN workspace */
    void *d_ws;                                /* the one workspace */
    double *d_bn_sums;                         /* batch norm's backward: 2 C doubles per
                                                * ghost batch, for the widest bn at max_batch */
    size_t ws_bytes;                           /* its size */
    unsigned long tick;                        /* LRU clock for plans */
} s_cuda_t;

static s_cuda_t *s_cx(dp_backend_t *be) { return (s_cuda_t *)be->impl; }

/* Every entry point: the calling thread may not be the one that opened the
 * backend, and cudaSetDevice is per thread. */
static s_cuda_t *s_enter(dp_backend_t *be)
{
    s_cuda_t *cx = s_cx(be);
    DP_CUDA_CHECK(cudaSetDevice(cx->dev));
    return cx;
}

/* ---- planning ----------------------------------------------------------- */

/* Algorithm choice. The three directions of a convolution (forward,
 * backward-data, backward-filter) have their own cuDNN types and calls; the
 * s_dir_* helpers below translate them into one candidate list, so one
 * picker serves all three. */
typedef enum { S_FWD, S_BWD_DATA, S_BWD_FILTER } s_dir_t;
static const char *const s_dir_name[] = {"forward", "backward-data", "backward-filter"};

typedef struct {
    int algo;
    cudnnStatus_t status;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} s_candidate_t;

#define S_MAX_CANDIDATES 32

/* Device scratch for a one-time find (cudnnFind*AlgorithmEx runs every
 * algorithm on these and times it): one layer's tensors at the planned
 * batch, and a workspace of the cap. */
typedef struct {
    void *x, *y, *w, *dx, *dw, *ws;  /* ws: cx->ws_limit bytes */
} s_find_t;

static void s_find_free(s_find_t *f)
{
    if (!f) return;
    void *bufs[] = {f->x, f->dx, f->y, f->w, f->dw, f->ws};
    for (int i = 0; i < 6; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    memset(f, 0, sizeof *f);
}

/* Copy cuDNN's perf results (any of the three perf types) into out[]. */
#define S_COPY_PERF(perf)                                                      \
    for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < *n; i++)                 \
    out[i] = (s_candidate_t){(int)perf[i].algo, perf[i].status, perf[i].determinism, \
                             perf[i].mathType}

/* Candidates, best first: timed by a find when `find` is given, else
 * cuDNN's heuristic ranking (cudnnGet*Algorithm_v7). */
static cudnnStatus_t s_dir_rank(s_cuda_t *cx, s_layer_t *L, s_conv_plan_t *P, s_dir_t dir,
                                const s_find_t *f, s_candidate_t *out, int *n)
{
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    const int max = S_MAX_CANDIDATES;
    *n = 0;
    switch (dir) {
    case S_FWD: {
        cudnnConvolutionFwdAlgoPerf_t perf[S_MAX_CANDIDATES];
        st = f ? cudnnFindConvolutionForwardAlgorithmEx(cx->cudnn, P->x, f->x, L->w, f->w,
                                                         L->conv, P->y, f->y, max, n, perf,
                                                         f->ws, cx->ws_limit)
               : cudnnGetConvolutionForwardAlgorithm_v7(cx->cudnn, P->x, L->w, L->conv, P->y,
                                                        max, n, perf);
        S_COPY_PERF(perf);
        break;
    }
    case S_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[S_MAX_CANDIDATES];
        st = f ? cudnnFindConvolutionBackwardDataAlgorithmEx(cx->cudnn, L->w, f->w, P->y, f->y,
                                                              L->conv, P->x, f->dx, max, n,
                                                              perf, f->ws, cx->ws_limit)
               : cudnnGetConvolutionBackwardDataAlgorithm_v7(cx->cudnn, L->w, P->y, L->conv,
                                                             P->x, max, n, perf);
        S_COPY_PERF(perf);
        break;
    }
    case S_BWD_FILTER: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[S_MAX_CANDIDATES];
        st = f ? cudnnFindConvolutionBackwardFilterAlgorithmEx(cx->cudnn, P->x, f->x, P->y,
                                                                f->y, L->conv, L->w, f->dw, max,
                                                                n, perf, f->ws, cx->ws_limit)
               : cudnnGetConvolutionBackwardFilterAlgorithm_v7(cx->cudnn, P->x, P->y, L->conv,
                                                               L->w, max, n, perf);
        S_COPY_PERF(perf);
        break;
    }
    }
    return st;
}
#undef S_COPY_PERF

/* The exact workspace algorithm `algo` needs with our descriptors. */
static cudnnStatus_t s_dir_workspace(s_cuda_t *cx, s_layer_t *L, s_conv_plan_t *P, s_dir_t dir,
                                     int algo, size_t *ws)
{
    switch (dir) {
    case S_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(cx->cudnn, P->x, L->w, L->conv, P->y,
                                                       (cudnnConvolutionFwdAlgo_t)algo, ws);
    case S_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            cx->cudnn, L->w, P->y, L->conv, P->x, (cudnnConvolutionBwdDataAlgo_t)algo, ws);
    case S_BWD_FILTER:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            cx->cudnn, P->x, P->y, L->conv, L->w, (cudnnConvolutionBwdFilterAlgo_t)algo, ws);
    }
    return CUDNN_STATUS_BAD_PARAM;
}

/* FFT and Winograd transform the data; their error grows with the norm of
 * the whole input rather than with each output (measured on an H200: a
 * Winograd backward-filter was off by 5e-3 relative where FP32 GEMM agreed
 * to 1e-6), so the exact mode leaves them out. */
static int s_dir_transforms(s_dir_t dir, int algo)
{
    switch (dir) {
    case S_FWD:
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case S_BWD_DATA:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    case S_BWD_FILTER:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    }
    return 1;
}

/* The implicit-GEMM algorithm of each direction: FP32, deterministic, no
 * workspace, in every cuDNN build. The last resort. */
static const int s_dir_fallback[] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};

/* The first of the ranked candidates (timed by a find, or cuDNN's
 * heuristic order) that succeeded, runs in the math
 * asked for (with TF32 off the descriptor says FMA, and a candidate that
 * wants tensor cores would not be FP32), suits the mode (exact: deterministic
 * and no FFT / Winograd) and whose workspace fits `limit`; else the
 * fallback. *need = its workspace. */
static int s_pick(s_cuda_t *cx, s_layer_t *L, s_conv_plan_t *P, s_dir_t dir,
                  const s_find_t *find, size_t limit, int *algo, size_t *need, char *err)
{
    s_candidate_t cand[S_MAX_CANDIDATES];
    int n = 0;
    cudnnStatus_t st = s_dir_rank(cx, L, P, dir, find, cand, &n);
    if (st != CUDNN_STATUS_SUCCESS && find) {
        /* a find that failed (out of memory, say) still leaves the heuristic */
        dp_log_warn("%s: %s: cuDNN's %s find failed (%s); using its heuristic", cx->name,
                    L->layer.name, s_dir_name[dir], cudnnGetErrorString(st));
        st = s_dir_rank(cx, L, P, dir, NULL, cand, &n);
    }
    if (st != CUDNN_STATUS_SUCCESS)
        return dp_err(err, "%s: %s: cuDNN's %s heuristic: %s", cx->name, L->layer.name,
                      s_dir_name[dir], cudnnGetErrorString(st));
    for (int i = 0; i < n; i++) {
        const s_candidate_t *c = &cand[i];
        size_t ws = 0;
        if (c->status != CUDNN_STATUS_SUCCESS) continue;
        if (!cx->tf32 && c->math != CUDNN_FMA_MATH && c->math != CUDNN_DEFAULT_MATH) continue;
        if (cx->exact &&
            (c->determinism != CUDNN_DETERMINISTIC || s_dir_transforms(dir, c->algo)))
            continue;
        if (s_dir_workspace(cx, L, P, dir, c->algo, &ws) != CUDNN_STATUS_SUCCESS || ws > limit)
            continue;
        *algo = c->algo;
        *need = ws;
        return 0;
    }
    if (s_dir_workspace(cx, L, P, dir, s_dir_fallback[dir], need) == CUDNN_STATUS_SUCCESS &&
        *need <= limit) {
        *algo = s_dir_fallback[dir];
        return 0;
    }
    return dp_err(err, "%s: %s at batch %d: no cuDNN %s algorithm fits %zu MiB of workspace",
                  cx->name, L->layer.name, P->B, s_dir_name[dir], limit >> 20);
}

/* Set P's descriptors for batch B and pick its algorithms within `limit`
 * bytes of workspace; *need = the most any of the three wants. Host-only
 * cuDNN calls: no device memory is allocated. */
static int s_plan_conv(s_cuda_t *cx, s_layer_t *L, s_conv_plan_t *P, int B,
                       const s_find_t *find, size_t limit, size_t *need, char *err)
{
    const dp_layer_t *l = &L->layer;
    int n = 0, c = 0, h = 0, w = 0;
    size_t a = 0, b = 0, f = 0;
    int algo[3];
    P->B = B;
    if (!P->x) DP_CUDNN_TRY(cudnnCreateTensorDescriptor(&P->x));
    if (!P->y) DP_CUDNN_TRY(cudnnCreateTensorDescriptor(&P->y));
    DP_CUDNN_TRY(cudnnSetTensor4dDescriptor(P->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B,
                                            l->in_c, l->in_h, l->in_w));
    DP_CUDNN_TRY(cudnnSetTensor4dDescriptor(P->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B,
                                            l->out_c, l->out_h, l->out_w));
    /* The model's output shape must be cuDNN's, or every op would be wrong. */
    DP_CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(L->conv, P->x, L->w, &n, &c, &h, &w));
    if (n != B || c != l->out_c || h != l->out_h || w != l->out_w) {
        dp_err(err, "%s: %s: cuDNN computes output %dx%dx%dx%d, the model says %dx%dx%dx%d",
               cx->name, l->name, n, c, h, w, B, l->out_c, l->out_h, l->out_w);
        goto fail;
    }
    if (s_pick(cx, L, P, S_FWD, find, limit, &algo[S_FWD], &a, err) < 0 ||
        s_pick(cx, L, P, S_BWD_DATA, find, limit, &algo[S_BWD_DATA], &b, err) < 0 ||
        s_pick(cx, L, P, S_BWD_FILTER, find, limit, &algo[S_BWD_FILTER], &f, err) < 0)
        goto fail;
    P->fwd = (cudnnConvolutionFwdAlgo_t)algo[S_FWD];
    P->bwd_data = (cudnnConvolutionBwdDataAlgo_t)algo[S_BWD_DATA];
    P->bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)algo[S_BWD_FILTER];
    *need = a > b ? a : b;
    if (f > *need) *need = f;
    dp_log_debug("%s: %s B=%d (%s): fwd algo %d, bwd-data algo %d, bwd-filter algo %d, "
                 "workspace %zu KiB",
                 cx->name, l->name, B, find ? "timed" : "heuristic", (int)P->fwd,
                 (int)P->bwd_data, (int)P->bwd_filter, *need >> 10);
    return 0;
fail:
    P->B = 0;
    return -1;
}

static void s_free_layer(s_layer_t *L)
{
    for (int i = 0; i < S_PLANS; i++) {
        if (L->plan[i].x) cudnnDestroyTensorDescriptor(L->plan[i].x);
        if (L->plan[i].y) cudnnDestroyTensorDescriptor(L->plan[i].y);
    }
    if (L->bias) cudnnDestroyTensorDescriptor(L->bias);
    if (L->w) cudnnDestroyFilterDescriptor(L->w);
    if (L->conv) cudnnDestroyConvolutionDescriptor(L->conv);
    memset(L, 0, sizeof *L);
}

static void s_free_plans(s_cuda_t *cx)
{
    for (int i = 0; i < DP_MAX_LAYERS; i++) s_free_layer(&cx->layers[i]);
    cx->n_layers = 0;
    if (cx->d_ws) cudaFree(cx->d_ws);
    cx->d_ws = NULL;
    if (cx->d_bn_sums) cudaFree(cx->d_bn_sums);
    cx->d_bn_sums = NULL;
    cx->ws_bytes = 0;
}

/* The one cuDNN workspace, at least `need` bytes: replaced (after the
 * compute stream has drained: queued ops may use the old one) when smaller. */
static int s_workspace_reserve(s_cuda_t *cx, size_t need, char *err)
{
    cudaError_t e;
    if (need <= cx->ws_bytes) return 0;
    DP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
    DP_CUDA_TRY(cudaFree(cx->d_ws));
    cx->d_ws = NULL;
    cx->ws_bytes = 0;
    e = cudaMalloc(&cx->d_ws, need);
    if (e != cudaSuccess) {
        cx->d_ws = NULL;
        return dp_err(err, "%s: cudaMalloc of the %zu MiB cuDNN workspace: %s (lower "
                      "DP_CUDA_WORKSPACE_MB)", cx->name, need >> 20, cudaGetErrorString(e));
    }
    cx->ws_bytes = need;
    return 0;
fail:
    return -1;
}

/* Scratch for a find over layer l at batch B, or NULL (then the heuristic
 * decides) when the GPU cannot spare it. Filled with a non-zero pattern:
 * some algorithms run faster on zeros than on data. */
static s_find_t *s_find_alloc(s_cuda_t *cx, const dp_layer_t *l, int B, s_find_t *f)
{
    size_t in = (size_t)B * l->in_c * l->in_h * l->in_w * sizeof(float);
    size_t out = (size_t)B * l->out_c * l->out_h * l->out_w * sizeof(float);
    size_t w = (size_t)l->out_c * l->in_c * l->k * l->k * sizeof(float);
    void **bufs[] = {&f->x, &f->dx, &f->y, &f->w, &f->dw, &f->ws};
    size_t bytes[] = {in, in, out, w, w, cx->ws_limit};
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 6; i++) {
        if (cudaMalloc(bufs[i], bytes[i] ? bytes[i] : 1) != cudaSuccess) {
            cudaGetLastError();
            dp_log_warn("%s: %s: no memory for a timed algorithm search; using cuDNN's heuristic",
                        cx->name, l->name);
            s_find_free(f);
            return NULL;
        }
        DP_CUDA_CHECK(cudaMemsetAsync(*bufs[i], 0x3c, bytes[i], cx->stream)); /* 0.0118f */
    }
    return f;
}

static int s_prepare(dp_backend_t *be, const dp_model_t *m, int max_batch, char *err)
{
    s_cuda_t *cx = s_enter(be);
    size_t ws_need = 0;
    if (max_batch < 1) return dp_err(err, "%s: prepare: max_batch %d < 1", cx->name, max_batch);
    if (m->n_layers > DP_MAX_LAYERS)
        return dp_err(err, "%s: prepare: %d layers > %d", cx->name, m->n_layers, DP_MAX_LAYERS);
    DP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
    s_free_plans(cx); /* a second prepare replans from scratch */
    cx->max_batch = max_batch;
    cx->n_layers = m->n_layers;
    int bn_c = 0; /* the widest batch norm */
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        s_layer_t *L = &cx->layers[i];
        size_t need = 0;
        L->layer = *l;
        L->planned = 1;
        if (l->kind == DP_LAYER_MAXPOOL) {
            dp_pool_dims_t d;
            dp_pool_dims_of(&d, l, 1);
            if (l->k < 1 || l->stride < 1 || d.OH != l->out_h || d.OW != l->out_w ||
                l->out_c != l->in_c) {
                dp_err(err, "%s: %s: pool shape %dx%dx%d k%d s%d -> %dx%dx%d is inconsistent",
                       cx->name, l->name, l->in_c, l->in_h, l->in_w, l->k, l->stride, l->out_c,
                       l->out_h, l->out_w);
                goto fail;
            }
        }
        if (l->kind == DP_LAYER_BN && l->in_c > bn_c) bn_c = l->in_c;
        if (l->kind != DP_LAYER_CONV) continue;
        if (l->k < 1 || l->stride < 1 || l->pad < 0) {
            dp_err(err, "%s: %s: bad conv k%d s%d p%d", cx->name, l->name, l->k, l->stride,
                   l->pad);
            goto fail;
        }
        DP_CUDNN_TRY(cudnnCreateFilterDescriptor(&L->w));
        DP_CUDNN_TRY(cudnnSetFilter4dDescriptor(L->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                l->out_c, l->in_c, l->k, l->k));
        DP_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&L->conv));
        /* Cross-correlation, as PyTorch and the CPU reference compute. */
        DP_CUDNN_TRY(cudnnSetConvolution2dDescriptor(L->conv, l->pad, l->pad, l->stride,
                                                     l->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                     CUDNN_DATA_FLOAT));
        DP_CUDNN_TRY(cudnnSetConvolutionMathType(
            L->conv, cx->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
        DP_CUDNN_TRY(cudnnCreateTensorDescriptor(&L->bias));
        DP_CUDNN_TRY(cudnnSetTensor4dDescriptor(L->bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                                1, l->out_c, 1, 1));
        s_find_t scratch, *find = cx->find ? s_find_alloc(cx, l, max_batch, &scratch) : NULL;
        int rc = s_plan_conv(cx, L, &L->plan[0], max_batch, find, cx->ws_limit, &need, err);
        s_find_free(find);
        if (rc < 0) goto fail;
        L->plan[0].used = ++cx->tick;
        if (need > ws_need) ws_need = need;
    }
    if (s_workspace_reserve(cx, ws_need, err) < 0) goto fail;
    if (bn_c > 0) /* a ghost batch has at least one sample: at most max_batch groups */
        DP_CUDA_TRY(cudaMalloc((void **)&cx->d_bn_sums,
                               (size_t)2 * bn_c * max_batch * sizeof(double)));
    dp_log_debug("%s: planned %d layers at batch %d, workspace %zu KiB", cx->name, m->n_layers,
                 max_batch, cx->ws_bytes >> 10);
    return 0;
fail:
    s_free_plans(cx);
    return -1;
}

/* The prepared layer for l, checked against l's shapes (misuse aborts). */
static s_layer_t *s_layer(s_cuda_t *cx, const dp_layer_t *l, dp_layer_kind_t kind)
{
    s_layer_t *L;
    if (l->index < 0 || l->index >= cx->n_layers || !cx->layers[l->index].planned) {
        fprintf(stderr, "cuda backend: %s: layer %d (%s) was not prepared\n", cx->name,
                l->index, l->name);
        abort();
    }
    L = &cx->layers[l->index];
    if (l->kind != kind || L->layer.kind != kind || L->layer.in_c != l->in_c ||
        L->layer.in_h != l->in_h || L->layer.in_w != l->in_w || L->layer.out_c != l->out_c ||
        L->layer.out_h != l->out_h || L->layer.out_w != l->out_w || L->layer.k != l->k ||
        L->layer.pad != l->pad || L->layer.stride != l->stride) {
        fprintf(stderr, "cuda backend: %s: layer %d (%s) differs from the one prepared\n",
                cx->name, l->index, l->name);
        abort();
    }
    return L;
}

/* The plan of conv layer L for batch B: cached, or made now in the least
 * recently used slot, growing the workspace if its algorithms need more. */
static s_conv_plan_t *s_conv_plan(s_cuda_t *cx, s_layer_t *L, int B)
{
    s_conv_plan_t *victim = &L->plan[0];
    char err[DP_ERR_LEN];
    size_t need = 0;
    for (int i = 0; i < S_PLANS; i++) {
        s_conv_plan_t *P = &L->plan[i];
        if (P->B == B) {
            P->used = ++cx->tick;
            return P;
        }
        if (P->B == 0 || (victim->B != 0 && P->used < victim->used)) victim = P;
    }
    if (B < 1) {
        fprintf(stderr, "cuda backend: %s: %s: batch %d < 1\n", cx->name, L->layer.name, B);
        abort();
    }
    if (s_plan_conv(cx, L, victim, B, NULL, cx->ws_limit, &need, err) < 0) {
        fprintf(stderr, "cuda backend: %s\n", err);
        abort();
    }
    if (need > cx->ws_bytes) {
        if (s_workspace_reserve(cx, need, err) < 0) {
            fprintf(stderr, "cuda backend: %s\n", err);
            abort();
        }
        dp_log_debug("%s: %s at batch %d: workspace grown to %zu KiB", cx->name, L->layer.name, B,
                     need >> 10);
    }
    victim->used = ++cx->tick;
    return victim;
}

/* ---- memory ------------------------------------------------------------- */

static void *s_alloc(dp_backend_t *be, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
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
    s_cuda_t *cx;
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
    s_cuda_t *cx = s_enter(be);
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
    s_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->stream));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

/* On cx->up, beside the compute stream; waits for its own copy only. */
static void s_stage_upload(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->up));
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->up));
}

/* The event marks how far the compute stream was queued: the copy waits for
 * that, not for ops queued later. */
static void s_download_async(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
    if (!bytes) return;
    DP_CUDA_CHECK(cudaEventRecord(cx->queued, cx->stream));
    DP_CUDA_CHECK(cudaStreamWaitEvent(cx->down, cx->queued, 0));
    DP_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cx->down));
    DP_CUDA_CHECK(cudaEventRecord(cx->copied[cx->n_copies++ % S_COPY_MARKS], cx->down));
}

static void s_download_wait(dp_backend_t *be)
{
    s_cuda_t *cx = s_enter(be);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->down));
    cx->n_copies = 0;
}

static void s_download_wait_first(dp_backend_t *be, unsigned n)
{
    s_cuda_t *cx = s_enter(be);
    if (n > cx->n_copies) n = cx->n_copies;
    if (n) DP_CUDA_CHECK(cudaEventSynchronize(cx->copied[(n - 1) % S_COPY_MARKS]));
}

/* In order with the ops on the compute stream; the DMA engine reads the
 * pinned src later, so it must hold still until the stream drains. */
static void s_upload_async(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
    if (bytes) DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cx->stream));
}

static void *s_host_alloc(dp_backend_t *be, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
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

static void s_synchronize(dp_backend_t *be)
{
    s_cuda_t *cx = s_enter(be);
    DP_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
}

/* ---- layer ops ---------------------------------------------------------- */

static const float s_one = 1.0f, s_zero = 0.0f;

static void s_conv_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                           const float *d_in, const float *d_w, const float *d_b)
{
    s_cuda_t *cx = s_enter(be);
    s_layer_t *L = s_layer(cx, l, DP_LAYER_CONV);
    s_conv_plan_t *P = s_conv_plan(cx, L, B);
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
    s_cuda_t *cx = s_enter(be);
    s_layer_t *L = s_layer(cx, l, DP_LAYER_CONV);
    s_conv_plan_t *P = s_conv_plan(cx, L, B);
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
    s_cuda_t *cx = s_enter(be);
    dp_relu_forward_gpu(d_out, d_in, n, cx->stream);
}

static void s_relu_backward(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                            const float *d_out)
{
    s_cuda_t *cx = s_enter(be);
    dp_relu_backward_gpu(d_din, d_dout, d_out, n, cx->stream);
}

static void s_maxpool_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                              const float *d_in)
{
    s_cuda_t *cx = s_enter(be);
    dp_pool_dims_t d;
    s_layer(cx, l, DP_LAYER_MAXPOOL);
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_forward_gpu(d_out, d_in, &d, cx->stream);
}

static void s_maxpool_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                               const float *d_dout, const float *d_in, const float *d_out)
{
    s_cuda_t *cx = s_enter(be);
    dp_pool_dims_t d;
    s_layer(cx, l, DP_LAYER_MAXPOOL);
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_backward_gpu(d_din, d_dout, d_in, d_out, &d, cx->stream);
}

/* cuBLAS is column-major: a row-major [R,C] matrix is a column-major [C,R]
 * one with leading dimension C, i.e. its transpose. So each row-major
 * product below is computed as its transpose. */
static void s_fc_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                         const float *d_in, const float *d_w, const float *d_b)
{
    s_cuda_t *cx = s_enter(be);
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
    s_cuda_t *cx = s_enter(be);
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
    s_cuda_t *cx = s_enter(be);
    dp_softmax_xent_forward_gpu(d_probs, d_loss, d_logits, d_labels, B, classes, cx->stream);
}

static void s_softmax_xent_backward(dp_backend_t *be, int B, int classes, float *d_dlogits,
                                    const float *d_probs, const int *d_labels)
{
    s_cuda_t *cx = s_enter(be);
    dp_softmax_xent_backward_gpu(d_dlogits, d_probs, d_labels, B, classes, cx->stream);
}

/* The residual networks' layers (resnet_gpu.cu), their semantics those of
 * the CPU backend's (kernels/backend.h). */

static void s_bn_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                         float *d_out, const float *d_in, const float *d_w, const float *d_b,
                         float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    s_cuda_t *cx = s_enter(be);
    int C = l->in_c, HW = l->in_h * l->in_w;
    s_layer(cx, l, DP_LAYER_BN);
    if (!train) {
        dp_bn_forward_eval_gpu(d_out, d_in, d_w, d_b, d_rm, d_rv, B, C, HW, l->eps, cx->stream);
        return;
    }
    if (G < 1 || G > B) G = B;
    int groups = (B + G - 1) / G;
    long last = B - (long)(groups - 1) * G;
    dp_bn_forward_train_gpu(d_out, d_save, d_in, d_w, d_b, B, G, C, HW, l->eps, cx->stream);
    dp_bn_running_update_gpu(d_rm, d_rv, d_nbt, d_save, (long)G * HW, last * HW, groups, C,
                             l->momentum, cx->stream);
}

static void s_bn_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w, const float *d_save)
{
    s_cuda_t *cx = s_enter(be);
    s_layer(cx, l, DP_LAYER_BN);
    if (B > cx->max_batch) {
        fprintf(stderr, "cuda backend: %s: %s: batch %d above the %d prepared\n", cx->name,
                l->name, B, cx->max_batch);
        abort();
    }
    if (G < 1 || G > B) G = B;
    dp_bn_backward_gpu(d_din, d_dw, d_db, d_dout, d_in, d_w, d_save, cx->d_bn_sums, B, G,
                       l->in_c, l->in_h * l->in_w, l->eps, cx->stream);
}

static void s_shortcut_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                               const float *d_a, const float *d_src)
{
    s_cuda_t *cx = s_enter(be);
    dp_shortcut_dims_t d;
    s_layer(cx, l, DP_LAYER_ADD);
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_add_forward_gpu(d_out, d_a, d_src, &d, cx->stream);
}

static void s_shortcut_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_dsrc,
                                const float *d_dout)
{
    s_cuda_t *cx = s_enter(be);
    dp_shortcut_dims_t d;
    s_layer(cx, l, DP_LAYER_ADD);
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_backward_gpu(d_dsrc, d_dout, &d, cx->stream);
}

static void s_gap_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                          const float *d_in)
{
    s_cuda_t *cx = s_enter(be);
    s_layer(cx, l, DP_LAYER_GAP);
    dp_gap_forward_gpu(d_out, d_in, B, l->in_c, l->in_h * l->in_w, cx->stream);
}

static void s_gap_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                           const float *d_dout)
{
    s_cuda_t *cx = s_enter(be);
    s_layer(cx, l, DP_LAYER_GAP);
    dp_gap_backward_gpu(d_din, d_dout, B, l->in_c, l->in_h * l->in_w, cx->stream);
}

static void s_dropout_forward(dp_backend_t *be, const dp_layer_t *l, int B,
                              unsigned long long seed, unsigned long long step,
                              unsigned long long sample0, float *d_out, const float *d_in)
{
    s_cuda_t *cx = s_enter(be);
    s_layer(cx, l, DP_LAYER_DROPOUT);
    dp_dropout_gpu(d_out, d_in, B, dp_layer_out_size(l), l->p, seed, step, sample0, cx->stream);
}

static void s_dropout_backward(dp_backend_t *be, const dp_layer_t *l, int B,
                               unsigned long long seed, unsigned long long step,
                               unsigned long long sample0, float *d_din, const float *d_dout)
{
    s_cuda_t *cx = s_enter(be);
    s_layer(cx, l, DP_LAYER_DROPOUT);
    dp_dropout_gpu(d_din, d_dout, B, dp_layer_out_size(l), l->p, seed, step, sample0, cx->stream);
}

static void s_vec_add(dp_backend_t *be, size_t n, float *d_dst, const float *d_src)
{
    s_cuda_t *cx = s_enter(be);
    dp_vec_add_gpu(d_dst, d_src, n, cx->stream);
}

/* On the compute stream, ordered with the ops around it. */
static void s_copy(dp_backend_t *be, void *d_dst, const void *d_src, size_t bytes)
{
    s_cuda_t *cx = s_enter(be);
    if (!bytes || d_dst == d_src) return;
    DP_CUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, cx->stream));
}

static void s_optim_step(dp_backend_t *be, const dp_optim_conf_t *c, float lr, float *d_w,
                         const float *d_g, float *d_state, size_t n, long t)
{
    s_cuda_t *cx = s_enter(be);
    dp_optim_step_gpu(c, lr, d_w, d_g, d_state, n, t, cx->stream);
}

/* ---- open / destroy ----------------------------------------------------- */

static void s_destroy(dp_backend_t *be)
{
    s_cuda_t *cx = s_cx(be);
    if (cx) {
        /* Nothing on the device to free when opening failed early (and no
         * CUDA call on a machine without one). */
        if (cx->stream) {
            cudaSetDevice(cx->dev);
            cudaDeviceSynchronize();
        }
        s_free_plans(cx);
        if (cx->cublas) cublasDestroy(cx->cublas);
        if (cx->cudnn) cudnnDestroy(cx->cudnn);
        if (cx->queued) cudaEventDestroy(cx->queued);
        for (int k = 0; k < S_COPY_MARKS; k++)
            if (cx->copied[k]) cudaEventDestroy(cx->copied[k]);
        if (cx->down) cudaStreamDestroy(cx->down);
        if (cx->up) cudaStreamDestroy(cx->up);
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
    .synchronize = s_synchronize,
    .stage_upload = s_stage_upload,
    .download_async = s_download_async,
    .download_wait_first = s_download_wait_first,
    .upload_async = s_upload_async,
    .download_wait = s_download_wait,
    .conv_forward = s_conv_forward,
    .conv_backward = s_conv_backward,
    .relu_forward = s_relu_forward,
    .relu_backward = s_relu_backward,
    .maxpool_forward = s_maxpool_forward,
    .maxpool_backward = s_maxpool_backward,
    .fc_forward = s_fc_forward,
    .fc_backward = s_fc_backward,
    .softmax_xent_forward = s_softmax_xent_forward,
    .softmax_xent_backward = s_softmax_xent_backward,
    .bn_forward = s_bn_forward,
    .bn_backward = s_bn_backward,
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
    s_cuda_t *cx = dp_calloc(1, sizeof *cx);
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
    DP_CUDA_TRY(cudaStreamCreateWithFlags(&cx->down, cudaStreamNonBlocking));
    DP_CUDA_TRY(cudaEventCreateWithFlags(&cx->queued, cudaEventDisableTiming));
    for (int k = 0; k < S_COPY_MARKS; k++)
        DP_CUDA_TRY(cudaEventCreateWithFlags(&cx->copied[k], cudaEventDisableTiming));

    dp_log_info("%s: %s (sm_%d%d, %zu MiB), cuDNN %zu, TF32 %s, %s algorithms (%s)", cx->name,
                prop.name, prop.major, prop.minor, prop.totalGlobalMem >> 20, cudnn_ver,
                cx->tf32 ? "on" : "off", cx->exact ? "exact" : "fastest",
                cx->find ? "timed at prepare" : "cuDNN's heuristic");
    *out = be;
    return 0;
fail:
    s_destroy(be);
    return -1;
}
