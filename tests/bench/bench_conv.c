/* bench_conv: one convolution layer's forward and backward (din + dw + db)
 * two levels of DP_CONV_DIRECT (by default 0, the ways before the direct 3x3
 * ones, and 2, every direct way; 1 leaves out the flat forward), interleaved rep by rep so that load on a shared machine falls on both
 * alike; prints the medians and their ratios. For choosing between designs
 * (kernels/cpu/conv.c), not a benchmark of record: pin it to one core
 * (taskset -c 1) and read the ratios, not the milliseconds. Times are the
 * process's CPU time (one thread), so the waits for the core are left out,
 * though not the caches other work on the machine takes.
 *
 *   bench_conv [-b B] [-c C] [-s H] [-o OC] [-k K] [-p PAD] [-S STRIDE] [-r REPS] [-d A:B] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/env.h"
#include "kernels/ops.h"

static double s_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); /* CPU time: a shared machine's waits left out */
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void s_direct(int level)
{
    char err[DP_ERR_LEN], v[8];
    snprintf(v, sizeof v, "%d", level);
    setenv("DP_CONV_DIRECT", v, 1);
    if (dp_conv_env(err) != 0) {
        fprintf(stderr, "bench_conv: %s\n", err);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    char err[DP_ERR_LEN];
    if (dp_kernels_env(err) != 0) {
        fprintf(stderr, "bench_conv: %s\n", err);
        return 2;
    }
    dp_conv_dims_t d = {.B = 128, .C = 16, .H = 28, .W = 28, .OC = 16, .K = 3, .pad = 1,
                        .stride = 1};
    int reps = 7, opt, level[2] = {0, 2};
    while ((opt = getopt(argc, argv, "b:c:s:o:k:p:S:r:d:")) != -1) {
        int v = atoi(optarg);
        switch (opt) {
        case 'b': d.B = v; break;
        case 'c': d.C = v; break;
        case 's': d.H = d.W = v; break;
        case 'o': d.OC = v; break;
        case 'k': d.K = v; break;
        case 'p': d.pad = v; break;
        case 'S': d.stride = v; break;
        case 'r': reps = v; break;
        case 'd':
            if (sscanf(optarg, "%d:%d", &level[0], &level[1]) != 2) level[0] = -1;
            break;
        default:
            fprintf(stderr, "usage: bench_conv [-b B] [-c C] [-s H] [-o OC] [-k K] [-p PAD] "
                            "[-S STRIDE] [-r REPS] [-d A:B]\n");
            return 2;
        }
    }
    if (d.B < 1 || d.C < 1 || d.H < 1 || d.OC < 1 || d.K < 1 || d.stride < 1 || d.pad < 0 ||
        d.H + 2 * d.pad < d.K || reps < 1 || reps > 1000 || level[0] < 0 || level[0] > 2 ||
        level[1] < 0 || level[1] > 2) {
        fprintf(stderr, "bench_conv: bad shape, -r or -d (want positive sizes, K <= H + 2 PAD, "
                        "levels 0-2)\n");
        return 2;
    }
    dp_cpu_set_threads(1);
    dp_conv_dims_finish(&d);
    size_t nin = (size_t)d.B * d.C * d.H * d.W, nout = (size_t)d.B * d.OC * d.OH * d.OW;
    size_t nw = (size_t)d.OC * d.C * d.K * d.K;
    float *in = dp_malloc(nin * 4), *din = dp_malloc(nin * 4), *w = dp_malloc(nw * 4);
    float *dw = dp_malloc(nw * 4), *db = dp_malloc((size_t)d.OC * 4);
    float *out = dp_malloc(nout * 4), *g = dp_malloc(nout * 4);
    dp_rng_t r;
    dp_rng_seed(&r, 1);
    for (size_t i = 0; i < nin; i++) in[i] = dp_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < nw; i++) w[i] = dp_rng_uniform(&r) - 0.5f;
    for (size_t i = 0; i < nout; i++) g[i] = dp_rng_uniform(&r) - 0.5f;
    double *t = dp_malloc(sizeof(double) * 6 * (size_t)reps); /* [way][pass][rep] */
    for (int rep = -1; rep < reps; rep++) /* rep -1 warms the scratch up */
        for (int way = 0; way < 2; way++) {
            s_direct(level[way]);
            double t0 = s_now();
            dp_conv2d_forward(out, in, w, NULL, &d);
            double t1 = s_now();
            dp_conv2d_backward(din, dw, db, g, in, w, &d);
            double t2 = s_now();
            dp_conv2d_backward(NULL, dw, db, g, in, w, &d);
            double t3 = s_now();
            if (rep < 0) continue;
            t[(way * 3 + 0) * reps + rep] = t1 - t0;
            t[(way * 3 + 1) * reps + rep] = t2 - t1;
            t[(way * 3 + 2) * reps + rep] = t3 - t2;
        }
    double m[6];
    for (int i = 0; i < 6; i++) m[i] = s_median(t + (size_t)i * reps, reps);
    printf("B %d C %d %dx%d OC %d K %d pad %d stride %d, 1 thread, median of %d (CPU ms):\n", d.B,
           d.C, d.H, d.W, d.OC, d.K, d.pad, d.stride, reps);
    const char *pass[3] = {"forward", "backward", "dw, db only"};
    printf("  DP_CONV_DIRECT %d vs %d\n", level[0], level[1]);
    for (int i = 0; i < 3; i++)
        printf("  %-11s %d: %8.2f  %d: %8.2f  ratio %.2fx\n", pass[i], level[0], m[i], level[1],
               m[3 + i], m[i] / m[3 + i]);
    free(in), free(din), free(w), free(dw), free(db), free(out), free(g), free(t);
    return 0;
}
