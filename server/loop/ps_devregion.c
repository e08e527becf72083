/* ps_devregion: a shard's device region (see ps_devregion.h). */
#include "server/loop/ps_devregion.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/devregion.h"

struct dp_ps_devr {
    dp_shard_t *s;
    dp_devregion_shard_t r;
    float *scratch;                 /* n floats: a taken push, our copy */
    unsigned char *granted;         /* per worker: its last HELLO got the region */
    int n_workers;
    int on_device;                  /* the ring is on the shard's device: publish from d_w */
    uint64_t newest;                /* the newest version in the ring (with published > 0) */
    dp_devregion_offer_t offer;     /* the last grant's (its handles go out from here) */
    uint64_t published, taken;      /* versions into the ring, pushes taken (the stop line) */
};

int dp_ps_devr_new(dp_ps_devr_t **out, dp_shard_t *s, int n_workers, const dp_devmem_ops_t *ops,
                   int on_device, char *err)
{
    *out = NULL;
    dp_ps_devr_t *x = dp_calloc(1, sizeof *x);
    if (dp_devregion_create(&x->r, ops, s->n, DP_PS_DEVREGION_RING, n_workers, err) != 0) {
        free(x);
        return -1;
    }
    x->s = s;
    x->n_workers = n_workers;
    x->on_device = on_device && s->dev;
    x->scratch = dp_malloc(s->n * sizeof(float));
    x->granted = dp_calloc((size_t)n_workers, 1);
    dp_log_info("shard %d: device region on %s: a ring of %d versions of %zu floats, %d gradient "
                "slots, generation %016llx",
                s->index, ops->name, DP_PS_DEVREGION_RING, s->n, n_workers,
                (unsigned long long)x->r.generation);
    *out = x;
    return 0;
}

const dp_devmem_ops_t *dp_ps_devr_ops(const dp_ps_devr_t *x)
{
    return x->r.ops;
}

void dp_ps_devr_destroy(dp_ps_devr_t **x_p)
{
    if (!x_p || !*x_p) return;
    dp_ps_devr_t *x = *x_p;
    /* Retired first: a worker's next pin fails and it goes back to frames.
     * What a worker still maps stays until this process exits, except where
     * a free leaves the worker's mapping whole (the stand-in's memfd). */
    dp_log_info("shard %d: device region: %llu versions published, %llu pushes taken, %llu "
                "publishes busy (frames instead), %llu pushes refused",
                x->s->index, (unsigned long long)x->published, (unsigned long long)x->taken,
                (unsigned long long)x->r.busy, (unsigned long long)x->r.refused);
    int held = dp_devregion_release_last(&x->r);
    if (held)
        dp_log_info("shard %d: device region retired; %d worker(s) still map it", x->s->index,
                    held);
    free(x->scratch);
    free(x->granted);
    free(x);
    *x_p = NULL;
}

int dp_ps_devr_grant(dp_ps_devr_t *x, int worker, Downpour__DevRegionOffer *o, char *err)
{
    if (worker < 0 || worker >= x->n_workers) return dp_err(err, "worker id %d out of range", worker);
    dp_devregion_offer_t *f = &x->offer;
    if (dp_devregion_offer(&x->r, worker, f, err) != 0) return -1;
    dp_devregion_drop(&x->r, worker); /* a push its last process counted but never sent */
    *o = (Downpour__DevRegionOffer)DOWNPOUR__DEV_REGION_OFFER__INIT;
    o->generation = f->generation;
    o->n = f->n;
    o->ring = (uint32_t)f->ring;
    o->workers = (uint32_t)f->workers;
    o->slot = f->slot;
    o->ctl = f->ctl;
    o->wctl = f->wctl;
    o->weights = (ProtobufCBinaryData){sizeof f->weights.b, f->weights.b};
    o->grad = (ProtobufCBinaryData){sizeof f->grad.b, f->grad.b};
    o->event = (ProtobufCBinaryData){sizeof f->event.b, f->event.b};
    o->device = f->device;
    x->granted[worker] = 1;
    return 0;
}

void dp_ps_devr_revoke(dp_ps_devr_t *x, int worker)
{
    if (x && worker >= 0 && worker < x->n_workers) x->granted[worker] = 0;
}

int dp_ps_devr_publish(dp_ps_devr_t *x, const dp_snap_t *snap)
{
    if (x->published && x->newest == snap->version) return 1; /* published counts them */
    float *e = dp_devregion_publish_begin(&x->r, snap->version);
    if (!e) return 0;
    /* A ring on the shard's device: its live weights copied there, device
     * to device, when they are the snapshot's version (between steps they
     * are: a step on the device ends with its snapshot whole, and the copy
     * is queued after every step, done when it returns). Else the
     * snapshot copied in, from the host. */
    char err[DP_ERR_LEN];
    dp_shard_t *s = x->s;
    size_t bytes = s->n * sizeof(float);
    int rc = 0;
    if (x->on_device && snap == s->snap && snap->version == s->version)
        s->dev->ops->copy_out(s->dev, e, s->d_w, bytes);
    else
        rc = x->r.ops->copy(e, snap->data, bytes, err);
    dp_devregion_publish_end(&x->r);
    if (rc != 0) {
        dp_log_warn("shard %d: device region: %s", x->s->index, err);
        return 0;
    }
    x->published++;
    x->newest = snap->version;
    return 1;
}

/* dp_devregion_take's apply: the shard's own path applies it (s_push_apply,
 * with all its checks), so taking is all there is to do here. */
static int s_taken(void *ctx, const float *grad, size_t n, char *err)
{
    (void)grad, (void)n, (void)err;
    *(int *)ctx = 1;
    return 0;
}

int dp_ps_devr_take(dp_ps_devr_t *x, int worker, dp_grad_slice_t *g, char *err)
{
    if (!x || worker < 0 || worker >= x->n_workers || !x->granted[worker])
        return dp_err(err, "malformed: PUSH through the device region, but worker %d has no "
                           "region here (say HELLO with devregion)",
                      worker);
    int taken = 0;
    int rc = dp_devregion_take(&x->r, worker, x->scratch, s_taken, &taken, err);
    if (rc == 0)
        return dp_err(err, "malformed: PUSH through the device region, but slot %d holds no "
                           "completed push (its count was not bumped)",
                      worker);
    if (rc < 0 || !taken) return -1;
    *g = (dp_grad_slice_t){x->scratch, x->s->n * sizeof(float), x->s->lo};
    x->taken++;
    return 0;
}
