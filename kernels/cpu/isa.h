/* isa: which instruction-set path the fast CPU kernels take — the one
 * dispatch point. The path is picked once, by dp_cpu_isa_init at the start
 * of main (kernels/env.h's dp_kernels_env), from the CPU's features: avx512
 * (AVX-512F), else avx2 (AVX2 + FMA), else generic (plain C and OpenBLAS,
 * the only path off x86).
 *
 * DP_CPU_ISA=avx512|avx2|generic (environment, any case) forces a path, so
 * every path can be run and tested on one machine. A value this CPU cannot
 * run, or an unknown one, is refused with one line on stderr (the variable,
 * the value, what the CPU has) and exit status 2: every binary that links
 * the kernels (downpour-worker, downpour local/eval, the tests and benches)
 * fails cleanly before doing anything. Nothing of it runs before main. */
#ifndef DP_CPU_ISA_H
#define DP_CPU_ISA_H

#include <stddef.h>

typedef enum {
    DP_CPU_ISA_GENERIC,  /* portable C + OpenBLAS */
    DP_CPU_ISA_AVX2,     /* our kernels in AVX2 + FMA (256-bit) */
    DP_CPU_ISA_AVX512,   /* our kernels in AVX-512F (512-bit) */
    DP_CPU_ISA_COUNT
} dp_cpu_isa_t;

/* Detect the CPU's features and choose the path (DP_CPU_ISA, else the
 * best); -1 with err for a refused DP_CPU_ISA. */
int dp_cpu_isa_init(char *err);
/* The path the kernels take now (after dp_cpu_isa_init: asserted). */
dp_cpu_isa_t dp_cpu_isa(void);

/* "generic", "avx2", "avx512". */
const char *dp_cpu_isa_name(dp_cpu_isa_t isa);

/* Bit (1 << isa) for every path this CPU (and this build) can run; generic
 * always. */
unsigned dp_cpu_isa_supported(void);

/* The CPU's features that matter for the choice of a path, fp32's and
 * bf16's, e.g. "avx512f avx2 fma avx512_bf16 no amx_bf16". */
const char *dp_cpu_isa_features(void);

/* bf16's instructions (kernels/cpu/bf16_ops.h), each with the state the
 * OS must save for it enabled in XCR0, so 0 under a kernel or hypervisor
 * that hides it. AVX512_BF16 (vdpbf16ps): CPUID leaf 7 subleaf 1 EAX bit
 * 5, with AVX-512F and XCR0's AVX-512 state (bits 1-2, 5-7). AMX-BF16:
 * leaf 7 subleaf 0 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), with XCR0's
 * tile state (bits 17-18); Linux still wants the permission for tile data
 * asked for (arch_prctl) before the first tile instruction, which the
 * AMX path does, not this. Valid after dp_cpu_isa_init; 0 off x86. */
int dp_cpu_has_avx512_bf16(void);
int dp_cpu_has_amx_bf16(void);

/* The path for a DP_CPU_ISA value (NULL or "" = the best of `supported`);
 * -1 with err for an unknown value or one outside `supported`. */
int dp_cpu_isa_choose(const char *value, unsigned supported, dp_cpu_isa_t *isa, char *err);

/* Tests and benches: switch path (must be supported; asserted). Not
 * thread-safe: call it between kernel calls, never during one. */
void dp_cpu_isa_set(dp_cpu_isa_t isa);

#endif
