/* test_lib_deal: libdownpour's downpour_deal_indices (what a library or
 * PyTorch worker trains of a batch shard 0 dealt) draws the same samples as
 * downpour-worker's dp_data_dealt_indices, for every batch of a few epochs
 * and seeds, and refuses a batch that is not one of the data's. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "tests/test.h"
#include "worker/exec/data.h"

typedef int (*s_indices_fn)(uint64_t, uint32_t, uint64_t, uint64_t, uint64_t, int64_t *);

static s_indices_fn s_load(void)
{
    const char *dir = getenv("BUILD");
    char path[512];
    snprintf(path, sizeof path, "%s/lib/libdownpour.so", dir && dir[0] ? dir : "build");
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) return NULL;
    return (s_indices_fn)dlsym(so, "downpour_deal_indices");
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

DP_TESTS(T(test_same_as_worker))
