/* conv_avx512: the convolution's SIMD kernels (conv_simd.h) in AVX-512F,
 * 16 floats a vector; the forward GEMM tiles are 6 positions x 64 channels,
 * 12 x 32 and 12 x 16 (resnet's 16-channel stage: the AVX2 path's 12 x 8
 * tile, the same macro at one vector); the direct dw's 8 channels x 48
 * patch floats (24 accumulators). Compiled on x86 only; conv.c calls it only where the CPU has
 * AVX-512F (isa.h). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f")
#include <immintrin.h>

#include <string.h>

#include "kernels/cpu/cpu.h"

#define V __m512
#define VW 16
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define VM __mmask16
#define V_MASK(n) ((n) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n)) - 1))
#define V_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define V_MSTORE(m, p, v) _mm512_mask_storeu_ps(p, m, v)
#define V_MASK_BITS(u) ((__mmask16)(u))
/* r[0..15] transposed in place: r[c] lane j = r[j] lane c before. 4 x 4
 * blocks within each 128-bit lane (unpack ps, then pd), then the lanes
 * (shuffle_f32x4 twice): 64 shuffles. */
#define V_TRANSPOSE(r)                                                                       \
    do {                                                                                     \
        __m512 t_[16];                                                                       \
        for (int i_ = 0; i_ < 8; i_++) {                                                     \
            t_[2 * i_] = _mm512_unpacklo_ps(r[2 * i_], r[2 * i_ + 1]);                       \
            t_[2 * i_ + 1] = _mm512_unpackhi_ps(r[2 * i_], r[2 * i_ + 1]);                   \
        }                                                                                    \
        for (int i_ = 0; i_ < 4; i_++)                                                       \
            for (int h_ = 0; h_ < 2; h_++) {                                                 \
                __m512d x_ = _mm512_castps_pd(t_[4 * i_ + h_]);                              \
                __m512d y_ = _mm512_castps_pd(t_[4 * i_ + h_ + 2]);                          \
                r[4 * i_ + 2 * h_] = _mm512_castpd_ps(_mm512_unpacklo_pd(x_, y_));           \
                r[4 * i_ + 2 * h_ + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x_, y_));       \
            }                                                                                \
        for (int k_ = 0; k_ < 4; k_++) {                                                     \
            __m512 ablo = _mm512_shuffle_f32x4(r[k_], r[4 + k_], 0x44);                      \
            __m512 abhi = _mm512_shuffle_f32x4(r[k_], r[4 + k_], 0xEE);                      \
            __m512 cdlo = _mm512_shuffle_f32x4(r[8 + k_], r[12 + k_], 0x44);                 \
            __m512 cdhi = _mm512_shuffle_f32x4(r[8 + k_], r[12 + k_], 0xEE);                 \
            t_[k_] = _mm512_shuffle_f32x4(ablo, cdlo, 0x88);                                 \
            t_[4 + k_] = _mm512_shuffle_f32x4(ablo, cdlo, 0xDD);                             \
            t_[8 + k_] = _mm512_shuffle_f32x4(abhi, cdhi, 0x88);                             \
            t_[12 + k_] = _mm512_shuffle_f32x4(abhi, cdhi, 0xDD);                            \
        }                                                                                    \
        for (int i_ = 0; i_ < 16; i_++) r[i_] = t_[i_];                                      \
    } while (0)
#define S(name) name##_avx512
#define FWD_BIG_NV 4
#define FWD_BIG_TP 6
#define FWD_SMALL_NV 2
#define FWD_SMALL_TP 12
#define FWD_ONE_TP 12
#define FL_OCT 8
#define FL_NQ 2
#define DW_TO 8
#define DW_NV 3
#define SP_NV 4
#define SP_NR 4

/* The non-zeros of row[0, n) in order: their positions to idx, values to
 * val (conv.c's s_nz_build, 16 floats a compare and two compress stores
 * instead of a float a step); returns the count. Non-zero as there: != 0,
 * so NaN counts. */
static int s_nz_list_avx512(int *idx, float *val, const float *row, int n)
{
    int k = 0, p = 0;
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; p + 16 <= n; p += 16, at = _mm512_add_epi32(at, step)) {
        __m512 v = _mm512_loadu_ps(row + p);
        __mmask16 m = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        _mm512_mask_compressstoreu_ps(val + k, m, v);
        _mm512_mask_compressstoreu_epi32(idx + k, m, at);
        k += __builtin_popcount(m);
    }
    for (; p < n; p++) {
        idx[k] = p;
        val[k] = row[p];
        k += row[p] != 0.0f;
    }
    return k;
}
#define NZ_LIST s_nz_list_avx512

#include "kernels/cpu/conv_simd.h"
#endif
