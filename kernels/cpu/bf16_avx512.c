/* bf16_avx512: the avx512_bf16 path of the bf16 passes (bf16_ops.h), for
 * CPUs with AVX512_BF16 and no AMX (AMD Zen 4 and 5): vdpbf16ps on bf16
 * pairs, fp32 accumulators. The passes are bf16_avx512_body.h, here with
 * the real intrinsics (the tests compile the same body against a scalar
 * model of them). Compiled for x86 only, with AVX-512F and AVX512_BF16
 * enabled for this file alone, so the build stays portable; bf16_ops.c
 * hands it out only where the CPU has both (isa.h). */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx512f,avx512bf16")
#include <immintrin.h>

#include "kernels/cpu/bf16_ops.h"

#define S(name) s_##name##_avx512
#define BV __m512
#define BI __m512i
#define BH __m256i
#define BM __mmask16
#define BF_ZERO() _mm512_setzero_ps()
#define BF_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define BF_MSTORE(m, p, v) _mm512_mask_storeu_ps(p, m, v)
#define BF_LOADI(p) _mm512_loadu_si512(p)
#define BF_STOREI(p, v) _mm512_storeu_si512(p, v)
#define BF_SET1I(u) _mm512_set1_epi32((int)(u))
#define BF_DP(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define BF_CVT(v) ((__m256i)_mm512_cvtneps_pbh(v))
#define BF_WIDEN(h) _mm512_cvtepu16_epi32(h)
#define BF_SHL16(x) _mm512_slli_epi32(x, 16)
#define BF_OR(x, y) _mm512_or_si512(x, y)

#include "kernels/cpu/bf16_avx512_body.h"

const dp_bf16_ops_t dp_bf16_avx512 = {
    .name = "avx512_bf16",
    .conv_forward = S(conv_forward),
    .conv_backward = S(conv_backward),
    .fc_forward = S(fc_forward),
    .fc_backward = S(fc_backward),
};
#endif
