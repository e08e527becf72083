// optim_dev: the fused kernels of the CUDA shard step device
// (kernels/optim_dev.h): one kernel per optimizer, reading each element's
// weight, gradient and state once and writing the new ones once, a push's
// whole step in one launch; and the delay compensation's.
//
// Each rule is kernels/optim.c's, float operation for float operation in
// the same order (per-call scalars — Adam's bias corrections, delayed
// Nesterov's lr / N and 1 / N — from the host, in double then rounded as
// there). The Makefile builds this file with -fmad=false, so no multiply
// and add is contracted into an FMA the CPU does not make, and division
// and square root are IEEE (nvcc's default -prec-div / -prec-sqrt): the
// aim is the CPU's bits. Not yet measured on a device here (the build
// machine has no GPU); tests/gpu/test_gpu_optim_dev.c holds them to
// |gpu - cpu| <= 1e-6 + 1e-5 |cpu|, and prints how many floats differ in
// their bits at all.
//
// Indexing: every pointer is the shard's range from 0; the state's second
// vector (Adam's s, delayed Nesterov's d) starts n_all after the first;
// the kernels touch [lo, hi) only. Out of place (w != w_from) the sources
// are only read; in place each element is read before it is written by
// the same thread, so either way is race-free.
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/optim_dev_gpu.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

using dp_cuda::kThreads;

struct s_args {
    float lr;        // the scheduled lr; adam: lr / (1 - b1^t)
    float mu;        // momentum / nesterov
    float wd;        // weight decay
    float b1, b2;    // adam
    float eps;       // adam, adagrad, rmsprop
    float bc2_sqrt;  // adam: sqrt(1 - b2^t)
    float alpha;     // rmsprop
    float part;      // delayed nesterov: lr / N
    float inv_n;     // delayed nesterov: 1 / N
    int turn;        // delayed nesterov: this step moves the momentum
    int nesterov;    // momentum kernel: nesterov's look-ahead
};

struct s_vecs {
    float *w;
    const float *w_from, *g;
    float *s1, *s2;              // state vectors (s2 = s1 + n_all)
    const float *s1_from, *s2_from;
    size_t lo, hi;
};

#define S_EACH(i, v) for (size_t i = (v).lo + blockIdx.x * (size_t)blockDim.x + threadIdx.x; \
                          i < (v).hi; i += (size_t)gridDim.x * blockDim.x)

__global__ void k_sgd(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        v.w[i] = v.w_from[i] - a.lr * gi;
    }
}

__global__ void k_momentum(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        float vi = a.mu * v.s1_from[i] + gi;
        v.s1[i] = vi;
        v.w[i] = v.w_from[i] - a.lr * (a.nesterov ? gi + a.mu * vi : vi);
    }
}

__global__ void k_delayed_nesterov(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        float wi = v.w_from[i] - a.part * gi;
        if (a.turn) {
            float vi = a.mu * v.s1_from[i] + (v.s2_from[i] + gi) * a.inv_n;
            v.s1[i] = vi;
            v.s2[i] = 0.0f;
            wi -= a.lr * a.mu * vi;
        } else {
            v.s1[i] = v.s1_from[i];
            v.s2[i] = v.s2_from[i] + gi;
        }
        v.w[i] = wi;
    }
}

__global__ void k_adam(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        float mi = a.b1 * v.s1_from[i] + (1.0f - a.b1) * gi;
        float si = a.b2 * v.s2_from[i] + (1.0f - a.b2) * gi * gi;
        v.s1[i] = mi;
        v.s2[i] = si;
        v.w[i] = v.w_from[i] - a.lr * (mi / (sqrtf(si) / a.bc2_sqrt + a.eps));
    }
}

__global__ void k_adagrad(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        float si = v.s1_from[i] + gi * gi;
        v.s1[i] = si;
        v.w[i] = v.w_from[i] - a.lr * (gi / (sqrtf(si) + a.eps));
    }
}

__global__ void k_rmsprop(s_args a, s_vecs v)
{
    S_EACH(i, v) {
        float gi = v.g[i] + a.wd * v.w_from[i];
        float si = a.alpha * v.s1_from[i] + (1.0f - a.alpha) * gi * gi;
        v.s1[i] = si;
        v.w[i] = v.w_from[i] - a.lr * (gi / (sqrtf(si) + a.eps));
    }
}

// dp_optim_dc_range's two rules; w_bak NULL: ms only (adaptive).
__global__ void k_dc(int adaptive, float lambda, float *out, const float *g, const float *w,
                     const float *w_bak, float *ms, size_t lo, size_t hi)
{
    for (size_t i = lo + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < hi;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (!adaptive) {
            out[i] = gi + lambda * gi * gi * (w[i] - w_bak[i]);
            continue;
        }
        float mi = DP_DC_MS_DECAY * ms[i] + (1.0f - DP_DC_MS_DECAY) * gi * gi;
        ms[i] = mi;
        if (w_bak) out[i] = gi + lambda / sqrtf(mi + DP_DC_MS_EPS) * gi * gi * (w[i] - w_bak[i]);
    }
}

// The host's scalars for one step, as s_step in kernels/optim.c makes them.
s_args s_args_of(const dp_optim_conf_t *c, float lr, long t)
{
    s_args a = {};
    a.lr = lr;
    a.mu = c->momentum;
    a.wd = c->weight_decay;
    a.b1 = c->beta1;
    a.b2 = c->beta2;
    a.eps = c->eps;
    a.alpha = c->alpha;
    a.nesterov = c->kind == DP_OPT_NESTEROV;
    if (c->kind == DP_OPT_ADAM) {
        if (t < 1) t = 1;
        double bc1 = 1.0 - pow((double)c->beta1, (double)t);
        double bc2 = 1.0 - pow((double)c->beta2, (double)t);
        a.lr = (float)(lr / bc1);
        a.bc2_sqrt = (float)sqrt(bc2);
    }
    if (c->kind == DP_OPT_NESTEROV && c->period > 1) {
        a.part = lr / (float)c->period;
        a.inv_n = 1.0f / (float)c->period;
        a.turn = t > 0 && t % c->period == 0;
    }
    return a;
}

}  // namespace

extern "C" {

void dp_optim_step_from_gpu(const dp_optim_conf_t *c, float lr, float *d_w, const float *d_w_from,
                            const float *d_g, float *d_state, const float *d_state_from,
                            size_t n_all, size_t lo, size_t hi, long t, cudaStream_t st)
{
    if (hi <= lo) return;
    s_args a = s_args_of(c, lr, t);
    s_vecs v = {d_w, d_w_from, d_g, d_state, NULL, d_state_from, NULL, lo, hi};
    if (d_state) { // sgd has none
        v.s2 = d_state + n_all;
        v.s2_from = d_state_from + n_all;
    }
    unsigned blocks = dp_cuda::blocks(hi - lo);
    switch (c->kind) {
    case DP_OPT_SGD: k_sgd<<<blocks, kThreads, 0, st>>>(a, v); break;
    case DP_OPT_NESTEROV:
        if (c->period > 1) {
            k_delayed_nesterov<<<blocks, kThreads, 0, st>>>(a, v);
            break;
        }
        k_momentum<<<blocks, kThreads, 0, st>>>(a, v);
        break;
    case DP_OPT_MOMENTUM: k_momentum<<<blocks, kThreads, 0, st>>>(a, v); break;
    case DP_OPT_ADAM: k_adam<<<blocks, kThreads, 0, st>>>(a, v); break;
    case DP_OPT_ADAGRAD: k_adagrad<<<blocks, kThreads, 0, st>>>(a, v); break;
    case DP_OPT_RMSPROP: k_rmsprop<<<blocks, kThreads, 0, st>>>(a, v); break;
    }
    DP_CUDA_LAUNCHED();
}

void dp_optim_dc_range_gpu(const dp_optim_conf_t *c, float *d_out, const float *d_g,
                           const float *d_w, const float *d_w_bak, float *d_ms, size_t lo,
                           size_t hi, cudaStream_t st)
{
    if (hi <= lo || c->dc == DP_DC_OFF || (c->dc == DP_DC_CONST && !d_w_bak)) return;
    k_dc<<<dp_cuda::blocks(hi - lo), kThreads, 0, st>>>(c->dc == DP_DC_ADAPTIVE, c->dc_lambda,
                                                        d_out, d_g, d_w, d_w_bak, d_ms, lo, hi);
    DP_CUDA_LAUNCHED();
}

}  // extern "C"
