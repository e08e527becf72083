/* bf16_emulated: bf16's numerics on the fp32 kernels (bf16_emulated.h). */
#include "kernels/cpu/bf16_emulated.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"

/* n floats rounded up to a whole 64-byte line, so each copy in the
 * scratch starts aligned as an allocation would. */
static size_t s_lines(size_t n) { return (n + 15) / 16 * 16; }

/* dst[0, n) = src rounded to bf16; element by element, so the bits do not
 * depend on the threads. */
static void s_round(float *dst, const float *src, size_t n)
{
    int nt = dp_cpu_team((double)n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = dp_bf16_round(src[i]);
}

static void s_conv_forward(float *out, const float *in, const float *w, const float *b,
                           const dp_conv_dims_t *d)
{
    size_t nin = (size_t)d->B * d->C * d->H * d->W, nw = (size_t)d->OC * d->C * d->K * d->K;
    float *rin = dp_cpu_scratch_slot(DP_CPU_SCRATCH_BF16, s_lines(nin) + nw);
    float *rw = rin + s_lines(nin);
    s_round(rin, in, nin);
    s_round(rw, w, nw);
    dp_conv2d_forward(out, rin, rw, b, d); /* the bias added in fp32 */
}

/* db[oc] = the sum of dout[n, oc, :] over n and positions, in fp32 on the
 * values as they are (the bias's gradient is not a product). */
static void s_bias_grad(float *db, const float *dout, int B, int OC, size_t P)
{
    for (int oc = 0; oc < OC; oc++) {
        float acc = 0;
        for (int n = 0; n < B; n++) {
            const float *g = dout + ((size_t)n * OC + oc) * P;
            for (size_t i = 0; i < P; i++) acc += g[i];
        }
        db[oc] = acc;
    }
}

static void s_conv_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, const dp_conv_dims_t *d)
{
    size_t P = (size_t)d->OH * d->OW, nout = (size_t)d->B * d->OC * P;
    size_t nin = (size_t)d->B * d->C * d->H * d->W, nw = (size_t)d->OC * d->C * d->K * d->K;
    /* in is rounded for dw, w for din alone: without din, w is not read */
    float *rout = dp_cpu_scratch_slot(DP_CPU_SCRATCH_BF16,
                                      s_lines(nout) + s_lines(nin) + (din ? nw : 0));
    float *rin = rout + s_lines(nout), *rw = din ? rin + s_lines(nin) : NULL;
    s_round(rout, dout, nout);
    s_round(rin, in, nin);
    if (din) s_round(rw, w, nw);
    dp_conv2d_backward(din, dw, NULL, rout, rin, din ? rw : w, d);
    if (db) s_bias_grad(db, dout, d->B, d->OC, P);
}

static void s_fc_forward(float *out, const float *in, const float *w, const float *b, int B, int IN,
                         int OUT)
{
    size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN;
    float *rin = dp_cpu_scratch_slot(DP_CPU_SCRATCH_BF16, s_lines(nin) + nw);
    float *rw = rin + s_lines(nin);
    s_round(rin, in, nin);
    s_round(rw, w, nw);
    dp_fc_forward(out, rin, rw, b, B, IN, OUT);
}

static void s_fc_backward(float *din, float *dw, float *db, const float *dout, const float *in,
                          const float *w, int B, int IN, int OUT)
{
    size_t nout = (size_t)B * OUT, nin = (size_t)B * IN, nw = (size_t)OUT * IN;
    /* after the copies, a place for the fp32 kernel's bias gradient of the
     * rounded dout, which is not the one wanted */
    float *rout = dp_cpu_scratch_slot(DP_CPU_SCRATCH_BF16, s_lines(nout) + s_lines(nin) +
                                                               s_lines(din ? nw : 0) + (size_t)OUT);
    float *rin = rout + s_lines(nout), *rw = rin + s_lines(nin), *spare = rw + s_lines(din ? nw : 0);
    s_round(rout, dout, nout);
    s_round(rin, in, nin);
    if (din) s_round(rw, w, nw);
    dp_fc_backward(din, dw, spare, rout, rin, din ? rw : w, B, IN, OUT);
    if (db) s_bias_grad(db, dout, B, OUT, 1);
}

const dp_bf16_ops_t dp_bf16_emulated = {
    .name = "emulated",
    .conv_forward = s_conv_forward,
    .conv_backward = s_conv_backward,
    .fc_forward = s_fc_forward,
    .fc_backward = s_fc_backward,
};

const dp_bf16_ops_t *dp_bf16_ops_select(char *why)
{
    /* Test hook, read here only: DP_TEST_BF16=emulated runs bf16 on a CPU
     * without a native path (this repository's CI machines). */
    const char *v = getenv("DP_TEST_BF16");
    if (v && strcmp(v, "emulated") == 0) return &dp_bf16_emulated;
    return dp_bf16_ops_native(why);
}
