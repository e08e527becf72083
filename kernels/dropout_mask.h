/* dropout_mask: dropout's keep-or-drop decision as a hash of its
 * coordinates (seed, step, sample, element), defined once for the CPU
 * kernels (kernels/cpu/ref.c's dp_dropout_keep) and the CUDA ones
 * (kernels/cuda/ops_gpu.cu), so that both draw the same mask bit for bit:
 * a run, its replay and a GPU worker drop the same elements. */
#ifndef DP_DROPOUT_MASK_H
#define DP_DROPOUT_MASK_H

#ifdef __CUDACC__
#define DP_HOST_DEVICE __host__ __device__
#else
#define DP_HOST_DEVICE
#endif

/* splitmix64's finaliser: a good 64-bit mix of one word. */
static inline DP_HOST_DEVICE unsigned long long dp_mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* 1 keep, 0 drop: the top 24 bits of the hash as a uniform in [0, 1)
 * (exact in float), kept when >= p. */
static inline DP_HOST_DEVICE int dp_dropout_mask(unsigned long long seed, unsigned long long step,
                                                 unsigned long long sample, unsigned long long i,
                                                 float p)
{
    unsigned long long h = dp_mix64(seed ^ 0x9e3779b97f4a7c15ULL);
    h = dp_mix64(h ^ step);
    h = dp_mix64(h ^ sample);
    h = dp_mix64(h ^ i);
    float u = (float)(h >> 40) * (1.0f / 16777216.0f);
    return u >= p;
}

#endif
