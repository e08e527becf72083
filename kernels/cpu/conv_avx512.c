/* conv_avx512: the convolution's SIMD kernels (conv_simd.h) in AVX-512F,
 * 16 floats a vector; the forward GEMM tiles are 6 positions x 64 channels,
 * 12 x 32 and 12 x 16 (resnet's 16-channel stage: the AVX2 path's 12 x 8
 * tile, the same macro at one vector); the direct dw's 8 channels x 48
 * patch floats (24 accumulators). Compiled on x86 only; conv.c calls it only where the CPU has
 * AVX-512F (isa.h). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f")
#include <immintrin.h>

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
#define S(name) name##_avx512
#define FWD_BIG_NV 4
#define FWD_BIG_TP 6
#define FWD_SMALL_NV 2
#define FWD_SMALL_TP 12
#define FWD_ONE_TP 12
#define DW_TO 8
#define DW_NV 3
#define SP_NV 2
#define SP_NR 4

#include "kernels/cpu/conv_simd.h"
#endif
