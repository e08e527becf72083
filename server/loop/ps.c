/* ps: the parameter-server shard's event loop — the ROUTER socket,
 * receiving under hard limits, validation, dispatch to one handler per
 * request type, held (deferred) pulls, pushes whole and in parts, the loop
 * itself; its state and the other files of the loop (admission and HELLO,
 * replies, checkpoints / metrics / STATS) are server/loop/ps_loop.h. The
 * shard's state and update are server/core/shard.h, the consistency policies
 * server/core/policy.h, liveness server/crew/members.h, checkpoints
 * server/core/shard_checkpoint.h, the early step server/core/shard_early.h; none of
 * those knows about sockets. The file reads from the handlers of a request
 * up to what receives it (s_handle) and the loop (dp_ps_run) at its end.
 *
 * Invariants:
 *  - Nothing touches the shard or a counter other than "rejected" /
 *    "requests_refused" / "malformed" before the message passed the size limits, dp_wire_check,
 *    the fingerprint, the worker id and (for gradients) the range and the
 *    finite check.
 *  - PARAMS replies hand ZeroMQ the shard's live buffer itself (no copy),
 *    with a reference released by ZeroMQ's free callback; while one is held
 *    the shard writes the next version into another buffer (server/core/shard.h),
 *    so a reply never goes out torn. Co-located workers that asked for it
 *    read the live buffer out of shared memory instead (server/loop/ps_shm.h).
 *  - What one peer can make the shard hold is bounded per worker id: at
 *    most DP_PS_PARAMS_PER_WORKER PARAMS frames ZeroMQ has not sent yet
 *    (each a reference to one buffer of the shard's range; a pull beyond
 *    that is answered "busy"), at most DP_PS_HELD_PER_WORKER held pulls (a
 *    pull beyond that is refused), and per connection at most DP_PS_SNDHWM
 *    replies queued (ZeroMQ drops a ROUTER's further replies to a peer that
 *    does not read). So the shard's parameter buffers number at most
 *    DP_SHARD_RETIRED + 2 (live, bfloat16) + DP_PS_PARAMS_PER_WORKER per
 *    worker, whatever a peer sends (dp_snap_alive, "snapshots" in the
 *    metrics); a worker that pushes in parts adds one buffer of the range
 *    (its assembly, server/core/shard_parts.h), allocated once, and the early
 *    step (one push at a time stepped as its parts come) one
 *    buffer and one copy of the optimizer state (server/core/shard_early.h).
 *  - A push's step (a row push's too, server/core/ps_rows.c) is plausible
 *    (dp_shard_step_check) before it can count
 *    as a repeat or be recorded as applied: one message cannot push a
 *    worker's step high-water mark (and its checkpoint) out of reach.
 *  - A version that moved is checkpointed (when due) before the reply that
 *    reports it; held pulls are asked again after every change.
 *  - Every blocking wait is zmq_poll with a timeout of at most 100 ms, so the
 *    stop flag is seen promptly. A ZeroMQ failure inside the loop is logged
 *    and counted (net_errors), never fatal. */
#include "server/loop/ps.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/compress.h"
#include "proto/curve.h"
#include "proto/zsock.h"
#include "server/core/pool.h"
#include "server/core/push_apply.h"
#include "server/core/shard_dc.h"
#include "server/loop/ps_loop.h"

/* Messages ZeroMQ may queue per peer before it stops reading that peer's
 * connection (the default is 1000). A worker has one request per shard in
 * flight, plus a heartbeat now and then while a pull is held (answered at
 * once), or a push's parts (sent as its backward makes them; those past 8
 * wait on the worker's side of the connection, nothing is lost); 8 leaves
 * room for a tool and bursts while capping how many messages one peer can
 * park in ZeroMQ's queue. */
#define S_RCVHWM 8

/* ---- held pulls, members ---------------------------------------------- */

/* Answer every held pull the policy (and the dealer) now allows, in
 * arrival order. */
static void s_release_pending(dp_ps_loop_t *ps)
{
    int j = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        dp_ps_pending_t *p = &ps->pending[i];
        if (dp_policy_pull_ready(ps->policy, p->worker, p->min_version) &&
            dp_ps_deal_answer_pull(ps, &p->identity, p->request_id, p->worker, &p->ask, p->deal_step)) {
            dp_wire_msg_close(&p->identity);
            ps->held[p->worker]--;
            continue;
        }
        if (j != i) {
            char err[DP_ERR_LEN];
            ps->pending[j] = *p; /* the identity is moved below, not copied */
            if (dp_wire_msg_move(&ps->pending[j].identity, &p->identity, err) != 0) {
                ps->net_errors++;
                dp_log_warn("shard %d: held pull of worker %d lost: %s", ps->cfg->shard_index,
                            p->worker, err);
                dp_wire_msg_close(&p->identity);
                ps->held[p->worker]--;
                continue;
            }
            dp_wire_msg_close(&p->identity);
        }
        j++;
    }
    ps->n_pending = j;
}

/* The member table changed: tell the policy, then re-ask the held pulls. */
void dp_ps_members_changed(dp_ps_loop_t *ps)
{
    dp_record_members(ps->rec, ps->cfg->shard_index, &ps->members);
    /* DyLU: a worker gone or finished no longer sets the crew's fastest */
    for (int w = 0; ps->cfg->local_auto && w < ps->members.n; w++)
        if (ps->members.w[w].gone || ps->members.w[w].finished) dp_dylu_forget(&ps->speeds, w);
    int news = dp_membership_note(&ps->membership, &ps->members, ps->shard.version);
    dp_ps_metrics_members(ps, news);
    dp_ps_deal_members(ps, news);
    if (dp_policy_members_changed(ps->policy)) dp_ps_version_moved(ps);
    s_release_pending(ps);
}

/* A held pull proves nothing (its worker may have died waiting): workers
 * send HEARTBEATs while they wait and while they compute (worker/client/ps_beat.h).
 * Nor does a live worker's heartbeat hold its dealt batches: each is
 * leased (server/crew/deal.h), and the dealer's clock is this tick's, after
 * every poll, which stamps the deals and pushes handled before the next. */
static void s_sweep(dp_ps_loop_t *ps, double now)
{
    if (dp_members_sweep(&ps->members, now, ps->cfg->heartbeat_timeout) > 0)
        dp_ps_members_changed(ps);
    if (dp_ps_deal_tick(ps, now) > 0) s_release_pending(ps);
}

/* SIGHUP under CURVE: the allow list read again. A key added is let in
 * from its next handshake; a key removed is refused from the next message
 * of any connection it holds (dp_ps_admit), and the worker id it held is
 * free and no longer counted. An allow list that cannot be read, names no
 * key or names keys wrongly for the workers (server/loop/auth.h) leaves the
 * old one in force, with one line. */
static void s_reload_allow(dp_ps_loop_t *ps)
{
    char err[DP_ERR_LEN];
    int shard = ps->cfg->shard_index;
    if (!ps->zap) {
        dp_log_info("shard %d: SIGHUP: no allow list to read (no --curve-secret)", shard);
        return;
    }
    if (dp_zap_reload(ps->zap, err) != 0) {
        dp_log_warn("shard %d: SIGHUP: the allow list stays as it was: %s", shard, err);
        return;
    }
    int n = dp_zap_allowed(ps->zap);
    dp_auth_key_t *keys = dp_calloc((size_t)n, sizeof *keys);
    for (int i = 0; i < n; i++) keys[i].key = dp_zap_key(ps->zap, i, &keys[i].file)->z85;
    unsigned char *dropped = dp_calloc((size_t)ps->members.n, 1);
    int rc = dp_auth_rekey(&ps->auth, keys, n, dropped, err);
    free(keys);
    if (rc != 0) {
        dp_zap_rollback(ps->zap);
        dp_log_warn("shard %d: SIGHUP: the allow list stays as it was: %s", shard, err);
        free(dropped);
        return;
    }
    int changed = 0;
    for (int i = 0; i < ps->members.n; i++) {
        if (!dropped[i]) continue;
        dp_log_warn("shard %d: SIGHUP: worker %d's key is no longer allowed: its connection is "
                    "refused from now on", shard, i);
        changed |= dp_members_drop(&ps->members, i);
    }
    free(dropped);
    dp_log_info("shard %d: SIGHUP: allow list read again: %d keys, %d named after their task", shard,
                n, ps->auth.n_named);
    if (changed) dp_ps_members_changed(ps);
}

/* ---- start-up --------------------------------------------------------- */

/* --startup-timeout: every worker said HELLO by the deadline (elastic: MIN
 * of them), or the shard fails naming those that did not (their ids: their
 * --task-index). */
static int s_check_startup(dp_ps_loop_t *ps, double now, char *err)
{
    if (ps->startup_deadline <= 0) return 0;
    char ids[120];
    int missing = dp_members_missing(&ps->members, ids, sizeof ids);
    int min = ps->members.min;
    int ok = min > 0 ? ps->members.n - missing >= min : missing == 0;
    if (ok) ps->startup_deadline = 0; /* checked once: later silence is liveness */
    if (ok || now < ps->startup_deadline) return 0;
    if (min > 0)
        return dp_err(err, "start-up: %d of at least %d workers said HELLO within %g s "
                      "(--startup-timeout, --workers %d:%d); are they running with this shard "
                      "(%s) in --ps?", ps->members.n - missing, min, ps->cfg->startup_timeout,
                      min, ps->members.n, ps->endpoint);
    return dp_err(err, "start-up: %d of %d workers never said HELLO within %g s (--startup-timeout): "
                  "worker id(s) %s; are they running with this shard (%s) in --ps?",
                  missing, ps->members.n, ps->cfg->startup_timeout, ids, ps->endpoint);
}

/* ---- request handlers ------------------------------------------------- */

/* What a PULL asks of its reply; -1 with why (its cuts outside the
 * range). dp_wire_check has seen them ascending and fewer than the limit. */
static int s_params_ask(const dp_ps_loop_t *ps, const Downpour__Envelope *env,
                        dp_ps_params_ask_t *ask, char *why)
{
    const Downpour__Pull *p = env->pull;
    ask->how = env->devregion ? DP_PS_PARAMS_DEVREGION
               : env->shm     ? DP_PS_PARAMS_SHM
               : p->no_checksum ? DP_PS_PARAMS_NO_CRC
                                : DP_PS_PARAMS_CRC;
    ask->bf16 = p->dtype == DOWNPOUR__DTYPE__BFLOAT16;
    ask->n_cuts = 0;
    if (ask->how == DP_PS_PARAMS_SHM || ask->how == DP_PS_PARAMS_DEVREGION)
        return 0; /* the slot, the ring entry, goes whole */
    uint64_t lo = ps->shard.lo, hi = lo + ps->shard.n;
    for (size_t k = 0; k < p->n_cuts; k++) {
        if (p->cuts[k] <= lo || p->cuts[k] >= hi)
            return dp_err(why, "bad PULL: cut %zu at %llu is not inside this shard's floats (%llu, %llu)",
                          k, (unsigned long long)p->cuts[k], (unsigned long long)lo,
                          (unsigned long long)hi);
        ask->cuts[k] = p->cuts[k];
    }
    ask->n_cuts = (uint32_t)p->n_cuts;
    return 0;
}

void dp_ps_on_pull(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                   const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    int wid = env->worker_id;
    dp_ps_params_ask_t ask;
    char why[DP_ERR_LEN];
    if (s_params_ask(ps, env, &ask, why) != 0) {
        dp_log_warn("shard %d: worker %d: %s", ps->cfg->shard_index, wid, why);
        dp_ps_reply_error(ps, id, env->request_id, wid, why);
        return;
    }
    uint64_t deal_step = ps->dealing ? env->pull->deal_step : 0; /* only shard 0 deals */
    if (dp_policy_pull_ready(ps->policy, wid, env->pull->min_version) &&
        dp_ps_deal_answer_pull(ps, id, env->request_id, wid, &ask, deal_step))
        return;
    /* Per worker, so one that floods pulls is refused and the others wait
     * as ever. A worker holds one pull per shard, two or three after it
     * repeated one (a restart, a lost reply). */
    if (ps->held[wid] >= DP_PS_HELD_PER_WORKER) {
        char msg[DP_ERR_LEN];
        snprintf(msg, sizeof msg,
                 "too many held pulls: worker %d has %d pulls waiting at this shard already (at "
                 "most %d)", wid, ps->held[wid], DP_PS_HELD_PER_WORKER);
        dp_ps_reply_error(ps, id, env->request_id, wid, msg);
        return;
    }
    dp_ps_pending_t *p = &ps->pending[ps->n_pending];
    char err[DP_ERR_LEN];
    if (dp_wire_msg_copy(&p->identity, id, err) != 0) {
        ps->net_errors++;
        dp_log_warn("shard %d: pull of worker %d not held: %s", ps->cfg->shard_index, wid, err);
        return;
    }
    p->request_id = env->request_id;
    p->worker = wid;
    p->min_version = env->pull->min_version;
    p->ask = ask;
    p->deal_step = deal_step;
    ps->n_pending++;
    ps->held[wid]++;
}

/* A push of a (worker, step) this shard applied already (its ACK was lost,
 * or the worker repeated it after a timeout): acknowledged as APPLIED —
 * from the worker's side it was, once — with the reason saying it was a
 * repeat; counted in "repeats" only, not applied again. 1 when answered. */
static int s_push_repeated(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    if (!dp_shard_step_seen(&ps->shard, env->worker_id, env->push->step)) return 0;
    ps->shard.counts.repeats++;
    dp_push_outcome_t o = {.status = DP_PUSH_APPLIED};
    snprintf(o.reason, sizeof o.reason, "repeat: step %" PRIu64 " of worker %d was applied before",
             env->push->step, env->worker_id);
    dp_log_debug("shard %d: %s", ps->cfg->shard_index, o.reason);
    dp_ps_reply_ack(ps, id, env->request_id, env->worker_id, &o);
    return 1;
}

/* Test hook, read here only: DP_TEST_KILL_AT_VERSION=V makes the shard die
 * as by kill -9 (SIGKILL: no checkpoint, no reply, nothing flushed) on the
 * first PUSH of worker 0 (the chief) computed on version V or later, before
 * applying it. The chief has then seen that version, so a restart test
 * knows what is lost: the versions after the last checkpoint up to the one
 * logged here (in sync mode the shard's version is the push's). */
static void s_test_kill_at_version(const dp_ps_loop_t *ps, const Downpour__Envelope *env)
{
    const char *v = getenv("DP_TEST_KILL_AT_VERSION");
    if (!v || !v[0] || env->worker_id != 0 || env->push->version < strtoull(v, NULL, 10)) return;
    fprintf(stderr, "downpour-ps: DP_TEST_KILL_AT_VERSION: dying as by kill -9 at version %" PRIu64
            " (a push of worker 0 on version %" PRIu64 ")\n", ps->shard.version, env->push->version);
    raise(SIGKILL);
}

/* An actor-critic push's segment, within the bounds (dp_ps_on_push), into
 * the run's account and the record (a replay checks each segment it
 * recomputes against the record's). */
static void s_count_episodes(dp_ps_loop_t *ps, const Downpour__Push *p)
{
    if (p->env_steps == 0 && p->n_episode_returns == 0) return;
    double sum = dp_account_add(&ps->episodes, p);
    dp_record_account(ps->rec, p->env_steps, p->n_episode_returns, sum);
}

/* A push whose account breaks the shard's bounds (server/core/account.h):
 * refused whole before anything of it is taken, ERROR ERR_ACCOUNT (an
 * actor-critic worker stops on it: its flags are not the shards'), counted;
 * the worker's half-sent push in parts, if this was a part, discarded with
 * its early step. One line, the first ten, then one in a thousand. */
static void s_refuse_account(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                             const char *why)
{
    int wid = env->worker_id;
    if (dp_wire_push_parts(env->push) > 1) {
        dp_shard_early_hello(&ps->early, wid);
        dp_shard_parts_drop(&ps->parts, wid);
    }
    uint64_t n = ++ps->account_refused;
    if (n <= 10 || n % 1000 == 0)
        dp_log_warn("shard %d: worker %d: push of step %" PRIu64 " refused (%" PRIu64 " so far): %s",
                    ps->cfg->shard_index, wid, env->push->step, n, why);
    dp_ps_reply_push_error_code(ps, id, env->request_id, wid, DOWNPOUR__ERROR_CODE__ERR_ACCOUNT, why);
}

/* A push's DyLU fields (Push.local_steps, Push.step_ms): with --local-steps
 * auto its round's steps in 1..H and a step time of 0 (none yet) or in
 * range; without, neither. -1 with one line in msg otherwise: a round
 * whose steps are unknown could not be replayed, and a step time out of
 * range would set every other worker's H. */
static int s_check_round(const dp_ps_config_t *cfg, const Downpour__Push *p, char *msg, size_t n)
{
    if (!cfg->local_auto) {
        if (p->local_steps == 0 && p->step_ms == 0) return 0;
        snprintf(msg, n, "malformed: PUSH with a round's steps or step time, to a shard not running "
                 "--local-steps auto");
        return -1;
    }
    if (p->local_steps >= 1 && p->local_steps <= (uint64_t)cfg->local_steps &&
        (p->step_ms == 0 || dp_dylu_valid_ms(p->step_ms)))
        return 0;
    snprintf(msg, n, "malformed: PUSH of a round of %" PRIu32 " steps at %g ms a step: --local-steps "
             "auto:%ld takes 1..%ld steps and a step time of 0 or %g..%g ms", p->local_steps,
             (double)p->step_ms, cfg->local_steps, cfg->local_steps, DP_DYLU_MIN_MS, DP_DYLU_MAX_MS);
    return -1;
}

static void s_push_refused(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                           const char *why);

/* A gradient that passed the wire's checks (g: n slices tiling the range,
 * all finite), whole or assembled from its parts: the state values' check,
 * the repeat check, the policy, the record, the reply. */
static void s_push_apply(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                         const dp_grad_slice_t *g, int n_frames)
{
    int wid = env->worker_id;
    char msg[DP_ERR_LEN];
    if (dp_shard_state_check(&ps->shard, g, n_frames, msg) != 0) {
        s_push_refused(ps, id, env, msg);
        return;
    }
    if (s_push_repeated(ps, id, env)) return;
    s_test_kill_at_version(ps, env);
    if (dp_ps_deal_unknown(ps, wid, env->push->step)) {
        dp_ps_reply_rejected(ps, id, env->request_id, wid,
                             "its batch was dealt before shard 0 restarted: dealt again");
        return;
    }
    dp_push_outcome_t o;
    bool early = dp_shard_early_of(&ps->early, wid, env->push->step); /* the policy may commit it */
    const dp_push_apply_t a = {.policy = ps->policy, .rows = &ps->rows, .rec = ps->rec,
                               .members = &ps->members, .shard = ps->cfg->shard_index};
    dp_push_apply(&a, wid, env->push->version, g, n_frames, early, &o);
    s_count_episodes(ps, env->push);
    dp_deal_batch_t batch;
    const dp_deal_batch_t *carried =
        dp_ps_deal_pushed(ps, wid, env->push->step, o.status == DP_PUSH_APPLIED, &batch);
    if (ps->cfg->local_auto) { /* DyLU: the round's steps (a replay's), the worker's speed */
        dp_record_round(ps->rec, env->push->local_steps);
        dp_dylu_report(&ps->speeds, wid, env->push->step_ms);
    }
    dp_push_apply_record(&a, wid, env->push->step, env->push->version, &o, ps->shard.version, carried);
    /* before a due checkpoint, so the file holds the step with its update */
    if (o.status == DP_PUSH_APPLIED) dp_shard_step_done(&ps->shard, wid, env->push->step);
    if (o.stepped) dp_ps_version_moved(ps);
    dp_ps_reply_ack(ps, id, env->request_id, wid, &o);
    /* the dealer changed too: a batch done, or back in the pool */
    if (o.status == DP_PUSH_APPLIED || carried) s_release_pending(ps);
    /* after the replies: the next early step's catch-up should not delay them */
    dp_shard_early_pushed(&ps->early, wid, env->push->step);
}

/* A push refused before the policy saw it: REJECTED, and its batch (if
 * shard 0 dealt it one) back to the pool. */
static void s_push_refused(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                           const char *why)
{
    dp_ps_reply_rejected(ps, id, env->request_id, env->worker_id, why);
    dp_deal_batch_t b;
    if (dp_ps_deal_pushed(ps, env->worker_id, env->push->step, 0, &b)) s_release_pending(ps);
}

/* A part of a push in parts (Push.parts > 1): the same step checks as a
 * whole push, then server/core/shard_parts.h checks and copies it; the part
 * that completes the push takes the whole push's path with the assembled
 * gradient, the others are answered RECEIVED (or REJECTED: the rule for a
 * bad part, ARCHITECTURE.md). */
static void s_on_push_part(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                           const dp_wire_frame_t *frames, int n_frames)
{
    char msg[DP_ERR_LEN];
    int wid = env->worker_id;
    if (dp_shard_step_check(&ps->shard, wid, env->push->step, msg, sizeof msg) != 0) {
        dp_ps_reply_push_error(ps, id, env->request_id, wid, msg);
        return;
    }
    dp_shard_step_handled(&ps->shard, wid, env->push->step);
    if (s_push_repeated(ps, id, env)) return;
    dp_grad_slice_t g;
    int first = ps->parts.w[wid].rejected_step != env->push->step; /* counted once a push */
    const float *shm = env->shm ? dp_ps_shm_grad_floats(ps->shm, wid) : NULL;
    dp_parts_result_t res = dp_shard_parts_add(&ps->parts, wid, env, frames, n_frames, shm, &g, msg);
    dp_shard_early_part(&ps->early, wid, env->push->step, res);
    switch (res) {
    case DP_PARTS_RECEIVED: {
        dp_push_outcome_t o = {.status = DP_PUSH_RECEIVED};
        snprintf(o.reason, sizeof o.reason, "%s", msg);
        dp_ps_reply_ack(ps, id, env->request_id, wid, &o);
        return;
    }
    case DP_PARTS_REJECTED: {
        dp_log_debug("shard %d: worker %d: %s", ps->cfg->shard_index, wid, msg);
        if (first) {
            s_push_refused(ps, id, env, msg); /* counted there */
            return;
        }
        dp_push_outcome_t o = {.status = DP_PUSH_REJECTED};
        snprintf(o.reason, sizeof o.reason, "%s", msg);
        dp_ps_reply_ack(ps, id, env->request_id, wid, &o);
        return;
    }
    case DP_PARTS_COMPLETE: s_push_apply(ps, id, env, &g, 1); return;
    }
}

void dp_ps_on_push(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                   const dp_wire_frame_t *frames, int n_frames)
{
    char msg[DP_ERR_LEN];
    int wid = env->worker_id;
    /* Through the device region: its slot taken before anything else, so
     * whatever becomes of the push the slot is the worker's again; a push
     * the region's rules refuse (none granted, no completed push, a count
     * jump, not finite) is answered with one line, nothing applied. */
    dp_grad_slice_t dg;
    if (env->devregion && dp_ps_devr_take(ps->devr, wid, &dg, msg) != 0) {
        dp_log_debug("shard %d: worker %d: %s", ps->cfg->shard_index, wid, msg);
        dp_ps_reply_push_error(ps, id, env->request_id, wid, msg);
        return;
    }
    /* First: what it says of its segment is checked like its gradient,
     * and a lie refuses the whole push, whole or a part. */
    if (dp_account_check(&ps->account, env->push, msg, sizeof msg) != 0) {
        s_refuse_account(ps, id, env, msg);
        return;
    }
    if (s_check_round(ps->cfg, env->push, msg, sizeof msg) != 0) {
        dp_ps_reply_push_error(ps, id, env->request_id, wid, msg);
        return;
    }
    if (dp_wire_push_parts(env->push) > 1) {
        s_on_push_part(ps, id, env, frames, n_frames);
        return;
    }
    /* A compressed gradient (--compress) is checked against this shard's
     * slice and expanded into scratch, a dense gradient from there on. */
    int compressed = env->push->compression != DOWNPOUR__COMPRESSION__COMPRESS_NONE;
    if (compressed ? dp_compress_expand_wire(env, frames, n_frames, ps->shard.lo, ps->shard.hi,
                                             ps->shard.scratch, msg) != 0
                   : dp_wire_check_range(env, ps->shard.lo, ps->shard.hi, msg) != 0) {
        dp_ps_reply_push_error(ps, id, env->request_id, wid, msg);
        return;
    }
    /* Before it may count as a repeat or be recorded: a step out of reach
     * would make the worker's real pushes repeats, in the checkpoint too. */
    if (dp_shard_step_check(&ps->shard, wid, env->push->step, msg, sizeof msg) != 0) {
        dp_ps_reply_push_error(ps, id, env->request_id, wid, msg);
        return;
    }
    /* Handled whatever becomes of it (dropped, refused as non-finite): the
     * worker's next step follows this one. */
    dp_shard_step_handled(&ps->shard, wid, env->push->step);
    dp_shard_early_whole(&ps->early, wid, env->push->step);
    if (dp_shard_parts_whole(&ps->parts, wid, env->push->step, msg) != 0) {
        s_push_refused(ps, id, env, msg);
        return;
    }
    dp_grad_slice_t g[DP_WIRE_MAX_TENSORS];
    int bf16[DP_WIRE_MAX_TENSORS];
    for (int f = 0; f < n_frames; f++) {
        g[f] = (dp_grad_slice_t){frames[f].data, frames[f].len, env->tensors[f]->offset};
        bf16[f] = env->tensors[f]->dtype == DOWNPOUR__DTYPE__BFLOAT16;
    }
    if (compressed) {
        g[0] = (dp_grad_slice_t){ps->shard.scratch, ps->shard.n * sizeof(float), ps->shard.lo};
        n_frames = 1;
    } else {
        n_frames = dp_shard_widen(&ps->shard, g, bf16, n_frames); /* --wire bf16: float32 in scratch */
    }
    int rejected = 0;
    if (env->shm && (!ps->shm || dp_ps_shm_gradient(ps->shm, wid, env, &g[0], &rejected, msg) != 0)) {
        if (rejected) s_push_refused(ps, id, env, msg);
        else dp_ps_reply_push_error(ps, id, env->request_id, wid,
                                    ps->shm ? msg : "malformed: PUSH through shared memory, which "
                                                    "this shard has not granted");
        return;
    }
    if (env->devregion) { /* the region's copy, checked finite as it was taken */
        g[0] = dg;
        n_frames = 1;
    } else if (env->shm) n_frames = 1; /* the private copy */
    else if (dp_shard_grad_nonfinite(&ps->shard, g, n_frames)) {
        dp_wire_frame_t fw[DP_WIRE_MAX_TENSORS];
        for (int f = 0; f < n_frames; f++) fw[f] = (dp_wire_frame_t){g[f].data, g[f].len};
        dp_wire_check_finite(fw, n_frames, msg); /* names the element */
        s_push_refused(ps, id, env, msg);
        return;
    }
    s_push_apply(ps, id, env, g, n_frames);
}

void dp_ps_on_barrier(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    if (env->barrier->finished) dp_members_finish(&ps->members, env->worker_id, env->barrier->leave);
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, DOWNPOUR__MSG_TYPE__BARRIER, env->request_id, env->worker_id);
    Downpour__Barrier b = DOWNPOUR__BARRIER__INIT;
    int joined;
    dp_members_counts(&ps->members, &joined, &b.workers_finished, &b.workers_gone);
    b.finished = env->barrier->finished;
    b.num_workers = ps->members.n;
    rep.barrier = &b;
    dp_ps_send(ps, id, &rep, NULL, 0);
    dp_ps_members_changed(ps);
}

/* ---- receiving: limits, validation, dispatch --------------------------- */

/* A message over the limits, already discarded by dp_wire_recv_bounded. */
static void s_refuse_oversized(dp_ps_loop_t *ps, dp_wire_rx_t *rx)
{
    char msg[DP_ERR_LEN];
    snprintf(msg, sizeof msg,
             "malformed: message of %zu bytes in %d frames refused (this shard takes at most %zu "
             "bytes in %d frames)",
             rx->n_bytes, rx->n_total, ps->max_msg, DP_WIRE_MAX_PARTS);
    if (rx->n_parts > 0) { /* the ROUTER identity: answerable */
        dp_ps_reply_error(ps, &rx->parts[0], 0, -1, msg);
        return;
    }
    ps->shard.counts.malformed++;
    ps->shard.counts.requests_refused++;
    dp_log_debug("shard %d: %s", ps->cfg->shard_index, msg);
}

/* An admitted request to its handler, the row admission found it in. */
static void s_dispatch(dp_ps_loop_t *ps, const dp_ps_msg_t *m, zmq_msg_t *id,
                       const Downpour__Envelope *env, const dp_wire_frame_t *frames, int n_frames)
{
    /* each admitted request in arrival order (DP_LOG=debug): what a worker asked, and when */
    dp_log_debug("shard %d: %s from worker %d", ps->cfg->shard_index, dp_wire_type_name(env->type),
                 env->worker_id);
    m->on(ps, id, env, frames, n_frames);
}

/* One received multipart: limits, decode, structural checks, admission,
 * then its handler. */
static void s_handle(dp_ps_loop_t *ps, dp_wire_rx_t *rx)
{
    char err[DP_ERR_LEN];
    if (rx->n_total > rx->n_parts) {
        s_refuse_oversized(ps, rx);
        return;
    }
    zmq_msg_t *id = &rx->parts[0]; /* ROUTER always prepends the identity */
    if (rx->n_parts < 2) {
        dp_ps_reply_error(ps, id, 0, -1, "malformed: message without an envelope frame");
        return;
    }
    Downpour__Envelope *env =
        dp_wire_decode(zmq_msg_data(&rx->parts[1]), zmq_msg_size(&rx->parts[1]), err);
    if (!env) {
        dp_ps_reply_error(ps, id, 0, -1, err);
        return;
    }
    dp_wire_frame_t frames[DP_WIRE_MAX_TENSORS];
    int n_frames = rx->n_parts - 2; /* <= DP_WIRE_MAX_TENSORS: the part limit */
    for (int i = 0; i < n_frames; i++) {
        frames[i].data = zmq_msg_data(&rx->parts[2 + i]);
        frames[i].len = zmq_msg_size(&rx->parts[2 + i]);
    }
    ps->peer_key = ps->zap ? zmq_msg_gets(&rx->parts[1], "User-Id") : NULL;
    ps->peer_addr = zmq_msg_gets(&rx->parts[1], "Peer-Address");
    const dp_ps_msg_t *m = NULL;
    if (dp_wire_check(env, frames, n_frames, err) != 0)
        dp_ps_reply_error(ps, id, env->request_id, env->worker_id, err);
    else if ((m = dp_ps_admit(ps, id, env)) != NULL)
        s_dispatch(ps, m, id, env, frames, n_frames);
    dp_wire_destroy(&env);
}

/* ---- setup and loop --------------------------------------------------- */

static int s_setopt(void *sock, int opt, const void *v, size_t len, const char *name, char *err)
{
    if (zmq_setsockopt(sock, opt, v, len) == 0) return 0;
    return dp_err(err, "socket option %s: %s", name, zmq_strerror(errno));
}

/* CURVE on the ROUTER and its gate (before bind), with --curve-secret. */
static int s_secure(dp_ps_loop_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (!cfg->curve_secret[0]) return 0;
    dp_curve_key_t sec, pub;
    if (dp_curve_read_secret(cfg->curve_secret, &sec, &pub, err) != 0 ||
        dp_curve_serve(ps->sock, &sec, err) != 0 ||
        dp_zap_new(&ps->zap, ps->ctx, ps->sock, cfg->curve_allow, err) != 0)
        return -1;
    /* Keys named after a task own that task's worker id (server/loop/auth.h). */
    int n = dp_zap_allowed(ps->zap);
    dp_auth_key_t *keys = dp_calloc((size_t)n, sizeof *keys);
    for (int i = 0; i < n; i++) keys[i].key = dp_zap_key(ps->zap, i, &keys[i].file)->z85;
    int rc = dp_auth_name_keys(&ps->auth, keys, n, err);
    free(keys);
    if (rc != 0) return -1;
    dp_log_info("shard %d: CURVE: public key %s, %d client keys allowed, %d named after their task",
                cfg->shard_index, pub.z85, n, ps->auth.n_named);
    return 0;
}

/* The ROUTER, its limits, bound; ps->endpoint is what it got. */
static int s_open_socket(dp_ps_loop_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (!(ps->ctx = zmq_ctx_new())) return dp_err(err, "ZeroMQ context: %s", zmq_strerror(errno));
    if (!(ps->sock = zmq_socket(ps->ctx, ZMQ_ROUTER)))
        return dp_err(err, "ZeroMQ socket: %s", zmq_strerror(errno));
    /* The largest legitimate message is a PUSH of this shard's range (its
     * floats) or, with a row table, a ROWS_PUSH of max_keys keys and rows;
     * an envelope and the identity besides. One frame may not be larger
     * either (ZeroMQ drops a peer that sends one). */
    ps->max_msg = ps->shard.n * sizeof(float);
    if (ps->shard.model.embed_dim > 0) {
        size_t rows = dp_ps_rows_max_bytes(cfg, ps->shard.model.embed_dim);
        if (rows > ps->max_msg) ps->max_msg = rows;
    }
    ps->max_msg += DP_WIRE_MAX_ENVELOPE + DP_WIRE_MAX_IDENTITY;
    int64_t maxmsg = (int64_t)ps->max_msg;
    int zero = 0, sndhwm = DP_PS_SNDHWM, rcvhwm = S_RCVHWM;
    if (s_setopt(ps->sock, ZMQ_LINGER, &zero, sizeof zero, "ZMQ_LINGER", err) != 0 ||
        s_setopt(ps->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg, "ZMQ_MAXMSGSIZE", err) != 0 ||
        s_setopt(ps->sock, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm, "ZMQ_SNDHWM", err) != 0 ||
        s_setopt(ps->sock, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm, "ZMQ_RCVHWM", err) != 0 ||
        dp_zsock_heartbeats(ps->sock, 0, err) != 0)
        return -1;
    if (s_secure(ps, err) != 0) return -1;
    if (zmq_bind(ps->sock, cfg->bind) != 0)
        return dp_err(err, "cannot bind %s: %s (is another downpour-ps using the port?)", cfg->bind,
                      zmq_strerror(errno));
    size_t len = sizeof ps->endpoint;
    if (zmq_getsockopt(ps->sock, ZMQ_LAST_ENDPOINT, ps->endpoint, &len) != 0)
        return dp_err(err, "bound %s but cannot read the endpoint: %s", cfg->bind, zmq_strerror(errno));
    if (!ps->zap && !dp_zsock_local_endpoint(ps->endpoint))
        dp_log_warn("listening on %s without CURVE: anyone who reaches this port can join, push "
                    "and read the weights (see --curve-secret)", ps->endpoint);
    return 0;
}

static const dp_policy_ops_t *s_policy_ops(dp_mode_t mode)
{
    switch (mode) {
    case DP_MODE_SYNC: return &dp_policy_sync;
    case DP_MODE_ASYNC: return &dp_policy_async;
    case DP_MODE_SSP: return &dp_policy_ssp;
    }
    return NULL;
}

/* --device cuda:N (dp_ps_device_check opened it once already, before
 * anything started): the shard's weights and optimizer state kept and
 * stepped there from now on. */
static int s_shard_device(dp_ps_loop_t *ps, char *err)
{
    const char *name = ps->cfg->device;
    dp_optim_dev_t *dev = NULL;
    if (!name[0] || strcmp(name, "cpu") == 0) return 0;
    if (dp_optim_dev_new(&dev, name, NULL, err) != 0 || dp_shard_set_device(&ps->shard, dev, err) != 0)
        return -1;
    dp_log_info("shard %d: weights and optimizer state on %s", ps->cfg->shard_index, name);
    return 0;
}

/* Shard, members and policy from the config; the checkpoint restored. */
static int s_setup_state(dp_ps_loop_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (cfg->num_workers < 1 || cfg->num_workers > 100000)
        return dp_err(err, "bad --workers %d", cfg->num_workers);
    const dp_policy_ops_t *ops = s_policy_ops(cfg->mode);
    if (!ops) return dp_err(err, "bad mode %d", (int)cfg->mode);
    dp_model_t m;
    float *values = NULL;
    if (dp_ps_config_model(cfg, &m, &values, err) != 0) return -1;
    dp_policy_conf_t pc = {cfg->replicas ? cfg->replicas : cfg->num_workers, cfg->staleness,
                           cfg->delay_lr, cfg->delay_k, cfg->replicas_frac};
    dp_optim_conf_t optim = cfg->optim;
    char who[32];
    snprintf(who, sizeof who, "shard %d", cfg->shard_index);
    dp_policy_for_mode(cfg->mode, &pc, &optim, who); /* sync: no delays to act on */
    int rc = values ? dp_shard_init_values(&ps->shard, &m, cfg->shard_index, cfg->shard_count,
                                           values, &optim, err)
                    : dp_shard_init(&ps->shard, &m, cfg->shard_index, cfg->shard_count, cfg->seed,
                                    &optim, err);
    free(values);
    if (rc != 0 ||
        dp_shard_set_threads(&ps->shard, dp_ps_config_threads(cfg), err) != 0 ||
        s_shard_device(ps, err) != 0)
        return -1;
    dp_members_init(&ps->members, cfg->num_workers, cfg->min_workers, cfg->shard_index, dp_now());
    dp_membership_init(&ps->membership, cfg->num_workers);
    dp_dylu_crew_init(&ps->speeds, cfg->num_workers);
    /* the threshold is the environment's (--env), never a push's */
    if (dp_account_bounds(&ps->account, cfg->env, cfg->envs, cfg->t_max, err) != 0) return -1;
    dp_episodes_init(&ps->episodes, ps->account.env ? ps->account.env->solved : NAN);
    dp_shard_track_steps(&ps->shard, cfg->num_workers);
    dp_shard_dc_init(&ps->shard, cfg->num_workers); /* --delay-compensation's slots and MS */
    /* A restore loses fewer than --checkpoint-every versions, and a worker
     * makes at most one step per version (plus the one it repeats). */
    if (cfg->checkpoint_dir[0] && cfg->checkpoint_every > 0)
        ps->shard.step_slack = (uint64_t)cfg->checkpoint_every;
    if (dp_policy_new(&ps->policy, ops, &pc, &ps->shard, &ps->members, err) != 0) return -1;
    /* calloc: pages of the table no peer filled stay untouched */
    ps->pending = dp_calloc((size_t)cfg->num_workers * DP_PS_HELD_PER_WORKER, sizeof *ps->pending);
    ps->held = dp_calloc((size_t)cfg->num_workers, sizeof *ps->held);
    ps->lent = dp_calloc((size_t)cfg->num_workers * DP_PS_PARAMS_PER_WORKER, sizeof *ps->lent);
    dp_shard_parts_init(&ps->parts, ps->shard.lo, ps->shard.hi, cfg->num_workers);
    dp_shard_early_init(&ps->early, &ps->shard, &ps->parts, ps->policy, cfg->early_step);
    dp_policy_early_steps(ps->policy, &ps->early);
    if (cfg->min_workers > 0 && cfg->shard_index == 0) /* shard 0 deals an elastic crew's batches */
        dp_ps_deal_init(ps, cfg->num_workers);
    dp_mode_t rows_mode = cfg->rows_mode ? cfg->rows_mode : cfg->mode;
    dp_rows_conf_t rows;
    float init;
    dp_ps_rows_conf(cfg, &rows, &init);
    if (dp_ps_rows_init(&ps->rows, m.embed_dim, &rows, rows_mode, cfg->mode,
                        (uint32_t)cfg->shard_index, (uint32_t)cfg->shard_count, cfg->num_workers,
                        err) != 0)
        return -1;
    if (dp_ps_restore(ps, err) != 0) return -1;
    ps->deal_restored = ps->dealing && dp_deal_planned(&ps->deal);
    return 0;
}

size_t dp_ps_rows_max_bytes(const dp_ps_config_t *cfg, int d)
{
    dp_rows_conf_t rows;
    float init;
    dp_ps_rows_conf(cfg, &rows, &init);
    size_t keys = rows.max_keys ? rows.max_keys : DP_ROWS_DEFAULT_KEYS;
    return keys * (sizeof(uint64_t) + (size_t)d * sizeof(float));
}

void dp_ps_rows_conf(const dp_ps_config_t *cfg, dp_rows_conf_t *out, float *init)
{
    *out = cfg->rows;
    out->optim.lr = cfg->row_lr > 0 ? cfg->row_lr : dp_optim_base_lr(&cfg->optim);
    *init = cfg->row_init >= 0 ? cfg->row_init : dp_rows_init_default(out->optim.kind);
    if (*init > 0) {
        out->init = DP_ROWS_INIT_UNIFORM;
        out->init_scale = *init;
        out->seed = cfg->seed;
    }
}

/* A random, non-zero id for this start of the shard. */
static int s_draw_incarnation(dp_ps_loop_t *ps, char *err)
{
    while (ps->incarnation == 0)
        if (getrandom(&ps->incarnation, sizeof ps->incarnation, 0) != sizeof ps->incarnation &&
            errno != EINTR)
            return dp_err(err, "getrandom: %s", strerror(errno));
    return 0;
}

/* --record: its header holds the row table's conf (width set) when there is one. */
static int s_open_record(dp_ps_loop_t *ps, char *err)
{
    dp_rows_conf_t rows;
    float init;
    dp_ps_rows_conf(ps->cfg, &rows, &init);
    rows.width = ps->rows.width;
    return dp_record_ps_open(&ps->rec, ps->cfg, ps->policy, ps->rows.width > 0 ? &rows : NULL, err);
}

static int s_setup(dp_ps_loop_t *ps, const dp_ps_config_t *cfg, char *err)
{
    ps->cfg = cfg;
    ps->ckpt_version = UINT64_MAX;
    if (s_draw_incarnation(ps, err) != 0) return -1;
    if (s_setup_state(ps, err) != 0) return -1;
    ps->start_version = ps->shard.version;
    if (dp_auth_init(&ps->auth, cfg->num_workers, cfg->curve_secret[0] != 0, err) != 0) return -1;
    if (dp_metrics_new(&ps->metrics, cfg->metrics_path, err) != 0) return -1;
    if (cfg->record[0] && s_open_record(ps, err) != 0) return -1;
    if (s_open_socket(ps, err) != 0) return -1;
    if (cfg->ready_file[0] &&
        dp_write_file_atomic(cfg->ready_file, ps->endpoint, strlen(ps->endpoint), err) != 0)
        return -1;
    dp_log_info("shard %d/%d on %s: floats [%zu, %zu) of %zu, %s, %d workers, R=%d, S=%d, %s lr %g, "
                "%d optimizer thread%s, version %" PRIu64 ", incarnation %016" PRIx64,
                cfg->shard_index, cfg->shard_count, ps->endpoint, ps->shard.lo, ps->shard.hi,
                ps->shard.model.n_floats, dp_mode_name(cfg->mode), ps->members.n,
                ps->policy->conf.replicas, cfg->staleness, dp_optim_kind_name(cfg->optim.kind),
                dp_optim_base_lr(&cfg->optim), dp_pool_size(ps->shard.pool),
                dp_pool_size(ps->shard.pool) > 1 ? "s" : "", ps->shard.version, ps->incarnation);
    return 0;
}

static void s_close_socket(dp_ps_loop_t *ps)
{
    if (ps->sock) {
        /* After SHUTDOWN give its reply a moment to leave; otherwise drop. */
        int linger = ps->quit ? 1000 : 0;
        char err[DP_ERR_LEN];
        if (s_setopt(ps->sock, ZMQ_LINGER, &linger, sizeof linger, "ZMQ_LINGER", err) != 0)
            dp_log_warn("shard %d: %s", ps->cfg->shard_index, err);
        if (zmq_close(ps->sock) != 0)
            dp_log_warn("shard %d: closing the socket: %s", ps->cfg->shard_index, zmq_strerror(errno));
        ps->sock = NULL;
    }
    dp_zap_destroy(&ps->zap); /* before the context ends */
    /* Waits for the I/O thread, so every snapshot ZeroMQ held is released. */
    char who[32];
    snprintf(who, sizeof who, "shard %d", ps->cfg->shard_index);
    dp_zsock_ctx_term(&ps->ctx, who);
}

static void s_teardown(dp_ps_loop_t *ps)
{
    /* Held pulls hear why instead of timing out. */
    for (int i = 0; i < ps->n_pending; i++) {
        dp_ps_pending_t *p = &ps->pending[i];
        dp_ps_reply_error(ps, &p->identity, p->request_id, p->worker, "shard shutting down");
        dp_wire_msg_close(&p->identity);
    }
    ps->n_pending = 0;
    s_close_socket(ps);
    dp_shard_early_fini(&ps->early); /* its buffer may be a slot: none is kept past the unmap */
    dp_ps_shm_destroy(&ps->shm); /* ZeroMQ holds no buffer now */
    dp_ps_devr_destroy(&ps->devr); /* retired: its workers re-map from the next shard's offer */
    dp_metrics_destroy(&ps->metrics);
    dp_record_abandon(&ps->rec);
    dp_policy_destroy(&ps->policy);
    dp_members_fini(&ps->members);
    dp_membership_fini(&ps->membership);
    dp_dylu_crew_fini(&ps->speeds);
    dp_auth_fini(&ps->auth);
    dp_shard_fini(&ps->shard);
    dp_shard_parts_fini(&ps->parts);
    dp_ps_deal_fini(ps);
    dp_ps_rows_fini(&ps->rows);
    free(ps->pending);
    free(ps->held);
    free(ps->lent); /* the context ended: ZeroMQ released every frame */
}

/* Is a message waiting? Asked through ZMQ_EVENTS, which is where ZeroMQ
 * applies the credits its I/O thread returns for the replies each peer
 * read. A receive applies them only every 100 messages and a send at most
 * once a millisecond or so (libzmq throttles both), so a loop that only
 * received and sent could queue DP_PS_SNDHWM replies to a fast peer that reads
 * every one of them and see its pipe "full": the ROUTER then drops the next
 * reply as if the peer had stopped reading (test_ps_bounds' lockstep flood
 * lost a heartbeat's answer that way, about once in 80 runs on 2 busy
 * cores). */
static int s_readable(dp_ps_loop_t *ps)
{
    int events = 0;
    size_t len = sizeof events;
    if (zmq_getsockopt(ps->sock, ZMQ_EVENTS, &events, &len) != 0) return 0;
    return (events & ZMQ_POLLIN) != 0;
}

/* Wait up to 100 ms, then handle a bounded batch of what arrived. */
static void s_poll_once(dp_ps_loop_t *ps)
{
    zmq_pollitem_t it = {ps->sock, 0, ZMQ_POLLIN, 0};
    int r = zmq_poll(&it, 1, 100);
    if (r < 0) {
        if (errno == EINTR) return;
        ps->net_errors++;
        dp_log_warn("shard %d: poll: %s", ps->cfg->shard_index, zmq_strerror(errno));
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL); /* no busy loop */
        return;
    }
    for (int k = 0; r > 0 && k < 256 && !ps->quit && (k == 0 || s_readable(ps)); k++) {
        dp_wire_rx_t rx;
        char err[DP_ERR_LEN];
        if (dp_wire_recv_bounded(ps->sock, &rx, ZMQ_DONTWAIT, ps->max_msg, err) != 0) {
            if (errno != EAGAIN && errno != EINTR) {
                ps->net_errors++;
                dp_log_warn("shard %d: %s", ps->cfg->shard_index, err);
            }
            break;
        }
        s_handle(ps, &rx);
        dp_wire_rx_fini(&rx);
    }
}

int dp_ps_run(const dp_ps_config_t *cfg, volatile sig_atomic_t *stop_flag, char *err)
{
    dp_ps_loop_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = -1;
    if (s_setup(&ps, cfg, err) != 0) goto done;
    if (cfg->on_ready) cfg->on_ready(ps.endpoint, cfg->on_ready_arg);
    ps.next_metrics = dp_now() + cfg->metrics_every;
    if (cfg->startup_timeout > 0) ps.startup_deadline = dp_now() + cfg->startup_timeout;
    dp_ps_metrics_start(&ps);
    dp_ps_metrics_line(&ps);
    while (!ps.quit && !(stop_flag && *stop_flag)) {
        s_poll_once(&ps);
        double now = dp_now();
        if (s_check_startup(&ps, now, err) != 0) goto done;
        s_sweep(&ps, now);
        if (cfg->reload && *cfg->reload) {
            *cfg->reload = 0;
            s_reload_allow(&ps);
        }
        if (ps.metrics && now >= ps.next_metrics) {
            dp_ps_metrics_line(&ps);
            ps.next_metrics = now + cfg->metrics_every;
        }
    }
    int ck = dp_ps_checkpoint(&ps, ps.run.finished, err); /* a failure is logged and counted there */
    dp_ps_metrics_line(&ps);
    if (ck == 0 && dp_record_close(&ps.rec, err) != 0) goto done;
    dp_log_info("shard %d: stopping at version %" PRIu64 " (applied %" PRIu64 ", dropped %" PRIu64
                ", rejected %" PRIu64 ", network errors %" PRIu64 ", refused by auth %" PRIu64
                ", by CURVE %" PRIu64 ", checkpoint failures %" PRIu64 ")",
                cfg->shard_index, ps.shard.version, ps.shard.counts.applied,
                ps.shard.counts.dropped, ps.shard.counts.rejected, ps.net_errors, ps.auth.refused,
                ps.zap ? dp_zap_refused(ps.zap) : 0, ps.ckpt_failures);
    if (ck != 0) {
        char e2[DP_ERR_LEN];
        snprintf(e2, sizeof e2, "%s", err);
        dp_err(err, "the final checkpoint failed (%" PRIu64 " checkpoint failure%s in this run): %s",
               ps.ckpt_failures, ps.ckpt_failures > 1 ? "s" : "", e2);
        goto done;
    }
    rc = 0;
done:
    s_teardown(&ps);
    return rc;
}
