/* ps_deal: shard 0 of an elastic crew dealing its batches over the wire
 * (server/crew/deal.h keeps the book): the plan a HELLO carries, the batch of
 * a pull, a push's fate, the crew's news and the leases' clock.
 *
 * Who sets the plan. The chief (worker 0) alone: its HELLO sets the
 * run's plan, every other worker's HELLO is checked against it (refused,
 * ERR_MODEL_MISMATCH, when they differ), and a worker whose HELLO came
 * first has its plan kept and its pulls held until the chief's arrives,
 * then refused if the two differ. Were the first HELLO to set it, a
 * stranger saying HELLO first under any free id with a plan of its own
 * would have every real worker refused for as long as shard 0 ran. The
 * chief's id is the one that already answers for the run (STATS,
 * SHUTDOWN: server/loop/auth.h), so taking the plan over means taking the
 * chief's id, which its connection (and under CURVE its key) guards. A
 * chief whose HELLO carries no plan (it brings its own data: a library
 * client) leaves the plan to the first worker that asks a batch. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/loop/ps_loop.h"

void dp_ps_deal_init(dp_ps_loop_t *ps, int workers)
{
    dp_deal_init(&ps->deal, workers);
    /* Test hook, read here only: DP_TEST_LEASE_FLOOR=S raises the leases'
     * floor, for the tests whose hold hook (DP_TEST_HOLD_DIR) keeps a
     * batch in a worker's hand for as long as the test acts. */
    const char *floor = getenv("DP_TEST_LEASE_FLOOR");
    if (floor && atof(floor) > 0) ps->deal.lease_floor = atof(floor);
    ps->dealing = true;
    ps->foreign_said = dp_calloc((size_t)workers, 1);
    ps->plans = dp_calloc((size_t)workers, sizeof *ps->plans);
    ps->asked_from = dp_calloc((size_t)workers, sizeof *ps->asked_from);
}

void dp_ps_deal_fini(dp_ps_loop_t *ps)
{
    dp_deal_fini(&ps->deal);
    free(ps->foreign_said);
    free(ps->plans);
    free(ps->asked_from);
    ps->foreign_said = NULL;
    ps->plans = NULL;
    ps->asked_from = NULL;
}

int dp_ps_deal_hello(dp_ps_loop_t *ps, const Downpour__Envelope *env, char *why, size_t n)
{
    if (!ps->dealing) return 0;
    int wid = env->worker_id;
    const Downpour__DealPlan *p = env->hello->deal;
    dp_deal_terms_t t = {0, 0, 0, 0};
    if (p && (p->samples || p->batch || p->epochs || p->steps)) { /* all 0: no plan */
        t = (dp_deal_terms_t){p->samples, p->epochs, p->steps, p->batch};
        int rc = wid == 0 ? dp_deal_plan(&ps->deal, t.samples, t.batch, t.epochs, t.steps, why, n)
                          : dp_deal_plan_check(&ps->deal, &t, why, n);
        if (rc != 0) return -1;
        if (!dp_deal_planned(&ps->deal))
            dp_log_info("shard %d: worker %d's batches wait for the chief's HELLO: worker 0 sets the "
                        "data plan", ps->cfg->shard_index, wid);
    }
    ps->plans[wid] = t;
    return 0;
}

/* The chief said HELLO without a plan: the first worker to ask sets it. */
static bool s_chief_unplanned(const dp_ps_loop_t *ps)
{
    return ps->members.w[0].joined && ps->plans[0].batch == 0;
}

/* The asker's plan against the run's: 0 when a batch may be dealt, 1 when
 * it waits for the chief's plan, -1 (why) when refused. */
static int s_pull_plan(dp_ps_loop_t *ps, int worker, char *why, size_t n)
{
    const dp_deal_terms_t *t = &ps->plans[worker];
    if (!dp_deal_planned(&ps->deal) && t->batch) {
        if (!s_chief_unplanned(ps)) return 1;
        if (dp_deal_plan(&ps->deal, t->samples, t->batch, t->epochs, t->steps, why, n) != 0) return -1;
        dp_log_info("shard %d: worker %d's data plan is the run's (the chief brings its own data)",
                    ps->cfg->shard_index, worker);
    }
    return t->batch ? dp_deal_plan_check(&ps->deal, t, why, n) : 0;
}

int dp_ps_deal_answer_pull(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                           const dp_ps_params_ask_t *ask, uint64_t deal_step)
{
    if (!deal_step) {
        dp_ps_reply_params(ps, id, req, worker, ask, NULL);
        return 1;
    }
    char why[DP_ERR_LEN];
    dp_deal_batch_t b = {0, 0};
    int plan = s_pull_plan(ps, worker, why, sizeof why);
    if (plan > 0) return 0; /* held till the chief's HELLO */
    dp_deal_answer_t a = plan < 0 ? DP_DEAL_REFUSED
                                  : dp_deal_ask(&ps->deal, worker, deal_step, &b, why, sizeof why);
    if (a == DP_DEAL_WAIT) return 0;
    if (a == DP_DEAL_REFUSED) {
        dp_log_warn("shard %d: worker %d: no batch dealt: %s", ps->cfg->shard_index, worker, why);
        dp_ps_reply_error(ps, id, req, worker, why);
        return 1;
    }
    if (!ps->asked_from[worker] || deal_step < ps->asked_from[worker]) ps->asked_from[worker] = deal_step;
    Downpour__Deal d = DOWNPOUR__DEAL__INIT;
    d.end = a == DP_DEAL_END;
    d.epoch = b.epoch;
    d.index = b.index;
    dp_ps_reply_params(ps, id, req, worker, ask, &d);
    return 1;
}

const dp_deal_batch_t *dp_ps_deal_pushed(dp_ps_loop_t *ps, int worker, uint64_t step, int used,
                                         dp_deal_batch_t *b)
{
    if (!ps->dealing || !dp_deal_planned(&ps->deal)) return NULL;
    if (dp_deal_pushed(&ps->deal, worker, step, used, b)) return b;
    if (!ps->foreign_said[worker]++)
        dp_log_warn("shard %d: worker %d pushed step %" PRIu64 ", for which it was dealt no batch: "
                    "applied as the policy says, not counted in the epochs' samples (said once a "
                    "worker)", ps->cfg->shard_index, worker, step);
    return NULL;
}

/* A step this worker pushes that the restored dealer has no batch for and
 * that is older than its first ask since the restart was dealt before it:
 * a repeated request from before the crash. Anything else (a later step
 * never asked) is a push of no dealt batch, applied and counted apart. */
int dp_ps_deal_unknown(dp_ps_loop_t *ps, int worker, uint64_t step)
{
    if (!ps->dealing || !ps->deal_restored || !ps->plans[worker].batch ||
        !dp_deal_planned(&ps->deal) || dp_deal_holds(&ps->deal, worker, step) ||
        (ps->asked_from[worker] && step >= ps->asked_from[worker]))
        return 0;
    if (!ps->foreign_said[worker]++)
        dp_log_warn("shard %d: worker %d pushed step %" PRIu64 ", whose batch was dealt before this "
                    "shard restarted: not applied, the batch is dealt again (said once a worker)",
                    ps->cfg->shard_index, worker, step);
    return 1;
}

void dp_ps_deal_members(dp_ps_loop_t *ps, int news)
{
    const dp_membership_t *h = &ps->membership;
    if (!ps->dealing || (size_t)news > h->n_ev) return;
    for (size_t k = h->n_ev - (size_t)news; k < h->n_ev; k++) {
        const dp_member_event_t *e = dp_membership_at(h, k);
        if (dp_member_joins(e->why)) continue;
        int died = e->why == DP_LEAVE_GONE || e->why == DP_LEAVE_REPLACED;
        int n = dp_deal_release(&ps->deal, e->task, died);
        if (n > 0)
            dp_log_info("shard %d: worker %d %s with %d batch%s in flight: back to the pool%s",
                        ps->cfg->shard_index, e->task, dp_member_why_name(e->why), n,
                        n > 1 ? "es" : "", died ? " (counted as trained once by it when dealt again)" : "");
    }
}

int dp_ps_deal_tick(dp_ps_loop_t *ps, double now)
{
    int n = ps->dealing ? dp_deal_tick(&ps->deal, now) : 0;
    if (n > 0)
        dp_log_warn("shard %d: %d batch%s held past the lease of %.1f s (%d median turnarounds, at "
                    "least %g s): back to the pool; a late push of one counts it again",
                    ps->cfg->shard_index, n, n > 1 ? "es" : "", dp_deal_lease(&ps->deal),
                    DP_DEAL_LEASE_TURNS, ps->deal.lease_floor);
    return n;
}
