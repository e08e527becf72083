/* bf16_ops: which native bf16 path this CPU runs (bf16_ops.h). AMX first
 * on a CPU with it (on Intel vdpbf16ps runs at half fp32's rate, so an AMX
 * CPU never takes avx512_bf16 unless DP_CPU_BF16 asks), else avx512_bf16
 * (AMD Zen 4 and 5), else none. */
#include "kernels/cpu/bf16_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "common/util.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/isa.h"

/* The avx512_bf16 table, where this build has one (x86). */
static const dp_bf16_ops_t *s_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return &dp_bf16_avx512;
#else
    return NULL;
#endif
}

/* The amx table, once Linux has granted the tile data (bf16_amx.h): a
 * CPU whose CPUID says AMX but whose kernel refuses gets that line. */
static const dp_bf16_ops_t *s_amx(char *why)
{
#if defined(__x86_64__)
    return dp_bf16_amx_enable(why) == 0 ? &dp_bf16_amx : NULL;
#else
    return dp_err(why, "bf16 amx: AMX is x86-64's; this build is for another CPU"), NULL;
#endif
}

const dp_bf16_ops_t *dp_bf16_ops_choose(const char *value, int has_avx512_bf16, int has_amx_bf16,
                                        const char *features, char *why)
{
    if (value && *value) {
        int amx = strcasecmp(value, "amx") == 0;
        if (!amx && strcasecmp(value, "avx512_bf16") != 0) {
            dp_err(why, "DP_CPU_BF16=%s: unknown path (expected amx or avx512_bf16; this CPU "
                   "has: %s)", value, features);
            return NULL;
        }
        if (!(amx ? has_amx_bf16 : has_avx512_bf16)) {
            dp_err(why, "DP_CPU_BF16=%s: this CPU cannot run the %s path (it has: %s); set "
                   "DP_CPU_BF16 to one it can run or unset it", value, amx ? "amx" : "avx512_bf16",
                   features);
            return NULL;
        }
        return amx ? s_amx(why) : s_avx512();
    }
    if (has_amx_bf16) return s_amx(why);
    if (has_avx512_bf16 && s_avx512()) return s_avx512();
    dp_err(why, "bf16 needs AVX512_BF16 or AMX; this CPU has neither");
    return NULL;
}

const dp_bf16_ops_t *dp_bf16_ops_native(char *why)
{
    return dp_bf16_ops_choose(getenv("DP_CPU_BF16"), dp_cpu_has_avx512_bf16(),
                              dp_cpu_has_amx_bf16(), dp_cpu_isa_features(), why);
}
