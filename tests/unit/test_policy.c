/* test_policy: the consistency policies (server/core/policy.h) driving a shard
 * (server/core/shard.h) and a member table (server/crew/members.h) with no sockets at
 * all — the way a simulator uses them — checked step by step against the
 * arithmetic: what each push decides, when a pull may be answered, what a
 * worker's finishing, silence and return change. */
#include <string.h>

#include "common/model.h"
#include "common/opts.h"
#include "common/util.h"
#include "server/core/shard_dc.h"
#include "server/crew/membership.h"
#include "tests/policy_fixture.h"
#include "tests/test.h"

#define SPEC POLICY_FX_SPEC

typedef policy_fx_t fx_t;

/* A plain-SGD (lr 0.1) single shard, n workers all joined, policy ops,
 * the delay rule delay_lr (K k) and the compensation dc (lambda). */
static int fx_init_delay(fx_t *f, const dp_policy_ops_t *ops, int workers, int replicas, int staleness,
                         int delay_lr, float k, dp_dc_kind_t dc, float lambda)
{
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    o.kind = DP_OPT_SGD;
    o.lr = 0.1f;
    o.dc = dc;
    o.dc_lambda = lambda;
    dp_policy_conf_t pc = {.replicas = replicas, .staleness = staleness, .delay_lr = delay_lr, .delay_k = k};
    return policy_fx_init(f, ops, &o, workers, &pc);
}

static int fx_init(fx_t *f, const dp_policy_ops_t *ops, int workers, int replicas, int staleness,
                   int delay_lr)
{
    return fx_init_delay(f, ops, workers, replicas, staleness, delay_lr, 0, DP_DC_OFF, 0);
}

static void fx_fini(fx_t *f)
{
    dp_policy_destroy(&f->policy); /* safe twice: policy_fx_fini destroys it again */
    policy_fx_fini(f);
}

/* Worker w pushes its gradient, computed on version v, as one slice. */
static dp_push_status_t fx_push(fx_t *f, int w, uint64_t v, dp_push_outcome_t *o)
{
    dp_grad_slice_t s = {f->g[w], f->shard.n * sizeof(float), f->shard.lo};
    dp_policy_push(f->policy, w, v, &s, 1, false, o);
    return o->status;
}

/* Sync, R = 2 of 3: accumulate, duplicate, step on the mean, late, future;
 * pulls wait for the next version. */
static void test_sync_decisions(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_sync, 3, 2, 0, 0) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.shard.n;
    float *w0 = dp_malloc(n * sizeof(float));
    memcpy(w0, f.shard.w, n * sizeof(float));
    dp_push_outcome_t o;
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 1), 0); /* waits for version 1 */
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_DROPPED);
    CHECK(strstr(o.reason, "duplicate") != NULL);
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 1);
    CHECK_EQ(f.shard.version, 1);
    int exact = 1;
    for (size_t i = 0; i < n; i++)
        exact &= f.shard.w[i] == w0[i] - 0.1f * ((f.g[0][i] + f.g[1][i]) * 0.5f);
    CHECK(exact);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 1), 1);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 5), 1); /* beyond the next step: answered */
    CHECK_EQ(fx_push(&f, 2, 0, &o), DP_PUSH_DROPPED); /* the backup worker, late */
    CHECK_EQ(o.staleness, 1);
    CHECK(strstr(o.reason, "stale") != NULL);
    CHECK_EQ(fx_push(&f, 2, 3, &o), DP_PUSH_REJECTED);
    CHECK(strstr(o.reason, "from the future") != NULL);
    CHECK_EQ(f.shard.counts.applied, 2);
    CHECK_EQ(f.shard.counts.dropped, 2);
    CHECK_EQ(f.shard.counts.rejected, 1);
    free(w0);
    fx_fini(&f);
}

/* Sync, R = all of 2: a worker that finishes or goes silent is no longer
 * waited for; one that comes back counts again. */
static void test_sync_members(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_sync, 2, 2, 0, 0) != 0) {
        CHECK(0);
        return;
    }
    dp_push_outcome_t o;
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0);
    CHECK_EQ(dp_policy_members_changed(f.policy), 0); /* nothing changed yet */
    CHECK_EQ(dp_members_sweep(&f.members, 10.0, 5.0), 2); /* both silent since 0 */
    dp_members_heard(&f.members, 0, 10.0);
    CHECK_EQ(dp_policy_members_changed(f.policy), 1); /* worker 1 gone: step alone */
    CHECK_EQ(f.shard.version, 1);
    CHECK_EQ(dp_members_heard(&f.members, 1, 11.0), 1); /* back */
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0); /* waits for worker 1 again */
    CHECK_EQ(dp_members_finish(&f.members, 1, 0), 1);
    CHECK_EQ(dp_members_finish(&f.members, 1, 0), 0);
    CHECK_EQ(dp_policy_members_changed(f.policy), 1);
    CHECK_EQ(f.shard.version, 2);
    int joined, finished, gone;
    dp_members_counts(&f.members, &joined, &finished, &gone);
    CHECK_EQ(joined, 2);
    CHECK_EQ(finished, 1);
    CHECK_EQ(gone, 0);
    fx_fini(&f);
}

/* SSP, S = 1: a worker two pushes ahead of the slowest live one waits;
 * once the slow one is gone it does not. */
static void test_ssp_bound(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_ssp, 2, 2, 1, 0) != 0) {
        CHECK(0);
        return;
    }
    dp_push_outcome_t o;
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 1);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 1); /* 1 ahead <= S */
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 0); /* 2 ahead > S */
    CHECK_EQ(dp_policy_pull_ready(f.policy, 1, 0), 1);
    CHECK_EQ(dp_members_sweep(&f.members, 10.0, 5.0), 2);
    dp_members_heard(&f.members, 0, 10.0);
    CHECK_EQ(dp_policy_members_changed(f.policy), 0);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 1); /* nobody slower is live */
    fx_fini(&f);
}

/* Async with --delay-lr inverse (--lr-staleness): a gradient two versions old moves the weights by
 * lr / 2 times it, and the staleness is counted. */
static void test_async_staleness(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_async, 2, 2, 0, 1) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.shard.n;
    dp_push_outcome_t o;
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 99), 1);
    float *before = dp_malloc(n * sizeof(float));
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.staleness, 2);
    CHECK_EQ(f.shard.version, 3);
    int exact = 1;
    for (size_t i = 0; i < n; i++) exact &= f.shard.w[i] == before[i] - (0.1f / 2.0f) * f.g[1][i];
    CHECK(exact);
    CHECK_EQ(f.shard.counts.staleness_sum, 2);
    CHECK_EQ(f.shard.counts.staleness_max, 2);
    free(before);
    fx_fini(&f);
}

/* Bad configurations are refused with the flag's name. */
static void test_bad_conf(void)
{
    dp_shard_t s;
    dp_members_t m;
    dp_model_t model;
    dp_optim_conf_t o;
    char err[DP_ERR_LEN] = "";
    dp_optim_conf_default(&o);
    CHECK_EQ(dp_model_parse(&model, SPEC, 1, 8, 8, err), 0);
    CHECK_EQ(dp_shard_init(&s, &model, 2, 2, 1, &o, err), -1);
    CHECK(strstr(err, "--shard") != NULL);
    dp_shard_fini(&s); /* safe after a failed init */
    CHECK_EQ(dp_shard_init(&s, &model, 0, 1, 1, &o, err), 0);
    dp_members_init(&m, 2, 0, 0, 0.0);
    dp_policy_t *p = NULL;
    dp_policy_conf_t pc = {.replicas = 3, .staleness = 0, .delay_lr = 0, .delay_k = 0};
    CHECK_EQ(dp_policy_new(&p, &dp_policy_sync, &pc, &s, &m, err), -1);
    CHECK(p == NULL && strstr(err, "--replicas-to-aggregate 3") != NULL);
    pc = (dp_policy_conf_t){.replicas = 1, .staleness = -1, .delay_lr = 0, .delay_k = 0};
    CHECK_EQ(dp_policy_new(&p, &dp_policy_ssp, &pc, &s, &m, err), -1);
    CHECK(strstr(err, "--staleness") != NULL);
    dp_members_fini(&m);
    dp_shard_fini(&s);
    dp_shard_fini(&s); /* safe twice */
}

/* Every weight moved by lr x g exactly (from before)? */
static int s_moved_by(const fx_t *f, const float *before, float lr, const float *g)
{
    int exact = 1;
    for (size_t i = 0; i < f->shard.n; i++) exact &= f->shard.w[i] == before[i] - lr * g[i];
    return exact;
}

/* --delay-lr adaptive, 2 workers: lr x min(1, 2 / tau) — the full lr at
 * tau 0 and at tau 2, half of it at tau 4. */
static void test_async_adaptive(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_async, 2, 2, 0, DP_DELAY_ADAPTIVE) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.shard.n;
    float *before = dp_malloc(n * sizeof(float));
    dp_push_outcome_t o;
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED); /* tau 0 */
    CHECK(o.lr == 0.1f);
    CHECK(s_moved_by(&f, before, 0.1f, f.g[0]));
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED); /* tau 0 */
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED); /* tau 2 = M: the full lr */
    CHECK_EQ(o.staleness, 2);
    CHECK(o.lr == 0.1f);
    CHECK(s_moved_by(&f, before, 0.1f, f.g[1]));
    CHECK_EQ(fx_push(&f, 0, 3, &o), DP_PUSH_APPLIED);
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED); /* tau 4: lr x 2/4 */
    CHECK_EQ(o.staleness, 4);
    CHECK(o.lr == 0.05f);
    CHECK(s_moved_by(&f, before, 0.05f, f.g[1]));
    CHECK_EQ(f.shard.counts.applied, 5);
    free(before);
    fx_fini(&f);
}

/* --delay-lr threshold:2: tau > 2 x max(1, the mean delay of the pushes
 * judged before) is skipped, counted as dropped with the reason, and the
 * weights stay; a skipped push counts in the mean. By hand, the delays
 * 0 1 2 3 3 4: means before each 0, 0, .5, 1, 1.5, 1.8, so thresholds
 * 2 2 2 2 3 3.6: the fourth and the sixth are skipped. */
static void test_async_threshold(void)
{
    fx_t f;
    if (fx_init_delay(&f, &dp_policy_async, 3, 3, 0, DP_DELAY_THRESHOLD, 2.0f, DP_DC_OFF, 0) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.shard.n;
    float *before = dp_malloc(n * sizeof(float));
    dp_push_outcome_t o;
    const uint64_t on[6] = {0, 0, 0, 0, 0, 0};   /* all computed on version 0 */
    const int want[6] = {DP_PUSH_APPLIED, DP_PUSH_APPLIED, DP_PUSH_APPLIED, DP_PUSH_DROPPED,
                         DP_PUSH_APPLIED, DP_PUSH_DROPPED};
    const uint64_t tau[6] = {0, 1, 2, 3, 3, 4};
    for (int i = 0; i < 6; i++) {
        memcpy(before, f.shard.w, n * sizeof(float));
        uint64_t v0 = f.shard.version;
        CHECK_EQ(fx_push(&f, i % 3, on[i], &o), want[i]);
        CHECK_EQ(o.staleness, tau[i]);
        if (want[i] == DP_PUSH_DROPPED) {
            CHECK(strstr(o.reason, "delay: ") != NULL && strstr(o.reason, "threshold") != NULL);
            CHECK_EQ(f.shard.version, v0);
            CHECK(memcmp(before, f.shard.w, n * sizeof(float)) == 0);
            CHECK(!o.stepped);
        } else {
            CHECK(s_moved_by(&f, before, 0.1f, f.g[i % 3]));
        }
    }
    CHECK_EQ(f.shard.counts.applied, 4);
    CHECK_EQ(f.shard.counts.dropped, 2);
    CHECK_EQ(f.policy->delay_count, 6);
    CHECK_EQ(f.policy->delay_sum, 13);
    free(before);
    fx_fini(&f);
}

/* --delay-compensation const:0.5 through the policy: a push stamped with
 * the version its worker pulled is compensated against those weights
 * (g + 0.5 g*g*(w - w_pulled), then SGD); one the shard kept no weights
 * for falls back to g, counted; a worker with two pulls outstanding
 * (--overlap) is compensated against the right one. */
static void test_async_compensation(void)
{
    fx_t f;
    if (fx_init_delay(&f, &dp_policy_async, 2, 2, 0, DP_DELAY_NONE, 0, DP_DC_CONST, 0.5f) != 0) {
        CHECK(0);
        return;
    }
    size_t n = f.shard.n;
    float *w0 = dp_malloc(n * sizeof(float)), *before = dp_malloc(n * sizeof(float));
    float *want = dp_malloc(n * sizeof(float));
    dp_push_outcome_t o;
    memcpy(w0, f.shard.w, n * sizeof(float));
    dp_shard_dc_pulled(&f.shard, 1); /* worker 1 pulls version 0 */
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED); /* worker 0 never pulled: g as it is */
    CHECK_EQ(o.compensated, 0);
    CHECK_EQ(f.shard.dc->fallback, 1);
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED); /* tau 1, against w0 */
    CHECK_EQ(o.compensated, 1);
    CHECK_EQ(f.shard.dc->compensated, 1);
    int exact = 1, moved = 0;
    for (size_t i = 0; i < n; i++) {
        float g = f.g[1][i], c = g + 0.5f * g * g * (before[i] - w0[i]);
        exact &= f.shard.w[i] == before[i] - 0.1f * c;
        moved |= c != g;
    }
    CHECK(exact);
    CHECK(moved); /* the compensation changed something */
    /* overlap: worker 1 pulls version 2, then 3, then pushes on 2 */
    float *w2 = dp_malloc(n * sizeof(float));
    memcpy(w2, f.shard.w, n * sizeof(float));
    dp_shard_dc_pulled(&f.shard, 1);
    CHECK_EQ(fx_push(&f, 0, 2, &o), DP_PUSH_APPLIED);
    dp_shard_dc_pulled(&f.shard, 1);
    memcpy(before, f.shard.w, n * sizeof(float));
    CHECK_EQ(fx_push(&f, 1, 2, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.compensated, 1);
    exact = 1;
    for (size_t i = 0; i < n; i++) {
        float g = f.g[1][i], c = g + 0.5f * g * g * (before[i] - w2[i]);
        exact &= f.shard.w[i] == before[i] - 0.1f * c;
    }
    CHECK(exact);
    CHECK_EQ(fx_push(&f, 1, 3, &o), DP_PUSH_APPLIED); /* the second slot: version 3 */
    CHECK_EQ(o.compensated, 1);
    CHECK_EQ(fx_push(&f, 1, 1, &o), DP_PUSH_APPLIED); /* no pull of version 1 kept */
    CHECK_EQ(o.compensated, 0);
    CHECK_EQ(f.shard.dc->compensated, 3);
    CHECK_EQ(f.shard.dc->fallback, 3); /* worker 0's two, worker 1's version 1 */
    free(w0);
    free(w2);
    free(before);
    free(want);
    fx_fini(&f);
}

/* Sync has no delays: dp_policy_for_mode turns the rule and the
 * compensation off (async keeps them); the rule names read back. */
static void test_delay_conf(void)
{
    dp_policy_conf_t pc = {.replicas = 1, .staleness = 0, .delay_lr = DP_DELAY_ADAPTIVE, .delay_k = 0};
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    char err[DP_ERR_LEN] = "", name[48];
    CHECK_EQ(dp_optim_parse_dc(&o, "adaptive:2", err), 0);
    dp_policy_for_mode(DP_MODE_ASYNC, &pc, &o, "test");
    CHECK_EQ(pc.delay_lr, DP_DELAY_ADAPTIVE);
    CHECK_EQ(o.dc, DP_DC_ADAPTIVE);
    dp_policy_for_mode(DP_MODE_SYNC, &pc, &o, "test");
    CHECK_EQ(pc.delay_lr, DP_DELAY_NONE);
    CHECK_EQ(o.dc, DP_DC_OFF);
    int kind = 0;
    float k = 0;
    CHECK_EQ(dp_delay_lr_parse("threshold", &kind, &k, err), 0);
    CHECK(kind == DP_DELAY_THRESHOLD && k == 2.0f);
    CHECK_EQ(dp_delay_lr_parse("threshold:3.5", &kind, &k, err), 0);
    dp_delay_lr_name(kind, k, name, sizeof name);
    CHECK_STR(name, "threshold:3.5");
    CHECK_EQ(dp_delay_lr_parse("inverse", &kind, &k, err), 0);
    CHECK_EQ(kind, DP_DELAY_INVERSE); /* --lr-staleness's value */
    CHECK_EQ(dp_delay_lr_parse("threshold:0.5", &kind, &k, err), -1);
    CHECK(strstr(err, "threshold:K") != NULL);
    CHECK_EQ(dp_delay_lr_parse("fast", &kind, &k, err), -1);
    CHECK_EQ(dp_optim_parse_dc(&o, "const:0.04", err), 0);
    dp_optim_dc_name(&o, name, sizeof name);
    CHECK_STR(name, "const:0.04");
    CHECK_EQ(dp_optim_parse_dc(&o, "const:", err), -1);
    CHECK_EQ(dp_optim_parse_dc(&o, "adaptive:-1", err), -1);
    CHECK(strstr(err, "adaptive:LAMBDA0") != NULL);
}

/* The fixture's members made an elastic crew of MIN min over its workers:
 * every slot absent until its HELLO (dp_members_join). */
static void fx_elastic(fx_t *f, int min)
{
    int n = f->members.n;
    dp_members_fini(&f->members);
    dp_members_init(&f->members, n, min, 0, 0.0);
    dp_policy_members_changed(f->policy);
}

/* An elastic crew's table: absent until HELLO (a HEARTBEAT alone does not
 * count a slot in), a leave is finished and left, a new HELLO is a join
 * again; the membership events and the live range follow. */
static void test_elastic_members(void)
{
    dp_members_t m;
    dp_members_init(&m, 4, 2, 0, 0.0);
    dp_membership_t h;
    dp_membership_init(&h, 4);
    CHECK_EQ(dp_members_active_count(&m), 0);
    CHECK_EQ(dp_members_live(&m, 3), 0);
    CHECK_EQ(dp_members_heard(&m, 3, 1.0), 0); /* its beat, before its HELLO */
    CHECK_EQ(dp_members_live(&m, 3), 0);
    CHECK_EQ(dp_membership_note(&h, &m, 0), 0);
    CHECK_EQ(h.live_max, -1); /* nobody joined yet: no range */
    dp_members_join(&m, 0);
    dp_members_join(&m, 2);
    CHECK_EQ(dp_membership_note(&h, &m, 3), 2);
    const dp_member_event_t *e = dp_membership_at(&h, 1);
    CHECK(e->why == DP_JOIN_HELLO && e->task == 2 && e->version == 3 && e->live == 2);
    CHECK_EQ(dp_members_finish(&m, 2, 1), 1); /* its SIGTERM */
    CHECK_EQ(dp_members_completed(&m), 0);
    CHECK_EQ(dp_members_sweep(&m, 10.0, 5.0), 1); /* worker 0 silent since 0 */
    CHECK_EQ(dp_membership_note(&h, &m, 9), 2);
    e = dp_membership_at(&h, 2); /* in worker order */
    CHECK(e->why == DP_LEAVE_GONE && e->task == 0 && e->live == 1);
    e = dp_membership_at(&h, 3);
    CHECK(e->why == DP_LEAVE_LEFT && e->task == 2 && e->live == 0);
    CHECK_EQ(h.live_min, 0);
    CHECK_EQ(dp_members_heard(&m, 0, 11.0), 1); /* back */
    dp_members_join(&m, 2);                     /* a new HELLO: in again */
    CHECK_EQ(dp_membership_note(&h, &m, 9), 2);
    CHECK(dp_membership_at(&h, 4)->why == DP_JOIN_BACK);
    CHECK_EQ(dp_members_active_count(&m), 2);
    dp_members_join(&m, 2); /* a new process under a live id */
    CHECK_EQ(dp_membership_note(&h, &m, 9), 2);
    CHECK(dp_membership_at(&h, 6)->why == DP_LEAVE_REPLACED && dp_membership_at(&h, 6)->live == 1);
    CHECK(dp_membership_at(&h, 7)->why == DP_JOIN_HELLO && dp_membership_at(&h, 7)->live == 2);
    CHECK_EQ(dp_members_finish(&m, 0, 0), 1); /* done with its steps: the range is closed */
    CHECK_EQ(dp_members_completed(&m), 1);
    dp_membership_note(&h, &m, 20);
    dp_members_finish(&m, 2, 0);
    dp_membership_note(&h, &m, 21);
    CHECK_EQ(h.live_min, 0);
    CHECK_EQ(h.live_max, 2);
    CHECK_EQ(h.live, dp_members_active_count(&m)); /* the count kept equals the count taken */
    CHECK_EQ((int)h.total, 10);
    CHECK_STR(dp_member_why_name(dp_membership_at(&h, 8)->why), "finished");
    dp_membership_fini(&h);
    dp_membership_fini(&h); /* safe twice */
    dp_members_fini(&m);
}

/* Sync, elastic MIN 2 of 3: below MIN the step waits (a push alone does
 * not step, nor does a member change); at MIN it steps on what is in; once
 * a worker is done with its steps the rest step without MIN. The mean is
 * over the gradients aggregated. */
static void test_sync_elastic(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_sync, 3, 3, 0, 0) != 0) {
        CHECK(0);
        return;
    }
    fx_elastic(&f, 2);
    size_t n = f.shard.n;
    float *w0 = dp_malloc(n * sizeof(float));
    memcpy(w0, f.shard.w, n * sizeof(float));
    dp_push_outcome_t o;
    dp_members_join(&f.members, 0);
    dp_policy_members_changed(f.policy);
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0); /* 1 of at least 2 live: waits */
    CHECK_EQ(f.policy->below_min, 1);
    dp_members_join(&f.members, 2);
    CHECK_EQ(dp_policy_members_changed(f.policy), 0); /* 2 live: wait for the newcomer's */
    CHECK_EQ(fx_push(&f, 2, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 1);
    CHECK_EQ(f.policy->below_min, 0);
    int exact = 1;
    for (size_t i = 0; i < n; i++)
        exact &= f.shard.w[i] == w0[i] - 0.1f * ((f.g[0][i] + f.g[2][i]) * 0.5f);
    CHECK(exact);
    dp_members_finish(&f.members, 2, 1); /* leaves: 1 live, below MIN */
    dp_policy_members_changed(f.policy);
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0);
    CHECK_EQ(fx_push(&f, 2, 1, &o), DP_PUSH_APPLIED); /* a leaver's push in flight still counts */
    CHECK_EQ(o.stepped, 0);
    CHECK_EQ(f.shard.version, 1);
    dp_members_join(&f.members, 1);
    CHECK_EQ(dp_policy_members_changed(f.policy), 0); /* MIN again: waits for the newcomer's */
    CHECK_EQ(fx_push(&f, 1, 1, &o), DP_PUSH_APPLIED); /* 0, 1 live and 2's: all in */
    CHECK_EQ(o.stepped, 1);
    CHECK_EQ(fx_push(&f, 0, 2, &o), DP_PUSH_APPLIED);
    dp_members_finish(&f.members, 1, 0); /* done with its steps: the run ends, no MIN */
    CHECK_EQ(dp_policy_members_changed(f.policy), 1);
    CHECK_EQ(f.shard.version, 3);
    free(w0);
    fx_fini(&f);
}

/* Sync, R a fraction: ceil(F x the workers counted). */
static void test_sync_fraction(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_sync, 3, 3, 0, 0) != 0) {
        CHECK(0);
        return;
    }
    f.policy->conf.replicas_frac = 0.5f; /* ceil(1.5) = 2 of 3 */
    dp_push_outcome_t o;
    CHECK_EQ(fx_push(&f, 0, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 0);
    CHECK_EQ(fx_push(&f, 1, 0, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 1);
    dp_members_finish(&f.members, 2, 1); /* 2 counted: ceil(1) = 1 */
    dp_policy_members_changed(f.policy);
    CHECK_EQ(fx_push(&f, 0, 1, &o), DP_PUSH_APPLIED);
    CHECK_EQ(o.stepped, 1);
    char err[DP_ERR_LEN];
    int r = 0;
    float frac = 0;
    CHECK_EQ(dp_policy_replicas_parse("--r", "0.75", &r, &frac, err), 0);
    CHECK(r == 0 && frac == 0.75f);
    CHECK_EQ(dp_policy_replicas_parse("--r", "3", &r, &frac, err), 0);
    CHECK(r == 3 && frac == 0);
    CHECK_EQ(dp_policy_replicas_parse("--r", "1.5", &r, &frac, err), -1);
    CHECK(strstr(err, "fraction F in (0, 1]") != NULL);
    CHECK_EQ(dp_policy_replicas_parse("--r", "0", &r, &frac, err), -1);
    fx_fini(&f);
}

/* SSP, S = 0, elastic: a newcomer starts at the slowest live clock, so
 * nobody waits for it to catch up from 0, and the bound holds over the
 * live workers. */
static void test_ssp_newcomer(void)
{
    fx_t f;
    if (fx_init(&f, &dp_policy_ssp, 3, 3, 0, 0) != 0) {
        CHECK(0);
        return;
    }
    fx_elastic(&f, 1);
    dp_push_outcome_t o;
    dp_members_join(&f.members, 0);
    dp_policy_members_changed(f.policy);
    for (uint64_t v = 0; v < 5; v++) CHECK_EQ(fx_push(&f, 0, v, &o), DP_PUSH_APPLIED);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 1); /* alone: the slowest itself */
    dp_members_join(&f.members, 1);
    dp_policy_members_changed(f.policy);
    CHECK_EQ(f.policy->clock[1], 5);                   /* starts at the slowest live clock */
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 1); /* so worker 0 does not wait */
    CHECK_EQ(fx_push(&f, 0, 5, &o), DP_PUSH_APPLIED);
    CHECK_EQ(dp_policy_pull_ready(f.policy, 0, 0), 0); /* one ahead, S 0: waits for worker 1 */
    CHECK_EQ(dp_policy_pull_ready(f.policy, 1, 0), 1);
    fx_fini(&f);
}

/* --workers N | MIN:MAX, and its text. */
static void test_crew_parse(void)
{
    char err[DP_ERR_LEN];
    int min = -1, max = -1;
    CHECK_EQ(dp_opts_parse_crew("--workers", "3", 100, &min, &max, err), 0);
    CHECK(min == 0 && max == 3);
    CHECK_EQ(dp_opts_parse_crew("--workers", "1:4", 100, &min, &max, err), 0);
    CHECK(min == 1 && max == 4);
    CHECK_EQ(dp_opts_parse_crew("--workers", "4:2", 100, &min, &max, err), -1);
    CHECK(strstr(err, "MIN 4 is above MAX 2") != NULL);
    CHECK_EQ(dp_opts_parse_crew("--workers", "0:2", 100, &min, &max, err), -1);
    CHECK(strstr(err, "N or MIN:MAX") != NULL);
    CHECK_EQ(dp_opts_parse_crew("--workers", "1:", 100, &min, &max, err), -1);
    CHECK_EQ(dp_opts_parse_crew("--workers", "1:2:3", 100, &min, &max, err), -1);
    CHECK_EQ(dp_opts_parse_crew("--workers", "2:101", 100, &min, &max, err), -1);
    CHECK(min == 1 && max == 4); /* untouched by a refusal */
    char name[16]; /* and back to the text that parses to the same crew */
    dp_opts_crew_name(1, 4, name, sizeof name);
    CHECK_STR(name, "1:4");
    dp_opts_crew_name(0, 3, name, sizeof name);
    CHECK_STR(name, "3");
}

DP_TESTS(T(test_sync_decisions), T(test_sync_members), T(test_ssp_bound), T(test_async_staleness),
         T(test_async_adaptive), T(test_async_threshold), T(test_async_compensation), T(test_delay_conf),
         T(test_bad_conf), T(test_elastic_members), T(test_sync_elastic), T(test_sync_fraction),
         T(test_ssp_newcomer), T(test_crew_parse))
