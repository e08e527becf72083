/* cpu: private helpers shared by the fast CPU kernels (kernels/cpu/) —
 * thread count, per-thread scratch that grows once and is then reused, and
 * a GEMM that splits across our OpenMP threads.
 *
 * Threading model: all parallelism is ours (OpenMP, dp_cpu_threads()
 * threads); OpenBLAS is set to one thread the first time a kernel runs, and
 * every sgemm call runs on the calling thread. Two thread pools on two
 * cores, each spinning while the other works, is what this avoids. */
#ifndef DP_CPU_H
#define DP_CPU_H

#include <stddef.h>

/* Threads to use for work of `work` multiply-adds (1 below a threshold, so
 * tiny ops don't pay for waking the team). Also makes OpenBLAS single-threaded
 * on first call. */
int dp_cpu_team(double work);

/* Scratch of at least `floats` floats for the calling thread, 64-byte
 * aligned. Grows (never shrinks) and is reused, so the training loop stops
 * allocating after its first step. The pointer stays valid until the next
 * call with a larger size from the same thread. */
float *dp_cpu_scratch(size_t floats);

/* C[M,N] = alpha op(A) op(B) + beta C, row-major, split by rows or columns of
 * C over dp_cpu_team threads, each calling single-threaded sgemm. */
void dp_cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
