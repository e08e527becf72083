/* backend_cpu: the "cpu" backend — device memory is host memory and every
 * layer op calls the fast kernels in ops.h. prepare() grows the kernels'
 * scratch for the largest layer at max_batch, so that the training loop
 * allocates nothing (the scratch belongs to the thread that calls the ops;
 * prepare from the same thread that trains, or the first step grows it). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/cpu/cpu.h"

static int s_prepare(dp_backend_t *be, const dp_model_t *m, int max_batch, char *err)
{
    (void)be;
    if (max_batch < 1) return dp_err(err, "cpu backend: max_batch %d must be >= 1", max_batch);
    /* Run every conv layer once at max_batch on zeros: the kernels grow their
     * scratch to what the real steps need (simplest way to size it exactly). */
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        if (l->kind != DP_LAYER_CONV) continue;
        dp_conv_dims_t d;
        dp_conv_dims_of(&d, l, max_batch);
        size_t nin = (size_t)max_batch * d.C * d.H * d.W;
        size_t nout = (size_t)max_batch * d.OC * d.OH * d.OW;
        size_t nw = (size_t)d.OC * d.C * d.K * d.K;
        float *in = dp_aligned_alloc((nin + nout + nw + d.OC + nin) * sizeof(float));
        memset(in, 0, (nin + nout + nw + d.OC + nin) * sizeof(float));
        float *out = in + nin, *w = out + nout, *b = w + nw, *din = b + d.OC;
        dp_conv2d_forward(out, in, w, b, &d);
        dp_conv2d_backward(din, w, b, out, in, w, &d);
        free(in);
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

static void s_download(dp_backend_t *be, void *dst, const void *d_src, size_t bytes)
{
    (void)be;
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
    (void)be;
}

/* Ops have finished when they return: every copy is a plain memcpy. */
static void s_download_wait(dp_backend_t *be)
{
    (void)be;
}

static void s_conv_forward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_out,
                           const float *d_in, const float *d_w, const float *d_b)
{
    (void)be;
    dp_conv_dims_t d;
    dp_conv_dims_of(&d, l, B);
    dp_conv2d_forward(d_out, d_in, d_w, d_b, &d);
}

static void s_conv_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                            float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                            const float *d_w)
{
    (void)be;
    dp_conv_dims_t d;
    dp_conv_dims_of(&d, l, B);
    dp_conv2d_backward(d_din, d_dw, d_db, d_dout, d_in, d_w, &d);
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
    (void)be;
    dp_fc_forward(d_out, d_in, d_w, d_b, B, l->in_c * l->in_h * l->in_w, l->out_c);
}

static void s_fc_backward(dp_backend_t *be, const dp_layer_t *l, int B, float *d_din,
                          float *d_dw, float *d_db, const float *d_dout, const float *d_in,
                          const float *d_w)
{
    (void)be;
    dp_fc_backward(d_din, d_dw, d_db, d_dout, d_in, d_w, B, l->in_c * l->in_h * l->in_w,
                   l->out_c);
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
    .synchronize = s_synchronize,
    .stage_upload = s_upload,
    .download_async = s_download,
    .download_wait = s_download_wait,
    .conv_forward = s_conv_forward,
    .conv_backward = s_conv_backward,
    .relu_forward = s_relu_forward,
    .relu_backward = s_relu_backward,
    .maxpool_forward = s_maxpool_forward,
    .maxpool_backward = s_maxpool_backward,
    .fc_forward = s_fc_forward,
    .fc_backward = s_fc_backward,
    .softmax_xent_forward = s_softmax_xent_forward,
    .softmax_xent_backward = s_softmax_xent_backward,
    .optim_step = s_optim_step,
    .destroy = s_destroy,
};

int dp_backend_cpu_new(dp_backend_t **out, char *err)
{
    (void)err; /* the cpu backend cannot fail today; the shape is dp_backend_new's */
    dp_backend_t *be = dp_calloc(1, sizeof *be);
    be->ops = &s_cpu_ops;
    be->name = "cpu";
    be->impl = NULL;
    be->host_memory = 1;
    *out = be;
    return 0;
}
