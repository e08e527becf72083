/* shard_early: the early step of a push in parts (see shard_early.h). */
#include "server/core/shard_early.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void dp_shard_early_init(dp_shard_early_t *e, dp_shard_t *shard, const dp_shard_parts_t *parts,
                         const dp_policy_t *policy, bool enabled)
{
    *e = (dp_shard_early_t){.shard = shard, .parts = parts, .policy = policy, .enabled = enabled};
}

/* The one in progress given up: nothing of it was ever visible; its
 * buffer is the shard's spare. */
static dp_early_result_t s_drop(dp_shard_early_t *e)
{
    if (!e->active) return DP_EARLY_NONE;
    dp_shard_keep_spare(e->shard, e->buf);
    e->shard->counts.early_dropped++;
    e->active = false;
    e->buf = NULL;
    return DP_EARLY_DROPPED;
}

void dp_shard_early_fini(dp_shard_early_t *e)
{
    if (e->shard) s_drop(e);
    dp_optim_dev_t *dev = e->shard ? e->shard->dev : NULL;
    if (dev) { /* the device's: before the shard's device goes */
        dev->ops->release(dev, e->state);
        dev->ops->release(dev, e->d_w);
    } else {
        free(e->state);
    }
    e->state = e->d_w = NULL;
}

bool dp_shard_early_of(const dp_shard_early_t *e, int wid, uint64_t step)
{
    return e->active && e->owner == wid && e->step == step;
}

/* Floats [lo, hi) of the range (local; the assembly's floats there final
 * and checked) stepped into the next version. */
static void s_step(dp_shard_early_t *e, size_t lo, size_t hi)
{
    if (lo >= hi || hi > e->shard->n) return;
    float *next = e->shard->dev ? e->d_w : e->buf->data;
    dp_shard_step_ahead(e->shard, next, e->state, e->g, e->count, e->lr, e->version, lo, hi);
    e->done += hi - lo;
}

/* An early step for wid's assembly, when none is in progress and the
 * policy can say now how the whole push would be stepped: the parts in so
 * far are stepped at once, the rest as they come. */
static dp_early_result_t s_try(dp_shard_early_t *e, int wid)
{
    const dp_parts_worker_t *w = &e->parts->w[wid];
    dp_shard_t *s = e->shard;
    float lr;
    int count;
    if (!e->enabled || !w->active || e->active ||
        dp_policy_early(e->policy, wid, w->version, &lr, &count) != 0)
        return DP_EARLY_NONE;
    /* async: not while another worker streams too, whose push may well
     * step the shard first and so waste the early work (measured, 4
     * workers on 2 cores, 240 steps: 44 early steps dropped without this
     * rule, 18 with it; early_dropped in the metrics) */
    for (int i = 0; count == 0 && i < e->parts->n_workers; i++)
        if (i != wid && e->parts->w[i].active) return DP_EARLY_NONE;
    size_t n_state = s->n * (size_t)s->state_per;
    if (s->dev && !e->d_w) e->d_w = s->dev->ops->alloc(s->dev, s->n * sizeof(float));
    if (!e->state && s->state_per)
        e->state = s->dev ? s->dev->ops->alloc(s->dev, n_state * sizeof(float))
                          : dp_aligned_alloc((n_state + 1) * sizeof(float));
    e->active = true;
    e->owner = wid;
    e->step = w->step;
    e->version = s->version;
    e->g = w->buf;
    e->lr = lr;
    e->count = count;
    e->done = 0;
    e->buf = dp_shard_take_buffer(s);
    for (uint32_t j = 0; j < w->got; j++) s_step(e, w->lo[j] - s->lo, w->hi[j] - s->lo);
    return DP_EARLY_BEGUN;
}

/* The early step of wid's push of step, if one is in progress, given up. */
static dp_early_result_t s_give_up(dp_shard_early_t *e, int wid, uint64_t step)
{
    return dp_shard_early_of(e, wid, step) ? s_drop(e) : DP_EARLY_NONE;
}

/* A push (or part) of a newer step of wid: the worker gave up the push its
 * early step was for, which can then never commit; dropped, so that it
 * does not hold off the next early step until the shard steps. */
static dp_early_result_t s_moved_on(dp_shard_early_t *e, int wid, uint64_t step)
{
    return e->active && e->owner == wid && step > e->step ? s_drop(e) : DP_EARLY_NONE;
}

dp_early_result_t dp_shard_early_part(dp_shard_early_t *e, int wid, uint64_t step,
                                      dp_parts_result_t res)
{
    s_moved_on(e, wid, step);
    if (res == DP_PARTS_REJECTED) return s_give_up(e, wid, step);
    /* not yet its push's: begun now (a push complete already is stepped
     * whole: the same work) */
    if (!dp_shard_early_of(e, wid, step)) return s_try(e, wid);
    const dp_parts_worker_t *w = &e->parts->w[wid];
    size_t lo = e->shard->lo;
    s_step(e, w->lo[w->got - 1] - lo, w->hi[w->got - 1] - lo);
    return DP_EARLY_STEPPED;
}

dp_early_result_t dp_shard_early_whole(dp_shard_early_t *e, int wid, uint64_t step)
{
    return s_moved_on(e, wid, step);
}

dp_early_result_t dp_shard_early_pushed(dp_shard_early_t *e, int wid, uint64_t step)
{
    dp_early_result_t r = s_give_up(e, wid, step); /* e.g. a threshold skip */
    for (int i = 0; i < e->parts->n_workers && !e->active; i++) s_try(e, i);
    return r;
}

dp_early_result_t dp_shard_early_hello(dp_shard_early_t *e, int wid)
{
    return e->active && e->owner == wid ? s_drop(e) : DP_EARLY_NONE;
}

dp_early_result_t dp_shard_early_commit(dp_shard_early_t *e, float lr, int count)
{
    if (!e || !e->active) return DP_EARLY_NONE;
    dp_shard_t *s = e->shard;
    if (e->done != s->n || e->version != s->version || memcmp(&e->lr, &lr, sizeof lr) != 0 ||
        e->count != count)
        return DP_EARLY_NONE;
    e->active = false;
    dp_shard_adopt(s, e->buf, &e->state, s->dev ? &e->d_w : NULL, count > 0);
    e->buf = NULL;
    s->counts.steps_early++;
    return DP_EARLY_COMMITTED;
}

dp_early_result_t dp_shard_early_overtaken(dp_shard_early_t *e)
{
    return e ? s_drop(e) : DP_EARLY_NONE;
}
