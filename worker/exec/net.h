/* net: the network executor. Runs a dp_model_t's layers forward and
 * backward through a backend, on one device, for batches up to max_batch.
 *
 * Memory is allocated once in dp_net_init: one buffer for the parameters,
 * one for their gradients (both laid out as the model's flat vector, so a
 * pull or a push is one copy), one activation buffer per layer boundary and
 * a few activation-gradient buffers shared by the boundaries in turn.
 * Nothing is allocated per step.
 *
 * The model is a small graph (common/model.h): boundary i holds act[i],
 * the output of layer i-1 (act[0] is the batch); layer i reads boundary
 * in0 (and an add in1). The backward visits the layers in reverse; a
 * boundary read twice (a residual block's input: the body and the
 * shortcut) gets the sum of both gradients. A boundary's gradient lives
 * from the backward of its last reader to that of its writer, so the
 * gradient buffers are handed out by that interval (a chain needs two,
 * a ResNet four). The softmax layer's output act[n] holds the probabilities.
 *
 * A bn whose output only the relu after it reads runs with that relu as
 * one op where the backend has it (bn_relu_forward: the CPU's; DP_FUSE=0
 * turns it off): the pair writes the relu's output and takes its gradient,
 * so bn's own output is never stored nor its gradient made; the bits are
 * the same either way on the CPU (tests/unit/test_net.c). Likewise a
 * block's end, bn + an identity shortcut's add + relu, where the backend
 * has bn_add_relu_forward (the CUDA backend's; the CPU has none).
 *
 * Batch norm's running statistics are parameters (trainable 0): a training
 * step updates them in d_params, and writes their new values into d_grads
 * at the same offsets, which is what a push carries there
 * (ARCHITECTURE.md, "State that is not a gradient"); dp_net_optim_step
 * keeps them out of the optimizer's step.
 *
 * A model with an embedding (embed:D, common/model.h) is run here from its
 * first dense layer on: its batch is the embedding's output (B x D, the
 * embedding stage is the caller's, kernels/embed.h), and a training step
 * also writes the gradient of the loss wrt that batch into d_dx, which
 * the caller takes (dp_net_get_input_grad) back to the rows. Without an
 * embedding nothing wants the batch's gradient and it is not computed. */
#ifndef DP_NET_H
#define DP_NET_H

#include "common/dataset.h"
#include "common/model.h"
#include "kernels/backend.h"
#include "worker/client/pull.h"

typedef struct {
    const dp_model_t *m;                  /* not owned */
    dp_backend_t *be;                     /* not owned */
    int max_batch;
    float *d_params;                      /* m->n_floats */
    float *d_grads;                       /* m->n_floats, written by train_step: own_grads,
                                           * or the caller's (dp_net_grads_into) */
    float *own_grads;                     /* the network's own gradient buffer */
    float **d_act;                        /* [n_layers + 1]: [max_batch * size of boundary i]; NULL inside a fused op (never stored) */
    float **d_dact;                       /* gradient of the loss wrt act[i] while it lives */
    float **d_save;                       /* [n_layers]: a bn's batch statistics, else NULL */
    float **d_pool;                       /* the shared gradient buffers, n_pool of them */
    int n_pool;
    int *last_reader;                     /* [n_layers + 1]: the last layer reading boundary i, -1 */
    int *pool_of;                         /* [n_layers + 1]: boundary i's buffer while it lives */
    unsigned char *written;               /* [n_layers + 1]: gradient started this backward */
    unsigned char *fuse;                  /* [n_layers]: how many layers after bn i run in its
                                           * op: 1 (relu i + 1), 2 (add i + 1, relu i + 2) */
    float *d_tmp;                         /* a second reader's gradient, before it is added */
    float *d_dx;                          /* an embedding's model: the gradient wrt the batch
                                           * [max_batch * input size], written by a training
                                           * step; NULL otherwise */
    int *d_labels;                        /* [max_batch]; an actor-critic model's actions */
    float *d_ret;                         /* an actor-critic model's returns [max_batch], else NULL */
    float *d_loss;                        /* the batch's mean loss (one float) */
    float *h_probs;                       /* [max_batch * classes], host copy for accuracy */
    /* Set by the caller before a training step (0 by default): */
    int ghost;                            /* bn statistics per ghost batch of this many (0: all) */
    unsigned long long seed, step;        /* dropout's mask (kernels/ops.h) ... */
    unsigned long long sample0;           /* ... and the batch's first sample in the global batch */
    /* An actor-critic model's loss weights (kernels/ops.h), set by dp_net_init
     * to the defaults; a caller may change them before a step: */
    float ac_entropy;                     /* beta, the entropy bonus (--entropy) */
    float ac_value_coef;                  /* the value loss's weight */
    /* Set by a profiler (tests/bench/bench_train -l), else NULL: [2 * n_layers],
     * seconds added per layer, forward at i, backward at n_layers + i. Only
     * meaningful on a backend whose ops finish before they return (the CPU). */
    double *t_layer;
    /* Set by a caller that streams the gradient (the worker's push in parts),
     * else NULL: called in a training step's backward as soon as layer i's
     * parameter gradients, floats [off, off + n) of d_grads (one run: the
     * parameters lie in model order), are written and final. The backward
     * runs from the last layer to the first, so the floats handed over grow
     * downward from the end of the vector. On a backend whose memory is
     * not the host's, the floats are those of the step's h_grads instead,
     * called once each layer's copy there is complete: the whole backward
     * is queued first, then the host waits for the copies in turn while
     * the device runs on (without h_grads the hook is not called). */
    void (*on_grads)(void *arg, size_t off, size_t n);
    void *on_grads_arg;
    /* Set by a caller that pulls the weights as the forward needs them
     * (the worker's pull in parts), else NULL: called in a training step's
     * forward before each layer that has parameters, with the end of that
     * layer's floats, and after the last layer with n_floats if no layer's
     * floats ended the vector: once per pass with n_floats, before the
     * backward. It returns DP_PULL_OK once floats [0, end) of d_params
     * are in place; DP_PULL_TORN when the floats the forward read so far
     * were replaced (a pull torn by a shard's restart), and the forward
     * starts again from the first layer; DP_PULL_FAILED, and the step stops
     * at once: no later layer's forward, no backward, no on_grads (the step
     * says so in pull_status). The parameters lie in model order, so what the hook
     * waits for grows upward from the start of the vector. On a backend
     * whose memory is not the host's, the hook fills h_pull instead, and
     * each run it returns is queued for d_params on the compute stream
     * (upload_async), so the device computes the first layers while the
     * host waits for the next (without h_pull the hook is not called). */
    dp_pull_status_t (*on_params)(void *arg, size_t end);
    void *on_params_arg;
    float *h_pull;                        /* m->n_floats, host (host_alloc): see on_params */
    /* Set by a training step: DP_PULL_FAILED when on_params failed and the
     * step stopped (its loss NAN, d_grads not this step's), else DP_PULL_OK. */
    dp_pull_status_t pull_status;
} dp_net_t;

int dp_net_init(dp_net_t *net, const dp_model_t *m, dp_backend_t *be, int max_batch, char *err);
void dp_net_fini(dp_net_t *net);

/* Copy the whole parameter vector from / to host memory. */
void dp_net_set_params(dp_net_t *net, const float *params);
void dp_net_get_params(dp_net_t *net, float *params);
void dp_net_get_grads(dp_net_t *net, float *grads);
/* Where training steps write the gradient from now on: buf (m->n_floats
 * of the host's memory, on a backend whose memory is the host's; the
 * worker's push buffer in shared memory, so that the push is made where
 * it is sent from), or the network's own buffer with NULL. */
void dp_net_grads_into(dp_net_t *net, float *buf);
/* The last training step's gradient wrt its batch of B samples (a model
 * with an embedding: d_dx) into host memory dx[B * input size]. */
void dp_net_get_input_grad(dp_net_t *net, float *dx, int B);

/* A round of local steps' push (host vectors of the model's floats): the
 * weights w0 it pulled minus the weights w it reached, and at state that is
 * not a gradient the value reached (what every push carries there). */
void dp_net_pseudo_gradient(const dp_net_t *net, const float *w0, const float *w, float *push);

/* One optimizer step of the whole vector (be->ops->optim_step), then the
 * rule for state that is not a gradient: those floats take the values the
 * step's gradient buffer carries (dp_model_copy_state), not the step. */
void dp_net_optim_step(dp_net_t *net, const dp_optim_conf_t *c, float lr, float *d_state,
                       long t);

/* Forward and backward on x[B, C, H, W] (host), labels y[B]; the gradient of
 * the batch's mean loss lands in d_grads. Returns the mean loss (NAN when
 * on_params failed: see pull_status). */
float dp_net_train_step(dp_net_t *net, const float *x, const int *y, int B);

/* The same on a batch already in device memory (the batcher's staged d_x,
 * d_y). When h_grads is not NULL the gradient is copied to it too (host
 * memory from host_alloc: the push buffer), each layer's part queued on the
 * backend's copy stream as soon as the backward pass has produced it, so the
 * copies of the upper layers overlap the backward pass of the lower ones.
 * Returns the mean loss once all of it, copies included, is done. */
float dp_net_train_step_device(dp_net_t *net, const float *d_x, const int *d_y, int B,
                               float *h_grads);

/* An actor-critic model (dp_model_is_ac): one training step on the
 * observations x[B, obs], the actions taken actions[B] and their n-step
 * returns ret[B]; the gradient of the batch's loss lands in d_grads, the
 * loss is returned. */
float dp_net_train_step_ac(dp_net_t *net, const float *x, const int *actions, const float *ret,
                           int B);
/* An actor-critic model's forward for acting (evaluation mode): the policy
 * probs[B, A] and, when value is not NULL, the critic's value[B] of the
 * observations x[B, obs]. */
void dp_net_act(dp_net_t *net, const float *x, int B, float *probs, float *value);

/* Forward only; returns the mean loss, and the number of correct argmax
 * predictions in *correct. */
float dp_net_evaluate(dp_net_t *net, const float *x, const int *y, int B, int *correct);

/* Accuracy and mean loss over the first limit samples of ds (0: all), in
 * batches of max_batch gathered into the host buffers x [max_batch sample
 * floats] and y [max_batch]. */
void dp_net_evaluate_dataset(dp_net_t *net, const dp_dataset_t *ds, int limit, float *x, int *y,
                             double *accuracy, double *loss);

#endif
