/* ps_devregion: the worker's side of a shard's device region
 * (proto/devregion.h, server/loop/ps_devregion.h) — mapped from the
 * WELCOME's offer, re-mapped when a restarted shard offers a new
 * generation; a pull pins the newest version and copies it out; a push
 * writes our slot and bumps its count. Anything the region refuses (retired,
 * a version other than the reply's, the slot not yet ours) sends the
 * request the way it went before: shared memory or frames.
 *
 * The provider: the stand-in under the test hook, else a GPU worker's CUDA
 * IPC (opts.devmem); a CPU worker has none and never asks. A region on a
 * device ours cannot reach (another GPU, no peer access: dp_devregion_reach)
 * is declined at the WELCOME, and the shard's shared memory carries the
 * tensors. Where the caller set the device's copies (dp_ps_client_set_device,
 * a device worker), a pull copies the pinned entry into the network device
 * to device and a push copies the network's gradient into the slot the
 * same way; else the client hands out host floats: a pull copies the entry
 * to the host buffer (device to host on CUDA: cudaMemcpyDefault), a push
 * the host slice into the slot (host to device). */
#include <string.h>

#include "common/util.h"
#include "worker/client/ps_exchange.h"

int dp_ps_client_devregion_shards(const dp_ps_client_t *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++) k += c->sh[i].devr;
    return k;
}

const dp_devmem_ops_t *dp_ps_devmem(const dp_ps_client_t *c)
{
    const dp_devmem_ops_t *t = dp_devmem_test_provider();
    return t ? t : dp_devmem_test_off() ? NULL : c->devmem;
}

void dp_ps_devr_close(dp_ps_shard_t *s)
{
    dp_devregion_detach(&s->devr_w);
    s->devr = false;
}

/* The offer off the wire as proto/devregion.h takes it: texts and handles
 * bounded here, the layout by dp_devregion_attach against the page. */
static int s_offer(const Downpour__DevRegionOffer *m, dp_devregion_offer_t *o, char *err)
{
    memset(o, 0, sizeof *o);
    if (!m->ctl || !m->wctl || strlen(m->ctl) >= sizeof o->ctl || strlen(m->wctl) >= sizeof o->wctl)
        return dp_err(err, "device region offer: control page names missing or too long");
    if (m->weights.len > DP_DEVMEM_HANDLE || m->grad.len > DP_DEVMEM_HANDLE ||
        m->event.len > DP_DEVMEM_HANDLE)
        return dp_err(err, "device region offer: a handle over %d bytes", DP_DEVMEM_HANDLE);
    o->generation = m->generation;
    o->n = m->n;
    o->ring = m->ring;
    o->workers = m->workers;
    o->slot = m->slot;
    snprintf(o->ctl, sizeof o->ctl, "%s", m->ctl);
    snprintf(o->wctl, sizeof o->wctl, "%s", m->wctl);
    if (m->device && strlen(m->device) >= sizeof o->device)
        return dp_err(err, "device region offer: a device name over %zu bytes",
                      sizeof o->device - 1);
    snprintf(o->device, sizeof o->device, "%s", m->device ? m->device : "");
    if (m->weights.len) memcpy(o->weights.b, m->weights.data, m->weights.len);
    if (m->grad.len) memcpy(o->grad.b, m->grad.data, m->grad.len);
    if (m->event.len) memcpy(o->event.b, m->event.data, m->event.len);
    return 0;
}

/* The calling thread put on the worker's device before device work: the
 * overlapped loop's communication thread never selected it, and CUDA's
 * route (cudaGetDevice), mappings and events take the thread's device. */
static void s_enter(const dp_ps_device_t *dev)
{
    if (dev && dev->enter) dev->enter(dev->arg);
}

void dp_ps_devr_welcome(dp_ps_client_t *c, int i, const Downpour__Welcome *w)
{
    dp_ps_shard_t *s = &c->sh[i];
    const dp_devmem_ops_t *ops = dp_ps_devmem(c);
    if (!w->devregion || !ops) {
        dp_ps_devr_close(s);
        return;
    }
    s_enter(c->dev); /* the route and the mapping on the worker's device */
    char err[DP_ERR_LEN];
    dp_devregion_offer_t o;
    int rc = s_offer(w->devregion, &o, err);
    if (rc == 0 && o.n != s->hi - s->lo)
        rc = dp_err(err, "device region offer of %llu floats for a range of %llu",
                    (unsigned long long)o.n, (unsigned long long)(s->hi - s->lo));
    if (rc == 0 && o.slot != (uint32_t)c->worker_id)
        rc = dp_err(err, "device region offer of slot %u to worker %d", o.slot, c->worker_id);
    dp_devregion_route_t route = DP_DEVREGION_LOCAL;
    if (rc == 0 && (route = dp_devregion_reach(ops, o.device, err)) == DP_DEVREGION_HOST) {
        dp_ps_devr_close(s);
        dp_log_info("%s: %s: weights and gradients through its shared memory", s->endpoint, err);
        return;
    }
    int mapped = 0;
    if (rc == 0) {
        if (!s->devr_w.ops) s->devr_w.ops = ops;
        mapped = dp_devregion_remap(&s->devr_w, &o, err); /* same generation: kept (0) */
        rc = mapped < 0 ? -1 : 0;
    }
    if (rc != 0) {
        dp_ps_devr_close(s);
        dp_log_info("%s: no device region: %s", s->endpoint, err);
        return;
    }
    if (mapped == 1)
        dp_log_info("%s: weights and gradients through the device region (%s, slot %u, "
                    "generation %016llx%s%s)",
                    s->endpoint, ops->name, o.slot, (unsigned long long)o.generation,
                    route == DP_DEVREGION_PEER ? ", by peer access to " : "",
                    route == DP_DEVREGION_PEER ? o.device : "");
    s->devr = true;
}

/* The ring's newest entry, pinned, when it is the version the reply named;
 * NULL (nothing pinned) otherwise: the pull then goes through the host. */
static const float *s_pin_version(dp_ps_shard_t *s, uint64_t version)
{
    char err[DP_ERR_LEN];
    uint64_t v = 0;
    const float *e = dp_devregion_pin(&s->devr_w, &v, err);
    if (!e) {
        dp_log_debug("%s: pull through the device region: %s", s->endpoint, err);
        return NULL;
    }
    if (v == version) return e;
    dp_log_debug("%s: pull through the device region: the ring's newest is version %llu, "
                 "the reply's %llu", s->endpoint, (unsigned long long)v,
                 (unsigned long long)version);
    dp_devregion_unpin(&s->devr_w);
    return NULL;
}

int dp_ps_devr_read(dp_ps_shard_t *s, uint64_t version, float *dst)
{
    char err[DP_ERR_LEN];
    const float *e = s_pin_version(s, version);
    if (!e) return -1;
    int rc = s->devr_w.ops->copy(dst, e, (size_t)(s->hi - s->lo) * sizeof(float), err);
    dp_devregion_unpin(&s->devr_w);
    return rc;
}

int dp_ps_devr_read_device(dp_ps_shard_t *s, uint64_t version, const dp_ps_device_t *dev)
{
    char err[DP_ERR_LEN];
    s_enter(dev);
    const float *e = s_pin_version(s, version);
    if (!e) return -1;
    int rc = dev->weights_in(dev->arg, (size_t)s->lo, e, (size_t)(s->hi - s->lo), err);
    if (rc != 0) dp_log_warn("%s: pull through the device region: %s", s->endpoint, err);
    /* Only now: weights_in returns once its copy is done on the device
     * (queued, then synchronized), so the shard, which never writes a
     * pinned entry, cannot have written this one under it. */
    dp_devregion_unpin(&s->devr_w);
    return rc;
}

int dp_ps_devr_write(dp_ps_shard_t *s, const float *slice, const float *from, size_t n,
                     const dp_ps_device_t *dev)
{
    char err[DP_ERR_LEN];
    s_enter(dev); /* the copy's, the event's record and wait */
    float *slot = dp_devregion_slot(&s->devr_w);
    if (!slot || n != s->devr_w.n) return -1;
    /* done when it returns (grads_out synchronizes its copy), so the record
     * and the count that follow cover written floats */
    int rc = slice ? s->devr_w.ops->copy(slot, slice, n * sizeof(float), err)
                   : dev->grads_out(dev->arg, slot, from, (size_t)s->lo, n, 1, err);
    if (rc != 0 || dp_devregion_push(&s->devr_w, NULL, err) != 0) {
        dp_log_debug("%s: push through the device region: %s", s->endpoint, err);
        return -1;
    }
    return 0;
}

void dp_ps_client_set_device(dp_ps_client_t *c, const dp_ps_device_t *dev)
{
    c->dev = dev;
}

int dp_ps_client_push_on_device(const dp_ps_client_t *c)
{
    if (!c->dev || c->compress.kind != DP_COMPRESS_NONE) return 0;
    for (int i = 0; i < c->n; i++)
        if (!c->sh[i].devr) return 0;
    return 1;
}

void dp_ps_client_device_counts(const dp_ps_client_t *c, uint64_t *pulls, uint64_t *pushes)
{
    *pulls = c->dev_pulls;
    *pushes = c->dev_pushes;
}
