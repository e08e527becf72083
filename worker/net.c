/* net: forward / backward of the layer list through the backend. */
#include "net.h"

#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

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
    if (be->prepare(be, m, max_batch, err) != 0) return -1;
    net->d_params = be->alloc(be, m->n_floats * sizeof(float));
    net->d_grads = be->alloc(be, m->n_floats * sizeof(float));
    for (int i = 0; i <= m->n_layers; i++) {
        size_t bytes = (size_t)max_batch * s_boundary_size(m, i) * sizeof(float);
        net->d_act[i] = be->alloc(be, bytes);
        /* No gradient flows into the batch itself. */
        if (i > 0) net->d_dact[i] = be->alloc(be, bytes);
    }
    net->d_labels = be->alloc(be, (size_t)max_batch * sizeof(int));
    net->h_probs = dp_malloc((size_t)max_batch * m->classes * sizeof(float));
    return 0;
}

void dp_net_free(dp_net_t *net)
{
    if (!net->be) return;
    dp_backend_t *be = net->be;
    be->release(be, net->d_params);
    be->release(be, net->d_grads);
    for (int i = 0; i <= net->m->n_layers; i++) {
        be->release(be, net->d_act[i]);
        if (net->d_dact[i]) be->release(be, net->d_dact[i]);
    }
    be->release(be, net->d_labels);
    free(net->h_probs);
    memset(net, 0, sizeof *net);
}

void dp_net_set_params(dp_net_t *net, const float *params)
{
    net->be->upload(net->be, net->d_params, params, net->m->n_floats * sizeof(float));
}

void dp_net_get_params(dp_net_t *net, float *params)
{
    net->be->download(net->be, params, net->d_params, net->m->n_floats * sizeof(float));
}

void dp_net_get_grads(dp_net_t *net, float *grads)
{
    net->be->download(net->be, grads, net->d_grads, net->m->n_floats * sizeof(float));
}

static float *s_param(dp_net_t *net, float *base, int index)
{
    return index < 0 ? NULL : base + net->m->params[index].offset;
}

/* Upload the batch and run every layer forward; returns the mean loss. */
static float s_forward(dp_net_t *net, const float *x, const int *y, int B)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    be->upload(be, net->d_act[0], x, (size_t)B * s_boundary_size(m, 0) * sizeof(float));
    be->upload(be, net->d_labels, y, (size_t)B * sizeof(int));
    float loss = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        float *in = net->d_act[i], *out = net->d_act[i + 1];
        const float *w = s_param(net, net->d_params, l->weight);
        const float *b = s_param(net, net->d_params, l->bias);
        switch (l->kind) {
        case DP_LAYER_CONV: be->conv_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_RELU: be->relu_forward(be, (size_t)B * dp_layer_out_size(l), out, in); break;
        case DP_LAYER_MAXPOOL: be->maxpool_forward(be, l, B, out, in); break;
        case DP_LAYER_FC: be->fc_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_SOFTMAX:
            loss = be->softmax_xent_forward(be, B, m->classes, out, in, net->d_labels);
            break;
        }
    }
    return loss;
}

float dp_net_train_step(dp_net_t *net, const float *x, const int *y, int B)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    float loss = s_forward(net, x, y, B);
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const dp_layer_t *l = &m->layers[i];
        float *in = net->d_act[i], *out = net->d_act[i + 1];
        float *din = i > 0 ? net->d_dact[i] : NULL;  /* the batch needs no gradient */
        const float *dout = net->d_dact[i + 1];
        const float *w = s_param(net, net->d_params, l->weight);
        float *dw = s_param(net, net->d_grads, l->weight);
        float *db = s_param(net, net->d_grads, l->bias);
        switch (l->kind) {
        case DP_LAYER_CONV: be->conv_backward(be, l, B, din, dw, db, dout, in, w); break;
        case DP_LAYER_RELU:
            if (din) be->relu_backward(be, (size_t)B * dp_layer_out_size(l), din, dout, out);
            break;
        case DP_LAYER_MAXPOOL:
            if (din) be->maxpool_backward(be, l, B, din, dout, in, out);
            break;
        case DP_LAYER_FC: be->fc_backward(be, l, B, din, dw, db, dout, in, w); break;
        case DP_LAYER_SOFTMAX:
            if (din) be->softmax_xent_backward(be, B, m->classes, din, out, net->d_labels);
            break;
        }
    }
    return loss;
}

float dp_net_evaluate(dp_net_t *net, const float *x, const int *y, int B, int *correct)
{
    const dp_model_t *m = net->m;
    float loss = s_forward(net, x, y, B);
    int C = m->classes;
    net->be->download(net->be, net->h_probs, net->d_act[m->n_layers], (size_t)B * C * sizeof(float));
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
