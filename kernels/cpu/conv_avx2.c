/* conv_avx2: the convolution's SIMD kernels (conv_simd.h) in AVX2 + FMA,
 * 8 floats a vector, for x86 CPUs without AVX-512 (Zen 1-3, Haswell to
 * Alder Lake). With 16 ymm registers the forward GEMM tiles are 6 positions
 * x 16 channels (12 accumulators, 2 weight vectors, 1 broadcast) and 12 x 8;
 * the direct dw's 4 channels x 24 patch floats (12 accumulators, 3 loads, 1
 * broadcast).
 * Compiled on x86 only; conv.c calls it only where the CPU has AVX2 and FMA
 * (isa.h). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include <string.h>

#include "kernels/cpu/cpu.h"

/* V_MASK(n): lanes [0, n) on, from a window into this table */
static const int s_tail[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

#define V __m256
#define VW 8
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define VM __m256i
#define V_MASK(n) _mm256_loadu_si256((const __m256i *)(s_tail + 8 - ((n) < 8 ? (n) : 8)))
#define V_MLOAD(m, p) _mm256_maskload_ps(p, m)
#define V_MSTORE(m, p, v) _mm256_maskstore_ps(p, m, v)
/* r[0..7] transposed in place: r[c] lane j = r[j] lane c before (unpack,
 * shuffle, then the 128-bit halves: 24 shuffles). */
#define V_TRANSPOSE(r)                                                                       \
    do {                                                                                     \
        __m256 t_[8], u_[8];                                                                 \
        for (int i_ = 0; i_ < 4; i_++) {                                                     \
            t_[2 * i_] = _mm256_unpacklo_ps(r[2 * i_], r[2 * i_ + 1]);                       \
            t_[2 * i_ + 1] = _mm256_unpackhi_ps(r[2 * i_], r[2 * i_ + 1]);                   \
        }                                                                                    \
        for (int i_ = 0; i_ < 2; i_++)                                                       \
            for (int h_ = 0; h_ < 2; h_++) {                                                 \
                u_[4 * i_ + 2 * h_] = _mm256_shuffle_ps(t_[4 * i_ + h_], t_[4 * i_ + h_ + 2], 0x44); \
                u_[4 * i_ + 2 * h_ + 1] =                                                    \
                    _mm256_shuffle_ps(t_[4 * i_ + h_], t_[4 * i_ + h_ + 2], 0xEE);           \
            }                                                                                \
        for (int k_ = 0; k_ < 4; k_++) {                                                     \
            r[k_] = _mm256_permute2f128_ps(u_[k_], u_[4 + k_], 0x20);                        \
            r[4 + k_] = _mm256_permute2f128_ps(u_[k_], u_[4 + k_], 0x31);                    \
        }                                                                                    \
    } while (0)
#define S(name) name##_avx2
#define FWD_BIG_NV 2
#define FWD_BIG_TP 6
#define FWD_SMALL_NV 1
#define FWD_SMALL_TP 12
#define FWD_ONE_TP 12
#define DW_TO 4
#define DW_NV 3
#define SP_NV 4
#define SP_NR 2

#include "kernels/cpu/conv_simd.h"
#endif
