/* cpu_paths: run a test body once per CPU kernel path this machine supports
 * (kernels/cpu/isa.h: generic, avx2, avx512), saying which path failed.
 * Include after test.h. */
#ifndef DP_TEST_CPU_PATHS_H
#define DP_TEST_CPU_PATHS_H

#include "kernels/cpu/isa.h"

/* body() on every supported path, then back to the path the run started on;
 * a failing path is named after its CHECK lines. */
static inline void t_each_cpu_path(void (*body)(void))
{
    dp_cpu_isa_t keep = dp_cpu_isa();
    for (int i = 0; i < DP_CPU_ISA_COUNT; i++) {
        if (!(dp_cpu_isa_supported() & (1u << i))) continue;
        dp_cpu_isa_set((dp_cpu_isa_t)i);
        int before = t_failures;
        body();
        if (t_failures != before)
            fprintf(stderr, "  ^ %d check(s) failed on the %s path (DP_CPU_ISA=%s)\n",
                    t_failures - before, dp_cpu_isa_name((dp_cpu_isa_t)i),
                    dp_cpu_isa_name((dp_cpu_isa_t)i));
    }
    dp_cpu_isa_set(keep);
}

/* "avx512 avx2 generic": the paths t_each_cpu_path runs here. */
static inline const char *t_cpu_paths(void)
{
    static char buf[64];
    buf[0] = 0;
    for (int i = DP_CPU_ISA_COUNT - 1; i >= 0; i--)
        if (dp_cpu_isa_supported() & (1u << i)) {
            strcat(buf, buf[0] ? " " : "");
            strcat(buf, dp_cpu_isa_name((dp_cpu_isa_t)i));
        }
    return buf;
}

#endif
