/* blas: OpenBLAS loaded in main with its core pinned per ISA path (see
 * blas.h). cblas.h is included for its types and prototypes only: the
 * functions are reached through the pointers below, never linked. */
#include "kernels/cpu/blas.h"

#include <assert.h>
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

/* What the project calls, resolved once from the loaded library. */
static struct {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(openblas_set_num_threads) *set_num_threads;
    __typeof__(openblas_get_corename) *get_corename;
} s_blas;
static int s_ready;          /* dp_cpu_blas_init has succeeded */
static char s_core[32] = ""; /* openblas_get_corename(), copied */

#if defined(__x86_64__) || defined(__i386__)
/* Per path: the core, and the CPU features its kernels use beyond what the
 * path itself checked (isa.c). SkylakeX's are built for Skylake-SP, which
 * has more of AVX-512 than the F the avx512 path asks for. */
static const struct {
    const char *core;
    const char *needs; /* blank-separated __builtin_cpu_supports names */
} s_pins[DP_CPU_ISA_COUNT] = {
    [DP_CPU_ISA_GENERIC] = {"Prescott", "sse3"},
    [DP_CPU_ISA_AVX2] = {"Haswell", "avx2 fma"},
    [DP_CPU_ISA_AVX512] = {"SkylakeX", "avx512f avx512cd avx512bw avx512dq avx512vl"},
};

/* __builtin_cpu_supports takes a literal: one line per feature named above. */
static int s_has(const char *f)
{
    __builtin_cpu_init();
    if (!strcmp(f, "sse3")) return __builtin_cpu_supports("sse3");
    if (!strcmp(f, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(f, "fma")) return __builtin_cpu_supports("fma");
    if (!strcmp(f, "avx512f")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(f, "avx512cd")) return __builtin_cpu_supports("avx512cd");
    if (!strcmp(f, "avx512bw")) return __builtin_cpu_supports("avx512bw");
    if (!strcmp(f, "avx512dq")) return __builtin_cpu_supports("avx512dq");
    if (!strcmp(f, "avx512vl")) return __builtin_cpu_supports("avx512vl");
    return 0;
}

/* The features of `needs` this CPU lacks, blank-separated, into out. */
static void s_missing(const char *needs, char *out, size_t n)
{
    char buf[128], *save = NULL;
    snprintf(buf, sizeof buf, "%s", needs);
    out[0] = 0;
    for (char *f = strtok_r(buf, " ", &save); f; f = strtok_r(NULL, " ", &save))
        if (!s_has(f)) snprintf(out + strlen(out), n - strlen(out), "%s%s", *out ? " " : "", f);
}
#endif

const char *dp_cpu_blas_pin(dp_cpu_isa_t isa)
{
    assert((unsigned)isa < DP_CPU_ISA_COUNT);
#if defined(__x86_64__) || defined(__i386__)
    return s_pins[isa].core;
#else
    (void)isa;
    return NULL;
#endif
}

const char *dp_cpu_blas_core(void)
{
    assert(s_ready && "dp_kernels_env (kernels/env.h) runs first, in main");
    return s_core;
}

/* dlopen with OPENBLAS_CORETYPE=pin for the constructor, the user's value
 * (or its absence) put back afterwards. Runs in main before any thread of
 * ours, so touching the environment is safe. */
static void *s_open(const char *pin)
{
    if (!pin) return dlopen(DP_CPU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    const char *was = getenv("OPENBLAS_CORETYPE");
    char *keep = was ? dp_strdup(was) : NULL;
    setenv("OPENBLAS_CORETYPE", pin, 1);
    void *h = dlopen(DP_CPU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (keep) setenv("OPENBLAS_CORETYPE", keep, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    free(keep);
    return h;
}

int dp_cpu_blas_init(dp_cpu_isa_t isa, char *err)
{
    if (s_ready) return 0;
    const char *pin = dp_cpu_blas_pin(isa);
#if defined(__x86_64__) || defined(__i386__)
    char lack[128];
    s_missing(s_pins[isa].needs, lack, sizeof lack);
    if (*lack)
        return dp_err(err, "the %s path pins OpenBLAS's %s kernels, which need %s: this CPU "
                      "lacks %s; set DP_CPU_ISA to a lower path (kernels/cpu/blas.h)",
                      dp_cpu_isa_name(isa), pin, s_pins[isa].needs, lack);
#endif
    /* Loaded already (LD_PRELOAD): its constructor ran before main with
     * whatever core it chose; the check below says whether that is ours. */
    void *h = dlopen(DP_CPU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    int before = h != NULL;
    if (!h) h = s_open(pin);
    if (!h)
        return dp_err(err, "cannot load OpenBLAS (%s): install libopenblas0 (make deps)",
                      dlerror());
    s_blas.sgemm = (__typeof__(s_blas.sgemm))dlsym(h, "cblas_sgemm");
    s_blas.set_num_threads =
        (__typeof__(s_blas.set_num_threads))dlsym(h, "openblas_set_num_threads");
    s_blas.get_corename = (__typeof__(s_blas.get_corename))dlsym(h, "openblas_get_corename");
    if (!s_blas.sgemm || !s_blas.set_num_threads || !s_blas.get_corename)
        return dp_err(err, "%s lacks cblas_sgemm, openblas_set_num_threads or "
                      "openblas_get_corename: not OpenBLAS? (install libopenblas0)",
                      DP_CPU_BLAS_SONAME);
    const char *core = s_blas.get_corename();
    snprintf(s_core, sizeof s_core, "%s", core ? core : "?");
    if (pin && strcasecmp(s_core, pin) != 0) {
        if (before)
            return dp_err(err, "OpenBLAS runs its %s kernels where the %s path pins %s: it was "
                          "loaded before main (LD_PRELOAD?), so results would depend on this "
                          "CPU; run without preloading it, or preload it with "
                          "OPENBLAS_CORETYPE=%s",
                          s_core, dp_cpu_isa_name(isa), pin, pin);
        return dp_err(err, "OpenBLAS runs its %s kernels where the %s path pins %s: this "
                      "%s ignores OPENBLAS_CORETYPE (not a DYNAMIC_ARCH build?), so results "
                      "would depend on this CPU; install Debian's libopenblas0",
                      s_core, dp_cpu_isa_name(isa), pin, DP_CPU_BLAS_SONAME);
    }
    s_blas.set_num_threads(1); /* all parallelism is ours (cpu.h) */
    s_ready = 1;
    return 0;
}

void dp_cpu_blas_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    assert(s_ready && "dp_kernels_env (kernels/env.h) runs first, in main");
    s_blas.sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans,
                 transb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                 ldc);
}
