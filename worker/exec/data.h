/* data: which samples a worker trains on, and a thread that prepares the
 * next batch while the current one is computed.
 *
 * The order is a "global batch" order shared by every worker: each epoch e
 * draws one permutation of the training set from (seed, e); global step j
 * of the epoch covers positions [j*world*batch, (j+1)*world*batch), and
 * worker `rank` takes the rank-th slice of batch samples in it. So sync
 * training with R workers at batch b sees exactly the samples, in the same
 * order, that one worker at batch R*b sees: the basis of the equivalence
 * test. The tail of each epoch that fills no whole global batch is skipped.
 *
 * Augmentation (--augment, off by default): the thread crops each sample
 * at random from the image padded by DP_DATA_CROP_PAD zeros on each side
 * and flips it horizontally with probability 1/2 (torchvision's
 * RandomCrop(padding=4) + RandomHorizontalFlip), each draw a hash of (seed,
 * step, the sample's place in the global batch): so sync with R workers
 * still sees what one worker at R*b sees, and the lab's replay recomputes
 * every batch bit for bit. Normalisation is the data set's
 * (dp_dataset_set_normalize): the padding is the value a 0 pixel takes.
 *
 * The thread also stages each batch on the backend's device (stage_upload,
 * on a copy stream of its own), so the next batch crosses to the GPU while
 * the current one computes. */
#ifndef DP_DATA_H
#define DP_DATA_H

#include <pthread.h>
#include <stdint.h>

#include "common/dataset.h"
#include "kernels/backend.h"

typedef struct {
    const dp_dataset_t *ds;   /* not owned */
    dp_backend_t *be;         /* host buffers come from be->host_alloc (pinned on GPU) */
    int batch, rank, world;
    unsigned long long seed;
    int augment;              /* crop + flip each batch (dp_data_augment) */
    float *aug_tmp;           /* one sample, for the crop */
    long steps_per_epoch;     /* global batches per epoch */
    long first_step;          /* step of the first batch handed out */
    long total_steps;         /* batches this batcher hands out */
    int *perm;                /* current epoch's permutation, produced by the thread */
    long perm_epoch;          /* epoch perm belongs to, -1 none */
    float *x[2];              /* double buffer: batch pixels (host) */
    int *y[2];                /* double buffer: batch labels (host) */
    float *d_x[2];            /* the same batches, staged on the device */
    int *d_y[2];
    size_t x_bytes, y_bytes;  /* one batch */
    int full[2];              /* slot holds a batch not yet consumed */
    long slot_step[2];        /* step the slot's batch belongs to */
    long produced, consumed;  /* steps produced / handed out */
    int held;                 /* slot the consumer holds, -1 none */
    int stop;
    int started;
    int dealt;                /* no thread: dp_batcher_take gathers the batches shard 0 deals */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
} dp_batcher_t;

/* Global batches per epoch for this data, batch and world; 0 if the set
 * is too small for even one. */
long dp_data_steps_per_epoch(int n, int batch, int world);

/* The sample indices of worker rank's batch at step (0-based, counting
 * across epochs), into idx[batch]. The thread uses the same rule. */
void dp_data_batch_indices(int n, int batch, int rank, int world, unsigned long long seed,
                           long step, int *idx);

/* A batch shard 0 dealt an elastic crew (server/crew/deal.h): the positions
 * [index*batch, (index+1)*batch) of epoch's permutation (the one the
 * global-batch order draws), into idx[batch]. -1 with err when index is
 * not one of the n / batch batches of an epoch. */
int dp_data_dealt_indices(int n, int batch, unsigned long long seed, uint64_t epoch,
                          uint64_t index, int *idx, char *err);

#define DP_DATA_CROP_PAD 4

/* Augment x[B, c, h, w] (ds's shape, as gathered) in place: sample b is
 * cropped and flipped by the hash of (seed, step, sample0 + b). tmp holds
 * one sample's floats. */
void dp_data_augment(const dp_dataset_t *ds, float *x, int B, unsigned long long seed, long step,
                     unsigned long long sample0, float *tmp);

int dp_batcher_init(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                     int rank, int world, unsigned long long seed, long total_steps, char *err);
/* The same, starting at first_step (a worker resuming after the steps the
 * servers hold): hands out steps [first_step, total_steps), augmented when
 * augment is 1. */
int dp_batcher_init_at(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                       int rank, int world, unsigned long long seed, long first_step,
                       long total_steps, int augment, char *err);
/* An elastic crew's batcher: no thread, no order of its own; each batch is
 * gathered (augmented by step, and this worker's rank, as the thread does)
 * and staged when the pull that dealt it is in, by dp_batcher_take: the
 * deal comes with the weights, so there is nothing to prefetch. A batch
 * stays valid until the call after next (two slots, as the thread's). */
int dp_batcher_init_dealt(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                          int rank, unsigned long long seed, int augment, char *err);
typedef struct dp_batch dp_batch_t;
int dp_batcher_take(dp_batcher_t *bt, uint64_t epoch, uint64_t index, long step, dp_batch_t *b,
                    char *err);

/* One batch: x [batch*c*h*w] as gathered (and augmented), y [batch], in host memory and
 * staged in device memory (d_x, d_y: the backend's). */
struct dp_batch {
    const float *x, *d_x;
    const int *y, *d_y;
};

/* The next batch into *b; it stays valid until the next call, which hands
 * its buffers back to the thread: ops that read d_x / d_y must have finished
 * by then (dp_net_train_step_device returns after they have). Returns the
 * step number, or -1 when total_steps were handed out. */
long dp_batcher_next(dp_batcher_t *bt, dp_batch_t *b);
void dp_batcher_fini(dp_batcher_t *bt);

#endif
