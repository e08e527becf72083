/* env: the kernels' environment variables, read once by each program's
 * main (dp_kernels_env) through common/opts.h's strict parsers, before any
 * kernel runs and never before main:
 *   DP_CPU_ISA            avx512|avx2|generic: force a CPU path (kernels/cpu/isa.h)
 *   DP_CONV_SPARSE_MAX    [0, 1]: the sparse convolution backward's non-zero
 *                         fraction (kernels/cpu/conv.c; default 0.4)
 *   DP_CUDA_TF32, DP_CUDA_FIND (0|1), DP_CUDA_ALGOS (exact|fastest),
 *   DP_CUDA_WORKSPACE_MB  the CUDA backend's (kernels/cuda/backend_cuda.c),
 *                         checked here in a CUDA build, read by each backend
 * A bad value is -1 with one line naming the variable; mains exit 2 on it,
 * as on a bad flag. ARCHITECTURE.md's "Environment" table lists every
 * variable a program reads. */
#ifndef DP_KERNELS_ENV_H
#define DP_KERNELS_ENV_H

/* All of the above; -1 with err at the first bad one. */
int dp_kernels_env(char *err);

/* The pieces, one per module. */
int dp_conv_env(char *err); /* kernels/cpu/conv.c */
int dp_cuda_env(char *err); /* kernels/cuda/backend_cuda.c (a CUDA build only) */

#endif
