/* devside: the overlapped loop's double buffers on the device, so that a
 * device worker's pulls and pushes go device to device while its
 * communication thread runs beside the compute (worker/train/distributed.c,
 * --overlap; worker/client/pipeline.h).
 *
 * The thread pulls version v+1 while the forward reads v: it lands the
 * next weights in d_next, never in the network's d_params (a shard's ring
 * entry by the backend's copy_side, device to device, done before the
 * client unpins it; a tensor over shared memory or frames the same way
 * from the host). At the step boundary the loop takes them
 * (dp_devside_take: d_next into d_params on the compute stream, then
 * synchronize), and only then posts the next pull, which is what lets the
 * thread write d_next again: the ordering is the posting's, by
 * construction. A push goes from a copy of the step's gradient
 * (dp_devside_grads: d_grads into d_push[step & 1], synchronized), since
 * the next backward rewrites d_grads while the thread pushes; the copy of
 * step k is written again at step k + 2, after the push of step k has been
 * taken (the loop takes every push before the pull it posted after it). */
#ifndef DP_DEVSIDE_H
#define DP_DEVSIDE_H

#include <stddef.h>

#include "kernels/backend.h"
#include "worker/client/ps_client.h"

typedef struct {
    dp_backend_t *be;
    float *d_params;        /* the network's weights: the forward's */
    const float *d_grads;   /* the network's gradient: the backward's */
    size_t n;
    float *d_next;          /* the thread's landing for the next weights */
    float *d_push[2];       /* the pushes' copies of the gradient, step k's at k & 1 */
    dp_ps_device_t dev;     /* the client's copies, on the thread: side stream only */
} dp_devside_t;

/* The buffers on be, and the client's copies for the thread (dev). */
void dp_devside_init(dp_devside_t *x, dp_backend_t *be, float *d_params, const float *d_grads,
                     size_t n);
void dp_devside_fini(dp_devside_t *x);
/* The thread's sink for tensors that come through the host (a shard
 * without a region): into d_next, on the side stream (dp_pipe_job_t.sink). */
void dp_devside_sink(void *arg, size_t off, const float *data, size_t n);
/* The step boundary, on the loop's thread, no pull in flight: the weights
 * the last pull landed into the network's (done when it returns). */
void dp_devside_take(dp_devside_t *x);
/* The step's gradient copied for its push (done when it returns): the
 * buffer to push from (dp_pipe_job_t.d_grads). */
const float *dp_devside_grads(dp_devside_t *x, long step);

#endif
