/* bf16_ops: the convolution and fc passes in bfloat16 (--precision bf16),
 * one `static const` table per instruction-set path. Every pass takes and
 * gives fp32 tensors in ops.h's layouts and signatures (NCHW, outputs
 * first, gradients overwritten, b/db/din may be NULL as there); inside,
 * the operands of every product (activations, weights, output gradients)
 * are rounded to bf16 (common/bf16.h) and the products summed in fp32, so
 * a pass differs from the fp32 one by its operands' rounding alone, and
 * from another path's only by the order of its fp32 sums. Bias and its
 * gradient are fp32 sums of fp32 values. Each path is deterministic for a
 * given shape and thread count (record and replay rely on it).
 *
 * Paths: "amx" (Intel AMX tiles), "avx512_bf16" (vdpbf16ps, for CPUs with
 * AVX512_BF16 and no AMX: AMD Zen 4 and 5), and "emulated" (the fp32
 * kernels on rounded copies of the operands: bf16's numerics on any CPU,
 * slower than fp32; a test hook, never chosen for a user). */
#ifndef DP_CPU_BF16_OPS_H
#define DP_CPU_BF16_OPS_H

#include "kernels/ops.h"

typedef struct {
    const char *name;
    void (*conv_forward)(float *out, const float *in, const float *w, const float *b,
                         const dp_conv_dims_t *d);
    void (*conv_backward)(float *din, float *dw, float *db, const float *dout, const float *in,
                          const float *w, const dp_conv_dims_t *d);
    void (*fc_forward)(float *out, const float *in, const float *w, const float *b, int B, int IN,
                       int OUT);
    void (*fc_backward)(float *din, float *dw, float *db, const float *dout, const float *in,
                        const float *w, int B, int IN, int OUT);
} dp_bf16_ops_t;

#if defined(__x86_64__) || defined(__i386__)
/* The avx512_bf16 path (bf16_avx512.c); call it only where
 * dp_cpu_has_avx512_bf16 (isa.h). */
extern const dp_bf16_ops_t dp_bf16_avx512;
#endif

/* The best native path this CPU runs (AMX, else AVX512_BF16), the Linux
 * permission for AMX's tile data asked for first; NULL with one line in
 * why (e.g. "bf16 needs AVX512_BF16 or AMX; this CPU has neither") where
 * it runs none. */
const dp_bf16_ops_t *dp_bf16_ops_native(char *why);

/* The choice itself, for a CPU with the features given (isa.h's
 * dp_cpu_has_*): value is DP_CPU_BF16 (environment; NULL or "" = the best
 * path, amx or avx512_bf16, any case), which forces a path the CPU has, so
 * an AMX machine tests both. NULL with one line in why for a CPU with
 * neither, or a value it cannot run or does not know (the variable, the
 * value and the CPU's features, as DP_CPU_ISA's refusal). */
const dp_bf16_ops_t *dp_bf16_ops_choose(const char *value, int has_avx512_bf16, int has_amx_bf16,
                                        const char *features, char *why);

#endif
