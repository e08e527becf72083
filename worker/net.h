/* net: the network executor. Runs a dp_model_t's layers forward and
 * backward through a backend, on one device, for batches up to max_batch.
 *
 * Memory is allocated once in dp_net_init: one buffer for the parameters,
 * one for their gradients (both laid out as the model's flat vector, so a
 * pull or a push is one copy), one activation and one activation-gradient
 * buffer per layer boundary. Nothing is allocated per step.
 *
 * Layer boundary i holds act[i], the input of layer i (act[0] is the
 * batch); the softmax layer's output act[n] holds the probabilities. */
#ifndef DP_NET_H
#define DP_NET_H

#include "common/dataset.h"
#include "common/model.h"
#include "kernels/backend.h"

typedef struct {
    const dp_model_t *m;                  /* not owned */
    dp_backend_t *be;                     /* not owned */
    int max_batch;
    float *d_params;                      /* m->n_floats */
    float *d_grads;                       /* m->n_floats, written by train_step */
    float *d_act[DP_MAX_LAYERS + 1];      /* [max_batch * size of boundary i] */
    float *d_dact[DP_MAX_LAYERS + 1];     /* gradient of the loss wrt act[i]; [0] unused */
    int *d_labels;                        /* [max_batch] */
    float *d_loss;                        /* the batch's mean loss (one float) */
    float *h_probs;                       /* [max_batch * classes], host copy for accuracy */
} dp_net_t;

int dp_net_init(dp_net_t *net, const dp_model_t *m, dp_backend_t *be, int max_batch, char *err);
void dp_net_fini(dp_net_t *net);

/* Copy the whole parameter vector from / to host memory. */
void dp_net_set_params(dp_net_t *net, const float *params);
void dp_net_get_params(dp_net_t *net, float *params);
void dp_net_get_grads(dp_net_t *net, float *grads);

/* Forward and backward on x[B, C, H, W] (host), labels y[B]; the gradient of
 * the batch's mean loss lands in d_grads. Returns the mean loss. */
float dp_net_train_step(dp_net_t *net, const float *x, const int *y, int B);

/* The same on a batch already in device memory (the batcher's staged d_x,
 * d_y). When h_grads is not NULL the gradient is copied to it too (host
 * memory from host_alloc: the push buffer), each layer's part queued on the
 * backend's copy stream as soon as the backward pass has produced it, so the
 * copies of the upper layers overlap the backward pass of the lower ones.
 * Returns the mean loss once all of it, copies included, is done. */
float dp_net_train_step_device(dp_net_t *net, const float *d_x, const int *d_y, int B,
                               float *h_grads);

/* Forward only; returns the mean loss, and the number of correct argmax
 * predictions in *correct. */
float dp_net_evaluate(dp_net_t *net, const float *x, const int *y, int B, int *correct);

/* Accuracy and mean loss over the first limit samples of ds (0: all), in
 * batches of max_batch gathered into the host buffers x [max_batch sample
 * floats] and y [max_batch]. */
void dp_net_evaluate_dataset(dp_net_t *net, const dp_dataset_t *ds, int limit, float *x, int *y,
                             double *accuracy, double *loss);

#endif
