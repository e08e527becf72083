// ops_gpu: the CUDA kernels of our own — ReLU, tanh, max-pool, bias broadcast
// and bias gradient, softmax + cross-entropy, the actor-critic loss and the
// optimizers' update. The
// convolutions (cuDNN) and the fully connected GEMMs (cuBLAS) are driven from
// backend_cuda.c.
//
// Dimensions: B = batch, C = channels, H, W = input height and width,
// K = pool window, OH, OW = output height and width, S = positions per
// channel (OH * OW after a conv, 1 after an fc layer). NCHW float32.
//
// Each launcher has the CPU kernel's parameters in the same order (outputs
// first, device pointers d_*) plus the stream; it queues asynchronously and
// checks the launch. Every kernel gives the same result on every run (no
// atomics, fixed reduction order), and max-pool follows the CPU reference's
// tie rule exactly.
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/ac_row.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

using dp_cuda::kThreads;
const auto s_blocks = dp_cuda::blocks;

__global__ void k_relu_forward(float *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = in[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void k_relu_backward(float *din, const float *dout, const float *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

__global__ void k_tanh_forward(float *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tanhf(in[i]);
}

__global__ void k_tanh_backward(float *din, const float *dout, const float *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        // the CPU's expression rounded as it rounds it: left alone, nvcc
        // contracts 1 - out * out into one fma, an ulp away from the CPU
        din[i] = __fmul_rn(dout[i], __fsub_rn(1.0f, __fmul_rn(out[i], out[i])));
}

// The actor-critic head: its rows as kernels/ac_loss.c computes them (kernels/ac_row.h).
constexpr int kAcThreads = 256;  // one block: the head's batch is a few segments

// One block; thread t takes rows t, t + 256, ...; thread 0 adds the
// threads' three sums in thread order: the same loss on every run.
// action NULL: the policy alone.
__global__ void k_ac_loss_forward(float *probs, float *loss, const float *logits,
                                  const float *value, const int *action, const float *ret, int B,
                                  int A, float beta, float vcoef)
{
    __shared__ double sum[3][kAcThreads];
    double lp[DP_AC_MAX_ACTIONS], p[DP_AC_MAX_ACTIONS];
    double pol = 0, val = 0, ent = 0;
    for (int n = threadIdx.x; n < B; n += blockDim.x) {
        double h = dp_ac_row_log_softmax(logits + (size_t)n * A, A, lp, p);
        for (int k = 0; k < A; k++) probs[(size_t)n * A + k] = (float)p[k];
        if (!action) continue;
        int a = action[n];
        double adv = (double)ret[n] - value[n];
        pol += (a >= 0 && a < A) ? -adv * lp[a] : (double)__int_as_float(0x7fc00000);
        val += adv * adv;
        ent += h;
    }
    if (!action) return;
    sum[0][threadIdx.x] = pol, sum[1][threadIdx.x] = val, sum[2][threadIdx.x] = ent;
    __syncthreads();
    if (threadIdx.x == 0) {
        double P = 0, V = 0, E = 0;
        for (int t = 0; t < (int)blockDim.x; t++) P += sum[0][t], V += sum[1][t], E += sum[2][t];
        *loss = (float)(P / B + vcoef * (V / B) - beta * (E / B));
    }
}

__global__ void k_ac_loss_backward(float *dlogits, float *dvalue, const float *logits,
                                   const float *value, const int *action, const float *ret, int B,
                                   int A, float beta, float vcoef)
{
    double lp[DP_AC_MAX_ACTIONS], p[DP_AC_MAX_ACTIONS];
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < B; n += gridDim.x * blockDim.x) {
        double h = dp_ac_row_log_softmax(logits + (size_t)n * A, A, lp, p);
        dp_ac_row_grad(dlogits + (size_t)n * A, dvalue + n, lp, p, h, value[n], action[n], ret[n],
                       B, A, beta, vcoef);
    }
}

// One thread per output element (b, c, oy, ox).
__global__ void k_maxpool_forward(float *out, const float *in, dp_pool_dims_t d)
{
    size_t n = (size_t)d.B * d.C * d.OH * d.OW;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox = (int)(i % d.OW);
        int oy = (int)(i / d.OW % d.OH);
        size_t plane = i / ((size_t)d.OW * d.OH);  // b * C + c
        const float *src = in + plane * d.H * d.W;
        float m = -INFINITY;
        for (int ky = 0; ky < d.K; ky++)
            for (int kx = 0; kx < d.K; kx++) {
                float v = src[(oy * d.stride + ky) * d.W + ox * d.stride + kx];
                if (v > m) m = v;  // same comparison as the reference (NaN never wins)
            }
        out[i] = m;
    }
}

// One thread per input element (b, c, y, x): for each window covering it, in
// the reference's order (oy, then ox, ascending), find the window's first
// element equal to its max; if that is this element, add the window's
// gradient. Elements no window covers (trailing rows / cols) get 0.
__global__ void k_maxpool_backward(float *din, const float *dout, const float *in,
                                   const float *out, dp_pool_dims_t d)
{
    size_t n = (size_t)d.B * d.C * d.H * d.W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int x = (int)(i % d.W);
        int y = (int)(i / d.W % d.H);
        size_t plane = i / ((size_t)d.W * d.H);
        const float *src = in + plane * d.H * d.W;
        const float *o = out + plane * d.OH * d.OW;
        const float *g = dout + plane * d.OH * d.OW;
        // windows oy with oy*stride <= y < oy*stride + K, likewise x
        int oy0 = y < d.K ? 0 : (y - d.K) / d.stride + 1;
        int ox0 = x < d.K ? 0 : (x - d.K) / d.stride + 1;
        int oy1 = min(y / d.stride, d.OH - 1);
        int ox1 = min(x / d.stride, d.OW - 1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++)
            for (int ox = ox0; ox <= ox1; ox++) {
                float m = o[oy * d.OW + ox];
                int first = -1;
                for (int ky = 0; ky < d.K && first < 0; ky++)
                    for (int kx = 0; kx < d.K; kx++) {
                        int j = (oy * d.stride + ky) * d.W + ox * d.stride + kx;
                        if (src[j] == m) {
                            first = j;
                            break;
                        }
                    }
                if (first == y * d.W + x) acc += g[oy * d.OW + ox];
            }
        din[i] = acc;
    }
}

__global__ void k_bias_fill(float *out, const float *b, int C, int S, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = b[(i / S) % C];
}

// One block per channel c: each thread sums a strided share of the B * S
// values, then a fixed tree in shared memory (same order every run).
__global__ void k_bias_backward(float *db, const float *dout, int B, int C, int S)
{
    __shared__ float part[kThreads];
    int c = blockIdx.x;
    size_t n = (size_t)B * S;
    float acc = 0.0f;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
        size_t b = j / S, s = j % S;
        acc += dout[(b * C + c) * S + s];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[c] = part[0];
}

__device__ float s_warp_max(float v)
{
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ float s_warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

constexpr int kXentThreads = 1024;  // one block: 32 warps, a warp per row

// One block. Warp w takes rows w, w + 32, ...; lanes stride over the classes.
// Each warp's lane 0 adds its rows' losses in row order, then thread 0 adds
// the 32 warp sums in order: the same float sum on every run.
__global__ void k_softmax_xent_forward(float *probs, float *loss, const float *logits,
                                       const int *labels, int B, int classes)
{
    __shared__ float warp_loss[kXentThreads / 32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    float mine = 0.0f;
    for (int n = warp; n < B; n += nwarps) {
        const float *z = logits + (size_t)n * classes;
        float *p = probs + (size_t)n * classes;
        float mx = -INFINITY;
        for (int k = lane; k < classes; k += 32) mx = fmaxf(mx, z[k]);
        mx = s_warp_max(mx);
        float sum = 0.0f;
        for (int k = lane; k < classes; k += 32) sum += expf(z[k] - mx);
        sum = s_warp_sum(sum);
        for (int k = lane; k < classes; k += 32) p[k] = expf(z[k] - mx) / sum;
        if (lane == 0) {
            int y = labels[n];
            // -log p[label] from the logits, finite even when p underflows
            float l = (y >= 0 && y < classes) ? logf(sum) - (z[y] - mx)
                                              : __int_as_float(0x7fc00000);  // NaN
            mine += l;
        }
    }
    if (lane == 0) warp_loss[warp] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < nwarps; w++) total += warp_loss[w];
        *loss = total / (float)B;
    }
}

__global__ void k_softmax_xent_backward(float *dlogits, const float *probs, const int *labels,
                                        int B, int classes)
{
    size_t n = (size_t)B * classes;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int b = (int)(i / classes), k = (int)(i % classes);
        dlogits[i] = (probs[i] - (k == labels[b] ? 1.0f : 0.0f)) / (float)B;
    }
}

// The binary head, one block: thread t takes samples t, t + blockDim, ...,
// then thread 0 adds the per-thread sums in order (the same float sum on
// every run). Backward: the same walk, the bias's gradient summed likewise.
__global__ void k_sigmoid_xent_forward(float *probs, float *loss, const float *logits,
                                       const float *bias, const int *labels, int B)
{
    __shared__ float part[kXentThreads];
    float b = bias ? *bias : 0.0f, mine = 0.0f;
    for (int n = threadIdx.x; n < B; n += blockDim.x) {
        float z = logits[n] + b;
        float e = expf(-fabsf(z));  // in (0, 1]: neither side overflows
        float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
        probs[2 * n] = z >= 0 ? small : big;
        probs[2 * n + 1] = z >= 0 ? big : small;
        if (labels) {
            int y = labels[n];
            mine += (y == 0 || y == 1) ? fmaxf(z, 0.0f) - z * (float)y + log1pf(e)
                                       : __int_as_float(0x7fc00000);  // NaN
        }
    }
    part[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < (int)blockDim.x; t++) total += part[t];
        *loss = total / (float)B;
    }
}

__global__ void k_sigmoid_xent_backward(float *dlogits, float *dbias, const float *probs,
                                        const int *labels, int B)
{
    __shared__ float part[kXentThreads];
    float mine = 0.0f;
    for (int n = threadIdx.x; n < B; n += blockDim.x) {
        float g = (probs[2 * n + 1] - (float)labels[n]) / (float)B;
        if (dlogits) dlogits[n] = g;
        mine += g;
    }
    part[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0 && dbias) {
        float total = 0.0f;
        for (int t = 0; t < (int)blockDim.x; t++) total += part[t];
        *dbias = total;
    }
}

// One kernel for every optimizer of kernels/optim.c, term by term as
// dp_optim_step writes it (adam's bias corrections come from the host, in
// double, as there). kind is uniform across the grid: the switch costs
// nothing.
struct s_optim_args {
    dp_optim_kind_t kind;
    float lr;        // adam: lr / (1 - b1^t)
    float mu;        // momentum / nesterov
    float wd;        // weight decay
    float b1, b2;    // adam
    float eps;       // adam, adagrad, rmsprop
    float bc2_sqrt;  // adam: sqrt(1 - b2^t)
    float alpha;     // rmsprop
};

__global__ void k_optim_step(s_optim_args a, float *w, const float *g, float *state, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] + a.wd * w[i];
        switch (a.kind) {
        case DP_OPT_SGD:
            w[i] -= a.lr * gi;
            break;
        case DP_OPT_MOMENTUM:
        case DP_OPT_NESTEROV: {
            float vi = a.mu * state[i] + gi;
            state[i] = vi;
            w[i] -= a.lr * (a.kind == DP_OPT_NESTEROV ? gi + a.mu * vi : vi);
            break;
        }
        case DP_OPT_ADAM: {
            float mi = a.b1 * state[i] + (1.0f - a.b1) * gi;
            float si = a.b2 * state[n + i] + (1.0f - a.b2) * gi * gi;
            state[i] = mi;
            state[n + i] = si;
            w[i] -= a.lr * (mi / (sqrtf(si) / a.bc2_sqrt + a.eps));
            break;
        }
        case DP_OPT_ADAGRAD: {
            float si = state[i] + gi * gi;
            state[i] = si;
            w[i] -= a.lr * (gi / (sqrtf(si) + a.eps));
            break;
        }
        case DP_OPT_RMSPROP: {
            float si = a.alpha * state[i] + (1.0f - a.alpha) * gi * gi;
            state[i] = si;
            w[i] -= a.lr * (gi / (sqrtf(si) + a.eps));
            break;
        }
        }
    }
}

}  // namespace

extern "C" {

void dp_relu_forward_gpu(float *d_out, const float *d_in, size_t n, cudaStream_t st)
{
    if (n == 0) return;
    k_relu_forward<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, n);
    DP_CUDA_LAUNCHED();
}

void dp_relu_backward_gpu(float *d_din, const float *d_dout, const float *d_out, size_t n,
                          cudaStream_t st)
{
    if (n == 0) return;
    k_relu_backward<<<s_blocks(n), kThreads, 0, st>>>(d_din, d_dout, d_out, n);
    DP_CUDA_LAUNCHED();
}

void dp_tanh_forward_gpu(float *d_out, const float *d_in, size_t n, cudaStream_t st)
{
    if (n == 0) return;
    k_tanh_forward<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, n);
    DP_CUDA_LAUNCHED();
}

void dp_tanh_backward_gpu(float *d_din, const float *d_dout, const float *d_out, size_t n,
                          cudaStream_t st)
{
    if (n == 0) return;
    k_tanh_backward<<<s_blocks(n), kThreads, 0, st>>>(d_din, d_dout, d_out, n);
    DP_CUDA_LAUNCHED();
}

void dp_ac_loss_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                            const float *d_value, const int *d_action, const float *d_ret, int B,
                            int A, float beta, float vcoef, cudaStream_t st)
{
    if (B < 1) return;
    k_ac_loss_forward<<<1, kAcThreads, 0, st>>>(d_probs, d_loss, d_logits, d_value, d_action,
                                                d_ret, B, A, beta, vcoef);
    DP_CUDA_LAUNCHED();
}

void dp_ac_loss_backward_gpu(float *d_dlogits, float *d_dvalue, const float *d_logits,
                             const float *d_value, const int *d_action, const float *d_ret, int B,
                             int A, float beta, float vcoef, cudaStream_t st)
{
    if (B < 1) return;
    k_ac_loss_backward<<<s_blocks((size_t)B), kThreads, 0, st>>>(d_dlogits, d_dvalue, d_logits,
                                                                d_value, d_action, d_ret, B, A,
                                                                beta, vcoef);
    DP_CUDA_LAUNCHED();
}

void dp_maxpool_forward_gpu(float *d_out, const float *d_in, const dp_pool_dims_t *d,
                            cudaStream_t st)
{
    size_t n = (size_t)d->B * d->C * d->OH * d->OW;
    if (n == 0) return;
    k_maxpool_forward<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_in, *d);
    DP_CUDA_LAUNCHED();
}

void dp_maxpool_backward_gpu(float *d_din, const float *d_dout, const float *d_in,
                             const float *d_out, const dp_pool_dims_t *d, cudaStream_t st)
{
    size_t n = (size_t)d->B * d->C * d->H * d->W;
    if (n == 0) return;
    k_maxpool_backward<<<s_blocks(n), kThreads, 0, st>>>(d_din, d_dout, d_in, d_out, *d);
    DP_CUDA_LAUNCHED();
}

void dp_bias_fill_gpu(float *d_out, const float *d_b, int B, int C, int S, cudaStream_t st)
{
    size_t n = (size_t)B * C * S;
    if (n == 0) return;
    k_bias_fill<<<s_blocks(n), kThreads, 0, st>>>(d_out, d_b, C, S, n);
    DP_CUDA_LAUNCHED();
}

void dp_bias_backward_gpu(float *d_db, const float *d_dout, int B, int C, int S,
                          cudaStream_t st)
{
    if (C <= 0) return;
    k_bias_backward<<<C, kThreads, 0, st>>>(d_db, d_dout, B, C, S);
    DP_CUDA_LAUNCHED();
}

void dp_softmax_xent_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                                 const int *d_labels, int B, int classes, cudaStream_t st)
{
    k_softmax_xent_forward<<<1, kXentThreads, 0, st>>>(d_probs, d_loss, d_logits, d_labels, B,
                                                       classes);
    DP_CUDA_LAUNCHED();
}

void dp_sigmoid_xent_forward_gpu(float *d_probs, float *d_loss, const float *d_logits,
                                 const float *d_bias, const int *d_labels, int B,
                                 cudaStream_t st)
{
    k_sigmoid_xent_forward<<<1, kXentThreads, 0, st>>>(d_probs, d_loss, d_logits, d_bias,
                                                       d_labels, B);
    DP_CUDA_LAUNCHED();
}

void dp_sigmoid_xent_backward_gpu(float *d_dlogits, float *d_dbias, const float *d_probs,
                                  const int *d_labels, int B, cudaStream_t st)
{
    if (B <= 0 || (!d_dlogits && !d_dbias)) return;
    k_sigmoid_xent_backward<<<1, kXentThreads, 0, st>>>(d_dlogits, d_dbias, d_probs, d_labels,
                                                        B);
    DP_CUDA_LAUNCHED();
}

void dp_softmax_xent_backward_gpu(float *d_dlogits, const float *d_probs, const int *d_labels,
                                  int B, int classes, cudaStream_t st)
{
    size_t n = (size_t)B * classes;
    if (n == 0) return;
    k_softmax_xent_backward<<<s_blocks(n), kThreads, 0, st>>>(d_dlogits, d_probs, d_labels, B,
                                                             classes);
    DP_CUDA_LAUNCHED();
}

void dp_optim_step_gpu(const dp_optim_conf_t *c, float lr, float *d_w, const float *d_g,
                       float *d_state, size_t n, long t, cudaStream_t st)
{
    s_optim_args a = {c->kind, lr, c->momentum, c->weight_decay, c->beta1, c->beta2, c->eps, 1.0f,
                      c->alpha};
    if (n == 0) return;
    if (c->kind == DP_OPT_ADAM) {
        if (t < 1) t = 1;
        a.lr = (float)(lr / (1.0 - pow((double)c->beta1, (double)t)));
        a.bc2_sqrt = (float)sqrt(1.0 - pow((double)c->beta2, (double)t));
    }
    k_optim_step<<<s_blocks(n), kThreads, 0, st>>>(a, d_w, d_g, d_state, n);
    DP_CUDA_LAUNCHED();
}

}  // extern "C"
