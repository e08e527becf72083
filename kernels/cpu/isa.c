/* isa: the CPU's features, DP_CPU_ISA, and the path the kernels take
 * (see isa.h). The x86 feature tests are compiled only for x86; elsewhere
 * the generic path is the only one. */
#include "kernels/cpu/isa.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static const char *const s_names[DP_CPU_ISA_COUNT] = {"generic", "avx2", "avx512"};

static dp_cpu_isa_t s_isa = DP_CPU_ISA_GENERIC; /* set by main, before any kernel runs */
static int s_ready;                             /* dp_cpu_isa_init has run */
static unsigned s_supported = 1u << DP_CPU_ISA_GENERIC;
static char s_features[128] = "no x86 features";
static int s_avx512_bf16, s_amx_bf16; /* bf16's instructions, usable (isa.h) */

const char *dp_cpu_isa_name(dp_cpu_isa_t isa)
{
    return (unsigned)isa < DP_CPU_ISA_COUNT ? s_names[isa] : "?";
}

dp_cpu_isa_t dp_cpu_isa(void)
{
    assert(s_ready && "dp_kernels_env (kernels/env.h) runs first, in main");
    return s_isa;
}

unsigned dp_cpu_isa_supported(void)
{
    return s_supported;
}

const char *dp_cpu_isa_features(void)
{
    return s_features;
}

int dp_cpu_isa_choose(const char *value, unsigned supported, dp_cpu_isa_t *isa, char *err)
{
    if (!value || !*value) {
        int best = DP_CPU_ISA_COUNT - 1;
        while (best > 0 && !(supported & (1u << best))) best--;
        *isa = (dp_cpu_isa_t)best;
        return 0;
    }
    for (int i = 0; i < DP_CPU_ISA_COUNT; i++) {
        if (strcasecmp(value, s_names[i]) != 0) continue; /* AVX2 as well as avx2 */
        if (!(supported & (1u << i)))
            return dp_err(err, "DP_CPU_ISA=%s: this CPU cannot run the %s path (it has: %s); "
                          "set DP_CPU_ISA to one it can run or unset it",
                          value, s_names[i], s_features);
        *isa = (dp_cpu_isa_t)i;
        return 0;
    }
    return dp_err(err, "DP_CPU_ISA=%s: unknown path (expected avx512, avx2 or generic; this "
                  "CPU has: %s)", value, s_features);
}

void dp_cpu_isa_set(dp_cpu_isa_t isa)
{
    assert((unsigned)isa < DP_CPU_ISA_COUNT && (s_supported & (1u << isa)));
    s_isa = isa;
}

int dp_cpu_has_avx512_bf16(void)
{
    return s_avx512_bf16;
}

int dp_cpu_has_amx_bf16(void)
{
    return s_amx_bf16;
}

#if defined(__x86_64__) || defined(__i386__)
/* XCR0, the state components the OS saves on a context switch (0 where
 * the OS has not enabled XSAVE: then nothing past SSE may be used). */
static unsigned long long s_xcr0(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (unsigned long long)hi << 32 | lo;
}

/* bf16's instructions, read from CPUID directly: GCC 12's
 * __builtin_cpu_supports knows avx512bf16 but not AMX, and neither looks
 * at XCR0's tile state. */
static void s_detect_bf16(int avx512f)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return;
    unsigned long long xcr0 = s_xcr0();
    const unsigned long long zmm_state = 0xe6; /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
    const unsigned long long tile_state = 3ull << 17; /* XTILECFG, XTILEDATA */
    __cpuid_count(7, 0, a, b, c, d);
    unsigned subleaves = a;
    s_amx_bf16 = (d & (1u << 22)) && (d & (1u << 24)) && (xcr0 & tile_state) == tile_state;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        s_avx512_bf16 = avx512f && (a & (1u << 5)) && (xcr0 & zmm_state) == zmm_state;
    }
}
#endif

/* What the CPU can run. Valgrind hides AVX-512 from the feature tests, so
 * under it the avx2 path runs. */
static void s_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    s_detect_bf16(avx512);
    snprintf(s_features, sizeof s_features, "%savx512f, %savx2, %sfma, %savx512_bf16, %samx_bf16",
             avx512 ? "" : "no ", __builtin_cpu_supports("avx2") ? "" : "no ",
             __builtin_cpu_supports("fma") ? "" : "no ", s_avx512_bf16 ? "" : "no ",
             s_amx_bf16 ? "" : "no ");
    if (avx2) s_supported |= 1u << DP_CPU_ISA_AVX2;
    if (avx512 && avx2) s_supported |= 1u << DP_CPU_ISA_AVX512;
#endif
}

int dp_cpu_isa_init(char *err)
{
    s_detect();
    if (dp_cpu_isa_choose(getenv("DP_CPU_ISA"), s_supported, &s_isa, err) != 0) return -1;
    s_ready = 1;
    return 0;
}
