/* backend_cpu: the "cpu" backend — device memory is host memory and every
 * layer op calls the fast kernels in ops.h. prepare() grows the kernels'
 * scratch for the largest layer at max_batch, so that the training loop
 * allocates nothing (the scratch belongs to the thread that calls the ops;
 * prepare from the same thread that trains, or the first step grows it).
 *
 * "cpu:staged" is the same ops with host_memory 0, so callers take a
 * device's paths: every transfer through the copy ops. Its download_async
 * only notes the copy, made at the wait that covers it, so a caller that
 * reads its buffer before waiting reads stale bytes here as it would on a
 * device (where the bytes arrive later); the copy's source is never
 * written in between by the executor (a layer's gradient is final when it
 * is queued).
 *
 * In bf16 (dp_backend_cpu_set_precision, --precision bf16) the conv and fc
 * ops, and prepare's runs of them, go through a bf16_ops.h table (AMX,
 * AVX512_BF16, or the emulated path under its test hook); every other op
 * (batch norm and its statistics, relu, pooling, the losses, the
 * optimizer) is the same fp32 op as in fp32. The fused ops call no conv
 * or fc: the executor calls conv_* and fc_* below for every one. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/cpu/bf16_emulated.h"
#include "kernels/cpu/cpu.h"

/* The instance's state (impl): its bf16 table, and cpu:staged's noted
 * copies, in order. */
typedef struct {
    const dp_bf16_ops_t *bf16; /* conv and fc in bf16 through this table; NULL: fp32 */
    char label[48];           /* be->precision in bf16: "bf16 (PATH)" */
    int staged;               /* cpu:staged: the fields below are kept */
    struct { void *dst; const void *src; size_t bytes; } *copy;
    unsigned n, done, cap;
    void **locked;            /* host_register's pointers not yet unregistered */
    unsigned n_locked, cap_locked;
    struct { void *dst; const void *src; size_t bytes; } *peer; /* copy_peer's, not made yet */
    unsigned n_peer, cap_peer;
    void (*before_peer)(void *); /* dp_backend_staged_before_copies */
    void *before_peer_arg;
} s_cpu_t;

/* cpu:staged's state; NULL on the plain cpu. */
static s_cpu_t *s_staged(dp_backend_t *be)
{
    s_cpu_t *c = be->impl;
    return c->staged ? c : NULL;
}

static const dp_bf16_ops_t *s_bf16(const dp_backend_t *be)
{
    return ((const s_cpu_t *)be->impl)->bf16;
}

/* Run layer l's forward and backward once at max_batch on zeros, in the
 * backend's precision: the kernels grow their scratch to what the real
 * steps need (the simplest way to size it exactly). */
static void s_prepare_layer(const dp_backend_t *be, const dp_layer_t *l, int max_batch)
{
    const dp_bf16_ops_t *t = s_bf16(be);
    dp_conv_dims_t d;
    if (l->kind == DP_LAYER_CONV) {
        dp_conv_dims_of(&d, l, max_batch);
    } else { /* an fc layer as a 1 x 1 convolution, for the sizes */
        d = (dp_conv_dims_t){.B = max_batch, .C = l->in_c * l->in_h * l->in_w, .H = 1, .W = 1,
                             .OC = l->out_c, .K = 1, .pad = 0, .stride = 1};
        dp_conv_dims_finish(&d);
    }
    size_t nin = (size_t)max_batch * d.C * d.H * d.W;
    size_t nout = (size_t)max_batch * d.OC * d.OH * d.OW;
    size_t nw = (size_t)d.OC * d.C * d.K * d.K, all = nin + nout + nw + d.OC + nin;
    float *in = dp_aligned_alloc(all * sizeof(float));
    memset(in, 0, all * sizeof(float));
    float *out = in + nin, *w = out + nout, *b = w + nw, *din = b + d.OC;
    if (l->kind == DP_LAYER_CONV) {
        (t ? t->conv_forward : dp_conv2d_forward)(out, in, w, b, &d);
        (t ? t->conv_backward : dp_conv2d_backward)(din, w, b, out, in, w, &d);
    } else {
        t->fc_forward(out, in, w, b, max_batch, d.C, d.OC);
        t->fc_backward(din, w, b, out, in, w, max_batch, d.C, d.OC);
    }
    free(in);
}

static int s_prepare(dp_backend_t *be, const dp_model_t *m, int max_batch, char *err)
{
    if (max_batch < 1) return dp_err(err, "cpu backend: max_batch %d must be >= 1", max_batch);
    /* every conv layer; the fc layers too in bf16 (their rounded copies) */
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        if (l->kind == DP_LAYER_CONV || (l->kind == DP_LAYER_FC && s_bf16(be)))
            s_prepare_layer(be, l, max_batch);
    }
    return 0;
}

static void *s_alloc(dp_backend_t *be, size_t bytes)
{
    (void)be;
    void *p = dp_aligned_alloc(bytes ? bytes : 1);
    memset(p, 0, bytes);
    return p;
}

static void s_release(dp_backend_t *be, void *d)
{
    (void)be;
    free(d);
}

static void s_upload(dp_backend_t *be, void *d_dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memcpy(d_dst, src, bytes);
}

static void s_peer_flush(dp_backend_t *be);

static void s_download(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    s_peer_flush(be); /* cpu:staged: its copy_peer copies, in order */
    if (bytes) memcpy(dst, d_src, bytes);
}

static void *s_host_alloc(dp_backend_t *be, size_t bytes)
{
    (void)be;
    return dp_malloc(bytes ? bytes : 1);
}

static void s_host_release(dp_backend_t *be, void *p)
{
    (void)be;
    free(p);
}

static void s_synchronize(dp_backend_t *be)
{
    s_peer_flush(be);
}

/* cpu: made at once. cpu:staged: noted, made at the next synchronize or
 * download (s_peer_flush), as a device's stream would reach it later. */
static void s_copy_peer(dp_backend_t *be, void *dst, const void *src, size_t bytes)
{
    s_cpu_t *st = s_staged(be);
    if (!st) {
        if (bytes) memcpy(dst, src, bytes);
        return;
    }
    if (st->n_peer == st->cap_peer) {
        st->cap_peer = st->cap_peer ? 2 * st->cap_peer : 8;
        st->peer = dp_realloc(st->peer, st->cap_peer * sizeof *st->peer);
    }
    st->peer[st->n_peer].dst = dst;
    st->peer[st->n_peer].src = src;
    st->peer[st->n_peer++].bytes = bytes;
}

static void s_peer_flush(dp_backend_t *be)
{
    s_cpu_t *st = s_staged(be);
    if (!st || !st->n_peer) return;
    if (st->before_peer) st->before_peer(st->before_peer_arg);
    for (unsigned i = 0; i < st->n_peer; i++)
        if (st->peer[i].bytes) memcpy(st->peer[i].dst, st->peer[i].src, st->peer[i].bytes);
    st->n_peer = 0;
}

/* Both cpus: made at once, the noted copy_peer copies untouched (they are
 * the compute stream's, this a side stream's). */
static void s_copy_side(dp_backend_t *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static void s_enter(dp_backend_t *be)
{
    (void)be;
}

void dp_backend_staged_before_copies(dp_backend_t *be, void (*fn)(void *), void *arg)
{
    s_cpu_t *st = s_staged(be);
    if (!st) return;
    st->before_peer = fn;
    st->before_peer_arg = arg;
}

/* cpu: nothing to lock. cpu:staged keeps the device's bookkeeping, so a
 * caller's pairing is checked here: registering p twice fails as CUDA's
 * does, and a registration never undone is said at destroy. */
static int s_host_register(dp_backend_t *be, void *p, size_t bytes, int read_only, char *err)
{
    (void)bytes, (void)read_only;
    s_cpu_t *st = s_staged(be);
    if (!st) return 0;
    for (unsigned i = 0; i < st->n_locked; i++)
        if (st->locked[i] == p) return dp_err(err, "cpu:staged: host memory %p registered already", p);
    if (st->n_locked == st->cap_locked) {
        st->cap_locked = st->cap_locked ? 2 * st->cap_locked : 8;
        st->locked = dp_realloc(st->locked, st->cap_locked * sizeof *st->locked);
    }
    st->locked[st->n_locked++] = p;
    return 0;
}

/* Memory never registered: nothing to undo (as the CUDA backend's). */
static void s_host_unregister(dp_backend_t *be, void *p)
{
    s_cpu_t *st = s_staged(be);
    for (unsigned i = 0; st && i < st->n_locked; i++)
        if (st->locked[i] == p) {
            st->locked[i] = st->locked[--st->n_locked];
            return;
        }
}

/* cpu: a plain memcpy; cpu:staged: noted for its wait. */
static void s_download_async(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    s_cpu_t *st = s_staged(be);
    if (!st) {
        s_download(be, dst, d_src, bytes);
        return;
    }
    if (st->n == st->cap) {
        st->cap = st->cap ? 2 * st->cap : 16;
        st->copy = dp_realloc(st->copy, st->cap * sizeof *st->copy);
    }
    st->copy[st->n].dst = dst;
    st->copy[st->n].src = d_src;
    st->copy[st->n++].bytes = bytes;
}

static void s_download_wait_first(dp_backend_t *be, unsigned n)
{
    s_cpu_t *st = s_staged(be);
    if (!st) return; /* cpu: every copy was made when asked */
    for (; st->done < n && st->done < st->n; st->done++)
        s_download(be, st->copy[st->done].dst, st->copy[st->done].src, st->copy[st->done].bytes);
}

static void s_download_wait(dp_backend_t *be)
{
    s_cpu_t *st = s_staged(be);
    if (!st) return;
    s_download_wait_first(be, st->n);
    st->n = st->done = 0;
}

static void s_conv_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                           const float *d_in, const float *d_w, const float *d_b)
{
    const dp_bf16_ops_t *t = s_bf16(be);
    dp_conv_dims_t d;
    dp_conv_dims_of(&d, l, B);
    (t ? t->conv_forward : dp_conv2d_forward)(d_out, d_in, d_w, d_b, &d);
}

static void s_conv_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                            float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                            const float *d_w)
{
    const dp_bf16_ops_t *t = s_bf16(be);
    dp_conv_dims_t d;
    dp_conv_dims_of(&d, l, B);
    (t ? t->conv_backward : dp_conv2d_backward)(d_din, d_dw, d_db, d_dout, d_in, d_w, &d);
}

static void s_relu_forward(dp_backend_t *be, size_t n, float *d_out, const float *d_in)
{
    (void)be;
    dp_relu_forward(d_out, d_in, n);
}

static void s_relu_backward(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                            const float *d_out)
{
    (void)be;
    dp_relu_backward(d_din, d_dout, d_out, n);
}

static void s_tanh_forward(dp_backend_t *be, size_t n, float *d_out, const float *d_in)
{
    (void)be;
    dp_tanh_forward(d_out, d_in, n);
}

static void s_tanh_backward(dp_backend_t *be, size_t n, float *d_din, const float *d_dout,
                            const float *d_out)
{
    (void)be;
    dp_tanh_backward(d_din, d_dout, d_out, n);
}

static void s_maxpool_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                              const float *d_in)
{
    (void)be;
    dp_pool_dims_t d;
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_forward(d_out, d_in, &d);
}

static void s_maxpool_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                               const float *d_dout, const float *d_in, const float *d_out)
{
    (void)be;
    dp_pool_dims_t d;
    dp_pool_dims_of(&d, l, B);
    dp_maxpool_backward(d_din, d_dout, d_in, d_out, &d);
}

static void s_fc_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                         const float *d_in, const float *d_w, const float *d_b)
{
    const dp_bf16_ops_t *t = s_bf16(be);
    (t ? t->fc_forward : dp_fc_forward)(d_out, d_in, d_w, d_b, B, l->in_c * l->in_h * l->in_w,
                                        l->out_c);
}

static void s_fc_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w)
{
    const dp_bf16_ops_t *t = s_bf16(be);
    (t ? t->fc_backward : dp_fc_backward)(d_din, d_dw, d_db, d_dout, d_in, d_w, B,
                                          l->in_c * l->in_h * l->in_w, l->out_c);
}

static void s_softmax_xent_forward(dp_backend_t *be, int B, int classes, float *d_probs,
                                   float *d_loss, const float *d_logits, const int *d_labels)
{
    (void)be;
    *d_loss = dp_softmax_xent_forward(d_probs, d_logits, d_labels, B, classes);
}

static void s_softmax_xent_backward(dp_backend_t *be, int B, int classes, float *d_dlogits,
                                    const float *d_probs, const int *d_labels)
{
    (void)be;
    dp_softmax_xent_backward(d_dlogits, d_probs, d_labels, B, classes);
}

static void s_obs_norm_forward(dp_backend_t *be, const dp_layer_t *l, int B, int train, float *d_out,
                               const float *d_in, float *d_mean, float *d_var, float *d_count)
{
    (void)be;
    int F = (int)dp_layer_out_size(l);
    dp_obs_norm_forward(d_out, d_in, d_mean, d_var, B, F);
    if (train) dp_obs_norm_update(d_mean, d_var, d_count, d_in, B, F);
}

static void s_sigmoid_xent_forward(dp_backend_t *be, int B, float *d_probs, float *d_loss,
                                   const float *d_logits, const float *d_bias,
                                   const int *d_labels)
{
    (void)be;
    *d_loss = dp_sigmoid_xent_forward(d_probs, d_logits, d_bias, d_labels, B);
}

static void s_sigmoid_xent_backward(dp_backend_t *be, int B, float *d_dlogits, float *d_dbias,
                                    const float *d_probs, const int *d_labels)
{
    (void)be;
    dp_sigmoid_xent_backward(d_dlogits, d_dbias, d_probs, d_labels, B);
}

static void s_ac_loss_forward(dp_backend_t *be, int B, int A, float beta, float vcoef,
                              float *d_probs, float *d_loss, const float *d_logits,
                              const float *d_value, const int *d_action, const float *d_ret)
{
    (void)be;
    if (!d_action) {
        dp_ac_policy(d_probs, d_logits, B, A);
        return;
    }
    *d_loss = dp_ac_loss_forward(d_probs, d_logits, d_value, d_action, d_ret, B, A, beta, vcoef,
                                 NULL);
}

static void s_ac_loss_backward(dp_backend_t *be, int B, int A, float beta, float vcoef,
                               float *d_dlogits, float *d_dvalue, const float *d_logits,
                               const float *d_value, const int *d_action, const float *d_ret)
{
    (void)be;
    dp_ac_loss_backward(d_dlogits, d_dvalue, d_logits, d_value, d_action, d_ret, B, A, beta,
                        vcoef);
}

/* Ghost batch g of a batch of B in groups of G: its first sample and size. */
static int s_group(int B, int G, int g, int *n0)
{
    *n0 = g * G;
    return B - *n0 < G ? B - *n0 : G;
}

/* bn_forward, and with relu bn_relu_forward (the relu's output in d_out). */
static void s_bn_forward_as(const dp_layer_t *l, int B, int G, int train, int relu, float *d_out,
                            const float *d_in, const float *d_w, const float *d_b, float *d_rm,
                            float *d_rv, float *d_nbt, float *d_save)
{
    int C = l->in_c, HW = l->in_h * l->in_w;
    if (!train) {
        (relu ? dp_bn_relu_forward_eval : dp_bn_forward_eval)(d_out, d_in, d_w, d_b, d_rm, d_rv,
                                                             B, C, HW, l->eps);
        return;
    }
    if (G < 1 || G > B) G = B;
    int groups = (B + G - 1) / G;
    for (int g = 0; g < groups; g++) {
        int n0, nb = s_group(B, G, g, &n0);
        size_t at = (size_t)n0 * C * HW;
        float *sv = d_save + (size_t)2 * C * g;
        (relu ? dp_bn_relu_forward_train : dp_bn_forward_train)(d_out + at, sv, sv + C, d_in + at,
                                                               d_w, d_b, nb, C, HW, l->eps);
    }
    int n0, last = s_group(B, G, groups - 1, &n0);
    dp_bn_running_update(d_rm, d_rv, d_nbt, d_save, (long)G * HW, (long)last * HW, groups, C,
                         l->momentum);
}

static void s_bn_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                         float *d_out, const float *d_in, const float *d_w, const float *d_b,
                         float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    (void)be;
    s_bn_forward_as(l, B, G, train, 0, d_out, d_in, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
}

static void s_bn_relu_forward(dp_backend_t *be, const dp_layer_t *l, int B, int G, int train,
                              float *d_out, const float *d_in, const float *d_w, const float *d_b,
                              float *d_rm, float *d_rv, float *d_nbt, float *d_save)
{
    (void)be;
    s_bn_forward_as(l, B, G, train, 1, d_out, d_in, d_w, d_b, d_rm, d_rv, d_nbt, d_save);
}

/* bn_backward, and with d_y (the fused relu's output) bn_relu_backward. */
static void s_bn_backward_as(const dp_layer_t *l, int B, int G, float *d_din, float *d_dw,
                             float *d_db, const float *d_dout, const float *d_y,
                             const float *d_in, const float *d_w, const float *d_save)
{
    int C = l->in_c, HW = l->in_h * l->in_w;
    if (G < 1 || G > B) G = B;
    int groups = (B + G - 1) / G;
    /* the parameter gradients sum over the groups, in group order */
    float *part = groups > 1 ? dp_cpu_scratch((size_t)2 * C) : NULL;
    for (int g = 0; g < groups; g++) {
        int n0, nb = s_group(B, G, g, &n0);
        size_t at = (size_t)n0 * C * HW;
        const float *sv = d_save + (size_t)2 * C * g;
        float *dw = g ? part : d_dw, *db = g ? part + C : d_db, *din = d_din ? d_din + at : NULL;
        if (d_y)
            dp_bn_relu_backward(din, dw, db, d_dout + at, d_y + at, d_in + at, d_w, sv, sv + C,
                                nb, C, HW, l->eps);
        else
            dp_bn_backward(din, dw, db, d_dout + at, d_in + at, d_w, sv, sv + C, nb, C, HW,
                           l->eps);
        if (g)
            for (int c = 0; c < C; c++) {
                d_dw[c] += part[c];
                d_db[c] += part[C + c];
            }
    }
}

static void s_bn_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w, const float *d_save)
{
    (void)be;
    s_bn_backward_as(l, B, G, d_din, d_dw, d_db, d_dout, NULL, d_in, d_w, d_save);
}

static void s_bn_relu_backward(dp_backend_t *be, const dp_layer_t *l, int B, int G, float *d_din,
                               float *d_dw, float *d_db, const float *d_dout, const float *d_out,
                               const float *d_in, const float *d_w, const float *d_save)
{
    (void)be;
    s_bn_backward_as(l, B, G, d_din, d_dw, d_db, d_dout, d_out, d_in, d_w, d_save);
}

static void s_shortcut_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                               const float *d_a, const float *d_src)
{
    (void)be;
    dp_shortcut_dims_t d;
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_add_forward(d_out, d_a, d_src, &d);
}

static void s_shortcut_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_dsrc,
                                const float *d_dout)
{
    (void)be;
    dp_shortcut_dims_t d;
    dp_shortcut_dims_of(&d, l, B);
    dp_shortcut_backward(d_dsrc, d_dout, &d);
}

static void s_gap_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                          const float *d_in)
{
    (void)be;
    dp_gap_forward(d_out, d_in, B, l->in_c, l->in_h * l->in_w);
}

static void s_gap_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                           const float *d_dout)
{
    (void)be;
    dp_gap_backward(d_din, d_dout, B, l->in_c, l->in_h * l->in_w);
}

static void s_dropout_forward(dp_backend_t *be, const dp_layer_t *l, int B,
                              unsigned long long seed, unsigned long long step,
                              unsigned long long sample0, float *d_out, const float *d_in)
{
    (void)be;
    dp_dropout_forward(d_out, d_in, B, dp_layer_out_size(l), l->p, seed, step, sample0);
}

static void s_dropout_backward(dp_backend_t *be, const dp_layer_t *l, int B,
                               unsigned long long seed, unsigned long long step,
                               unsigned long long sample0, float *d_din, const float *d_dout)
{
    (void)be;
    dp_dropout_backward(d_din, d_dout, B, dp_layer_out_size(l), l->p, seed, step, sample0);
}

static void s_vec_add(dp_backend_t *be, size_t n, float *d_dst, const float *d_src)
{
    (void)be;
    dp_vec_add(d_dst, d_src, n);
}

/* Threads take contiguous slices: element-wise, so the result is the same
 * bits as one thread's dp_optim_step. */
static void s_optim_step(dp_backend_t *be, const dp_optim_conf_t *c, float lr, float *d_w,
                         const float *d_g, float *d_state, size_t n, long t)
{
    (void)be;
    int nt = dp_cpu_team((double)n);
#pragma omp parallel num_threads(nt)
    {
        int k = omp_get_thread_num(), K = omp_get_num_threads();
        size_t lo = n * (size_t)k / (size_t)K, hi = n * (size_t)(k + 1) / (size_t)K;
        dp_optim_step_range(c, lr, d_w, d_g, d_state, n, lo, hi, t);
    }
}

static void s_destroy(dp_backend_t *be)
{
    s_cpu_t *st = be->impl;
    if (st->staged && st->n_locked)
        dp_log_warn("cpu:staged: %u host memory registration(s) never undone", st->n_locked);
    free(st->copy);
    free(st->locked);
    free(st->peer);
    free(st);
    free(be);
}

static const dp_backend_ops_t s_cpu_ops = {
    .prepare = s_prepare,
    .alloc = s_alloc,
    .release = s_release,
    .upload = s_upload,
    .download = s_download,
    .host_alloc = s_host_alloc,
    .host_release = s_host_release,
    .host_register = s_host_register,
    .host_unregister = s_host_unregister,
    .synchronize = s_synchronize,
    .stage_upload = s_upload,
    .download_async = s_download_async,
    .download_wait = s_download_wait,
    .download_wait_first = s_download_wait_first,
    .upload_async = s_upload, /* ops are done when they return: so is the copy */
    .copy_peer = s_copy_peer,
    .copy_side = s_copy_side,
    .enter = s_enter,
    .conv_forward = s_conv_forward,
    .conv_backward = s_conv_backward,
    .relu_forward = s_relu_forward,
    .relu_backward = s_relu_backward,
    .tanh_forward = s_tanh_forward,
    .tanh_backward = s_tanh_backward,
    .maxpool_forward = s_maxpool_forward,
    .maxpool_backward = s_maxpool_backward,
    .fc_forward = s_fc_forward,
    .fc_backward = s_fc_backward,
    .softmax_xent_forward = s_softmax_xent_forward,
    .softmax_xent_backward = s_softmax_xent_backward,
    .sigmoid_xent_forward = s_sigmoid_xent_forward,
    .sigmoid_xent_backward = s_sigmoid_xent_backward,
    .ac_loss_forward = s_ac_loss_forward,
    .obs_norm_forward = s_obs_norm_forward,
    .ac_loss_backward = s_ac_loss_backward,
    .bn_forward = s_bn_forward,
    .bn_backward = s_bn_backward,
    .bn_relu_forward = s_bn_relu_forward,
    .bn_relu_backward = s_bn_relu_backward,
    .shortcut_forward = s_shortcut_forward,
    .shortcut_backward = s_shortcut_backward,
    .gap_forward = s_gap_forward,
    .gap_backward = s_gap_backward,
    .dropout_forward = s_dropout_forward,
    .dropout_backward = s_dropout_backward,
    .vec_add = s_vec_add,
    .copy = s_download,
    .optim_step = s_optim_step,
    .destroy = s_destroy,
};

int dp_backend_cpu_new(dp_backend_t **out, char *err)
{
    (void)err; /* the cpu backend cannot fail today; the shape is dp_backend_new's */
    dp_backend_t *be = dp_calloc(1, sizeof *be);
    be->ops = &s_cpu_ops;
    be->name = "cpu";
    be->impl = dp_calloc(1, sizeof(s_cpu_t));
    be->host_memory = 1;
    be->precision = "fp32";
    *out = be;
    return 0;
}

int dp_backend_cpu_staged_new(dp_backend_t **out, char *err)
{
    if (dp_backend_cpu_new(out, err) != 0) return -1;
    (*out)->name = "cpu:staged";
    ((s_cpu_t *)(*out)->impl)->staged = 1;
    (*out)->host_memory = 0;
    return 0;
}

int dp_backend_cpu_set_precision(dp_backend_t *be, dp_precision_t p, char *err)
{
    s_cpu_t *c = be->impl;
    char why[DP_ERR_LEN];
    c->bf16 = NULL;
    be->precision = "fp32";
    if (p == DP_PRECISION_FP32) return 0;
    c->bf16 = dp_bf16_ops_select(why);
    if (!c->bf16) return dp_err(err, "--precision bf16: %s", why);
    /* the path's name in the start line: "bf16 (emulated)", "bf16 (amx)" */
    snprintf(c->label, sizeof c->label, "bf16 (%s)", c->bf16->name);
    be->precision = c->label;
    return 0;
}
