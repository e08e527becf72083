// resnet_gpu: the CUDA kernels of the residual networks' layers — batch
// norm (training by ghost batches, evaluation, backward, the running
// statistics), the residual shortcut (identity or option A), global average
// pooling, dropout, and the vector add and copy the executor's graph uses.
//
// They follow the CPU reference (kernels/cpu/ref.c) formula by formula:
// batch statistics in double, two passes (the mean, then the squared
// deviations), the biased variance saved for the backward, PyTorch's
// running update with the unbiased variance, group by group then averaged
// in group order (dp_bn_running_update, in float, the same expression), and
// dropout's mask from the one hash of kernels/dropout_mask.h. Every
// reduction is a fixed tree (no atomics): the same bits on every run.
//
// Why our own batch norm beside cuDNN's (bn_cudnn.c, which takes the
// training step with the batch's own statistics): the ghost batches
// (--bn-ghost-batch) need each group's statistics kept and the groups'
// running updates averaged, which cuDNN's training call (one batch, its
// own saved inverse deviation, a running average it chains) does not
// express; these kernels keep the CPU path's layout of d_save (mean, then
// biased variance, per group), evaluation is one pass of them (the relu
// in it), and DP_CUDA_BN=own runs them alone.
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/dropout_mask.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

using dp_cuda::kThreads;
const auto s_blocks = dp_cuda::blocks;

// The block's sum of v in a fixed tree (blockDim.x == kThreads, a power of 2).
__device__ double s_block_sum(double v, double *part)
{
    part[threadIdx.x] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    double s = part[0];
    __syncthreads();  // part is reused by the next sum
    return s;
}

// Ghost batch g of B samples in groups of G: first sample and size.
__device__ __host__ int s_group(int B, int G, int g, int *n0)
{
    *n0 = g * G;
    return B - *n0 < G ? B - *n0 : G;
}

// Block (c, g): channel c's mean and biased variance over group g.
__global__ void k_bn_stats(float *save, const float *in, int B, int G, int C, int HW)
{
    __shared__ double part[kThreads];
    int c = blockIdx.x, g = blockIdx.y, n0;
    int nb = s_group(B, G, g, &n0);
    size_t n = (size_t)nb * HW;
    double s = 0;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x)
        s += in[((size_t)(n0 + j / HW) * C + c) * HW + j % HW];
    double mu = s_block_sum(s, part) / (double)n;
    double q = 0;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
        double x = in[((size_t)(n0 + j / HW) * C + c) * HW + j % HW] - mu;
        q += x * x;
    }
    q = s_block_sum(q, part);
    if (threadIdx.x == 0) {
        save[(size_t)2 * C * g + c] = (float)mu;
        save[(size_t)2 * C * g + C + c] = (float)(q / (double)n);
    }
}

// out = w (x - mean) / sqrt(var + eps) + b, the statistics of the sample's
// group: group g's at mean + g * stride (training: d_save's layout) or the
// running ones for all (stride 0, G = B); relu: then max(0, .).
__global__ void k_bn_apply(float *out, const float *in, const float *w, const float *b,
                           const float *mean, const float *var, size_t stride, int B, int G,
                           int C, int HW, float eps, int relu)
{
    size_t n = (size_t)B * C * HW;
    DP_GRID_STRIDE(i, n)
    {
        size_t k = i / ((size_t)C * HW);
        int c = (int)(i / HW % C);
        size_t at = (k / G) * stride + c;
        double inv = 1.0 / sqrt((double)var[at] + eps);
        float y = (float)(w[c] * (in[i] - (double)mean[at]) * inv + b[c]);
        out[i] = relu && !(y > 0.0f) ? 0.0f : y;
    }
}

// dp_bn_running_update's expression, one thread a channel.
__global__ void k_bn_running(float *rm, float *rv, float *nbt, const float *save, long n,
                             long n_last, int groups, int C, float momentum)
{
    float inv = 1.0f / (float)groups, keep = 1.0f - momentum;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float am = 0.0f, av = 0.0f;
        for (int g = 0; g < groups; g++) {
            const float *sv = save + (size_t)2 * C * g;
            long k = g == groups - 1 ? n_last : n;
            float unb = k > 1 ? sv[C + c] * ((float)k / (float)(k - 1)) : sv[C + c];
            am = __fadd_rn(am, __fadd_rn(__fmul_rn(keep, rm[c]), __fmul_rn(momentum, sv[c])));
            av = __fadd_rn(av, __fadd_rn(__fmul_rn(keep, rv[c]), __fmul_rn(momentum, unb)));
        }
        rm[c] = groups == 1 ? am : __fmul_rn(am, inv);
        rv[c] = groups == 1 ? av : __fmul_rn(av, inv);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *nbt += 1.0f;
}

// After cuDNN's training forward: its saved mean and inverse deviation
// into d_save's layout (mean, biased variance = 1 / inv^2 - eps), and the
// step counted, one thread a channel.
__global__ void k_bn_cudnn_saved(float *save, float *nbt, const float *saved, int C, float eps)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        double inv = saved[C + c];
        double var = 1.0 / (inv * inv) - (double)eps;
        save[c] = saved[c];
        save[C + c] = var > 0 ? (float)var : 0.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *nbt += 1.0f;
}

// Block (c, g): sum dout and sum dout * xhat over group g, in double, at
// sums[2 (g C + c)] and the next.
__global__ void k_bn_backward_sums(double *sums, const float *dout, const float *in,
                                   const float *save, int B, int G, int C, int HW, float eps)
{
    __shared__ double part[kThreads];
    int c = blockIdx.x, g = blockIdx.y, n0;
    int nb = s_group(B, G, g, &n0);
    size_t n = (size_t)nb * HW;
    double mean = save[(size_t)2 * C * g + c];
    double inv = 1.0 / sqrt((double)save[(size_t)2 * C * g + C + c] + eps);
    double sg = 0, sgx = 0;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
        size_t at = ((size_t)(n0 + j / HW) * C + c) * HW + j % HW;
        sg += dout[at];
        sgx += dout[at] * ((in[at] - mean) * inv);
    }
    sg = s_block_sum(sg, part);
    sgx = s_block_sum(sgx, part);
    if (threadIdx.x == 0) {
        sums[2 * ((size_t)g * C + c)] = sg;
        sums[2 * ((size_t)g * C + c) + 1] = sgx;
    }
}

// dw, db: each group's sum rounded to float, added in group order (the CPU
// backend's order).
__global__ void k_bn_backward_params(float *dw, float *db, const double *sums, int groups, int C)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float w = 0.0f, b = 0.0f;
        for (int g = 0; g < groups; g++) {
            float sw = (float)sums[2 * ((size_t)g * C + c) + 1];
            float sb = (float)sums[2 * ((size_t)g * C + c)];
            w = g ? __fadd_rn(w, sw) : sw;
            b = g ? __fadd_rn(b, sb) : sb;
        }
        dw[c] = w;
        db[c] = b;
    }
}

// din = w inv (dout - sg / n - xhat sgx / n), the sample's group's sums.
__global__ void k_bn_backward_din(float *din, const float *dout, const float *in, const float *w,
                                  const float *save, const double *sums, int B, int G, int C,
                                  int HW, float eps)
{
    size_t total = (size_t)B * C * HW;
    DP_GRID_STRIDE(i, total)
    {
        int k = (int)(i / ((size_t)C * HW)), c = (int)(i / HW % C), g = k / G, n0;
        double n = (double)s_group(B, G, g, &n0) * HW;
        double mean = save[(size_t)2 * C * g + c];
        double inv = 1.0 / sqrt((double)save[(size_t)2 * C * g + C + c] + eps);
        double sg = sums[2 * ((size_t)g * C + c)], sgx = sums[2 * ((size_t)g * C + c) + 1];
        double xh = (in[i] - mean) * inv;
        din[i] = (float)(w[c] * inv * (dout[i] - sg / n - xh * sgx / n));
    }
}

// The input element the shortcut puts at output (k, oc, oy, ox), or -1.
__device__ long s_short_src(const dp_shortcut_dims_t &d, int k, int oc, int oy, int ox)
{
    int c = oc - (d.OC - d.C) / 2;
    if (c < 0 || c >= d.C) return -1;
    return (long)((((size_t)k * d.C + c) * d.H + (size_t)oy * d.stride) * d.W +
                  (size_t)ox * d.stride);
}

// out = a + shortcut(in), one thread an output element (out may be a).
__global__ void k_shortcut_forward(float *out, const float *a, const float *in,
                                   dp_shortcut_dims_t d)
{
    size_t n = (size_t)d.B * d.OC * d.OH * d.OW;
    DP_GRID_STRIDE(i, n)
    {
        int ox = (int)(i % d.OW), oy = (int)(i / d.OW % d.OH);
        int oc = (int)(i / ((size_t)d.OW * d.OH) % d.OC);
        int k = (int)(i / ((size_t)d.OW * d.OH * d.OC));
        long src = s_short_src(d, k, oc, oy, ox);
        out[i] = a[i] + (src < 0 ? 0.0f : in[src]);
    }
}

// din = shortcut^T(dout), one thread an input element: the output it went
// to, or 0 (a row or column the stride skipped).
__global__ void k_shortcut_backward(float *din, const float *dout, dp_shortcut_dims_t d)
{
    size_t n = (size_t)d.B * d.C * d.H * d.W;
    DP_GRID_STRIDE(i, n)
    {
        int x = (int)(i % d.W), y = (int)(i / d.W % d.H);
        int c = (int)(i / ((size_t)d.W * d.H) % d.C);
        int k = (int)(i / ((size_t)d.W * d.H * d.C));
        float v = 0.0f;
        if (y % d.stride == 0 && x % d.stride == 0 && y / d.stride < d.OH && x / d.stride < d.OW) {
            int oc = c + (d.OC - d.C) / 2;
            v = dout[(((size_t)k * d.OC + oc) * d.OH + y / d.stride) * d.OW + x / d.stride];
        }
        din[i] = v;
    }
}

// One thread a plane (sample, channel): its mean over HW, in double.
__global__ void k_gap_forward(float *out, const float *in, size_t planes, int HW)
{
    DP_GRID_STRIDE(p, planes)
    {
        double s = 0;
        for (int i = 0; i < HW; i++) s += in[p * HW + i];
        out[p] = (float)(s / HW);
    }
}

__global__ void k_gap_backward(float *din, const float *dout, size_t planes, int HW)
{
    size_t n = planes * HW;
    DP_GRID_STRIDE(i, n) din[i] = dout[i / HW] / (float)HW;
}

// Inverted dropout of x[B,N]; the backward is the same map on the gradient.
__global__ void k_dropout(float *out, const float *in, int B, size_t N, float p,
                          unsigned long long seed, unsigned long long step,
                          unsigned long long sample0)
{
    float scale = 1.0f / (1.0f - p);
    size_t n = (size_t)B * N;
    DP_GRID_STRIDE(i, n)
    {
        size_t k = i / N, e = i % N;
        out[i] = dp_dropout_mask(seed, step, sample0 + (unsigned)k, e, p) ? in[i] * scale : 0.0f;
    }
}

__global__ void k_vec_add(float *dst, const float *src, size_t n)
{
    DP_GRID_STRIDE(i, n) dst[i] += src[i];
}

}  // namespace

extern "C" {

void dp_bn_forward_train_gpu(float *d_out, float *d_save, const float *d_in, const float *d_w,
                             const float *d_b, int B, int G, int C, int HW, float eps,
                             cudaStream_t st)
{
    if (B < 1 || C < 1) return;
    int groups = (B + G - 1) / G;
    k_bn_stats<<<dim3((unsigned)C, (unsigned)groups), kThreads, 0, st>>>(d_save, d_in, B, G, C, HW);
    DP_CUDA_LAUNCHED();
    size_t n = (size_t)B * C * HW;
    k_bn_apply<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, d_w, d_b, d_save, d_save + C,
                                                 (size_t)2 * C, B, G, C, HW, eps, 0);
    DP_CUDA_LAUNCHED();
}

void dp_bn_forward_eval_gpu(float *d_out, const float *d_in, const float *d_w, const float *d_b,
                            const float *d_rm, const float *d_rv, int B, int C, int HW, float eps,
                            int relu, cudaStream_t st)
{
    size_t n = (size_t)B * C * HW;
    if (n == 0) return;
    k_bn_apply<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, d_w, d_b, d_rm, d_rv, 0, B, B, C,
                                                 HW, eps, relu);
    DP_CUDA_LAUNCHED();
}

void dp_bn_cudnn_saved_gpu(float *d_save, float *d_nbt, const float *d_saved, int C, float eps,
                           cudaStream_t st)
{
    if (C < 1) return;
    k_bn_cudnn_saved<<<s_blocks((size_t)C), kThreads, 0, st>>>(d_save, d_nbt, d_saved, C, eps);
    DP_CUDA_LAUNCHED();
}

void dp_bn_running_update_gpu(float *d_rm, float *d_rv, float *d_nbt, const float *d_save,
                              long n, long n_last, int groups, int C, float momentum,
                              cudaStream_t st)
{
    if (C < 1) return;
    k_bn_running<<<s_blocks((size_t)C), kThreads, 0, st>>>(d_rm, d_rv, d_nbt, d_save, n, n_last,
                                                           groups, C, momentum);
    DP_CUDA_LAUNCHED();
}

void dp_bn_backward_gpu(float *d_din, float *d_dw, float *d_db, const float *d_dout,
                        const float *d_in, const float *d_w, const float *d_save, double *d_sums,
                        int B, int G, int C, int HW, float eps, cudaStream_t st)
{
    if (B < 1 || C < 1) return;
    int groups = (B + G - 1) / G;
    k_bn_backward_sums<<<dim3((unsigned)C, (unsigned)groups), kThreads, 0, st>>>(
        d_sums, d_dout, d_in, d_save, B, G, C, HW, eps);
    DP_CUDA_LAUNCHED();
    k_bn_backward_params<<<s_blocks((size_t)C), kThreads, 0, st>>>(d_dw, d_db, d_sums, groups, C);
    DP_CUDA_LAUNCHED();
    if (!d_din) return;
    size_t n = (size_t)B * C * HW;
    k_bn_backward_din<<<s_blocks(n), kThreads, 0, st>>>(d_din, d_dout, d_in, d_w, d_save, d_sums,
                                                        B, G, C, HW, eps);
    DP_CUDA_LAUNCHED();
}

void dp_shortcut_add_forward_gpu(float *d_out, const float *d_a, const float *d_in,
                                 const dp_shortcut_dims_t *d, cudaStream_t st)
{
    size_t n = (size_t)d->B * d->OC * d->OH * d->OW;
    if (n == 0) return;
    k_shortcut_forward<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_a, d_in, *d);
    DP_CUDA_LAUNCHED();
}

void dp_shortcut_backward_gpu(float *d_din, const float *d_dout, const dp_shortcut_dims_t *d,
                              cudaStream_t st)
{
    size_t n = (size_t)d->B * d->C * d->H * d->W;
    if (n == 0) return;
    k_shortcut_backward<<<s_blocks(n), kThreads, 0, st>>>(d_din, d_dout, *d);
    DP_CUDA_LAUNCHED();
}

void dp_gap_forward_gpu(float *d_out, const float *d_in, int B, int C, int HW, cudaStream_t st)
{
    size_t planes = (size_t)B * C;
    if (planes == 0) return;
    k_gap_forward<<<s_blocks(planes), kThreads, 0, st>>>(d_out, d_in, planes, HW);
    DP_CUDA_LAUNCHED();
}

void dp_gap_backward_gpu(float *d_din, const float *d_dout, int B, int C, int HW, cudaStream_t st)
{
    size_t planes = (size_t)B * C;
    if (planes == 0 || HW < 1) return;
    k_gap_backward<<<s_blocks(planes * HW), kThreads, 0, st>>>(d_din, d_dout, planes, HW);
    DP_CUDA_LAUNCHED();
}

void dp_dropout_gpu(float *d_out, const float *d_in, int B, size_t N, float p,
                    unsigned long long seed, unsigned long long step, unsigned long long sample0,
                    cudaStream_t st)
{
    size_t n = (size_t)B * N;
    if (n == 0) return;
    k_dropout<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, B, N, p, seed, step, sample0);
    DP_CUDA_LAUNCHED();
}

void dp_vec_add_gpu(float *d_dst, const float *d_src, size_t n, cudaStream_t st)
{
    if (n == 0) return;
    k_vec_add<<<s_blocks(n), kThreads, 0, st>>>(d_dst, d_src, n);
    DP_CUDA_LAUNCHED();
}

}  // extern "C"
