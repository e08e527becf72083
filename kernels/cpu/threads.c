/* threads: how many threads the fast CPU kernels use, per-thread scratch,
 * and a row/column-split GEMM over those threads (see cpu.h for why OpenBLAS
 * itself runs single-threaded). */
#include <omp.h>
#include <stdlib.h>

#include "common/util.h"
#include "kernels/ops.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu.h"

static int s_threads; /* 0 until set or first asked: then all cores */

void dp_cpu_set_threads(int n)
{
    s_threads = n >= 1 ? n : omp_get_num_procs();
}

int dp_cpu_threads(void)
{
    if (s_threads <= 0) s_threads = omp_get_num_procs();
    return s_threads;
}

int dp_cpu_team(double work)
{
    int n = dp_cpu_threads();
    /* Below ~50k multiply-adds waking a second thread costs more than it saves. */
    if (work < 5e4) return 1;
    return n;
}

/* One buffer per slot per thread: the kernels' own (slot 0), and the bf16
 * emulation's rounded operands (slot 1), which stay whole while the fp32
 * kernel it calls takes slot 0. */
static _Thread_local float *s_scratch[DP_CPU_SCRATCH_SLOTS];
static _Thread_local size_t s_scratch_n[DP_CPU_SCRATCH_SLOTS];

float *dp_cpu_scratch_slot(int slot, size_t floats)
{
    if (floats > s_scratch_n[slot]) {
        free(s_scratch[slot]);
        /* round up so a slightly larger request later doesn't grow again */
        size_t n = floats + floats / 4 + 1024;
        s_scratch[slot] = dp_aligned_alloc(n * sizeof(float));
        s_scratch_n[slot] = n;
    }
    return s_scratch[slot];
}

float *dp_cpu_scratch(size_t floats)
{
    return dp_cpu_scratch_slot(DP_CPU_SCRATCH_KERNEL, floats);
}

void dp_cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int nt = dp_cpu_team((double)M * N * K);
    if (nt <= 1 || (M < 32 && N < 32)) {
        dp_cpu_blas_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the larger side of C in multiples of 16 (kernel-friendly). */
    int split_n = N >= M;
    int len = split_n ? N : M;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int chunk = ((len + T - 1) / T + 15) / 16 * 16;
        int lo = t * chunk, hi = lo + chunk < len ? lo + chunk : len;
        if (lo < hi) {
            if (split_n) {
                const float *Bp = transb ? B + (size_t)lo * ldb : B + lo;
                dp_cpu_blas_sgemm(transa, transb, M, hi - lo, K, alpha, A, lda, Bp, ldb, beta,
                            C + lo, ldc);
            } else {
                const float *Ap = transa ? A + lo : A + (size_t)lo * lda;
                dp_cpu_blas_sgemm(transa, transb, hi - lo, N, K, alpha, Ap, lda, B, ldb, beta,
                            C + (size_t)lo * ldc, ldc);
            }
        }
    }
}
