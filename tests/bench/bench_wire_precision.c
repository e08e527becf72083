/* bench_wire_precision: what a 16-bit wire does to training. One worker in
 * turn with one server, simulated in one process so that nothing but the
 * rounding differs between runs: the "server" keeps float32 weights and
 * Adam state (the trainer's defaults: lr 0.0015, cosine over the run,
 * batch 64, Fashion-MNIST, the default network on the CPU); each
 * step the "worker" gets the weights rounded to the wire's format, computes
 * its gradient on them, and the server applies that gradient rounded to the
 * same format. Formats: fp32 (no rounding), bf16 (dp_wire_to_bf16, what
 * --wire bf16 sends) and fp16 (IEEE half, which the wire does not offer:
 * this measures whether it would be worth offering).
 *
 *   bench_wire_precision [-w fp32|bf16|fp16] [-s STEPS] [-e EVERY] [-S SEED] [-t THREADS]
 *
 * STEPS defaults to 937 (one epoch), SEED to 1. The fp32 run is the
 * standalone trainer's `--epochs 1 --seed SEED`: the same initial weights,
 * batches, optimizer and schedule.
 *
 * Output: every EVERY steps (and at the last), for the gradient and the
 * weights of that step, what each 16-bit format does to them:
 *   round STEP grad|weights FORMAT rel_err ZERO SUBNORMAL OVERFLOW
 * rel_err = ||q(x) - x|| / ||x|| (the rounding's relative noise), ZERO the
 * share of the nonzero values that round to 0, SUBNORMAL the share that
 * land below the format's smallest normal number (fewer significant bits),
 * OVERFLOW the count that round to infinity. Last:
 *   result FORMAT STEPS test_accuracy ACC test_loss LOSS
 * Runs are deterministic: the same flags give the same lines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dataset.h"
#include "common/model.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "proto/wire.h"
#include "worker/exec/data.h"
#include "worker/exec/net.h"
#include "common/opts.h"
#include "kernels/env.h"

typedef enum { S_FP32, S_BF16, S_FP16 } s_format_t;
static const char *const s_format_names[] = {"fp32", "bf16", "fp16"};

enum { S_BATCH = 64 };

/* x rounded to fmt and back, into q (q may be x). */
static void s_round(s_format_t fmt, float *q, const float *x, size_t n, uint16_t *scratch)
{
    if (fmt == S_BF16) {
        dp_wire_to_bf16(scratch, x, n);
        dp_wire_from_bf16(q, scratch, n);
    } else if (fmt == S_FP16) {
        for (size_t i = 0; i < n; i++) q[i] = (float)(_Float16)x[i];
    } else if (q != x) {
        memcpy(q, x, n * sizeof(float));
    }
}

/* One "round" line: what fmt does to x[0..n). */
static void s_report(long step, const char *what, s_format_t fmt, const float *x, size_t n,
                     float *q, uint16_t *scratch)
{
    /* smallest normal numbers: bfloat16 has float32's exponent range */
    const double min_normal = fmt == S_FP16 ? 6.103515625e-05 : 1.1754943508222875e-38;
    s_round(fmt, q, x, n, scratch);
    double err2 = 0, norm2 = 0;
    size_t nonzero = 0, zero = 0, subnormal = 0, overflow = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)q[i] - x[i];
        err2 += d * d;
        norm2 += (double)x[i] * x[i];
        if (x[i] == 0) continue;
        nonzero++;
        if (isinf(q[i])) overflow++;
        else if (q[i] == 0) zero++;
        else if (fabs(q[i]) < min_normal) subnormal++;
    }
    printf("round %ld %s %s %.3e %.3e %.3e %zu\n", step, what, s_format_names[fmt],
           norm2 > 0 ? sqrt(err2 / norm2) : 0.0, nonzero ? (double)zero / nonzero : 0.0,
           nonzero ? (double)subnormal / nonzero : 0.0, overflow);
}

static int s_usage(void)
{
    fprintf(stderr, "usage: bench_wire_precision [-w fp32|bf16|fp16] [-s STEPS] [-e EVERY] "
                    "[-S SEED] [-t THREADS]\n");
    return 2;
}

/* The run: STEPS steps in turn through a wire of format fmt. */
static int s_train(s_format_t fmt, long steps, long every, uint64_t seed, char *err)
{
    dp_model_t m;
    dp_dataset_t train = {0}, test = {0};
    if (dp_model_parse(&m, DP_MODEL_DEFAULT_SPEC, 1, 28, 28, err) != 0 ||
        dp_dataset_init(&train, "fashion-mnist", DP_SPLIT_TRAIN, err) != 0 ||
        dp_dataset_init(&test, "fashion-mnist", DP_SPLIT_TEST, err) != 0) {
        dp_dataset_fini(&train);
        return -1;
    }
    dp_backend_t *be = NULL;
    dp_net_t net;
    if (dp_backend_cpu_new(&be, err) != 0 || dp_net_init(&net, &m, be, S_BATCH, err) != 0) {
        dp_backend_destroy(&be);
        dp_dataset_fini(&train);
        dp_dataset_fini(&test);
        return -1;
    }
    size_t nf = m.n_floats, in = (size_t)dp_dataset_sample_size(&train);
    dp_optim_conf_t opt;
    dp_optim_conf_default(&opt);
    opt.schedule = DP_LR_COSINE;
    opt.total_steps = steps;
    float *master = dp_malloc(nf * sizeof(float)), *wire = dp_malloc(nf * sizeof(float));
    float *grad = dp_malloc(nf * sizeof(float)), *q = dp_malloc(nf * sizeof(float));
    float *state = dp_calloc(nf * (size_t)dp_optim_state_per_param(opt.kind), sizeof(float));
    uint16_t *scratch = dp_malloc(nf * sizeof(uint16_t));
    float *x = dp_malloc((size_t)S_BATCH * in * sizeof(float));
    int *y = dp_malloc(S_BATCH * sizeof(int)), idx[S_BATCH];
    dp_model_init_params(&m, master, seed);
    for (long step = 0; step < steps; step++) {
        s_round(fmt, wire, master, nf, scratch); /* the pull */
        dp_net_set_params(&net, wire);
        dp_data_batch_indices(train.n, S_BATCH, 0, 1, seed, step, idx);
        dp_dataset_gather(&train, idx, S_BATCH, x, y);
        dp_net_train_step(&net, x, y, S_BATCH);
        dp_net_get_grads(&net, grad);
        if (step % every == 0 || step == steps - 1)
            for (s_format_t f = S_BF16; f <= S_FP16; f++) {
                s_report(step, "grad", f, grad, nf, q, scratch);
                s_report(step, "weights", f, master, nf, q, scratch);
            }
        s_round(fmt, grad, grad, nf, scratch); /* the push */
        dp_optim_step(&opt, dp_optim_lr_at(&opt, step), master, grad, state, nf, step + 1);
    }
    double acc, loss;
    dp_net_set_params(&net, master); /* the server's float32 weights are the model */
    dp_net_evaluate_dataset(&net, &test, 0, x, y, &acc, &loss);
    printf("result %s %ld test_accuracy %.4f test_loss %.4f\n", s_format_names[fmt], steps, acc,
           loss);
    free(master), free(wire), free(grad), free(q), free(state), free(scratch), free(x), free(y);
    dp_net_fini(&net);
    dp_backend_destroy(&be);
    dp_dataset_fini(&train);
    dp_dataset_fini(&test);
    return 0;
}

int main(int argc, char **argv)
{
    char env_err[DP_ERR_LEN]; /* the environment's knobs first (kernels/env.h) */
    if (dp_log_env(env_err) != 0 || dp_kernels_env(env_err) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], env_err);
        return 2;
    }
    s_format_t fmt = S_FP32;
    long steps = 937, every = 100; /* 937: one epoch of Fashion-MNIST at batch 64 */
    int threads = 1;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-w")) {
            for (fmt = S_FP32; fmt <= S_FP16 && strcmp(v, s_format_names[fmt]); fmt++) {}
            if (fmt > S_FP16) return s_usage();
        } else if (!strcmp(a, "-s")) steps = atol(v);
        else if (!strcmp(a, "-e")) every = atol(v);
        else if (!strcmp(a, "-S")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else return s_usage();
    }
    if (argc % 2 == 0 || steps < 1 || every < 1 || threads < 1 || threads > 1024) return s_usage();
    dp_cpu_set_threads(threads);
    char err[DP_ERR_LEN];
    if (s_train(fmt, steps, every, seed, err) != 0) {
        fprintf(stderr, "bench_wire_precision: %s\n", err);
        return 1;
    }
    return 0;
}
