/* bench_kernels: per-layer times and whole-network training-step throughput
 * of the cpu backend on the default model (1x28x28 input) — forward,
 * softmax-xent, backward (no din for the first layer), momentum SGD over the
 * flat parameter vector. Not run by the tests; prints a table.
 *
 *   bench_kernels [-b 32,64,128] [-t 1,2] [-s SECONDS] [-m SPEC]
 *
 * OpenBLAS runs the core DP_CPU_ISA's path pins (kernels/cpu/blas.h), printed
 * first; OPENBLAS_CORETYPE does not change it.
 * A chain of the seed network's kinds only: residual networks (bn, add,
 * gap, dropout, the graph) are timed per layer by `bench_train -l -m
 * resnet20`, through the real executor (worker/exec/net.h's t_layer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/isa.h"
#include "kernels/ops.h"
#include "common/opts.h"
#include "kernels/env.h"

typedef struct {
    dp_model_t m;
    dp_backend_t *be;
    int B;
    float *params, *grads, *vel;
    dp_optim_conf_t opt;  /* momentum SGD */
    float *act[DP_MAX_LAYERS + 1]; /* act[0] = input, act[i+1] = output of layer i */
    float *grad[DP_MAX_LAYERS + 1];
    int *labels;
    /* per layer: the fastest time seen (robust against other load on a shared machine) */
    double t_fwd[DP_MAX_LAYERS], t_bwd[DP_MAX_LAYERS], t_sgd;
} s_net_t;

static void s_net_init(s_net_t *n, const char *spec, int B)
{
    char err[DP_ERR_LEN];
    memset(n, 0, sizeof *n);
    if (dp_model_parse(&n->m, spec, 1, 28, 28, err) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        exit(2);
    }
    dp_backend_cpu_new(&n->be, NULL);
    n->B = B;
    if (n->be->ops->prepare(n->be, &n->m, B, err) < 0) {
        fprintf(stderr, "bench: %s\n", err);
        exit(2);
    }
    size_t nf = n->m.n_floats;
    n->params = n->be->ops->alloc(n->be, nf * sizeof(float));
    n->grads = n->be->ops->alloc(n->be, nf * sizeof(float));
    n->vel = n->be->ops->alloc(n->be, nf * sizeof(float));
    dp_optim_conf_default(&n->opt);
    n->opt.kind = DP_OPT_MOMENTUM;
    float *host = malloc(nf * sizeof(float));
    dp_model_init_params(&n->m, host, 1);
    n->be->ops->upload(n->be, n->params, host, nf * sizeof(float));
    free(host);
    size_t in = (size_t)B * n->m.in_c * n->m.in_h * n->m.in_w;
    n->act[0] = n->be->ops->alloc(n->be, in * sizeof(float));
    n->grad[0] = n->be->ops->alloc(n->be, in * sizeof(float));
    dp_rng_t r;
    dp_rng_seed(&r, 7);
    for (size_t i = 0; i < in; i++) n->act[0][i] = dp_rng_uniform(&r);
    for (int i = 0; i < n->m.n_layers; i++) {
        size_t sz = (size_t)B * dp_layer_out_size(&n->m.layers[i]);
        n->act[i + 1] = n->be->ops->alloc(n->be, sz * sizeof(float));
        n->grad[i + 1] = n->be->ops->alloc(n->be, sz * sizeof(float));
    }
    n->labels = n->be->ops->alloc(n->be, (size_t)B * sizeof(int));
    for (int b = 0; b < B; b++) n->labels[b] = (int)dp_rng_below(&r, (uint32_t)n->m.classes);
}

static void s_net_free(s_net_t *n)
{
    for (int i = 0; i <= n->m.n_layers; i++) {
        n->be->ops->release(n->be, n->act[i]);
        n->be->ops->release(n->be, n->grad[i]);
    }
    n->be->ops->release(n->be, n->params);
    n->be->ops->release(n->be, n->grads);
    n->be->ops->release(n->be, n->vel);
    n->be->ops->release(n->be, n->labels);
    dp_backend_destroy(&n->be);
}

static void s_min(double *best, double t)
{
    if (*best == 0 || t < *best) *best = t;
}

/* CPU seconds of the whole process: with one thread, a measure that other
 * load on the machine barely moves. */
static double s_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float s_step(s_net_t *n, int timed)
{
    dp_backend_t *be = n->be;
    const dp_model_t *m = &n->m;
    int B = n->B;
    float loss = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        double t0 = timed ? dp_now() : 0;
        float *w = l->weight >= 0 ? n->params + m->params[l->weight].offset : NULL;
        float *b = l->bias >= 0 ? n->params + m->params[l->bias].offset : NULL;
        switch (l->kind) {
        case DP_LAYER_CONV: be->ops->conv_forward(be, l, B, n->act[i + 1], n->act[i], w, b); break;
        case DP_LAYER_RELU:
            be->ops->relu_forward(be, (size_t)B * dp_layer_out_size(l), n->act[i + 1], n->act[i]);
            break;
        case DP_LAYER_MAXPOOL: be->ops->maxpool_forward(be, l, B, n->act[i + 1], n->act[i]); break;
        case DP_LAYER_FC: be->ops->fc_forward(be, l, B, n->act[i + 1], n->act[i], w, b); break;
        case DP_LAYER_SOFTMAX:
            be->ops->softmax_xent_forward(be, B, m->classes, n->act[i + 1], &loss, n->act[i],
                                     n->labels);
            break;
        default: break; /* the seed network's chain only: bench_train -l times the others */
        }
        if (timed) s_min(&n->t_fwd[i], dp_now() - t0);
    }
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const dp_layer_t *l = &m->layers[i];
        double t0 = timed ? dp_now() : 0;
        float *w = l->weight >= 0 ? n->params + m->params[l->weight].offset : NULL;
        float *dw = l->weight >= 0 ? n->grads + m->params[l->weight].offset : NULL;
        float *db = l->bias >= 0 ? n->grads + m->params[l->bias].offset : NULL;
        float *din = i > 0 ? n->grad[i] : NULL;
        switch (l->kind) {
        case DP_LAYER_CONV:
            be->ops->conv_backward(be, l, B, din, dw, db, n->grad[i + 1], n->act[i], w);
            break;
        case DP_LAYER_RELU:
            be->ops->relu_backward(be, (size_t)B * dp_layer_out_size(l), din, n->grad[i + 1],
                              n->act[i + 1]);
            break;
        case DP_LAYER_MAXPOOL:
            be->ops->maxpool_backward(be, l, B, din, n->grad[i + 1], n->act[i], n->act[i + 1]);
            break;
        case DP_LAYER_FC:
            be->ops->fc_backward(be, l, B, din, dw, db, n->grad[i + 1], n->act[i], w);
            break;
        case DP_LAYER_SOFTMAX:
            be->ops->softmax_xent_backward(be, B, m->classes, din, n->act[i + 1], n->labels);
            break;
        default: break; /* the seed network's chain only, as above */
        }
        if (timed) s_min(&n->t_bwd[i], dp_now() - t0);
    }
    double t0 = timed ? dp_now() : 0;
    be->ops->optim_step(be, &n->opt, 0.01f, n->params, n->grads, n->vel, m->n_floats, 1);
    if (timed) s_min(&n->t_sgd, dp_now() - t0);
    return loss;
}

/* Parse "32,64,128" into v (at most 16); returns the count. */
static int s_list(const char *s, int *v)
{
    int k = 0;
    while (*s && k < 16) {
        v[k++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return k;
}

int main(int argc, char **argv)
{
    char env_err[DP_ERR_LEN]; /* the environment's knobs first (kernels/env.h) */
    if (dp_log_env(env_err) != 0 || dp_kernels_env(env_err) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], env_err);
        return 2;
    }
    int batches[16] = {32, 64, 128}, nb = 3, threads[16] = {1, 2}, nth = 2;
    double secs = 2.0;
    const char *spec = DP_MODEL_DEFAULT_SPEC;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-b") && i + 1 < argc) nb = s_list(argv[++i], batches);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) nth = s_list(argv[++i], threads);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) spec = argv[++i];
        else {
            fprintf(stderr, "usage: bench_kernels [-b 32,64,128] [-t 1,2] [-s SECONDS] [-m SPEC]\n");
            return 2;
        }
    }
    printf("path %s, OpenBLAS core %s\n", dp_cpu_isa_name(dp_cpu_isa()), dp_cpu_blas_core());
    dp_model_t m;
    dp_model_parse(&m, spec, 1, 28, 28, NULL);
    double flop = dp_model_forward_macs(&m) * 2 * 3;
    /* step_ms: median wall time of a step; img/s and GFLOP/s from it; best_ms:
     * fastest step; cpu_ms: process CPU time per step (all threads) */
    printf("%-8s %-7s %10s %10s %12s %9s %10s %10s\n", "threads", "batch", "step_ms", "img/s",
           "GFLOP/s", "loss", "best_ms", "cpu_ms");
    for (int ti = 0; ti < nth; ti++)
        for (int bi = 0; bi < nb; bi++) {
            dp_cpu_set_threads(threads[ti]);
            s_net_t n;
            s_net_init(&n, spec, batches[bi]);
            for (int w = 0; w < 3; w++) s_step(&n, 0);
            /* median step time: other processes on a shared machine make the mean
             * (and single runs) noisy */
            static double times[100000];
            int steps = 0;
            float loss = 0;
            double t0 = dp_now(), c0 = s_cpu_now();
            while (dp_now() - t0 < secs && steps < 100000) {
                double ts = dp_now();
                loss = s_step(&n, 1);
                times[steps++] = dp_now() - ts;
            }
            double cpu = (s_cpu_now() - c0) / steps;
            qsort(times, (size_t)steps, sizeof times[0], s_cmp);
            double dt = times[steps / 2];
            printf("%-8d %-7d %10.3f %10.0f %12.1f %9.4f %10.3f %10.3f\n", threads[ti], batches[bi],
                   dt * 1e3, batches[bi] / dt, flop * batches[bi] / dt / 1e9, loss, times[0] * 1e3,
                   cpu * 1e3);
            if (bi == nb / 2 || nb == 1) {
                double sum = 0;
                printf("    per layer at batch %d, %d threads (best ms):\n", batches[bi],
                       threads[ti]);
                printf("    %-10s %9s %9s\n", "layer", "forward", "backward");
                for (int i = 0; i < n.m.n_layers; i++) {
                    printf("    %-10s %9.3f %9.3f\n", n.m.layers[i].name, n.t_fwd[i] * 1e3,
                           n.t_bwd[i] * 1e3);
                    sum += n.t_fwd[i] + n.t_bwd[i];
                }
                printf("    %-10s %9.3f\n", "sgd", n.t_sgd * 1e3);
                sum += n.t_sgd;
                printf("    %-10s %9.3f  (%.0f img/s)\n", "sum", sum * 1e3, batches[bi] / sum);
            }
            s_net_free(&n);
        }
    return 0;
}
