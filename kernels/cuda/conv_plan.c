/* conv_plan: cuDNN's plans for the CUDA backend's conv layers (see
 * conv_plan.h).
 *
 * Invariants:
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
 * - FP32 math by default (CUDNN_FMA_MATH; DP_CUDA_TF32=1 allows TF32 tensor
 *   cores) and "exact" algorithms (see s_pick), as backend_cuda.c says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cuda/conv_plan.h"

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
static cudnnStatus_t s_dir_rank(dp_cuda_t *cx, dp_cuda_layer_t *L, dp_cuda_conv_plan_t *P, s_dir_t dir,
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
static cudnnStatus_t s_dir_workspace(dp_cuda_t *cx, dp_cuda_layer_t *L, dp_cuda_conv_plan_t *P, s_dir_t dir,
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
static int s_pick(dp_cuda_t *cx, dp_cuda_layer_t *L, dp_cuda_conv_plan_t *P, s_dir_t dir,
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
static int s_plan_conv(dp_cuda_t *cx, dp_cuda_layer_t *L, dp_cuda_conv_plan_t *P, int B,
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

static void s_free_layer(dp_cuda_layer_t *L)
{
    for (int i = 0; i < DP_CUDA_PLANS; i++) {
        if (L->plan[i].x) cudnnDestroyTensorDescriptor(L->plan[i].x);
        if (L->plan[i].y) cudnnDestroyTensorDescriptor(L->plan[i].y);
    }
    if (L->bias) cudnnDestroyTensorDescriptor(L->bias);
    if (L->w) cudnnDestroyFilterDescriptor(L->w);
    if (L->conv) cudnnDestroyConvolutionDescriptor(L->conv);
    dp_cuda_bn_free(L);
    memset(L, 0, sizeof *L);
}

void dp_cuda_plan_free(dp_cuda_t *cx)
{
    for (int i = 0; i < DP_MAX_LAYERS; i++) s_free_layer(&cx->layers[i]);
    cx->n_layers = 0;
    if (cx->d_ws) cudaFree(cx->d_ws);
    cx->d_ws = NULL;
    if (cx->d_bn_sums) cudaFree(cx->d_bn_sums);
    cx->d_bn_sums = NULL;
    if (cx->d_bn_dy) cudaFree(cx->d_bn_dy);
    cx->d_bn_dy = NULL;
    if (cx->relu) cudnnDestroyActivationDescriptor(cx->relu);
    cx->relu = NULL;
    cx->ws_bytes = 0;
}

/* The one cuDNN workspace, at least `need` bytes: replaced (after the
 * compute stream has drained: queued ops may use the old one) when smaller. */
static int s_workspace_reserve(dp_cuda_t *cx, size_t need, char *err)
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
static s_find_t *s_find_alloc(dp_cuda_t *cx, const dp_layer_t *l, int B, s_find_t *f)
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

int dp_cuda_plan_prepare(dp_cuda_t *cx, const dp_model_t *m, int max_batch, char *err)
{
    size_t ws_need = 0;
    if (max_batch < 1) return dp_err(err, "%s: prepare: max_batch %d < 1", cx->name, max_batch);
    if (m->n_layers > DP_MAX_LAYERS)
        return dp_err(err, "%s: prepare: %d layers > %d", cx->name, m->n_layers, DP_MAX_LAYERS);
    DP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
    dp_cuda_plan_free(cx); /* a second prepare replans from scratch */
    cx->max_batch = max_batch;
    cx->n_layers = m->n_layers;
    int bn_c = 0;      /* the widest batch norm */
    size_t bn_n = 0;   /* the largest, in floats a sample */
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        dp_cuda_layer_t *L = &cx->layers[i];
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
        if (l->kind == DP_LAYER_BN) {
            size_t per = (size_t)l->in_c * l->in_h * l->in_w;
            if (l->in_c > bn_c) bn_c = l->in_c;
            if (per > bn_n) bn_n = per;
            if (dp_cuda_bn_plan(cx, L, max_batch, &need, err) < 0) goto fail;
            if (need > ws_need) ws_need = need;
        }
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
    if (bn_c > 0) { /* a ghost batch has at least one sample: at most max_batch groups */
        DP_CUDA_TRY(cudaMalloc((void **)&cx->d_bn_sums,
                               (size_t)2 * bn_c * max_batch * sizeof(double)));
        DP_CUDA_TRY(cudaMalloc((void **)&cx->d_bn_dy, bn_n * max_batch * sizeof(float)));
    }
    dp_log_debug("%s: planned %d layers at batch %d, workspace %zu KiB", cx->name, m->n_layers,
                 max_batch, cx->ws_bytes >> 10);
    return 0;
fail:
    dp_cuda_plan_free(cx);
    return -1;
}

/* The prepared layer for l, checked against l's shapes (misuse aborts). */
dp_cuda_layer_t *dp_cuda_layer(dp_cuda_t *cx, const dp_layer_t *l, dp_layer_kind_t kind)
{
    dp_cuda_layer_t *L;
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
dp_cuda_conv_plan_t *dp_cuda_conv_plan(dp_cuda_t *cx, dp_cuda_layer_t *L, int B)
{
    dp_cuda_conv_plan_t *victim = &L->plan[0];
    char err[DP_ERR_LEN];
    size_t need = 0;
    for (int i = 0; i < DP_CUDA_PLANS; i++) {
        dp_cuda_conv_plan_t *P = &L->plan[i];
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
