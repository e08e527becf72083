/* bf16: the bfloat16 number (the top half of an IEEE fp32: sign, 8 bits of
 * exponent, 7 of mantissa) and its conversions, the one definition every
 * bf16 path shares (the wire's bf16, the CPU kernels, their references).
 *
 * fp32 -> bf16 rounds to nearest, ties to even (what vcvtneps2bf16 and
 * PyTorch's c10::BFloat16 do); a NaN stays a NaN (quiet, sign kept), an
 * infinity stays infinite, a finite value past bf16's largest rounds to
 * infinity. bf16 -> fp32 is exact (a shift). */
#ifndef DP_COMMON_BF16_H
#define DP_COMMON_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t dp_bf16_t;

static inline dp_bf16_t dp_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one, quiet */
        return (dp_bf16_t)((u >> 16) | 0x0040u);
    /* Add half an ulp of bf16, plus one when the kept part is odd (ties
     * to even); the carry may run into the exponent, which is the right
     * rounding up to the next binade or to infinity. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (dp_bf16_t)(u >> 16);
}

static inline float dp_bf16_to_f32(dp_bf16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest bf16, as an fp32 (a product of two of these is
 * exact in fp32, so an fp32 kernel on rounded operands computes what a
 * bf16 kernel with fp32 accumulation does, up to the order of its sums). */
static inline float dp_bf16_round(float x) { return dp_bf16_to_f32(dp_bf16_from_f32(x)); }

#endif
