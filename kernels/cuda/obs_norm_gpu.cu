// obs_norm_gpu: the obsnorm layer on the GPU (kernels/ops.h,
// dp_obs_norm_forward and dp_obs_norm_update; kernels/obs_norm.c is the
// reference). An observation has a few components F and a batch a few
// rows B, so one block does it all: a thread a component, each the
// reference's own loop over the batch in the same order and precision
// (float for the output, double for the merge), hence the same bits. The
// count is shared by every component: each thread reads it before thread 0
// writes the merged one (a barrier between).
#include "kernels/cuda/backend_cuda.h"

#include <cuda_runtime.h>

namespace {

const int kObsThreads = 128;

__global__ void k_obs_norm(float *out, const float *in, float *mean, float *var, float *count,
                           int B, int F, int train)
{
    // statistics from a push, so from a peer: a negative variance or count
    // (which no merge makes) is taken as 0, as the reference does
    const double n = *count > 0 ? *count : 0, b = B, total = n + b;
    for (int i = threadIdx.x; i < F; i += blockDim.x) {
        const float m = mean[i], v0 = var[i];
        const float inv = 1.0f / sqrtf((v0 > 0 ? v0 : 0) + DP_OBS_NORM_EPS);
        for (int k = 0; k < B; k++) {
            float v = (in[(size_t)k * F + i] - m) * inv;
            out[(size_t)k * F + i] = v > DP_OBS_NORM_CLIP ? DP_OBS_NORM_CLIP
                                     : v < -DP_OBS_NORM_CLIP ? -DP_OBS_NORM_CLIP : v;
        }
        if (!train || B < 1) continue;
        double s = 0, ss = 0;
        for (int k = 0; k < B; k++) s += in[(size_t)k * F + i];
        const double bm = s / b;
        for (int k = 0; k < B; k++) {
            double d = in[(size_t)k * F + i] - bm;
            ss += d * d;
        }
        // Chan et al.'s pairwise merge of (n, mean, var) with the batch's
        const double delta = bm - m;
        const double m2 = (v0 > 0 ? (double)v0 : 0) * n + ss + delta * delta * n * b / total;
        mean[i] = (float)(m + delta * b / total);
        var[i] = (float)(m2 / total);
    }
    __syncthreads(); // every thread has read the old count
    if (train && B >= 1 && threadIdx.x == 0)
        *count = (float)(total < DP_OBS_NORM_MAX_COUNT ? total : DP_OBS_NORM_MAX_COUNT);
}

} // namespace

extern "C" void dp_obs_norm_gpu(float *d_out, const float *d_in, float *d_mean, float *d_var,
                                float *d_count, int B, int F, int train, cudaStream_t st)
{
    k_obs_norm<<<1, kObsThreads, 0, st>>>(d_out, d_in, d_mean, d_var, d_count, B, F, train);
    DP_CUDA_LAUNCHED();
}
