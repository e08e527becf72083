/* devside: the overlapped loop's double buffers on the device (see
 * devside.h). */
#include "worker/train/devside.h"

#include <string.h>

/* The communication thread's copies: each on the backend's side stream,
 * done when it returns (the client unpins the ring entry, or counts the
 * slot's push, right after), never on the compute stream, whose ops the
 * loop's thread queues meanwhile. */
static int s_weights_in(void *arg, size_t off, const float *src, size_t n, char *err)
{
    (void)err;
    dp_devside_t *x = arg;
    x->be->ops->copy_side(x->be, x->d_next + off, src, n * sizeof(float));
    return 0;
}

static int s_grads_out(void *arg, float *dst, const float *from, size_t off, size_t n, int device,
                       char *err)
{
    (void)err, (void)device; /* into a slot or to the host: copy_side takes either */
    dp_devside_t *x = arg;
    const float *src = (from ? from : x->d_grads) + off;
    x->be->ops->copy_side(x->be, dst, src, n * sizeof(float));
    return 0;
}

static void s_enter(void *arg)
{
    dp_devside_t *x = arg;
    x->be->ops->enter(x->be);
}

void dp_devside_sink(void *arg, size_t off, const float *data, size_t n)
{
    dp_devside_t *x = arg;
    x->be->ops->copy_side(x->be, x->d_next + off, data, n * sizeof(float));
}

void dp_devside_init(dp_devside_t *x, dp_backend_t *be, float *d_params, const float *d_grads,
                     size_t n)
{
    *x = (dp_devside_t){.be = be, .d_params = d_params, .d_grads = d_grads, .n = n};
    x->d_next = be->ops->alloc(be, n * sizeof(float));
    for (int k = 0; k < 2; k++) x->d_push[k] = be->ops->alloc(be, n * sizeof(float));
    x->dev = (dp_ps_device_t){.weights_in = s_weights_in, .grads_out = s_grads_out,
                              .enter = s_enter, .arg = x};
}

void dp_devside_fini(dp_devside_t *x)
{
    if (!x->be) return;
    x->be->ops->release(x->be, x->d_next);
    for (int k = 0; k < 2; k++) x->be->ops->release(x->be, x->d_push[k]);
    memset(x, 0, sizeof *x);
}

/* After the last step's ops in the compute stream's order, before the next
 * forward's; synchronized, so the thread may write d_next again once the
 * next pull is posted (cpu:staged makes the copy only at the synchronize:
 * a forward let run before it would read the old weights). */
void dp_devside_take(dp_devside_t *x)
{
    x->be->ops->copy_peer(x->be, x->d_params, x->d_next, x->n * sizeof(float));
    x->be->ops->synchronize(x->be);
}

const float *dp_devside_grads(dp_devside_t *x, long step)
{
    float *g = x->d_push[step & 1];
    x->be->ops->copy_peer(x->be, g, x->d_grads, x->n * sizeof(float));
    x->be->ops->synchronize(x->be);
    return g;
}
