/* bf16_amx: the "amx" bf16 path (bf16_amx.h) on the real tile
 * instructions, and the check that this CPU and kernel run them.
 *
 * The kernel (bf16_amx_body.h) is compiled for amx-tile, amx-bf16 and
 * avx512f by the pragma around its inclusion, so the build needs no -m
 * flags and runs on any x86-64; only dp_bf16_amx_enable, compiled for the
 * plain target, runs before the CPU is known to have them. */
#include "kernels/cpu/bf16_amx.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "common/bf16.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux's arch_prctl for the dynamically enabled tile data (5.16 and later;
 * asm/prctl.h, which older headers lack) and the XSAVE feature number of
 * the tile data (XTILEDATA: XCR0 bit 18). */
#define S_ARCH_REQ_XCOMP_PERM 0x1023
#define S_XFEATURE_XTILEDATA 18

/* The tile operations bf16_amx_body.h is written on, as instructions.
 * GCC 12's _tile_loadconfig and _tile_loadd tell the compiler they read 8
 * bytes and nothing respectively, so stores to the configuration or to a
 * tile's rows just before could be dropped or moved after them: ldtilecfg
 * here names its 64 bytes, and a compiler barrier goes before each load. */
#define AMX_LOADCONFIG(cfg) __asm__ volatile("ldtilecfg %0" ::"m"(*(const s_amx_cfg_t *)(cfg)))
#define AMX_RELEASE() _tile_release()
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOADD(t, base, stride)               \
    do {                                         \
        __asm__ volatile("" ::: "memory");       \
        _tile_loadd(t, base, stride);            \
    } while (0)
#define AMX_STORED(t, base, stride) _tile_stored(t, base, stride)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f")
#include "kernels/cpu/bf16_amx_body.h"
#pragma GCC pop_options

const dp_bf16_ops_t dp_bf16_amx = {
    .name = "amx",
    .conv_forward = s_amx_conv_forward,
    .conv_backward = s_amx_conv_backward,
    .fc_forward = s_amx_fc_forward,
    .fc_backward = s_amx_fc_backward,
};

/* What the CPU and kernel lack, in why, or 0 with the tile data granted.
 * The features are isa.c's reading (CPUID and XCR0's tile and AVX-512
 * state, once at start); only the permission is asked here. */
static int s_enable(char *why)
{
    if (!dp_cpu_has_amx_bf16() || !(dp_cpu_isa_supported() & 1u << DP_CPU_ISA_AVX512))
        return dp_err(why, "bf16 amx: this CPU (or its OS) runs no AMX-BF16 with AVX-512 (it "
                      "has: %s)", dp_cpu_isa_features());
    if (syscall(SYS_arch_prctl, S_ARCH_REQ_XCOMP_PERM, S_XFEATURE_XTILEDATA) != 0)
        return dp_err(why, "bf16 amx: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): %s",
                      strerror(errno));
    return 0;
}

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static int s_rc;              /* s_enable's answer, once */
static char s_why[DP_ERR_LEN]; /* and its line */

static void s_enable_once(void) { s_rc = s_enable(s_why); }

/* The CPU is asked and the permission requested once per process; later
 * calls give the first answer. */
int dp_bf16_amx_enable(char *why)
{
    pthread_once(&s_once, s_enable_once);
    if (s_rc != 0) snprintf(why, DP_ERR_LEN, "%s", s_why);
    return s_rc;
}

#else

int dp_bf16_amx_enable(char *why)
{
    return dp_err(why, "bf16 amx: AMX is x86-64's; this build is for another CPU");
}

#endif
