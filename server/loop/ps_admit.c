/* ps_admit: who and what may reach downpour-ps's handlers
 * (server/loop/ps_loop.h) — a request, not a reply (a row of the message
 * table, server/loop/ps_msgs.c, whose who this file and server/loop/auth.h
 * follow); the model (a HELLO's spec, input and tensor table, every other
 * request's fingerprint: refused with ERR_MODEL_MISMATCH, logged with both
 * sides, the reply naming neither); the worker id in range, claimed at
 * HELLO by its connection (and key) and spoken for by it alone after
 * (server/loop/auth.h); said HELLO before a WORKER's request (PULL, PUSH,
 * BARRIER, ROWS_PULL, ROWS_PUSH: ERR_UNKNOWN_WORKER) — and the WELCOME that
 * answers a HELLO. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "proto/shm.h"
#include "server/loop/ps_loop.h"

static dp_auth_peer_t s_peer(const dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    return (dp_auth_peer_t){zmq_msg_data(id), zmq_msg_size(id), ps->peer_key, env->session};
}

/* auth.h's "live": the ROUTER still has a peer with this routing id. */
static int s_conn_live(void *arg, const void *conn, size_t len)
{
    dp_ps_loop_t *ps = arg;
    Downpour__Envelope env;
    dp_ps_env(ps, &env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 0, -1);
    return dp_auth_router_has_peer(ps->sock, conn, len, &env);
}

/* HELLO: may this connection (and key) take its worker id? Answers
 * ERR_ID_TAKEN when not. */
static bool s_claim(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    char msg[DP_ERR_LEN];
    dp_auth_peer_t p = s_peer(ps, id, env);
    if (dp_auth_claim(&ps->auth, env->worker_id, &p, s_conn_live, ps, msg, sizeof msg) == 0)
        return true;
    dp_log_warn("shard %d: HELLO refused: %s", ps->cfg->shard_index, msg);
    dp_ps_reply_error_code(ps, id, env->request_id, env->worker_id,
                           DOWNPOUR__ERROR_CODE__ERR_ID_TAKEN, msg);
    return false;
}

/* Any request but HELLO: as its row's who says (a worker id only on its
 * own connection, STATS and SHUTDOWN only from the chief, a HEARTBEAT from
 * the id's holder). Answers when not; nothing else changes. */
static bool s_authorized(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                         dp_auth_who_t who)
{
    char msg[DP_ERR_LEN];
    /* a key removed from the allow list (SIGHUP) on a connection it made before */
    if (ps->zap && ps->peer_key && !dp_zap_allows(ps->zap, ps->peer_key)) {
        ps->auth.refused++;
        snprintf(msg, sizeof msg, "refused: this connection's key is no longer in the allow list");
        dp_ps_send_error(ps, id, env->request_id, env->worker_id,
                         DOWNPOUR__ERROR_CODE__ERR_NONE, msg);
        return false;
    }
    if (who == DP_AUTH_ANYONE) return true; /* HELLO: s_claim, once the model matched */
    int code;
    dp_auth_peer_t p = s_peer(ps, id, env);
    if (dp_auth_check(&ps->auth, who, env->type, env->worker_id, env->run_token, &p, &code, msg,
                      sizeof msg) == 0)
        return true;
    /* A refused HEARTBEAT is counted in auth_refused only: the shard's
     * rejected / malformed account for pushes and broken messages, and a
     * restarted worker's beats before its HELLO are neither. */
    if (who == DP_AUTH_BEAT)
        dp_ps_send_error(ps, id, env->request_id, env->worker_id, code, msg);
    else
        dp_ps_reply_error_code(ps, id, env->request_id, env->worker_id, code, msg);
    return false;
}

static bool s_same_model(const dp_model_t *m, const Downpour__Envelope *env)
{
    const Downpour__Hello *h = env->hello;
    const char *spec = h->model_spec ? h->model_spec : "";
    return env->model_fingerprint == m->fingerprint && strcmp(spec, m->spec) == 0 &&
           h->in_c == m->in_c && h->in_h == m->in_h && h->in_w == m->in_w &&
           h->n_floats == m->n_floats;
}

/* A request for another model: both sides into the shard's log (the first
 * ten, then one in a thousand, so a flood cannot fill it). The reply says
 * only that the models differ: the spec and its fingerprint are all a HELLO
 * needs, so a peer that does not know them is not told. */
static void s_log_mismatch(dp_ps_loop_t *ps, const Downpour__Envelope *env)
{
    const dp_model_t *m = &ps->shard.model;
    uint64_t n = ++ps->mismatches;
    if (n > 10 && n % 1000 != 0) return;
    const Downpour__Hello *h = env->type == DOWNPOUR__MSG_TYPE__HELLO ? env->hello : NULL;
    char theirs[400] = "";
    if (h)
        snprintf(theirs, sizeof theirs, "'%.300s' on %dx%dx%d, ", h->model_spec ? h->model_spec : "",
                 h->in_c, h->in_h, h->in_w);
    dp_log_warn("shard %d: model mismatch (%" PRIu64 " so far): %s from worker %d has %sfingerprint "
                "%016" PRIx64 "; this shard '%s' on %dx%dx%d, fingerprint %016" PRIx64,
                ps->cfg->shard_index, n, dp_wire_type_name(env->type), env->worker_id, theirs,
                env->model_fingerprint, m->spec, m->in_c, m->in_h, m->in_w, m->fingerprint);
}

/* A tool (no worker id, fingerprint 0) may ask what a HEARTBEAT or the
 * chief's requests ask: it speaks for no worker. */
static bool s_tool_may(dp_auth_who_t who)
{
    return who == DP_AUTH_BEAT || who == DP_AUTH_CHIEF;
}

/* Before who's rules: a request (a row of the table), of this shard's
 * model (HELLO answers a mismatch itself), from a worker id in range (a
 * tool's requests aside). Answers when not. */
static const dp_ps_msg_t *s_request(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    char msg[DP_ERR_LEN + 128];
    int type = env->type, wid = env->worker_id;
    const dp_ps_msg_t *m = dp_ps_msg_of(type);
    bool tool = m && s_tool_may(m->who);
    msg[0] = 0;
    int code = DOWNPOUR__ERROR_CODE__ERR_NONE;
    if (!m)
        snprintf(msg, sizeof msg, "malformed: %s is a reply, not a request", dp_wire_type_name(type));
    /* Tools may ask STATS / HEARTBEAT / SHUTDOWN with fingerprint 0; HELLO
     * answers a mismatch itself. Neither reply names this shard's model. */
    else if (m->who != DP_AUTH_ANYONE && env->model_fingerprint != ps->shard.model.fingerprint &&
             !(tool && env->model_fingerprint == 0)) {
        snprintf(msg, sizeof msg,
                 "model mismatch: fingerprint %016" PRIx64 " is not this shard's model (the "
                 "shard's log names its own)", env->model_fingerprint);
        code = DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH;
        s_log_mismatch(ps, env);
    }
    else if (!tool && (wid < 0 || wid >= ps->members.n))
        snprintf(msg, sizeof msg, "worker id %d out of range: this cluster has %d workers (--workers)",
                 wid, ps->members.n);
    if (!msg[0]) return m;
    dp_ps_reply_error_code(ps, id, env->request_id, wid, code, msg);
    return NULL;
}

const dp_ps_msg_t *dp_ps_admit(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    int wid = env->worker_id;
    const dp_ps_msg_t *m = s_request(ps, id, env);
    if (!m || !s_authorized(ps, id, env, m->who)) return NULL;
    if (wid < 0 || wid >= ps->members.n) return m; /* a tool */
    if (dp_members_heard(&ps->members, wid, dp_now())) dp_ps_members_changed(ps);
    /* what only a worker that said HELLO may ask */
    if (m->who != DP_AUTH_WORKER || ps->members.w[wid].joined) return m;
    /* e.g. this shard restarted: the client says HELLO again and repeats */
    char msg[DP_ERR_LEN];
    snprintf(msg, sizeof msg, "worker %d has not said HELLO to this shard", wid);
    dp_ps_reply_error_code(ps, id, env->request_id, wid, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER,
                           msg);
    return NULL;
}

/* Welcome.worker_step: where a (restarted) worker resumes. */
static uint64_t s_welcome_step(const dp_ps_loop_t *ps, int wid)
{
    uint64_t step = ps->shard.worker_step ? ps->shard.worker_step[wid] : 0;
    if (step > 0)
        dp_log_info("shard %d: worker %d (re)joins; its steps 1..%" PRIu64 " are applied here",
                    ps->cfg->shard_index, wid, step);
    return step;
}

/* Hello.shm: the segments' names into the WELCOME, or none (the worker
 * then sends frames) with a line saying why. Only a peer on this host
 * (ipc, loopback: dp_shm_peer_local) is offered them: one elsewhere could
 * not open them, and its pushes would "come" from a segment it cannot
 * write. */
static void s_grant_shm(dp_ps_loop_t *ps, int wid, Downpour__Welcome *wl)
{
    char err[DP_ERR_LEN];
    const char *params = NULL, *grad = NULL;
    if (!dp_shm_peer_local(ps->peer_addr)) {
        dp_log_warn("shard %d: no shared memory for worker %d: it connects from %s, not from "
                    "this host (ipc or loopback)",
                    ps->cfg->shard_index, wid, ps->peer_addr ? ps->peer_addr : "an unknown address");
        return;
    }
    if ((!ps->shm && dp_ps_shm_new(&ps->shm, &ps->shard, ps->members.n, err) != 0) ||
        dp_ps_shm_grant(ps->shm, wid, &params, &grad, err) != 0) {
        dp_log_warn("shard %d: no shared memory for worker %d: %s", ps->cfg->shard_index, wid, err);
        return;
    }
    wl->shm_name = (char *)params;
    wl->shm_grad_name = (char *)grad;
}

/* Hello.devregion: the region's offer into the WELCOME, or none (the
 * worker then goes on with shared memory or frames) with a line saying
 * why. Only for a peer on this host, as shared memory, and only when this
 * shard has a provider: the stand-in under the test hook
 * (dp_devmem_test_provider), else CUDA IPC on the device of a shard run
 * with --device cuda:N --device-region on (dp_devmem_for_device, the ring
 * on that device; DP_TEST_DEVMEM=off: none). A CPU shard, or cpu:staged,
 * has none. Opt-in until a device has run it: through the mapping a
 * worker can write the ring the others read (docs/SECURITY.md). */
static void s_grant_devregion(dp_ps_loop_t *ps, int wid, Downpour__Welcome *wl,
                              Downpour__DevRegionOffer *o)
{
    char err[DP_ERR_LEN];
    const dp_devmem_ops_t *ops = dp_devmem_test_provider();
    int on_device = 0;
    if (!ops && ps->shard.dev && ps->cfg->device_region && !ps->devr && !dp_devmem_test_off()) {
        ops = dp_devmem_for_device(ps->shard.dev->name, err);
        if (!ops && err[0])
            dp_log_warn("shard %d: no device region for worker %d: %s", ps->cfg->shard_index,
                        wid, err);
        on_device = ops != NULL;
    } else if (!ops && ps->devr) {
        ops = dp_ps_devr_ops(ps->devr);
    }
    if (!ops) return; /* no device region here: nothing to say */
    if (!dp_shm_peer_local(ps->peer_addr)) {
        dp_log_warn("shard %d: no device region for worker %d: it connects from %s, not from "
                    "this host (ipc or loopback)",
                    ps->cfg->shard_index, wid, ps->peer_addr ? ps->peer_addr : "an unknown address");
        return;
    }
    if ((!ps->devr && dp_ps_devr_new(&ps->devr, &ps->shard, ps->members.n, ops, on_device, err) != 0) ||
        dp_ps_devr_grant(ps->devr, wid, o, err) != 0) {
        dp_log_warn("shard %d: no device region for worker %d: %s", ps->cfg->shard_index, wid,
                    err);
        return;
    }
    wl->devregion = o;
}

void dp_ps_on_hello(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    const dp_model_t *m = &ps->shard.model;
    if (!s_same_model(m, env)) {
        const Downpour__Hello *h = env->hello;
        char msg[800];
        const char *spec = h->model_spec ? h->model_spec : "";
        if (strcmp(spec, DP_MODEL_TABLE_SPEC) == 0) /* a library client's table */
            snprintf(msg, sizeof msg,
                     "model mismatch: this shard serves another model than the worker's tensor "
                     "table of %" PRIu64 " floats (fingerprint %016" PRIx64 "); check its "
                     "names, shapes and state tensors against the servers' --init file",
                     h->n_floats, env->model_fingerprint);
        else
            snprintf(msg, sizeof msg,
                     "model mismatch: this shard serves another model than the worker's '%.500s' "
                     "on %dx%dx%d (fingerprint %016" PRIx64 "); check --model and the data set "
                     "on both sides (the shard's log names its own)",
                     spec, h->in_c, h->in_h, h->in_w, env->model_fingerprint);
        s_log_mismatch(ps, env);
        dp_ps_reply_error_code(ps, id, env->request_id, env->worker_id,
                               DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH, msg);
        return;
    }
    if (!s_claim(ps, id, env)) return;
    char why[DP_ERR_LEN];
    if (dp_ps_deal_hello(ps, env, why, sizeof why) != 0) { /* server/loop/ps_deal.c: who sets the plan */
        dp_log_warn("shard %d: HELLO of worker %d refused: %s", ps->cfg->shard_index,
                    env->worker_id, why);
        dp_ps_reply_error_code(ps, id, env->request_id, env->worker_id,
                               DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH, why);
        return;
    }
    dp_members_join(&ps->members, env->worker_id);
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, DOWNPOUR__MSG_TYPE__WELCOME, env->request_id, env->worker_id);
    Downpour__Welcome wl = DOWNPOUR__WELCOME__INIT;
    wl.mode = (Downpour__Mode)ps->cfg->mode;
    wl.num_workers = ps->members.n;
    wl.min_workers = ps->members.min;
    wl.replicas = ps->policy->conf.replicas;
    wl.staleness = ps->cfg->staleness;
    wl.shard_index = ps->cfg->shard_index;
    wl.shard_count = ps->cfg->shard_count;
    wl.range_lo = ps->shard.lo;
    wl.range_hi = ps->shard.hi;
    wl.n_floats = m->n_floats;
    wl.version = ps->shard.version;
    wl.start_version = ps->start_version;
    wl.local_steps = ps->cfg->local_steps;
    wl.local_steps_auto = ps->cfg->local_auto;
    wl.push_parts = DP_WIRE_MAX_PUSH_PARTS;
    wl.heartbeat_timeout = ps->cfg->heartbeat_timeout;
    wl.run_token = dp_auth_token_for(&ps->auth, env->worker_id);
    wl.worker_step = s_welcome_step(ps, env->worker_id);
    dp_ps_shm_revoke(ps->shm, env->worker_id); /* a grant holds for the HELLO that got it */
    dp_ps_devr_revoke(ps->devr, env->worker_id);
    dp_shard_parts_drop(&ps->parts, env->worker_id); /* it repeats a push whole, every part */
    dp_shard_early_hello(&ps->early, env->worker_id);
    if (env->hello->shm) s_grant_shm(ps, env->worker_id, &wl);
    Downpour__DevRegionOffer offer;
    if (env->hello->devregion) s_grant_devregion(ps, env->worker_id, &wl, &offer);
    rep.welcome = &wl;
    dp_ps_send(ps, id, &rep, NULL, 0);
    dp_ps_members_changed(ps); /* it may have been finished before */
}
