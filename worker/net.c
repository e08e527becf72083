/* net: forward / backward of the layer list through the backend. */
#include "worker/net.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static size_t s_boundary_size(const dp_model_t *m, int i)
{
    if (i == 0) return (size_t)m->in_c * m->in_h * m->in_w;
    return dp_layer_out_size(&m->layers[i - 1]);
}

int dp_net_init(dp_net_t *net, const dp_model_t *m, dp_backend_t *be, int max_batch, char *err)
{
    memset(net, 0, sizeof *net);
    if (max_batch < 1) return dp_err(err, "batch size must be at least 1 (got %d)", max_batch);
    net->m = m;
    net->be = be;
    net->max_batch = max_batch;
    if (be->ops->prepare(be, m, max_batch, err) != 0) return -1;
    net->d_params = be->ops->alloc(be, m->n_floats * sizeof(float));
    net->d_grads = be->ops->alloc(be, m->n_floats * sizeof(float));
    for (int i = 0; i <= m->n_layers; i++) {
        size_t bytes = (size_t)max_batch * s_boundary_size(m, i) * sizeof(float);
        net->d_act[i] = be->ops->alloc(be, bytes);
        /* No gradient flows into the batch itself. */
        if (i > 0) net->d_dact[i] = be->ops->alloc(be, bytes);
    }
    net->d_labels = be->ops->alloc(be, (size_t)max_batch * sizeof(int));
    net->d_loss = be->ops->alloc(be, sizeof(float));
    net->h_probs = dp_malloc((size_t)max_batch * m->classes * sizeof(float));
    return 0;
}

void dp_net_fini(dp_net_t *net)
{
    if (!net->be) return;
    dp_backend_t *be = net->be;
    be->ops->release(be, net->d_params);
    be->ops->release(be, net->d_grads);
    for (int i = 0; i <= net->m->n_layers; i++) {
        be->ops->release(be, net->d_act[i]);
        if (net->d_dact[i]) be->ops->release(be, net->d_dact[i]);
    }
    be->ops->release(be, net->d_labels);
    be->ops->release(be, net->d_loss);
    free(net->h_probs);
    memset(net, 0, sizeof *net);
}

void dp_net_set_params(dp_net_t *net, const float *params)
{
    net->be->ops->upload(net->be, net->d_params, params, net->m->n_floats * sizeof(float));
}

void dp_net_get_params(dp_net_t *net, float *params)
{
    net->be->ops->download(net->be, params, net->d_params, net->m->n_floats * sizeof(float));
}

void dp_net_get_grads(dp_net_t *net, float *grads)
{
    net->be->ops->download(net->be, grads, net->d_grads, net->m->n_floats * sizeof(float));
}

static float *s_param(dp_net_t *net, float *base, int index)
{
    return index < 0 ? NULL : base + net->m->params[index].offset;
}

/* Input of layer i: the batch for i = 0, else the previous layer's output. */
static const float *s_input(dp_net_t *net, const float *d_x, int i)
{
    return i == 0 ? d_x : net->d_act[i];
}

/* Queue every layer forward on the batch d_x, d_y; the mean loss goes to
 * d_loss on the device. */
static void s_forward(dp_net_t *net, const float *d_x, const int *d_y, int B)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        const float *in = s_input(net, d_x, i);
        float *out = net->d_act[i + 1];
        const float *w = s_param(net, net->d_params, l->weight);
        const float *b = s_param(net, net->d_params, l->bias);
        switch (l->kind) {
        case DP_LAYER_CONV: be->ops->conv_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_RELU: be->ops->relu_forward(be, (size_t)B * dp_layer_out_size(l), out, in); break;
        case DP_LAYER_MAXPOOL: be->ops->maxpool_forward(be, l, B, out, in); break;
        case DP_LAYER_FC: be->ops->fc_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_SOFTMAX:
            be->ops->softmax_xent_forward(be, B, m->classes, out, net->d_loss, in, d_y);
            break;
        }
    }
}

/* Queue the copy of layer l's parameter gradients (one contiguous range of
 * the flat vector) to h_grads. */
static void s_copy_layer_grads(dp_net_t *net, const dp_layer_t *l, float *h_grads)
{
    size_t lo = (size_t)-1, hi = 0;
    int idx[2] = {l->weight, l->bias};
    for (int k = 0; k < 2; k++) {
        if (idx[k] < 0) continue;
        const dp_param_t *p = &net->m->params[idx[k]];
        if (p->offset < lo) lo = p->offset;
        if (p->offset + p->count > hi) hi = p->offset + p->count;
    }
    if (hi <= lo) return;
    net->be->ops->download_async(net->be, h_grads + lo, net->d_grads + lo, (hi - lo) * sizeof(float));
}

float dp_net_train_step_device(dp_net_t *net, const float *d_x, const int *d_y, int B,
                               float *h_grads)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    s_forward(net, d_x, d_y, B);
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const dp_layer_t *l = &m->layers[i];
        const float *in = s_input(net, d_x, i);
        float *out = net->d_act[i + 1];
        float *din = i > 0 ? net->d_dact[i] : NULL;  /* the batch needs no gradient */
        const float *dout = net->d_dact[i + 1];
        const float *w = s_param(net, net->d_params, l->weight);
        float *dw = s_param(net, net->d_grads, l->weight);
        float *db = s_param(net, net->d_grads, l->bias);
        switch (l->kind) {
        case DP_LAYER_CONV: be->ops->conv_backward(be, l, B, din, dw, db, dout, in, w); break;
        case DP_LAYER_RELU:
            if (din) be->ops->relu_backward(be, (size_t)B * dp_layer_out_size(l), din, dout, out);
            break;
        case DP_LAYER_MAXPOOL:
            if (din) be->ops->maxpool_backward(be, l, B, din, dout, in, out);
            break;
        case DP_LAYER_FC: be->ops->fc_backward(be, l, B, din, dw, db, dout, in, w); break;
        case DP_LAYER_SOFTMAX:
            if (din) be->ops->softmax_xent_backward(be, B, m->classes, din, out, d_y);
            break;
        }
        if (h_grads) s_copy_layer_grads(net, l, h_grads);
    }
    float loss = 0;
    be->ops->download(be, &loss, net->d_loss, sizeof loss); /* waits for the whole step */
    if (h_grads) be->ops->download_wait(be);
    return loss;
}

/* Upload a host batch into the net's own input buffers. */
static void s_upload_batch(dp_net_t *net, const float *x, const int *y, int B)
{
    dp_backend_t *be = net->be;
    be->ops->upload(be, net->d_act[0], x, (size_t)B * s_boundary_size(net->m, 0) * sizeof(float));
    be->ops->upload(be, net->d_labels, y, (size_t)B * sizeof(int));
}

float dp_net_train_step(dp_net_t *net, const float *x, const int *y, int B)
{
    s_upload_batch(net, x, y, B);
    return dp_net_train_step_device(net, net->d_act[0], net->d_labels, B, NULL);
}

float dp_net_evaluate(dp_net_t *net, const float *x, const int *y, int B, int *correct)
{
    const dp_model_t *m = net->m;
    float loss = 0;
    s_upload_batch(net, x, y, B);
    s_forward(net, net->d_act[0], net->d_labels, B);
    net->be->ops->download(net->be, &loss, net->d_loss, sizeof loss);
    int C = m->classes;
    net->be->ops->download(net->be, net->h_probs, net->d_act[m->n_layers], (size_t)B * C * sizeof(float));
    int ok = 0;
    for (int b = 0; b < B; b++) {
        const float *p = net->h_probs + (size_t)b * C;
        int best = 0;
        for (int c = 1; c < C; c++)
            if (p[c] > p[best]) best = c;
        ok += best == y[b];
    }
    *correct = ok;
    return loss;
}

void dp_net_evaluate_dataset(dp_net_t *net, const dp_dataset_t *ds, int limit, float *x, int *y,
                             double *accuracy, double *loss)
{
    int n = limit > 0 && limit < ds->n ? limit : ds->n;
    int B = net->max_batch;
    int *idx = dp_malloc((size_t)B * sizeof(int));
    long correct = 0;
    double loss_sum = 0;
    for (int at = 0; at < n; at += B) {
        int b = n - at < B ? n - at : B;
        for (int i = 0; i < b; i++) idx[i] = at + i;
        dp_dataset_gather(ds, idx, b, x, y);
        int ok = 0;
        loss_sum += (double)dp_net_evaluate(net, x, y, b, &ok) * b;
        correct += ok;
    }
    free(idx);
    *accuracy = (double)correct / n;
    *loss = loss_sum / n;
}
