/* cpu: private helpers shared by the fast CPU kernels (kernels/cpu/) —
 * thread count, per-thread scratch that grows once and is then reused, and
 * a GEMM that splits across our OpenMP threads.
 *
 * Threading model: all parallelism is ours (OpenMP, dp_cpu_threads()
 * threads); OpenBLAS is set to one thread when it is loaded (blas.h), and
 * every sgemm call runs on the calling thread. Two thread pools on two
 * cores, each spinning while the other works, is what this avoids. */
#ifndef DP_CPU_H
#define DP_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* Threads to use for work of `work` multiply-adds (1 below a threshold, so
 * tiny ops don't pay for waking the team). */
int dp_cpu_team(double work);

/* Scratch of at least `floats` floats for the calling thread, 64-byte
 * aligned. Grows (never shrinks) and is reused, so the training loop stops
 * allocating after its first step. The pointer stays valid until the next
 * call with a larger size from the same thread. */
float *dp_cpu_scratch(size_t floats);
/* The same for a slot of its own: a caller that keeps its buffer across a
 * call into a kernel that takes dp_cpu_scratch (the bf16 emulation's
 * rounded operands, kernels/cpu/bf16_emulated.c) uses another slot. */
enum { DP_CPU_SCRATCH_KERNEL = 0, DP_CPU_SCRATCH_BF16 = 1, DP_CPU_SCRATCH_SLOTS = 2 };
float *dp_cpu_scratch_slot(int slot, size_t floats);

/* C[M,N] = alpha op(A) op(B) + beta C, row-major, split by rows or columns of
 * C over dp_cpu_team threads, each calling single-threaded sgemm. */
void dp_cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The convolution's SIMD kernels for one instruction-set path (written once
 * in conv_simd.h, compiled per path; conv.c picks the set from isa.h). */
typedef struct {
    int oc_multiple; /* fwd takes OC in multiples of this (one vector) */
    int oc_block;    /* the multiple before the one-vector block (DP_CONV_DIRECT=0) */
    /* out (one image, NCHW, rows ldo floats apart) = b + w X, X the patches
     * read in place from the padded HWC image pin of geometry d (or a colT:
     * conv.c's s_colT_dims); wt[r', oc] in patch order */
    void (*fwd)(float *out, size_t ldo, const float *pin, const dp_conv_dims_t *d,
                const float *wt, const float *b);
    /* dwq[oc, r'] (patch order) += sum_p g[oc, p] X[p, r'], X as for fwd */
    void (*dw)(float *dwq, const float *g, const float *pin, const dp_conv_dims_t *d);
    /* Y[i, 0:n) (+)= sum over j in [start[i], start[i] + count[i]) of
     * coef[j] X[idx[j], 0:n), for rows i in [0, rows); overwritten when !accumulate */
    void (*spmm)(float *Y, size_t ldy, int rows, int n, const float *X, size_t ldx,
                 const int *start, const int *count, const int *idx, const float *coef,
                 int accumulate);
    /* out (one image, NCHW) = b + conv(in) read in place from the CHW image
     * (planes ldi floats apart), for a "same" stride-1 d (2 pad = K - 1) and
     * OC a multiple of flat_oc: fwd's bits; masks: flat_masks' table for d,
     * flat_mask_count(d) long. NULL (flat_oc 0) on a path without it. */
    int flat_oc, flat_block; /* a tile's channels and positions */
    void (*fwd_flat)(float *out, const float *in, size_t ldi, const dp_conv_dims_t *d,
                     const float *wt, const float *b, const uint32_t *masks);
    void (*flat_masks)(uint32_t *masks, const dp_conv_dims_t *d);
    size_t (*flat_mask_count)(const dp_conv_dims_t *d);
    /* the padded HWC image pin (zero border of d->pad) of one CHW image */
    void (*pad_hwc)(float *pin, const float *in, const dp_conv_dims_t *d);
    /* the non-zeros (!= 0) of row[0, n) in order, positions to idx and
     * values to val; returns their count (NULL: conv.c's scalar loop) */
    int (*nz_list)(int *idx, float *val, const float *row, int n);
    /* colT[p, r'] from the padded HWC image; dpin += one dcolT row */
    void (*im2colT)(float *colT, const float *pin, const dp_conv_dims_t *d);
    void (*col2imT_row)(float *dpin, const float *row, int p, const dp_conv_dims_t *d);
    /* stride-1 im2col / col2im through the padded CHW image */
    void (*im2col_s1)(float *col, size_t ld, float *pin, const dp_conv_dims_t *d);
    void (*col2im_s1)(float *col, size_t ld, float *pin, const dp_conv_dims_t *d);
} dp_conv_simd_t;

#if defined(__x86_64__) || defined(__i386__)
extern const dp_conv_simd_t dp_conv_simd_avx512, dp_conv_simd_avx2;
#endif

/* The loop of a stride-1 im2col / col2im through a zero-padded CHW copy pin
 * of the image: every column-matrix row is OH plain runs of OW floats (cr in
 * col, pr in pin); COPY moves one run. Needs col, ld, pin, d in scope. */
#define DP_S1_BODY(COPY)                                                                  \
    int K = d->K, Hp = d->H + 2 * d->pad, Wp = d->W + 2 * d->pad, OH = d->OH, OW = d->OW; \
    for (int c = 0; c < d->C; c++)                                                          \
        for (int ky = 0; ky < K; ky++)                                                      \
            for (int kx = 0; kx < K; kx++) {                                                \
                float *cr = col + (size_t)((c * K + ky) * K + kx) * ld;                     \
                float *pr = pin + ((size_t)c * Hp + ky) * Wp + kx;                          \
                for (int oy = 0; oy < OH; oy++, cr += OW, pr += Wp) COPY;                   \
            }

#endif
