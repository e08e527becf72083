/* ps_client: the client's small requests — stats, finish, the wait for
 * the others, shutdown — and what it tells of itself (versions, stamps,
 * bytes, the options' parsers); see ps_client.h. A pull is ps_pull.c's, a
 * push ps_push.c's; each request is a plan (what to ask each shard, what
 * to do with each reply) run by dp_ps_exchange, which owns the sockets,
 * the liveness rules and recovery (worker/client/ps_exchange.h). */
#include "worker/client/ps_client.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "worker/client/ps_exchange.h"

uint64_t dp_ps_client_bytes_pushed(const dp_ps_client_t *c)
{
    return c->bytes_pushed;
}

uint64_t dp_ps_client_bytes_pulled(const dp_ps_client_t *c)
{
    return c->bytes_pulled;
}

uint64_t dp_ps_client_resume_step(const dp_ps_client_t *c)
{
    uint64_t step = UINT64_MAX;
    for (int i = 0; i < c->n; i++)
        if (c->sh[i].worker_step < step) step = c->sh[i].worker_step;
    return c->n ? step : 0;
}

uint64_t dp_ps_client_updates_lost(const dp_ps_client_t *c)
{
    return c->updates_lost;
}

uint64_t dp_ps_client_version(const dp_ps_client_t *c)
{
    uint64_t v = 0;
    for (int i = 0; i < c->n; i++) v += c->sh[i].version;
    return v;
}

/* ---- stats, finish, shutdown ---------------------------------------- */

typedef struct {
    dp_ps_stats_t st;
    int finished, gone, num_workers; /* shard 0's worker counts */
} s_stats_acc_t;

/* A STATS reply's body, or NULL with what the reply was in *no (a refusal,
 * or another type). */
static const Downpour__Stats *s_stats_body(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                           dp_ps_reply_t *no, char *err)
{
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) *no = dp_ps_refused(c, i, env, err);
    else if (env->type != DOWNPOUR__MSG_TYPE__STATS || !env->stats)
        *no = dp_err(err, "%s: answered STATS with %s", c->sh[i].endpoint, dp_wire_type_name(env->type));
    else return env->stats;
    return NULL;
}

static dp_ps_reply_t s_on_stats(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_stats_acc_t *a = arg;
    dp_ps_reply_t no;
    const Downpour__Stats *s = s_stats_body(c, i, env, &no, err);
    if (!s) return no;
    if (i == 0) {
        a->st.applied = s->applied;
        a->st.dropped = s->dropped;
        a->st.rejected = s->rejected;
        a->st.staleness_mean = s->staleness_mean;
        a->st.staleness_max = s->staleness_max;
        a->st.staleness_bins = s->n_staleness_hist < DP_STATS_HIST_BINS ? s->n_staleness_hist : DP_STATS_HIST_BINS;
        if (a->st.staleness_bins) /* an empty repeated field is NULL */
            memcpy(a->st.staleness_hist, s->staleness_hist, a->st.staleness_bins * sizeof(uint64_t));
        a->finished = s->workers_finished;
        a->gone = s->workers_gone;
        a->num_workers = s->num_workers;
        a->st.env_steps = s->env_steps;
        a->st.episodes = s->episodes;
        a->st.return_mean_100 = s->return_mean_100;
        a->st.solved_at_env_steps = s->solved ? (int64_t)s->solved_at_env_steps : -1;
        size_t nc = s->n_return_curve_at < s->n_return_curve_mean ? s->n_return_curve_at : s->n_return_curve_mean;
        a->st.n_curve = nc < DP_EPISODES_CURVE ? (int)nc : DP_EPISODES_CURVE;
        for (int k = 0; k < a->st.n_curve; k++) {
            a->st.curve_at[k] = s->return_curve_at[k];
            a->st.curve_mean[k] = s->return_curve_mean[k];
        }
    }
    a->st.version += s->version;
    a->st.steps_early += s->steps_early;
    a->st.requests_refused += s->requests_refused;
    a->st.rows[i] = s->rows;
    if (i + 1 > a->st.rows_shards) a->st.rows_shards = i + 1;
    a->st.rows_evicted += s->rows_evicted;
    a->st.row_pushes += s->row_pushes;
    a->st.row_pushes_rejected += s->row_pushes_rejected;
    a->st.row_staleness_sum += s->row_staleness_sum;
    if (s->row_staleness_max > a->st.row_staleness_max) a->st.row_staleness_max = s->row_staleness_max;
    a->st.rows_bytes += s->rows_bytes;
    return DP_PS_REPLY_DONE;
}

/* STATS to every shard, or to shard 0 only (its worker counts suffice). */
static int s_stats(dp_ps_client_t *c, s_stats_acc_t *a, bool only_first, char *err)
{
    memset(a, 0, sizeof *a);
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__STATS, .n_shards = only_first ? 1 : c->n,
                     .on_reply = s_on_stats, .arg = a};
    return dp_ps_exchange(c, &plan, err);
}

int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err)
{
    s_stats_acc_t a;
    if (s_stats(c, &a, false, err) != 0) return -1;
    *out = a.st;
    return 0;
}

static dp_ps_reply_t s_on_membership(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                     const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    dp_ps_membership_t *m = arg;
    dp_ps_reply_t no;
    const Downpour__Stats *s = s_stats_body(c, i, env, &no, err);
    if (!s) return no;
    dp_ps_membership_fini(m); /* a repeated request: the last reply's */
    m->ev = dp_calloc(s->n_membership ? s->n_membership : 1, sizeof *m->ev);
    for (size_t k = 0; k < s->n_membership; k++) {
        const Downpour__MemberEvent *e = s->membership[k];
        m->ev[k] = (dp_ps_member_event_t){.join = e->join, .task = e->task, .version = e->version,
                                          .live = e->live};
        snprintf(m->ev[k].why, sizeof m->ev[k].why, "%s", e->why ? e->why : "");
    }
    m->n = s->n_membership;
    m->epochs = dp_calloc(s->n_epoch_samples ? s->n_epoch_samples : 1, sizeof *m->epochs);
    for (size_t k = 0; k < s->n_epoch_samples; k++) {
        const Downpour__EpochSamples *e = s->epoch_samples[k];
        m->epochs[k] = (dp_ps_epoch_samples_t){e->epoch, e->trained, e->repeated,
                                               e->retrained_after_death, e->batches};
    }
    m->n_epochs = s->n_epoch_samples;
    m->deal_foreign = s->deal_foreign;
    m->live_min = s->live_min;
    m->live_max = s->live_max;
    m->live = s->workers_live;
    return DP_PS_REPLY_DONE;
}

int dp_ps_client_membership(dp_ps_client_t *c, dp_ps_membership_t *out, char *err)
{
    memset(out, 0, sizeof *out);
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__STATS, .n_shards = 1,
                         .on_reply = s_on_membership, .arg = out};
    if (dp_ps_exchange(c, &plan, err) == 0) return 0;
    dp_ps_membership_fini(out);
    return -1;
}

void dp_ps_membership_fini(dp_ps_membership_t *m)
{
    free(m->ev);
    free(m->epochs);
    m->ev = NULL;
    m->epochs = NULL;
    m->n = m->n_epochs = 0;
}

/* A reply without a body of interest: the request's own type, or ERROR. */
static dp_ps_reply_t s_on_bare(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                               const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    int want = *(const int *)arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if ((int)env->type != want)
        return dp_err(err, "%s: answered %s with %s", c->sh[i].endpoint, dp_wire_type_name(want),
                      dp_wire_type_name(env->type));
    return DP_PS_REPLY_DONE;
}

static void s_build_finished(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    (void)c, (void)i, (void)arg;
    Downpour__Barrier *b = &rq->body.barrier;
    *b = (Downpour__Barrier)DOWNPOUR__BARRIER__INIT;
    b->finished = 1;
    rq->env.barrier = b;
}

static void s_build_leave(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    s_build_finished(c, i, rq, arg);
    rq->body.barrier.leave = 1;
}

static int s_finish(dp_ps_client_t *c, bool leave, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__BARRIER; /* the reply's type */
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__BARRIER, .n_shards = c->n,
                         .build = leave ? s_build_leave : s_build_finished, .on_reply = s_on_bare,
                         .arg = &want};
    if (dp_ps_exchange(c, &plan, err) != 0) return -1;
    c->finished = true;
    return 0;
}

int dp_ps_client_finish(dp_ps_client_t *c, char *err)
{
    return s_finish(c, false, err);
}

int dp_ps_client_leave(dp_ps_client_t *c, char *err)
{
    return s_finish(c, true, err);
}

void dp_ps_client_set_stop(dp_ps_client_t *c, volatile sig_atomic_t *stop)
{
    c->stop = stop;
}

void dp_ps_client_set_compress(dp_ps_client_t *c, const dp_compress_conf_t *z)
{
    c->compress = *z;
    for (int i = 0; i < c->n; i++)
        if (c->sh[i].z) {
            dp_compressor_fini(c->sh[i].z);
            free(c->sh[i].z);
            c->sh[i].z = NULL;
        }
}

int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err)
{
    if (!c->finished && dp_ps_client_finish(c, err) != 0) return -1;
    double t0 = dp_now();
    for (;;) {
        s_stats_acc_t a;
        if (s_stats(c, &a, true, err) != 0) return -1;
        int done = a.finished + a.gone;
        if (done >= a.num_workers) return 0;
        if (dp_now() - t0 >= timeout_s) {
            c->code = DP_PS_ERR_TIMEOUT;
            return dp_err(err, "%d of %d workers still running after %.0f s",
                          a.num_workers - done, a.num_workers, timeout_s);
        }
        if (c->stop && *c->stop) {
            c->code = DP_PS_ERR_INTERRUPTED;
            return dp_err(err, "interrupted");
        }
        dp_ps_sleep(0.1);
    }
}

int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__SHUTDOWN; /* the reply's type */
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__SHUTDOWN, .n_shards = c->n,
                     .on_reply = s_on_bare, .arg = &want};
    return dp_ps_exchange(c, &plan, err);
}

int dp_ps_client_shm_shards(const dp_ps_client_t *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++) k += c->sh[i].shm;
    return k;
}

int dp_ps_transport_parse(const char *s, dp_ps_transport_t *out, char *err)
{
    if (s && strcmp(s, "auto") == 0) *out = DP_PS_TRANSPORT_AUTO;
    else if (s && strcmp(s, "shm") == 0) *out = DP_PS_TRANSPORT_SHM;
    else if (s && strcmp(s, "zmq") == 0) *out = DP_PS_TRANSPORT_ZMQ;
    else return dp_err(err, "'%s' is not a transport (auto, shm or zmq)", s ? s : "");
    return 0;
}

int dp_ps_wire_parse(const char *s, dp_ps_wire_t *out, char *err)
{
    if (s && strcmp(s, "fp32") == 0) *out = DP_PS_WIRE_FP32;
    else if (s && strcmp(s, "bf16") == 0) *out = DP_PS_WIRE_BF16;
    else return dp_err(err, "'%s' is not a wire precision (fp32 or bf16)", s ? s : "");
    return 0;
}

/* ---- pushing on an earlier pull's versions ---------------------------- */

void dp_ps_client_stamp(const dp_ps_client_t *c, dp_ps_stamp_t *out)
{
    out->n = c->n;
    for (int i = 0; i < c->n; i++) out->v[i] = c->sh[i].version;
}

uint64_t dp_ps_stamp_sum(const dp_ps_stamp_t *s)
{
    uint64_t v = 0;
    for (int i = 0; i < s->n; i++) v += s->v[i];
    return v;
}
