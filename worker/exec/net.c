/* net: forward / backward of the layer list through the backend. */
#include "worker/exec/net.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/env.h"

static size_t s_boundary_size(const dp_model_t *m, int i)
{
    if (i == 0) return (size_t)m->in_c * m->in_h * m->in_w;
    return dp_layer_out_size(&m->layers[i - 1]);
}

/* Which boundaries each layer reads (in1 -1 when one). */
static void s_reads(const dp_layer_t *l, int *a, int *b)
{
    *a = l->in0;
    *b = l->kind == DP_LAYER_ADD || l->kind == DP_LAYER_AC ? l->in1 : -1;
}

/* How many layers read boundary b. */
static int s_readers(const dp_model_t *m, int b)
{
    int n = 0;
    for (int j = 0; j < m->n_layers; j++) {
        int a, c;
        s_reads(&m->layers[j], &a, &c);
        n += (a == b) + (c == b);
    }
    return n;
}

/* Layer j (an add) sums boundary j's layer's output and an identity
 * shortcut of the same shape. */
static int s_identity_add(const dp_layer_t *a)
{
    return a->kind == DP_LAYER_ADD && a->stride == 1 && a->src_c == a->out_c &&
           a->src_h == a->out_h && a->src_w == a->out_w;
}

/* Which bn layers run with the layers after them as one op (unless
 * DP_FUSE=0): relu i + 1 reading bn i's output and nothing else doing so
 * (the backend's bn_relu ops), or an identity add i + 1 of bn i's output
 * and relu i + 2 of the sum, each boundary read by the next alone, and
 * bn i's input read by bn i alone (bn_add_relu: then the gradients of
 * both the bn's input and the shortcut are first written there). The
 * boundaries inside are never stored nor their gradients made. A residual
 * block's bn, relu pairs are all such, and its end (bn, add, relu) where
 * the shortcut is the identity. */
static void s_plan_fuse(dp_net_t *net)
{
    const dp_model_t *m = net->m;
    const dp_backend_ops_t *o = net->be->ops;
    if (!dp_fuse_on()) return;
    for (int i = 0; i + 1 < m->n_layers; i++) {
        const dp_layer_t *n1 = &m->layers[i + 1];
        if (m->layers[i].kind != DP_LAYER_BN || s_readers(m, i + 1) != 1) continue;
        if (o->bn_relu_forward && n1->kind == DP_LAYER_RELU && n1->in0 == i + 1) {
            net->fuse[i] = 1;
        } else if (o->bn_add_relu_forward && i + 2 < m->n_layers && s_identity_add(n1) &&
                   n1->in0 == i + 1 && n1->in1 != i + 1 && m->layers[i].in0 == i &&
                   s_readers(m, i) == 1 && m->layers[i + 2].kind == DP_LAYER_RELU &&
                   m->layers[i + 2].in0 == i + 2 && s_readers(m, i + 2) == 1) {
            net->fuse[i] = 2;
            i += 2;
        }
    }
}

/* Layer i runs inside the op of a bn before it. */
static int s_fused_away(const dp_net_t *net, int i)
{
    return (i > 0 && net->fuse[i - 1]) || (i > 1 && net->fuse[i - 2] == 2);
}

/* Boundary b is inside a fused op: never stored, no gradient buffer. */
static int s_unstored(const dp_net_t *net, int b)
{
    return b > 0 && s_fused_away(net, b);
}

/* The gradient buffers: boundary b's lives from the backward of its last
 * reader (it is started there) to that of its writer, layer b-1; buffers
 * are assigned in backward order, first free first. A fused op (bn i and
 * the fuse[i] layers after it) is one layer here: the boundaries inside
 * get no buffer, and its output's lives on to bn i's backward, which reads
 * it (and writes the shortcut's, live from the add's place on). Returns
 * the count. */
static int s_plan_pool(dp_net_t *net)
{
    const dp_model_t *m = net->m;
    int nb = m->n_layers + 1, n_pool = 0;
    for (int b = 0; b < nb; b++) net->last_reader[b] = -1, net->pool_of[b] = -1;
    for (int i = 0; i < m->n_layers; i++) {
        int a, c;
        s_reads(&m->layers[i], &a, &c);
        if (a > 0 && i > net->last_reader[a]) net->last_reader[a] = i;
        if (c > 0 && i > net->last_reader[c]) net->last_reader[c] = i;
    }
    int *busy = dp_calloc((size_t)nb, sizeof(int)); /* buffer k holds a live boundary */
    for (int i = m->n_layers - 1; i >= 0; i--) {
        for (int b = 1; b < nb; b++) {
            if (net->last_reader[b] != i || s_unstored(net, b)) continue;
            int k = 0;
            while (k < n_pool && busy[k]) k++;
            if (k == n_pool) n_pool++;
            busy[k] = 1;
            net->pool_of[b] = k;
        }
        /* layer i wrote boundary i + 1 (a fused bn, through its op's last
         * layer, i + 1 + fuse[i]): that gradient dies with this backward */
        int w = s_fused_away(net, i) ? -1 : i + 1 + net->fuse[i];
        if (w > 0 && net->pool_of[w] >= 0) busy[net->pool_of[w]] = 0;
    }
    free(busy);
    return n_pool;
}

int dp_net_init(dp_net_t *net, const dp_model_t *m, dp_backend_t *be, int max_batch, char *err)
{
    memset(net, 0, sizeof *net);
    if (max_batch < 1) return dp_err(err, "batch size must be at least 1 (got %d)", max_batch);
    if (dp_model_is_table(m))
        return dp_err(err, "a tensor table has no layers to run (a library client trains it)");
    for (int i = 0; i < m->n_layers; i++)
        if (dp_layer_is_resnet_kind(&m->layers[i]) && !be->ops->bn_forward)
            return dp_err(err, "%s: layer '%s' (%s) is not supported by this backend yet (run "
                          "with --device cpu)", be->name, m->layers[i].name,
                          m->layers[i].kind == DP_LAYER_BN ? "bn" : m->layers[i].kind == DP_LAYER_ADD ? "res" : m->layers[i].kind == DP_LAYER_GAP ? "gap" : "dropout");
    if (m->n_layers > 0 && m->layers[0].kind == DP_LAYER_OBSNORM && !be->ops->obs_norm_forward)
        return dp_err(err, "%s: layer 'obsnorm' is not supported by this backend yet (run with "
                      "--device cpu, or --obs-norm off)", be->name);
    net->m = m;
    net->be = be;
    net->max_batch = max_batch;
    if (be->ops->prepare(be, m, max_batch, err) != 0) return -1;
    int nb = m->n_layers + 1;
    net->d_act = dp_calloc((size_t)nb, sizeof(float *));
    net->d_dact = dp_calloc((size_t)nb, sizeof(float *));
    net->d_save = dp_calloc((size_t)nb, sizeof(float *));
    net->last_reader = dp_calloc((size_t)nb, sizeof(int));
    net->pool_of = dp_calloc((size_t)nb, sizeof(int));
    net->written = dp_calloc((size_t)nb, 1);
    net->fuse = dp_calloc((size_t)m->n_layers, 1);
    net->d_params = be->ops->alloc(be, m->n_floats * sizeof(float));
    net->d_grads = net->own_grads = be->ops->alloc(be, m->n_floats * sizeof(float));
    s_plan_fuse(net);
    size_t max_b = 0;
    for (int i = 0; i < nb; i++) {
        size_t sz = s_boundary_size(m, i);
        if (sz > max_b) max_b = sz;
        /* boundary i inside a fused op: never stored, no buffer */
        if (!s_unstored(net, i))
            net->d_act[i] = be->ops->alloc(be, (size_t)max_batch * sz * sizeof(float));
    }
    net->n_pool = s_plan_pool(net);
    net->d_pool = dp_calloc((size_t)net->n_pool + 1, sizeof(float *));
    for (int k = 0; k < net->n_pool; k++)
        net->d_pool[k] = be->ops->alloc(be, (size_t)max_batch * max_b * sizeof(float));
    net->d_tmp = be->ops->alloc(be, (size_t)max_batch * max_b * sizeof(float));
    if (m->embed_dim > 0) /* its batch's gradient goes back to the rows */
        net->d_dx = be->ops->alloc(be, (size_t)max_batch * s_boundary_size(m, 0) * sizeof(float));
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == DP_LAYER_BN) /* 2 C floats per ghost batch, at most max_batch */
            net->d_save[i] = be->ops->alloc(be, (size_t)2 * m->layers[i].in_c * max_batch * sizeof(float));
    net->d_labels = be->ops->alloc(be, (size_t)max_batch * sizeof(int));
    net->d_loss = be->ops->alloc(be, sizeof(float));
    if (dp_model_is_ac(m)) {
        net->d_ret = be->ops->alloc(be, (size_t)max_batch * sizeof(float));
        net->ac_entropy = DP_AC_ENTROPY_DEFAULT;
        net->ac_value_coef = DP_AC_VALUE_COEF;
    }
    net->h_probs = dp_malloc((size_t)max_batch * m->classes * sizeof(float));
    return 0;
}

void dp_net_fini(dp_net_t *net)
{
    if (!net->be) return;
    dp_backend_t *be = net->be;
    be->ops->release(be, net->d_params);
    be->ops->release(be, net->own_grads);
    for (int i = 0; i <= net->m->n_layers; i++) {
        if (net->d_act[i]) be->ops->release(be, net->d_act[i]);
        if (net->d_save[i]) be->ops->release(be, net->d_save[i]);
    }
    for (int k = 0; k < net->n_pool; k++) be->ops->release(be, net->d_pool[k]);
    be->ops->release(be, net->d_tmp);
    if (net->d_dx) be->ops->release(be, net->d_dx);
    be->ops->release(be, net->d_labels);
    be->ops->release(be, net->d_loss);
    if (net->d_ret) be->ops->release(be, net->d_ret);
    free(net->d_act);
    free(net->d_dact);
    free(net->d_save);
    free(net->d_pool);
    free(net->last_reader);
    free(net->pool_of);
    free(net->written);
    free(net->fuse);
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

void dp_net_get_input_grad(dp_net_t *net, float *dx, int B)
{
    net->be->ops->download(net->be, dx, net->d_dx,
                           (size_t)B * s_boundary_size(net->m, 0) * sizeof(float));
}

void dp_net_get_grads(dp_net_t *net, float *grads)
{
    net->be->ops->download(net->be, grads, net->d_grads, net->m->n_floats * sizeof(float));
}

void dp_net_grads_into(dp_net_t *net, float *buf)
{
    net->d_grads = buf ? buf : net->own_grads;
}

void dp_net_pseudo_gradient(const dp_net_t *net, const float *w0, const float *w, float *push)
{
    const dp_model_t *m = net->m;
    for (size_t i = 0; i < m->n_floats; i++) push[i] = w0[i] - w[i];
    dp_model_copy_state(m, 0, 0, m->n_floats, push, w); /* state: the value itself */
}

void dp_net_optim_step(dp_net_t *net, const dp_optim_conf_t *c, float lr, float *d_state,
                       long t)
{
    dp_backend_t *be = net->be;
    const dp_model_t *m = net->m;
    be->ops->optim_step(be, c, lr, net->d_params, net->d_grads, d_state, m->n_floats, t);
    if (be->host_memory) {
        dp_model_copy_state(m, 0, 0, m->n_floats, net->d_params, net->d_grads);
        return;
    }
    for (int i = 0; i < m->n_params; i++) /* on the device, one run of state at a time */
        if (!m->params[i].trainable)
            be->ops->copy(be, net->d_params + m->params[i].offset,
                          net->d_grads + m->params[i].offset, m->params[i].count * sizeof(float));
}

static float *s_param(dp_net_t *net, float *base, int index)
{
    return index < 0 ? NULL : base + net->m->params[index].offset;
}

/* Boundary b's activation: the batch for b = 0. */
static const float *s_act(dp_net_t *net, const float *d_x, int b)
{
    return b == 0 ? d_x : net->d_act[b];
}

/* A bn's state tensors are one contiguous run: running_mean, running_var,
 * num_batches_tracked (an obsnorm's the same: running_mean, running_var,
 * count). Their new values go to d_grads too (what a push carries there). */
static void s_bn_state_to_grads(dp_net_t *net, const dp_layer_t *l)
{
    const dp_param_t *a = &net->m->params[l->running_mean];
    const dp_param_t *z = &net->m->params[l->num_batches_tracked];
    net->be->ops->copy(net->be, net->d_grads + a->offset, net->d_params + a->offset,
                       (z->offset + z->count - a->offset) * sizeof(float));
}

/* The caller's hook before the forward reads floats [0, end) of the
 * parameters (a training step): its status (worker/client/pull.h). On a device
 * the floats the hook added since *up go up behind the ops queued. */
static dp_pull_status_t s_params_needed(dp_net_t *net, size_t end, int train, size_t *up)
{
    dp_backend_t *be = net->be;
    if (!train || !net->on_params || (!be->host_memory && !net->h_pull)) return DP_PULL_OK;
    dp_pull_status_t st = net->on_params(net->on_params_arg, end);
    if (st != DP_PULL_OK) return st;
    if (!be->host_memory && end > *up) {
        be->ops->upload_async(be, net->d_params + *up, net->h_pull + *up, (end - *up) * sizeof(float));
        *up = end;
    }
    return DP_PULL_OK;
}

/* Queue every layer forward on the batch d_x, d_y; the mean loss goes to
 * d_loss on the device. train: batch norm by the batch's statistics (and
 * its running statistics updated), dropout on; else evaluation. Returns
 * the hook's first status other than DP_PULL_OK, where the forward stops
 * (TORN: start again; FAILED: give the step up), else DP_PULL_OK. */
static dp_pull_status_t s_forward_layers(dp_net_t *net, const float *d_x, const int *d_y, int B,
                                         int train)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    size_t asked = 0, up = 0; /* the end the hook was last called with; uploaded */
    for (int i = 0; i < m->n_layers; i++) {
        const dp_layer_t *l = &m->layers[i];
        size_t lo, hi;
        dp_pull_status_t st = DP_PULL_OK;
        if (dp_model_layer_span(m, i, &lo, &hi) &&
            (st = s_params_needed(net, asked = hi, train, &up)) != DP_PULL_OK)
            return st;
        const float *in = s_act(net, d_x, l->in0);
        float *out = net->d_act[i + 1];
        float *P = net->d_params;
        double t0 = net->t_layer ? dp_now() : 0;
        const float *w = s_param(net, P, l->weight);
        const float *b = s_param(net, P, l->bias);
        switch (l->kind) {
        case DP_LAYER_CONV: be->ops->conv_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_RELU:
            if (!s_fused_away(net, i))
                be->ops->relu_forward(be, (size_t)B * dp_layer_out_size(l), out, in);
            break;
        case DP_LAYER_TANH: be->ops->tanh_forward(be, (size_t)B * dp_layer_out_size(l), out, in); break;
        case DP_LAYER_MAXPOOL: be->ops->maxpool_forward(be, l, B, out, in); break;
        case DP_LAYER_FC: be->ops->fc_forward(be, l, B, out, in, w, b); break;
        case DP_LAYER_BN: {
            /* fused: the op's last layer's output, and those layers are done */
            int G = net->ghost > 0 ? net->ghost : B;
            float *rm = s_param(net, P, l->running_mean), *rv = s_param(net, P, l->running_var);
            float *nbt = s_param(net, P, l->num_batches_tracked);
            if (net->fuse[i] == 2)
                be->ops->bn_add_relu_forward(be, l, B, G, train, net->d_act[i + 3], in,
                                             s_act(net, d_x, m->layers[i + 1].in1), w, b, rm,
                                             rv, nbt, net->d_save[i]);
            else
                (net->fuse[i] ? be->ops->bn_relu_forward : be->ops->bn_forward)(
                    be, l, B, G, train, net->fuse[i] ? net->d_act[i + 2] : out, in, w, b, rm, rv,
                    nbt, net->d_save[i]);
            if (train) s_bn_state_to_grads(net, l);
            break;
        }
        case DP_LAYER_GAP: be->ops->gap_forward(be, l, B, out, in); break;
        case DP_LAYER_OBSNORM:
            be->ops->obs_norm_forward(be, l, B, train, out, in, s_param(net, P, l->running_mean),
                                      s_param(net, P, l->running_var),
                                      s_param(net, P, l->num_batches_tracked));
            if (train) s_bn_state_to_grads(net, l);
            break;
        case DP_LAYER_DROPOUT:
            if (train && l->p > 0)
                be->ops->dropout_forward(be, l, B, net->seed, net->step, net->sample0, out, in);
            else
                be->ops->copy(be, out, in, (size_t)B * dp_layer_out_size(l) * sizeof(float));
            break;
        case DP_LAYER_ADD:
            if (!s_fused_away(net, i))
                be->ops->shortcut_forward(be, l, B, out, in, s_act(net, d_x, l->in1));
            break;
        case DP_LAYER_SOFTMAX:
            be->ops->softmax_xent_forward(be, B, m->classes, out, net->d_loss, in, d_y);
            break;
        case DP_LAYER_SIGMOID:
            be->ops->sigmoid_xent_forward(be, B, out, net->d_loss, in, b, d_y);
            break;
        case DP_LAYER_AC: /* without actions (acting): the policy alone */
            be->ops->ac_loss_forward(be, B, m->classes, net->ac_entropy, net->ac_value_coef, out,
                                     net->d_loss, in, s_act(net, d_x, l->in1), d_y,
                                     d_y ? net->d_ret : NULL);
            break;
        }
        if (net->t_layer) net->t_layer[i] += dp_now() - t0;
    }
    return asked == m->n_floats ? DP_PULL_OK : s_params_needed(net, m->n_floats, train, &up);
}

/* The forward, started again as long as the hook says so (a torn pull:
 * the weights read so far were replaced, and the repeated reply is in):
 * DP_PULL_OK, or DP_PULL_FAILED where it stopped. */
static dp_pull_status_t s_forward(dp_net_t *net, const float *d_x, const int *d_y, int B,
                                  int train)
{
    dp_pull_status_t st;
    while ((st = s_forward_layers(net, d_x, d_y, B, train)) == DP_PULL_TORN) {
    }
    return st;
}

/* Where a layer writes the gradient of boundary b: NULL for the batch
 * unless its gradient is wanted (d_dx); its buffer when this is the first
 * gradient it gets (written, not added: the kernels overwrite), else
 * d_tmp, added in by s_din_done. */
static float *s_din(dp_net_t *net, int b)
{
    if (b == 0 && !net->d_dx) return NULL;
    if (!net->written[b]) {
        net->written[b] = 1;
        return net->d_dact[b];
    }
    return net->d_tmp;
}

static void s_din_done(dp_net_t *net, int b, const float *din, int B)
{
    if (!din || din != net->d_tmp) return;
    net->be->ops->vec_add(net->be, (size_t)B * s_boundary_size(net->m, b), net->d_dact[b],
                          net->d_tmp);
}

/* Queue the copy of layer i's parameter gradients (one contiguous range of
 * the flat vector: a bn's state values with them) to h_grads. */
static void s_copy_layer_grads(dp_net_t *net, int i, float *h_grads)
{
    size_t lo, hi;
    if (!dp_model_layer_span(net->m, i, &lo, &hi)) return;
    net->be->ops->download_async(net->be, h_grads + lo, net->d_grads + lo, (hi - lo) * sizeof(float));
}

/* Layer i's gradients are final: to the caller's hook, on a backend whose
 * ops are done when they return (host memory: the CPU). */
static void s_grads_ready(dp_net_t *net, int i)
{
    size_t lo, hi;
    if (net->on_grads && net->be->host_memory && dp_model_layer_span(net->m, i, &lo, &hi))
        net->on_grads(net->on_grads_arg, lo, hi - lo);
}

/* A device's backward is queued whole; then the host takes the layers'
 * copies to h_grads in the order they were queued (the last layer first)
 * and hands each to the hook as soon as it is complete, while the device
 * still runs the layers below. */
static void s_copies_ready(dp_net_t *net)
{
    const dp_model_t *m = net->m;
    unsigned k = 0;
    for (int i = m->n_layers - 1; i >= 0; i--) {
        size_t lo, hi;
        if (!dp_model_layer_span(m, i, &lo, &hi)) continue;
        net->be->ops->download_wait_first(net->be, ++k);
        net->on_grads(net->on_grads_arg, lo, hi - lo);
    }
}

/* The backward of layer i: its boundaries' gradients get their buffers
 * from the pool while they live. */
static void s_backward_layer(dp_net_t *net, const float *d_x, const int *d_y, int B, int i)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    const dp_layer_t *l = &m->layers[i];
    const float *in = s_act(net, d_x, l->in0);
    float *out = net->d_act[i + 1];
    const float *dout = net->d_dact[i + 1];
    const float *w = s_param(net, net->d_params, l->weight);
    float *dw = s_param(net, net->d_grads, l->weight);
    float *db = s_param(net, net->d_grads, l->bias);
    size_t n_out = (size_t)B * dp_layer_out_size(l);
    if (s_fused_away(net, i)) return; /* its bn's backward does it */
    float *din = s_din(net, l->in0);
    switch (l->kind) {
    case DP_LAYER_CONV: be->ops->conv_backward(be, l, B, din, dw, db, dout, in, w); break;
    case DP_LAYER_RELU:
        if (din) be->ops->relu_backward(be, n_out, din, dout, out);
        break;
    case DP_LAYER_TANH:
        if (din) be->ops->tanh_backward(be, n_out, din, dout, out);
        break;
    case DP_LAYER_MAXPOOL:
        if (din) be->ops->maxpool_backward(be, l, B, din, dout, in, out);
        break;
    case DP_LAYER_FC: be->ops->fc_backward(be, l, B, din, dw, db, dout, in, w); break;
    case DP_LAYER_BN:
        if (net->fuse[i] == 2) { /* and the shortcut's gradient, first written here */
            int z = m->layers[i + 1].in1;
            float *dz = s_din(net, z);
            be->ops->bn_add_relu_backward(be, l, B, net->ghost > 0 ? net->ghost : B, din, dz, dw,
                                          db, net->d_dact[i + 3], net->d_act[i + 3], in, w,
                                          net->d_save[i]);
            s_din_done(net, z, dz, B);
        } else if (net->fuse[i]) /* the gradient wrt the relu's output, and its mask */
            be->ops->bn_relu_backward(be, l, B, net->ghost > 0 ? net->ghost : B, din, dw, db,
                                      net->d_dact[i + 2], net->d_act[i + 2], in, w,
                                      net->d_save[i]);
        else
            be->ops->bn_backward(be, l, B, net->ghost > 0 ? net->ghost : B, din, dw, db, dout,
                                 in, w, net->d_save[i]);
        break;
    case DP_LAYER_GAP:
        if (din) be->ops->gap_backward(be, l, B, din, dout);
        break;
    case DP_LAYER_OBSNORM: /* first (the grammar's rule): its input is the batch, and none of
                            * its tensors is trained */
        break;
    case DP_LAYER_DROPOUT:
        if (din && l->p > 0)
            be->ops->dropout_backward(be, l, B, net->seed, net->step, net->sample0, din, dout);
        else if (din)
            be->ops->copy(be, din, dout, n_out * sizeof(float));
        break;
    case DP_LAYER_ADD:
        if (din) be->ops->copy(be, din, dout, n_out * sizeof(float));
        s_din_done(net, l->in0, din, B);
        din = s_din(net, l->in1);
        if (din) be->ops->shortcut_backward(be, l, B, din, dout);
        s_din_done(net, l->in1, din, B);
        return;
    case DP_LAYER_SOFTMAX:
        if (din) be->ops->softmax_xent_backward(be, B, m->classes, din, out, d_y);
        break;
    case DP_LAYER_SIGMOID: /* its bias's gradient even where the logit's is not wanted */
        if (din || db) be->ops->sigmoid_xent_backward(be, B, din, db, out, d_y);
        break;
    case DP_LAYER_AC: { /* the policy's and the value's gradients, both first here */
        float *dv = s_din(net, l->in1);
        be->ops->ac_loss_backward(be, B, m->classes, net->ac_entropy, net->ac_value_coef, din, dv,
                                  in, s_act(net, d_x, l->in1), d_y, net->d_ret);
        s_din_done(net, l->in0, din, B);
        s_din_done(net, l->in1, dv, B);
        return;
    }
    }
    s_din_done(net, l->in0, din, B);
}

float dp_net_train_step_device(dp_net_t *net, const float *d_x, const int *d_y, int B,
                               float *h_grads)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    net->pull_status = s_forward(net, d_x, d_y, B, 1);
    if (net->pull_status == DP_PULL_FAILED) return NAN; /* no backward: the step is given up */
    memset(net->written, 0, (size_t)m->n_layers + 1);
    for (int b = 0; b <= m->n_layers; b++) net->d_dact[b] = NULL;
    net->d_dact[0] = net->d_dx; /* the batch's gradient: NULL but for an embedding's model */
    for (int i = m->n_layers - 1; i >= 0; i--) {
        /* the boundaries whose last reader this is start their gradient here */
        for (int b = 1; b <= m->n_layers; b++)
            if (net->last_reader[b] == i && net->pool_of[b] >= 0)
                net->d_dact[b] = net->d_pool[net->pool_of[b]];
        double t0 = net->t_layer ? dp_now() : 0;
        s_backward_layer(net, d_x, d_y, B, i);
        if (net->t_layer) net->t_layer[m->n_layers + i] += dp_now() - t0;
        if (h_grads) s_copy_layer_grads(net, i, h_grads);
        s_grads_ready(net, i);
    }
    if (h_grads && net->on_grads && !be->host_memory) s_copies_ready(net);
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

float dp_net_train_step_ac(dp_net_t *net, const float *x, const int *actions, const float *ret,
                           int B)
{
    s_upload_batch(net, x, actions, B);
    net->be->ops->upload(net->be, net->d_ret, ret, (size_t)B * sizeof(float));
    return dp_net_train_step_device(net, net->d_act[0], net->d_labels, B, NULL);
}

void dp_net_act(dp_net_t *net, const float *x, int B, float *probs, float *value)
{
    const dp_model_t *m = net->m;
    dp_backend_t *be = net->be;
    be->ops->upload(be, net->d_act[0], x, (size_t)B * s_boundary_size(m, 0) * sizeof(float));
    s_forward(net, net->d_act[0], NULL, B, 0);
    const dp_layer_t *head = &m->layers[m->n_layers - 1];
    be->ops->download(be, probs, net->d_act[m->n_layers], (size_t)B * m->classes * sizeof(float));
    if (value) be->ops->download(be, value, net->d_act[head->in1], (size_t)B * sizeof(float));
}

float dp_net_evaluate(dp_net_t *net, const float *x, const int *y, int B, int *correct)
{
    const dp_model_t *m = net->m;
    float loss = 0;
    s_upload_batch(net, x, y, B);
    s_forward(net, net->d_act[0], net->d_labels, B, 0);
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
