/* env: the kernels' environment variables, read once by each program's
 * main (dp_kernels_env) through common/opts.h's strict parsers, before any
 * kernel runs and never before main:
 *   DP_CPU_ISA            avx512|avx2|generic: force a CPU path (kernels/cpu/isa.h)
 *   DP_CONV_SPARSE_MAX    [0, 1]: the sparse convolution backward's non-zero
 *                         fraction (kernels/cpu/conv.c; default 0.4)
 *   DP_CONV_DIRECT        0|1: the convolution's direct ways (default 1)
 *   DP_FUSE               0|1: batch norm and the ReLU after it (and a block's
 *                         bn, add, ReLU) as one op where the backend has it
 *                         (worker/exec/net.c; default 1)
 * then loads OpenBLAS with the chosen path's core (kernels/cpu/blas.h: sets
 * OPENBLAS_CORETYPE for the load and puts the user's back).
 *   DP_CUDA_TF32, DP_CUDA_FIND, DP_CUDA_ALGOS, DP_CUDA_WORKSPACE_MB, DP_CUDA_BN
 *                         the CUDA backend's (dp_cuda_knobs below), checked
 *                         in every build so a script's typo shows anywhere
 * A bad value is -1 with one line naming the variable; mains exit 2 on it,
 * as on a bad flag. ARCHITECTURE.md's "Environment" table lists every
 * variable a program reads. */
#ifndef DP_KERNELS_ENV_H
#define DP_KERNELS_ENV_H

/* All of the above; -1 with err at the first bad one. */
int dp_kernels_env(char *err);

/* DP_CONV_SPARSE_MAX and DP_CONV_DIRECT into the convolution (kernels/cpu/conv.c). */
int dp_conv_env(char *err);

/* DP_FUSE (default 1; 0 runs batch norm and relu apart, for measuring and
 * for the tests that compare the two), and its value read. */
int dp_fuse_env(char *err);
int dp_fuse_on(void);

/* The CUDA backend's knobs, all off by default so results match the CPU
 * reference to float rounding (README.md, "GPUs"). */
#define DP_CUDA_WORKSPACE_MB_DEFAULT 256
typedef struct {
    int tf32;          /* DP_CUDA_TF32=0|1: TF32 tensor cores */
    int find;          /* DP_CUDA_FIND=0|1: time the conv algorithms once at start */
    int fastest;       /* DP_CUDA_ALGOS=exact|fastest: 1 for fastest */
    long workspace_mb; /* DP_CUDA_WORKSPACE_MB in [0, 1048576]: cuDNN's workspace cap */
    int bn_own;        /* DP_CUDA_BN=cudnn|own: 1 for own (batch norm on our kernels
                        * alone, kernels/cuda/resnet_gpu.cu; cudnn: kernels/cuda/bn_cudnn.c) */
} dp_cuda_knobs_t;
/* Read them (unset: the defaults); -1 with err for a bad one. */
int dp_cuda_knobs(dp_cuda_knobs_t *k, char *err);

#endif
