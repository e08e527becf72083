/* optim_dev_gpu.h: private header between the CUDA shard step device's
 * table (optim_dev_cuda.c) and its kernels (optim_dev.cu). Nothing outside
 * kernels/cuda includes it.
 *
 * The launchers take kernels/optim.c's parameters in the same order (the
 * step's are dp_optim_step_from's, the compensation's dp_optim_dc_range's;
 * device pointers d_*) plus the stream they are queued on; they return at
 * once and check the launch. */
#ifndef DP_OPTIM_DEV_GPU_H
#define DP_OPTIM_DEV_GPU_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "kernels/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One fused kernel for c's optimizer over [lo, hi) of vectors of n_all. */
void dp_optim_step_from_gpu(const dp_optim_conf_t *c, float lr, float *d_w, const float *d_w_from,
                            const float *d_g, float *d_state, const float *d_state_from,
                            size_t n_all, size_t lo, size_t hi, long t, cudaStream_t st);
/* Delay compensation over [lo, hi); nothing for DP_DC_OFF. */
void dp_optim_dc_range_gpu(const dp_optim_conf_t *c, float *d_out, const float *d_g,
                           const float *d_w, const float *d_w_bak, float *d_ms, size_t lo,
                           size_t hi, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
