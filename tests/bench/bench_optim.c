/* bench_optim: the server's apply (dp_optim_step over a shard) against memcpy
 * of the same vector, measured side by side in one run.
 *
 * Bandwidth counts the bytes the update must touch: SGD reads w and g and
 * writes w (3 vectors), momentum / Nesterov / Adagrad / RMSProp read w, g and one state
 * vector and write w and the state (5), Adam reads w, g, m and v and writes
 * w, m and v (7); memcpy reads one vector and writes one (2). Rounds
 * alternate memcpy and the optimizers so that other load falls on all of
 * them; figures are medians. `apply / memcpy` is the ">= 70 %".
 *
 *   bench_optim [-n FLOATS] [-r ROUNDS] [-t THREADS]   (default: the default
 *   model's 1,663,370 floats, 30 rounds, 1 thread) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/optim.h"

#define S_MAX_ROUNDS 1000

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return v[n / 2];
}

/* Vectors the update touches (read + written), per element. */
static int s_touched(dp_optim_kind_t k)
{
    return 3 + 2 * dp_optim_state_per_param(k);
}

int main(int argc, char **argv)
{
    size_t n = 1663370;
    int rounds = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-n") == 0) n = (size_t)strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "-r") == 0) rounds = atoi(argv[i + 1]);
    }
    if (n < 1024 || rounds < 3 || rounds > S_MAX_ROUNDS) {
        fprintf(stderr, "usage: bench_optim [-n FLOATS >= 1024] [-r ROUNDS 3..%d]\n", S_MAX_ROUNDS);
        return 2;
    }
    const dp_optim_kind_t kinds[] = {DP_OPT_SGD, DP_OPT_MOMENTUM, DP_OPT_ADAM, DP_OPT_RMSPROP};
    enum { K = 4 };
    float *w = dp_aligned_alloc(n * 4), *g = dp_aligned_alloc(n * 4);
    float *state = dp_aligned_alloc(2 * n * 4), *dst = dp_aligned_alloc(n * 4);
    for (size_t i = 0; i < n; i++) w[i] = 0.01f * (float)(i % 97), g[i] = 1e-4f * (float)(i % 13);
    memset(state, 0, 2 * n * 4);
    memset(dst, 0, n * 4);
    static double t_copy[S_MAX_ROUNDS], t_opt[K][S_MAX_ROUNDS];
    for (int r = 0; r < rounds + 2; r++) { /* 2 warm-up rounds */
        double t0 = dp_now();
        memcpy(dst, w, n * 4);
        __asm__ volatile("" : : "r"(dst) : "memory");
        double t1 = dp_now();
        if (r >= 2) t_copy[r - 2] = t1 - t0;
        for (int k = 0; k < K; k++) {
            dp_optim_conf_t c;
            dp_optim_conf_default(&c);
            c.kind = kinds[k];
            double a = dp_now();
            dp_optim_step(&c, 1e-3f, w, g, state, n, r + 1);
            double b = dp_now();
            if (r >= 2) t_opt[k][r - 2] = b - a;
        }
    }
    double copy = s_median(t_copy, rounds);
    double copy_gbs = 2.0 * (double)n * 4 / copy / 1e9;
    printf("bench_optim: %zu floats (%.2f MB), %d rounds, 1 thread; medians\n", n,
           (double)n * 4 / 1e6, rounds);
    printf("%-10s %9s %12s %16s\n", "", "ms", "GB/s touched", "of memcpy's GB/s");
    printf("%-10s %9.3f %12.1f %16s\n", "memcpy", copy * 1e3, copy_gbs, "100%");
    for (int k = 0; k < K; k++) {
        double t = s_median(t_opt[k], rounds);
        double gbs = (double)s_touched(kinds[k]) * (double)n * 4 / t / 1e9;
        printf("%-10s %9.3f %12.1f %15.0f%%\n", dp_optim_kind_name(kinds[k]), t * 1e3, gbs,
               100.0 * gbs / copy_gbs);
    }
    free(w), free(g), free(state), free(dst);
    return 0;
}
