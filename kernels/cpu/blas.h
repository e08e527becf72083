/* blas: the one door to OpenBLAS. Every GEMM the CPU kernels hand to a
 * library goes through dp_cpu_blas_sgemm; nothing links libopenblas.
 *
 * Why a door: OpenBLAS (Debian's DYNAMIC_ARCH build) picks its kernels, and
 * with them the order in which a GEMM sums, from the CPU model it detects
 * when it is loaded. Linked normally it loads, and picks, before main, so
 * the same flags gave other bits on another CPU of the same ISA path. Here
 * dp_cpu_blas_init (from dp_kernels_env, in main, right after the ISA path
 * is chosen) sets OPENBLAS_CORETYPE to the core the path pins, dlopens
 * libopenblas.so.0 (its constructor reads the variable then), puts the
 * variable back as the user had it (children see the user's), and checks
 * with openblas_get_corename that OpenBLAS runs the pinned core:
 *   avx512  -> SkylakeX  (AVX-512; needs avx512f/cd/bw/dq/vl, checked)
 *   avx2    -> Haswell   (AVX2 + FMA)
 *   generic -> Prescott  (SSE3: every x86-64 of the last twenty years)
 * So a CPU result is a function of the path (and the thread count, the
 * build and the OpenBLAS library), not of the CPU model. The pin wins over
 * a user's OPENBLAS_CORETYPE. Refused with one line (mains exit 2): no
 * libopenblas.so.0, one without the functions used, a CPU lacking the
 * pinned core's instructions, or an OpenBLAS already loaded before main
 * (LD_PRELOAD) on another core. Off x86 nothing is pinned: OpenBLAS keeps
 * the core it detects (stated in README).
 *
 * OpenBLAS always runs single-threaded (set at load): the parallelism is
 * ours (cpu.h). The core is the one of the path chosen at start; a test
 * that switches path in-process (dp_cpu_isa_set) keeps that core. */
#ifndef DP_CPU_BLAS_H
#define DP_CPU_BLAS_H

#include "kernels/cpu/isa.h"

/* The soname loaded (Debian's libopenblas0, an alternative of its variants). */
#define DP_CPU_BLAS_SONAME "libopenblas.so.0"

/* Load OpenBLAS with the core `isa` pins (once; later calls return 0);
 * -1 with err if it cannot be loaded or does not run the pinned core. */
int dp_cpu_blas_init(dp_cpu_isa_t isa, char *err);

/* The OpenBLAS core a path pins ("SkylakeX", "Haswell", "Prescott"); NULL
 * off x86, where nothing is pinned. */
const char *dp_cpu_blas_pin(dp_cpu_isa_t isa);

/* OpenBLAS's name for the kernels it runs (after init: asserted). */
const char *dp_cpu_blas_core(void);

/* C[M,N] = alpha op(A) op(B) + beta C, row-major, op = transpose when the
 * flag is set; single-threaded OpenBLAS on the calling thread. */
void dp_cpu_blas_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
