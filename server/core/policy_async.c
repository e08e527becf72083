/* policy_async: async and ssp (see policy.h). Both apply every gradient on
 * arrival; ssp also holds the pull of a worker more than S pushes ahead of
 * the slowest live worker. Neither waits for a crew of MIN: async and ssp
 * go on with whoever is live. */
#include "server/core/policy.h"
#include "server/core/shard_dc.h"

static void s_push(dp_policy_t *p, int worker, uint64_t v, const dp_grad_slice_t *g, int n,
                   bool early, dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    uint64_t staleness = s->version - v;
    out->staleness = staleness;
    if (dp_policy_delay_skip(p, staleness, out->reason, sizeof out->reason)) {
        s->counts.dropped++;
        out->status = DP_PUSH_DROPPED;
        return;
    }
    float lr = dp_policy_delay_lr(p, staleness, dp_shard_lr(s));
    dp_grad_slice_t one;
    if (s->dc) {
        out->compensated = dp_shard_dc_apply(s, worker, v, g, n, &one);
        if (out->compensated) {
            g = &one;
            n = 1;
        }
    }
    dp_policy_step(p, g, n, lr, early, out); /* early never with compensation: s_early */
    dp_staleness_add(&p->staleness, staleness);
    p->clock[worker]++;
    s->counts.applied++;
    s->counts.staleness_sum += staleness;
    if (staleness > s->counts.staleness_max) s->counts.staleness_max = staleness;
    out->status = DP_PUSH_APPLIED;
    out->stepped = 1;
}

static int s_async_pull_ready(const dp_policy_t *p, int worker, uint64_t min_version)
{
    (void)p, (void)worker, (void)min_version;
    return 1;
}

static int s_ssp_pull_ready(const dp_policy_t *p, int worker, uint64_t min_version)
{
    (void)min_version;
    uint64_t min_clock = UINT64_MAX;
    for (int i = 0; i < p->members->n; i++)
        if (dp_members_live(p->members, i) && p->clock[i] < min_clock) min_clock = p->clock[i];
    if (min_clock == UINT64_MAX) return 1; /* nobody live: nobody to wait for */
    return p->clock[worker] <= min_clock + (uint64_t)p->conf.staleness;
}

/* Who is live matters only to held ssp pulls, which the caller re-asks. */
static int s_members_changed(dp_policy_t *p)
{
    (void)p;
    return 0;
}

/* ssp: a worker that joins (or comes back) starts at the slowest clock of
 * the workers already live, so the bound holds over the live crew and
 * nobody waits for a newcomer to catch up from 0. */
static int s_ssp_members_changed(dp_policy_t *p)
{
    const dp_members_t *m = p->members;
    uint64_t min_clock = UINT64_MAX;
    for (int i = 0; i < m->n; i++)
        if (p->was_live[i] && dp_members_live(m, i) && p->clock[i] < min_clock) min_clock = p->clock[i];
    for (int i = 0; i < m->n; i++) {
        int live = dp_members_live(m, i);
        if (live && !p->was_live[i] && min_clock != UINT64_MAX && p->clock[i] < min_clock)
            p->clock[i] = min_clock;
        p->was_live[i] = (unsigned char)live;
    }
    return 0;
}

/* The push by its gradient at the delay rule's lr for the present
 * staleness; not with delay compensation (dp_policy_early). */
static int s_early(const dp_policy_t *p, int worker, uint64_t v, float *lr, int *count)
{
    (void)worker;
    const dp_shard_t *s = p->shard;
    if (s->dc || v > s->version) return -1;
    *lr = dp_policy_delay_lr(p, s->version - v, dp_shard_lr(s));
    *count = 0;
    return 0;
}

const dp_policy_ops_t dp_policy_async = {.push = s_push, .pull_ready = s_async_pull_ready,
                                         .members_changed = s_members_changed, .early = s_early};
const dp_policy_ops_t dp_policy_ssp = {.push = s_push, .pull_ready = s_ssp_pull_ready,
                                       .members_changed = s_ssp_members_changed, .early = s_early};
