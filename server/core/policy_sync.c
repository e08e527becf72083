/* policy_sync: synchronous aggregation with backup workers (see policy.h).
 *
 * A step fires when min(R, workers that are live or already contributed to
 * this version) gradients of the current version are in, so workers that
 * finished or went silent no longer hold it back and the last steps never
 * hang; a worker that comes back counts again from the next check. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "server/core/policy.h"

/* An elastic crew below MIN live workers, while nobody is done with its
 * steps yet: the step waits. */
static int s_below_min(const dp_policy_t *p)
{
    const dp_members_t *m = p->members;
    return m->min > 0 && dp_members_active_count(m) < m->min && dp_members_completed(m) == 0;
}

/* The gradients the current version's step needs: min(R, workers live or
 * that contributed to it) (R: ceil(F x them) for a fraction), at least 1;
 * INT_MAX below MIN. */
static int s_need(const dp_policy_t *p)
{
    if (s_below_min(p)) return INT_MAX;
    const dp_shard_t *s = p->shard;
    int counting = 0;
    for (int i = 0; i < p->members->n; i++)
        if (dp_members_live(p->members, i) || p->contributed[i] == s->version + 1) counting++;
    int r = p->conf.replicas_frac > 0 ? (int)ceil((double)p->conf.replicas_frac * counting)
                                      : p->conf.replicas;
    int need = r < counting ? r : counting;
    return need < 1 ? 1 : need;
}

/* Step if enough gradients of this version are in; 1 when it stepped.
 * out (NULL from a membership change) gets what the step did. */
static int s_maybe_step_out(dp_policy_t *p, bool early, dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    if (s->acc_count == 0) return 0;
    int need = s_need(p);
    if (need == INT_MAX && !p->below_min) {
        p->below_min = 1;
        dp_log_warn("shard %d: sync waits at version %" PRIu64 ": %d of at least %d workers live "
                    "(--workers %d:%d)", p->members->shard, s->version,
                    dp_members_active_count(p->members), p->members->min, p->members->min,
                    p->members->n);
    }
    if (s->acc_count < need) return 0;
    if (p->below_min)
        dp_log_info("shard %d: sync steps again: %d workers live", p->members->shard,
                    dp_members_active_count(p->members));
    p->below_min = 0;
    dp_policy_step_mean(p, early, out);
    return 1;
}

static int s_maybe_step(dp_policy_t *p)
{
    return s_maybe_step_out(p, false, NULL);
}

static void s_push(dp_policy_t *p, int worker, uint64_t v, const dp_grad_slice_t *g, int n,
                   bool early, dp_push_outcome_t *out)
{
    dp_shard_t *s = p->shard;
    if (v < s->version) {
        s->counts.dropped++;
        out->status = DP_PUSH_DROPPED;
        out->staleness = s->version - v;
        snprintf(out->reason, sizeof out->reason,
                 "stale: computed on version %" PRIu64 ", current %" PRIu64, v, s->version);
        return;
    }
    if (p->contributed[worker] == s->version + 1) {
        s->counts.dropped++;
        out->status = DP_PUSH_DROPPED;
        snprintf(out->reason, sizeof out->reason,
                 "duplicate: worker %d already contributed to version %" PRIu64, worker, s->version);
        return;
    }
    dp_shard_accumulate(s, g, n);
    p->contributed[worker] = s->version + 1;
    p->clock[worker]++;
    s->counts.applied++;
    dp_staleness_add(&p->staleness, 0);
    out->status = DP_PUSH_APPLIED;
    out->stepped = s_maybe_step_out(p, early, out); /* this push last: acc holds its gradient */
}

/* Answer once the version is past the one the worker pushed on. A
 * min_version beyond the next step cannot come from a correct worker of this
 * shard (e.g. the shard restarted from an older checkpoint): answer rather
 * than wait for ever. */
static int s_pull_ready(const dp_policy_t *p, int worker, uint64_t min_version)
{
    (void)worker;
    uint64_t v = p->shard->version;
    return v >= min_version || min_version > v + 1;
}

/* An early step only for the push that completes the step: of the current
 * version, not a duplicate, the one that makes the count (dp_policy_early). */
static int s_early(const dp_policy_t *p, int worker, uint64_t v, float *lr, int *count)
{
    const dp_shard_t *s = p->shard;
    if (v != s->version || p->contributed[worker] == s->version + 1 || s->acc_count + 1 < s_need(p))
        return -1;
    *lr = dp_shard_lr(s);
    *count = s->acc_count + 1;
    return 0;
}

const dp_policy_ops_t dp_policy_sync = {
    .push = s_push, .pull_ready = s_pull_ready, .members_changed = s_maybe_step, .early = s_early};
