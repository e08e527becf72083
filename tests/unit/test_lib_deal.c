/* test_lib_deal: libdownpour's downpour_deal_indices (what a library or
 * PyTorch worker trains of a batch shard 0 dealt) draws the same samples as
 * downpour-worker's dp_data_dealt_indices, for every batch of a few epochs
 * and seeds, and refuses a batch that is not one of the data's; the whole
 * epoch's downpour_deal_permutation, sliced, gives the same batches. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "tests/test.h"
#include "worker/exec/data.h"

typedef int (*s_indices_fn)(uint64_t, uint32_t, uint64_t, uint64_t, uint64_t, int64_t *);
typedef int (*s_perm_fn)(uint64_t, uint64_t, uint64_t, int64_t *);

static void *s_sym(const char *name)
{
    const char *dir = getenv("BUILD");
    char path[512];
    snprintf(path, sizeof path, "%s/lib/libdownpour.so", dir && dir[0] ? dir : "build");
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    return so ? dlsym(so, name) : NULL;
}

static s_indices_fn s_load(void)
{
    return (s_indices_fn)s_sym("downpour_deal_indices");
}

static void test_same_as_worker(void)
{
    s_indices_fn f = s_load();
    if (!f) SKIP("build/lib/libdownpour.so not built (make all)");
    const int n = 640, b = 32;
    int want[32];
    int64_t got[32];
    char err[256];
    int same = 1;
    for (unsigned long long seed = 0; seed < 3; seed++)
        for (uint64_t e = 0; e < 3; e++)
            for (uint64_t j = 0; j < (uint64_t)(n / b); j++) {
                CHECK_EQ(dp_data_dealt_indices(n, b, seed, e, j, want, err), 0);
                CHECK_EQ(f((uint64_t)n, (uint32_t)b, seed, e, j, got), 0);
                for (int k = 0; k < b; k++) same &= got[k] == want[k];
            }
    CHECK(same);
    CHECK_EQ(f(640, 32, 0, 0, 20, got), -1); /* batch 20 of 20 */
    CHECK_EQ(f(640, 0, 0, 0, 0, got), -1);
    CHECK_EQ(f((uint64_t)1 << 40, 32, 0, 0, 0, got), -1);
}

/* The Python client draws an epoch once and slices it: every batch of the
 * slice is the worker's. */
static void test_permutation_slices(void)
{
    s_perm_fn perm = (s_perm_fn)s_sym("downpour_deal_permutation");
    if (!perm) SKIP("build/lib/libdownpour.so not built (make all)");
    const int n = 650, b = 32; /* 20 batches and 10 samples left over */
    int want[32];
    int64_t all[650];
    char err[256];
    int same = 1, seen[650] = {0};
    for (unsigned long long seed = 0; seed < 3; seed++)
        for (uint64_t e = 0; e < 3; e++) {
            CHECK_EQ(perm((uint64_t)n, seed, e, all), 0);
            for (uint64_t j = 0; j < (uint64_t)(n / b); j++) {
                CHECK_EQ(dp_data_dealt_indices(n, b, seed, e, j, want, err), 0);
                for (int k = 0; k < b; k++) same &= all[j * b + (uint64_t)k] == want[k];
            }
        }
    CHECK(same);
    for (int i = 0; i < n; i++) seen[all[i]]++;
    int once = 1;
    for (int i = 0; i < n; i++) once &= seen[i] == 1;
    CHECK(once); /* a permutation: every sample once */
    CHECK_EQ(perm(0, 0, 0, all), -1);
    CHECK_EQ(perm((uint64_t)1 << 40, 0, 0, all), -1);
}

DP_TESTS(T(test_same_as_worker), T(test_permutation_slices))
