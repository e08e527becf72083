/* shard_dc: a shard's delay compensation state and step (see shard_dc.h). */
#include "server/core/shard_dc.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/core/pool.h"

void dp_shard_dc_init(dp_shard_t *s, int n_workers)
{
    dp_shard_dc_fini(s);
    if (s->optim.dc == DP_DC_OFF || n_workers < 1) return;
    dp_shard_dc_t *dc = dp_calloc(1, sizeof *dc);
    dc->n_workers = n_workers;
    dc->slot = dp_calloc((size_t)n_workers * DP_DC_SLOTS, sizeof *dc->slot);
    if (s->optim.dc == DP_DC_ADAPTIVE) {
        dc->ms = dp_aligned_alloc((s->n + 1) * sizeof(float));
        memset(dc->ms, 0, s->n * sizeof(float));
        if (s->dev) dc->d_ms = s->dev->ops->alloc(s->dev, s->n * sizeof(float)); /* zeroed */
    }
    s->dc = dc;
}

/* n floats for a slot: the device's on a device shard. */
static float *s_slot_alloc(const dp_shard_t *s)
{
    if (s->dev) return s->dev->ops->alloc(s->dev, s->n * sizeof(float));
    return dp_aligned_alloc((s->n + 1) * sizeof(float));
}

static void s_slot_free(const dp_shard_t *s, float *w)
{
    if (s->dev) s->dev->ops->release(s->dev, w);
    else free(w);
}

void dp_shard_dc_fini(dp_shard_t *s)
{
    dp_shard_dc_t *dc = s->dc;
    if (!dc) return;
    for (int i = 0; i < dc->n_workers * DP_DC_SLOTS; i++) s_slot_free(s, dc->slot[i].w);
    if (s->dev) s->dev->ops->release(s->dev, dc->d_ms);
    free(dc->slot);
    free(dc->ms);
    free(dc);
    s->dc = NULL;
}

void dp_shard_dc_to_device(dp_shard_t *s)
{
    dp_shard_dc_t *dc = s->dc;
    if (!dc || !s->dev) return;
    const dp_optim_dev_ops_t *o = s->dev->ops;
    for (int i = 0; i < dc->n_workers * DP_DC_SLOTS; i++) {
        float *w = dc->slot[i].w;
        if (!w) continue;
        dc->slot[i].w = s_slot_alloc(s);
        o->upload(s->dev, dc->slot[i].w, w, s->n * sizeof(float));
        free(w);
    }
    if (dc->ms) dc->d_ms = o->alloc(s->dev, s->n * sizeof(float)); /* dp_shard_device_reload fills it */
}

static dp_dc_slot_t *s_slots(const dp_shard_t *s, int worker)
{
    if (!s->dc || worker < 0 || worker >= s->dc->n_workers) return NULL;
    return s->dc->slot + (size_t)worker * DP_DC_SLOTS;
}

/* The worker's slot for a new pull: one that already holds the version (the
 * same weights: no copy needed, *fresh 0), else a free one, else the one
 * holding the oldest version. */
static dp_dc_slot_t *s_slot_for(const dp_shard_t *s, dp_dc_slot_t *sl, uint64_t version, int *fresh)
{
    *fresh = 1;
    for (int i = 0; i < DP_DC_SLOTS; i++)
        if (sl[i].w && sl[i].version == version) {
            *fresh = 0;
            return &sl[i];
        }
    dp_dc_slot_t *pick = NULL;
    for (int i = 0; i < DP_DC_SLOTS && !pick; i++)
        if (!sl[i].held) pick = &sl[i];
    if (!pick) { /* every slot holds an unused pull: the oldest goes */
        pick = &sl[0];
        for (int i = 1; i < DP_DC_SLOTS; i++)
            if (sl[i].version < pick->version) pick = &sl[i];
    }
    if (!pick->w) pick->w = s_slot_alloc(s);
    return pick;
}

/* The worker's slot holds w at version: w is the device's live d_w (on_dev)
 * or host memory, copied up on a device shard. */
static void s_hold(dp_shard_t *s, int worker, uint64_t version, const float *w, int on_dev)
{
    dp_dc_slot_t *sl = s_slots(s, worker);
    if (!sl) return;
    int fresh;
    dp_dc_slot_t *d = s_slot_for(s, sl, version, &fresh);
    size_t bytes = s->n * sizeof(float);
    if (fresh && !s->dev) memcpy(d->w, w, bytes);
    else if (fresh && on_dev) s->dev->ops->copy_out(s->dev, d->w, w, bytes);
    else if (fresh) s->dev->ops->upload(s->dev, d->w, w, bytes);
    d->version = version;
    d->held = 1;
}

void dp_shard_dc_pulled(dp_shard_t *s, int worker)
{
    if (s->dev) s_hold(s, worker, s->version, s->d_w, 1);
    else s_hold(s, worker, s->version, s->w, 0);
}

void dp_shard_dc_hold(dp_shard_t *s, int worker, uint64_t version, const float *w)
{
    dp_shard_dc_forget(s, worker); /* the record's slot, not one made earlier */
    s_hold(s, worker, version, w, 0);
}

void dp_shard_dc_forget(dp_shard_t *s, int worker)
{
    dp_dc_slot_t *sl = s_slots(s, worker);
    for (int i = 0; sl && i < DP_DC_SLOTS; i++) {
        sl[i].held = 0;
        sl[i].version = UINT64_MAX; /* matches no stamp a push may carry */
    }
}

typedef struct {
    dp_shard_t *s;
    const float *g, *w_bak;
} s_dc_job_t;

/* Part k of nk, cut as the optimizer's sweep is. */
static void s_dc_part(void *arg, int k, int nk)
{
    const s_dc_job_t *j = arg;
    dp_shard_t *s = j->s;
    size_t lo, hi;
    if (!dp_shard_part(s, k, nk, &lo, &hi)) return;
    /* State floats (a table's non-gradients) carry values, not gradients:
     * compensated nothing, passed through; the rest between them as usual. */
    size_t at = lo;
    for (int r = 0; r <= s->n_state_ranges && at < hi; r++) {
        size_t a = r < s->n_state_ranges ? s->state_ranges[r][0] : hi;
        size_t b = r < s->n_state_ranges ? s->state_ranges[r][1] : hi;
        if (a > hi) a = hi;
        if (b > hi) b = hi;
        if (b <= at) continue;
        if (a > at) dp_optim_dc_range(&s->optim, s->scratch, j->g, s->w, j->w_bak, s->dc->ms, at, a);
        if (a < at) a = at;
        if (b > a && s->scratch + a != j->g + a)
            memmove(s->scratch + a, j->g + a, (b - a) * sizeof(float));
        at = b;
    }
}

/* s_dc_part's rule on the device: src copied up into d_g and compensated
 * there in place, between the state floats (passed through as they are),
 * against w_bak (the device's; NULL: MS only). The step by src then takes
 * d_g as it is (d_g_of). */
static void s_apply_device(dp_shard_t *s, const float *src, const float *w_bak)
{
    const dp_optim_dev_ops_t *o = s->dev->ops;
    o->upload(s->dev, s->d_g, src, s->n * sizeof(float));
    size_t at = 0;
    for (int r = 0; r <= s->n_state_ranges; r++) {
        size_t a = r < s->n_state_ranges ? s->state_ranges[r][0] : s->n;
        size_t b = r < s->n_state_ranges ? s->state_ranges[r][1] : s->n;
        if (a > at) o->dc(s->dev, &s->optim, s->d_g, s->d_g, s->d_w, w_bak, s->dc->d_ms, at, a);
        if (b > at) at = b;
    }
    s->d_g_of = src;
}

int dp_shard_dc_apply(dp_shard_t *s, int worker, uint64_t version, const dp_grad_slice_t *g, int n,
                      dp_grad_slice_t *one)
{
    dp_shard_dc_t *dc = s->dc;
    dp_dc_slot_t *sl = s_slots(s, worker), *match = NULL;
    for (int i = 0; sl && i < DP_DC_SLOTS; i++)
        if (sl[i].w && sl[i].version == version) match = &sl[i];
    if (!match) dc->fallback++;
    if (!match && !dc->ms) return 0; /* const: nothing to do */
    /* Read from the slice itself when it is the whole range and aligned,
     * else from its copy in scratch (elementwise, so out = g is fine). */
    const float *src = g[0].data;
    if (n != 1 || ((uintptr_t)g[0].data & 3) != 0) {
        for (int f = 0; f < n; f++)
            memmove(s->scratch + (g[f].offset - s->lo), g[f].data, g[f].len);
        src = s->scratch;
    }
    if (s->dev) {
        s_apply_device(s, src, match ? match->w : NULL);
    } else {
        s_dc_job_t j = {s, src, match ? match->w : NULL};
        if (s->pool) dp_pool_run(s->pool, s_dc_part, &j);
        else s_dc_part(&j, 0, 1);
    }
    if (!match) return 0;
    match->held = 0;
    dc->compensated++;
    /* on the device the compensated gradient is d_g, which a step by src takes */
    *one = (dp_grad_slice_t){s->dev ? src : s->scratch, s->n * sizeof(float), s->lo};
    return 1;
}

int dp_shard_dc_host(dp_shard_t *s, const dp_grad_slice_t *g, int n, dp_grad_slice_t *one)
{
    if (!s->dev || !s->d_g_of || n != 1 || g[0].data != (const void *)s->d_g_of) return 0;
    s->dev->ops->download(s->dev, s->scratch, s->d_g, s->n * sizeof(float));
    s->d_g_of = s->scratch;
    *one = (dp_grad_slice_t){s->scratch, s->n * sizeof(float), s->lo};
    return 1;
}
