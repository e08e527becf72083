/* bench_train: Downpour's training throughput, measured the way the worker
 * trains — dp_net_train_step (batch upload, forward, softmax-xent, backward)
 * then the backend's momentum SGD over the flat parameter vector — on a fixed
 * synthetic batch, so neither data loading nor evaluation is in the figure.
 * tests/bench/run.sh (`make bench`) runs it next to tests/bench/torch_train.py.
 *
 *   bench_train [-b 32,64,128] [-t THREADS] [-s SECONDS] [-r SAMPLES] [-w WARMUP]
 *               [-m SPEC] [-i CxHxW] [-l] [-g] [-p]
 *
 * -m SPEC the network (default the seed CNN; resnet20 etc.), -i its input
 * shape (default 1x28x28). -l adds, after each batch's samples, where a
 * step's time goes: each layer's forward and backward (worker/exec/net.h's
 * t_layer, over 5 steps) and the same summed by kind, as "#" lines:
 *   # layer NAME KIND FWD_MS BWD_MS
 *   # kind KIND FWD_MS BWD_MS SHARE_PERCENT
 *
 * Output, one line per sample (what run.sh parses):
 *   sample downpour THREADS BATCH IMAGES_PER_S LOSS
 * A sample is the throughput of as many whole steps as fit in SECONDS; run.sh
 * takes medians, because the machine is shared and single samples are noisy.
 * -g measures instead what OpenBLAS's sgemm reaches on THREADS cores (each
 * thread multiplying its own 1024x1024 matrices, single-threaded OpenBLAS,
 * as the kernels call it):
 *   sgemm THREADS GFLOP_PER_S
 * -p prints the CPU kernel paths this machine supports, best first, and the
 * CPU features behind them (kernels/cpu/isa.h), then exits:
 *   paths avx512 avx2 generic
 *   features avx512f, avx2, fma, no avx512_bf16, no amx_bf16
 * The kernels take the path DP_CPU_ISA names (default: the best).
 * Invariant: nothing here changes the model or the kernels; the step is the
 * standalone trainer's (worker/train/train.c), minus its data thread. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"
#include "worker/exec/net.h"
#include "common/opts.h"
#include "kernels/env.h"

/* Parse "32,64,128" into v (at most max, each >= 1); returns the count or -1. */
static int s_list(const char *s, int *v, int max)
{
    int k = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 1 || x > 65536 || k == max) return -1;
        v[k++] = (int)x;
        if (*end == 0) break;
        if (*end != ',') return -1;
        s = end + 1;
    }
    return k > 0 ? k : -1;
}

/* Layer l's kind as the per-layer table groups it: a conv by kernel and stride. */
static void s_kind(const dp_layer_t *l, char *out, size_t n)
{
    static const char *const names[] = {
        [DP_LAYER_CONV] = "conv",   [DP_LAYER_RELU] = "relu", [DP_LAYER_MAXPOOL] = "maxpool",
        [DP_LAYER_FC] = "fc",       [DP_LAYER_SOFTMAX] = "softmax", [DP_LAYER_BN] = "bn",
        [DP_LAYER_GAP] = "gap",     [DP_LAYER_DROPOUT] = "dropout", [DP_LAYER_ADD] = "add",
        [DP_LAYER_TANH] = "tanh",   [DP_LAYER_AC] = "ac",
    };
    if (l->kind == DP_LAYER_CONV) snprintf(out, n, "conv%dx%d:s%d", l->k, l->k, l->stride);
    else snprintf(out, n, "%s", names[l->kind]);
}

/* -l: 5 steps with the executor's per-layer clock on; the table. */
static void s_per_layer(dp_net_t *net, dp_backend_t *be, const dp_optim_conf_t *opt, float *vel,
                        const float *x, const int *y, int B)
{
    const dp_model_t *m = net->m;
    enum { STEPS = 5 };
    double *t = dp_calloc(2 * (size_t)m->n_layers, sizeof *t), t_opt = 0, total = 0;
    net->t_layer = t;
    for (int s = 0; s < STEPS; s++) {
        dp_net_train_step(net, x, y, B);
        double t0 = dp_now();
        be->ops->optim_step(be, opt, 0.01f, net->d_params, net->d_grads, vel, m->n_floats, 1);
        t_opt += dp_now() - t0;
    }
    net->t_layer = NULL;
    char kind[64][32];
    double kf[64] = {0}, kb[64] = {0};
    int nk = 0;
    for (int i = 0; i < m->n_layers; i++) {
        char k[32];
        s_kind(&m->layers[i], k, sizeof k);
        double f = t[i] / STEPS * 1e3, b = t[m->n_layers + i] / STEPS * 1e3;
        printf("# layer %s %s %.3f %.3f\n", m->layers[i].name, k, f, b);
        int j = 0;
        while (j < nk && strcmp(kind[j], k) != 0) j++;
        if (j == nk && nk < 64) snprintf(kind[nk++], sizeof kind[0], "%s", k);
        if (j < 64) kf[j] += f, kb[j] += b;
        total += f + b;
    }
    total += t_opt / STEPS * 1e3;
    for (int j = 0; j < nk; j++)
        printf("# kind %s %.3f %.3f %.1f\n", kind[j], kf[j], kb[j], 100 * (kf[j] + kb[j]) / total);
    printf("# kind optimizer %.3f 0 %.1f\n", t_opt / STEPS * 1e3, 100 * t_opt / STEPS * 1e3 / total);
    printf("# step %.3f ms at batch %d: %.0f images/s with the clock on\n", total, B, B / total * 1e3);
    free(t);
}

/* Samples of training throughput at batch B: the net is built for B alone,
 * as the worker builds it for its --batch. */
static int s_bench_batch(const dp_model_t *m, int T, int B, double secs, int samples, int warmup,
                         int per_layer)
{
    char err[DP_ERR_LEN];
    dp_backend_t *be = NULL;
    dp_backend_cpu_new(&be, NULL);
    dp_net_t net;
    if (dp_net_init(&net, m, be, B, err) != 0) {
        fprintf(stderr, "bench_train: %s\n", err);
        dp_backend_destroy(&be);
        return -1;
    }
    size_t nf = m->n_floats, in = (size_t)m->in_c * m->in_h * m->in_w;
    float *params = dp_malloc(nf * sizeof(float));
    dp_model_init_params(m, params, 1);
    dp_net_set_params(&net, params);
    free(params);
    float *vel = be->ops->alloc(be, nf * sizeof(float));
    dp_optim_conf_t opt; /* momentum SGD, as PyTorch's side of the bench */
    dp_optim_conf_default(&opt);
    opt.kind = DP_OPT_MOMENTUM;
    /* one fixed batch of pixels in [0, 1) and random labels, on the host as the
     * data thread hands them to the worker */
    float *x = dp_malloc((size_t)B * in * sizeof(float));
    int *y = dp_malloc((size_t)B * sizeof(int));
    dp_rng_t r;
    dp_rng_seed(&r, 7);
    for (size_t i = 0; i < (size_t)B * in; i++) x[i] = dp_rng_uniform(&r);
    for (int b = 0; b < B; b++) y[b] = (int)dp_rng_below(&r, (uint32_t)m->classes);

    float loss = 0;
    for (int w = 0; w < warmup; w++) {
        loss = dp_net_train_step(&net, x, y, B);
        be->ops->optim_step(be, &opt, 0.01f, net.d_params, net.d_grads, vel, nf, 1);
    }
    int rc = 0;
    for (int s = 0; s < samples; s++) {
        long n = 0;
        double t0 = dp_now(), dt;
        do {
            loss = dp_net_train_step(&net, x, y, B);
            be->ops->optim_step(be, &opt, 0.01f, net.d_params, net.d_grads, vel, nf, 1);
            n++;
            dt = dp_now() - t0;
        } while (dt < secs || n < 2);
        if (!isfinite(loss)) {
            fprintf(stderr, "bench_train: loss is %f at batch %d: the kernels are broken\n", loss, B);
            rc = -1;
            break;
        }
        printf("sample downpour %d %d %.1f %.4f\n", T, B, n * B / dt, loss);
        fflush(stdout);
    }
    if (rc == 0 && per_layer) s_per_layer(&net, be, &opt, vel, x, y, B);
    free(x);
    free(y);
    be->ops->release(be, vel);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    return rc;
}

/* Aggregate single-threaded sgemm rate of T threads, each on its own
 * N x N x N product (the shape class of the big conv GEMMs, well past cache). */
static void s_bench_sgemm(int T, double secs, int samples)
{
    enum { N = 1024 };
    for (int s = 0; s < samples; s++) {
        long calls = 0;
        double dt = 0;
#pragma omp parallel num_threads(T) reduction(+ : calls)
        {
            float *a = dp_aligned_alloc((size_t)N * N * sizeof(float));
            float *b = dp_aligned_alloc((size_t)N * N * sizeof(float));
            float *c = dp_aligned_alloc((size_t)N * N * sizeof(float));
            for (size_t i = 0; i < (size_t)N * N; i++) {
                a[i] = (float)(i % 7) * 0.1f;
                b[i] = (float)(i % 5) * 0.1f;
                c[i] = 0;
            }
            /* warm-up: pages, OpenBLAS buffers */
            dp_cpu_blas_sgemm(0, 0, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
#pragma omp barrier
            double t0 = dp_now();
            do {
                dp_cpu_blas_sgemm(0, 0, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
                calls++;
            } while (dp_now() - t0 < secs);
#pragma omp barrier
#pragma omp master
            dt = dp_now() - t0;
            free(a);
            free(b);
            free(c);
        }
        printf("sgemm %d %.1f\n", T, calls * 2.0 * N * N * N / dt / 1e9);
        fflush(stdout);
    }
}

static int s_usage(void)
{
    fprintf(stderr, "usage: bench_train [-b 32,64,128] [-t THREADS] [-s SECONDS] [-r SAMPLES] "
                    "[-w WARMUP] [-m SPEC] [-i CxHxW] [-l] [-g] [-p]\n");
    return 2;
}

int main(int argc, char **argv)
{
    char env_err[DP_ERR_LEN]; /* the environment's knobs first (kernels/env.h) */
    if (dp_log_env(env_err) != 0 || dp_kernels_env(env_err) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], env_err);
        return 2;
    }
    int batches[16] = {32, 64, 128}, nb = 3, threads = 1, samples = 3, warmup = 5, sgemm = 0;
    int per_layer = 0, in_c = 1, in_h = 28, in_w = 28;
    double secs = 0.5;
    const char *spec = DP_MODEL_DEFAULT_SPEC;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-g")) { sgemm = 1; continue; }
        if (!strcmp(a, "-l")) { per_layer = 1; continue; }
        if (!strcmp(a, "-p")) {
            printf("paths");
            for (int k = DP_CPU_ISA_COUNT - 1; k >= 0; k--)
                if (dp_cpu_isa_supported() & (1u << k))
                    printf(" %s", dp_cpu_isa_name((dp_cpu_isa_t)k));
            printf("\nfeatures %s\n", dp_cpu_isa_features());
            return 0;
        }
        if (!v) return s_usage();
        i++;
        if (!strcmp(a, "-b")) nb = s_list(v, batches, 16);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "-s")) secs = atof(v);
        else if (!strcmp(a, "-r")) samples = atoi(v);
        else if (!strcmp(a, "-w")) warmup = atoi(v);
        else if (!strcmp(a, "-m")) spec = v;
        else if (!strcmp(a, "-i")) {
            char tail;
            if (sscanf(v, "%dx%dx%d%c", &in_c, &in_h, &in_w, &tail) != 3 || in_c < 1 || in_h < 1 || in_w < 1)
                return s_usage();
        }
        else return s_usage();
    }
    if (nb < 0 || threads < 1 || threads > 1024 || !(secs > 0) || samples < 1 || warmup < 0) {
        fprintf(stderr, "bench_train: bad argument (batches are positive integers, -t >= 1, "
                        "-s > 0, -r >= 1, -w >= 0)\n");
        return s_usage();
    }
    if (sgemm) {
        s_bench_sgemm(threads, secs, samples);
        return 0;
    }
    char err[DP_ERR_LEN];
    dp_model_t m;
    if (dp_model_parse(&m, spec, in_c, in_h, in_w, err) != 0) {
        fprintf(stderr, "bench_train: %s\n", err);
        return 2;
    }
    dp_cpu_set_threads(threads);
    /* training FLOPs per image: forward, and twice that for the backward */
    printf("# model %s on %dx%dx%d; %.1f MFLOP per training image\n", m.spec, in_c, in_h, in_w,
           dp_model_forward_macs(&m) * 2 * 3 / 1e6);
    printf("# path %s (CPU: %s)\n", dp_cpu_isa_name(dp_cpu_isa()), dp_cpu_isa_features());
    for (int bi = 0; bi < nb; bi++)
        if (s_bench_batch(&m, threads, batches[bi], secs, samples, warmup, per_layer) != 0) return 1;
    return 0;
}
