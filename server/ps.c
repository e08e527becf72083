/* ps: the parameter-server shard's event loop — the ROUTER socket, receiving
 * under hard limits, validation, dispatch to one handler per request type,
 * replies, held (deferred) pulls, checkpoints when due, metrics and stats.
 * The shard's state and update are server/shard.h, the consistency policies
 * server/policy.h, liveness server/members.h, checkpoints
 * server/shard_checkpoint.h; none of those knows about sockets.
 *
 * Invariants:
 *  - Nothing touches the shard or a counter other than "rejected" /
 *    "malformed" before the message passed the size limits, dp_wire_check,
 *    the fingerprint, the worker id and (for gradients) the range and the
 *    finite check.
 *  - PARAMS replies hand ZeroMQ the shard's live buffer itself (no copy),
 *    with a reference released by ZeroMQ's free callback; while one is held
 *    the shard writes the next version into another buffer (server/shard.h),
 *    so a reply never goes out torn. Co-located workers that asked for it
 *    read the live buffer out of shared memory instead (server/ps_shm.h).
 *  - What one peer can make the shard hold is bounded per worker id: at
 *    most DP_PS_PARAMS_PER_WORKER PARAMS frames ZeroMQ has not sent yet
 *    (each a reference to one buffer of the shard's range; a pull beyond
 *    that is answered "busy"), at most DP_PS_HELD_PER_WORKER held pulls (a
 *    pull beyond that is refused), and per connection at most S_SNDHWM
 *    replies queued (ZeroMQ drops a ROUTER's further replies to a peer that
 *    does not read). So the shard's parameter buffers number at most
 *    DP_SHARD_RETIRED + 2 (live, bfloat16) + DP_PS_PARAMS_PER_WORKER per
 *    worker, whatever a peer sends (dp_snap_alive, "snapshots" in the
 *    metrics); a worker that pushes in parts adds one buffer of the range
 *    (its assembly, server/shard_parts.h), allocated once, and the early
 *    step (one push at a time stepped as its parts come) one
 *    buffer and one copy of the optimizer state (server/shard_early.h).
 *  - A push's step is plausible (dp_shard_step_check) before it can count
 *    as a repeat or be recorded as applied: one message cannot push a
 *    worker's step high-water mark (and its checkpoint) out of reach.
 *  - A version that moved is checkpointed (when due) before the reply that
 *    reports it; held pulls are asked again after every change.
 *  - Every blocking wait is zmq_poll with a timeout of at most 100 ms, so the
 *    stop flag is seen promptly. A ZeroMQ failure inside the loop is logged
 *    and counted (net_errors), never fatal. */
#include "server/ps.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/util.h"
#include "proto/compress.h"
#include "proto/curve.h"
#include "proto/shm.h"
#include "proto/zsock.h"
#include "server/auth.h"
#include "server/members.h"
#include "server/policy.h"
#include "server/pool.h"
#include "server/record.h"
#include "server/ps_shm.h"
#include "server/shard.h"
#include "server/shard_checkpoint.h"
#include "server/shard_dc.h"
#include "server/shard_early.h"
#include "server/shard_parts.h"

/* Replies ZeroMQ may queue per peer before the ROUTER drops further ones to
 * it (ZMQ_ROUTER_MANDATORY is off: a peer that does not read loses replies,
 * the shard never blocks on it). A worker reads every reply: it has one
 * request per shard in flight and its heartbeat answers, so a queue this
 * long only fills behind a peer that stopped reading. */
#define S_SNDHWM 16
/* Messages ZeroMQ may queue per peer before it stops reading that peer's
 * connection (the default is 1000). A worker has one request per shard in
 * flight, plus a heartbeat now and then while a pull is held (answered at
 * once), or a push's parts (sent as its backward makes them; those past 8
 * wait on the worker's side of the connection, nothing is lost); 8 leaves
 * room for a tool and bursts while capping how many messages one peer can
 * park in ZeroMQ's queue. */
#define S_RCVHWM 8

/* A PARAMS reply lent to ZeroMQ: DP_PS_PARAMS_PER_WORKER of them per worker
 * id, so the buffers a peer that does not read pins are bounded. A reply in
 * parts is one loan: every part's frame points into the same buffer. */
typedef struct {
    dp_snap_t *snap;       /* the buffer sent (its reference), while busy */
    atomic_int frames;     /* its frames ZeroMQ still holds (set before the first is sent) */
    atomic_int busy;       /* 1 from the send until ZeroMQ's free callback of its last frame
                            * (I/O thread) */
} s_lent_t;

/* How a PARAMS reply carries the tensor (the PULL asked). */
#define S_PARAMS_CRC 0     /* a frame with its CRC-32 */
#define S_PARAMS_NO_CRC 1  /* a frame without one (Pull.no_checksum) */
#define S_PARAMS_SHM 2     /* the live slot of the shared segment (Envelope.shm), else as NO_CRC */

/* What a PULL asked of its reply. */
typedef struct {
    int how;               /* S_PARAMS_* */
    int bf16;              /* bfloat16 frames (Pull.dtype) */
    uint32_t n_cuts;       /* a reply in n_cuts + 1 parts (Pull.cuts; 0: whole) */
    uint64_t cuts[DP_WIRE_MAX_PULL_PARTS - 1];
} s_params_ask_t;
_Static_assert(DP_WIRE_MAX_PULL_PARTS <= S_SNDHWM / 2,
               "a reply in parts fits the per-peer send queue with room for other replies");

typedef struct {
    zmq_msg_t identity;    /* ROUTER identity to answer */
    uint64_t request_id;
    int worker;
    uint64_t min_version;  /* sync: answer once the version is >= this */
    s_params_ask_t ask;
} s_pending_t;

typedef struct {
    const dp_ps_config_t *cfg;
    dp_shard_t shard;
    dp_members_t members;
    dp_policy_t *policy;
    s_pending_t *pending;  /* held pulls, in arrival order: DP_PS_HELD_PER_WORKER per worker */
    int n_pending;
    int *held;             /* per worker: its pulls in pending */
    s_lent_t *lent;        /* per worker DP_PS_PARAMS_PER_WORKER: PARAMS frames ZeroMQ holds */
    void *ctx, *sock;
    size_t max_msg;        /* bytes of the largest message accepted, all parts */
    uint64_t net_errors;   /* ZeroMQ calls that failed inside the loop */
    char endpoint[256];
    char ckpt_path[DP_PS_PATH_LEN + 64];
    uint64_t ckpt_version; /* version last written (UINT64_MAX: none) */
    uint64_t ckpt_failures; /* checkpoint writes that failed (metrics, stop line) */
    dp_ckpt_run_t run;     /* the run the checkpoints belong to; .finished as last written */
    dp_metrics_t *metrics; /* JSON lines; a no-op without --metrics */
    dp_record_t *rec;      /* --record: the schedule, or NULL */
    double next_metrics;
    int quit;              /* SHUTDOWN received */
    dp_auth_t auth;        /* worker ids bound to connections / keys, the chief's token */
    dp_zap_t *zap;         /* CURVE: the gate (NULL without --curve-secret) */
    const char *peer_key;  /* CURVE: User-Id of the message being handled, else NULL */
    const char *peer_addr; /* its Peer-Address (ZeroMQ's; NULL when it has none) */
    double startup_deadline; /* dp_now() by which every worker must have said HELLO; 0 = none */
    uint64_t incarnation;  /* random per start, on every reply: clients see a restart */
    uint64_t start_version; /* the version this start restored (0 fresh): Welcome.start_version */
    dp_ps_shm_t *shm;      /* shared memory for co-located workers; NULL until one asks */
    uint64_t mismatches;   /* requests refused for another model (logged: s_log_mismatch) */
    dp_shard_parts_t parts; /* pushes in parts being assembled, one per worker at most */
    dp_shard_early_t early; /* the early step of one of them (server/shard_early.h) */
} s_ps_t;

/* ---- replies ---------------------------------------------------------- */

static void s_send(s_ps_t *ps, zmq_msg_t *id, Downpour__Envelope *env,
                   const dp_wire_payload_t *pl, int n_pl)
{
    char err[DP_ERR_LEN];
    if (dp_wire_send(ps->sock, id, env, pl, n_pl, err) == 0) return;
    ps->net_errors++;
    dp_log_warn("shard %d: reply %s not sent: %s", ps->cfg->shard_index,
                dp_wire_type_name(env->type), err);
}

static void s_env(const s_ps_t *ps, Downpour__Envelope *env, int type, uint64_t req, int worker)
{
    dp_wire_env_init(env, type, req, worker, ps->shard.model.fingerprint);
    env->incarnation = ps->incarnation;
}

/* ERROR with Error.code (DOWNPOUR__ERROR_CODE__*), not counted. */
static void s_send_error(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                         const char *msg)
{
    dp_log_debug("shard %d: ERROR to worker %d: %s", ps->cfg->shard_index, worker, msg);
    Downpour__Envelope env;
    s_env(ps, &env, DOWNPOUR__MSG_TYPE__ERROR, req, worker);
    Downpour__Error e = DOWNPOUR__ERROR__INIT;
    e.message = (char *)msg;
    e.code = (Downpour__ErrorCode)code;
    env.error = &e;
    s_send(ps, id, &env, NULL, 0);
}

/* ERROR with Error.code, counted as malformed. */
static void s_reply_error_code(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                               const char *msg)
{
    ps->shard.counts.malformed++;
    ps->shard.counts.rejected++;
    s_send_error(ps, id, req, worker, code, msg);
}

static void s_reply_error(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, const char *msg)
{
    s_reply_error_code(ps, id, req, worker, DOWNPOUR__ERROR_CODE__ERR_NONE, msg);
}

/* ZeroMQ's free callback of a PARAMS frame (on its I/O thread): the buffer's
 * reference goes, the worker's slot is free again. */
static void s_lent_release(void *data, void *hint)
{
    (void)data;
    s_lent_t *l = hint;
    if (atomic_fetch_sub_explicit(&l->frames, 1, memory_order_acq_rel) != 1) return;
    dp_snap_t *snap = l->snap;
    l->snap = NULL;
    dp_snap_unref(NULL, snap);
    atomic_store_explicit(&l->busy, 0, memory_order_release);
}

/* A free slot of the worker's, or NULL: it has DP_PS_PARAMS_PER_WORKER
 * PARAMS frames ZeroMQ could not send yet (it does not read them). */
static s_lent_t *s_lend(s_ps_t *ps, int worker)
{
    s_lent_t *l = ps->lent + (size_t)worker * DP_PS_PARAMS_PER_WORKER;
    for (int k = 0; k < DP_PS_PARAMS_PER_WORKER; k++)
        if (atomic_load_explicit(&l[k].busy, memory_order_acquire) == 0) {
            atomic_store_explicit(&l[k].busy, 1, memory_order_relaxed);
            return &l[k];
        }
    return NULL;
}

/* PARAMS: the live buffer goes to ZeroMQ as it is (its reference with it);
 * the shard writes the next version elsewhere while ZeroMQ holds it. In
 * bfloat16 (--wire bf16) the version is converted once and sent as is. A
 * reply in parts (Pull.cuts) is one message per run between the cuts, in
 * order, every frame pointing into the same buffer: one version, one loan.
 * A shared-memory reader is told the slot instead of getting a frame (the
 * slot whole: its cuts do not apply). A worker whose earlier PARAMS replies
 * all still wait in ZeroMQ is answered "busy" instead (s_lend). */
static void s_reply_params(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                           const s_params_ask_t *ask)
{
    int bf16 = ask->bf16 && ask->how != S_PARAMS_SHM;
    dp_snap_t *s = bf16 ? dp_shard_snapshot_bf16(&ps->shard) : dp_shard_snapshot(&ps->shard);
    uint64_t lo = ps->shard.lo, hi = lo + ps->shard.n; /* s->n counts bfloat16 pairs */
    Downpour__Envelope env;
    s_env(ps, &env, DOWNPOUR__MSG_TYPE__PARAMS, req, worker);
    Downpour__Params p = DOWNPOUR__PARAMS__INIT;
    p.version = s->version;
    env.params = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    int crc = ask->how == S_PARAMS_CRC;
    env.n_tensors = 1;
    env.tensors = dv;
    if (ask->how == S_PARAMS_SHM && ps->shm && dp_ps_shm_params(ps->shm, &p.shm_slot, &p.shm_seq)) {
        dp_wire_desc_fill(&d, shape, "params", NULL, hi - lo, lo, 1, 0);
        dp_wire_desc_no_checksum(&d);
        env.shm = 1; /* the reader copies the slot itself */
        dp_shard_dc_pulled(&ps->shard, worker);
        s_send(ps, id, &env, NULL, 0);
        dp_snap_unref(NULL, s);
        return;
    }
    s_lent_t *l = s_lend(ps, worker);
    if (!l) {
        dp_snap_unref(NULL, s);
        char msg[DP_ERR_LEN];
        snprintf(msg, sizeof msg,
                 "busy: worker %d has %d PARAMS replies this shard could not send yet (is it "
                 "reading its replies?); pull again once they are read",
                 worker, DP_PS_PARAMS_PER_WORKER);
        s_reply_error(ps, id, req, worker, msg);
        return;
    }
    uint32_t parts = ask->n_cuts + 1;
    l->snap = s;
    atomic_store_explicit(&l->frames, (int)parts, memory_order_relaxed);
    dp_shard_dc_pulled(&ps->shard, worker); /* the weights its next push was computed on */
    p.parts = parts > 1 ? parts : 0;
    size_t esize = bf16 ? 2 : sizeof(float);
    for (uint32_t k = 0; k < parts; k++) {
        uint64_t a = k ? ask->cuts[k - 1] : lo, b = k < ask->n_cuts ? ask->cuts[k] : hi;
        const char *at = (const char *)s->data + (a - lo) * esize;
        /* a whole reply's CRC is the snapshot's, computed once for every pull of it */
        dp_wire_desc_fill(&d, shape, "params", bf16 ? NULL : (const float *)at, b - a, a,
                          parts == 1 || !crc || bf16, crc && !bf16 && parts == 1 ? dp_snap_crc(s) : 0);
        if (bf16) dp_wire_desc_bf16(&d, (const uint16_t *)at, crc);
        else if (!crc) dp_wire_desc_no_checksum(&d);
        p.part = k;
        dp_wire_payload_t pl = {(void *)at, (b - a) * esize, s_lent_release, l};
        s_send(ps, id, &env, &pl, 1);
    }
}

static void s_reply_ack(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                        const dp_push_outcome_t *o)
{
    Downpour__Envelope env;
    s_env(ps, &env, DOWNPOUR__MSG_TYPE__ACK, req, worker);
    Downpour__Ack a = DOWNPOUR__ACK__INIT;
    a.status = (Downpour__AckStatus)o->status; /* same numbers, policy.h */
    a.reason = (char *)o->reason;
    a.staleness = o->staleness;
    a.version = ps->shard.version;
    env.ack = &a;
    s_send(ps, id, &env, NULL, 0);
}

/* A push refused before the policy saw it. */
static void s_reply_rejected(s_ps_t *ps, zmq_msg_t *id, uint64_t req, int worker, const char *why)
{
    ps->shard.counts.rejected++;
    dp_push_outcome_t o = {.status = DP_PUSH_REJECTED};
    snprintf(o.reason, sizeof o.reason, "%s", why);
    s_reply_ack(ps, id, req, worker, &o);
}

static void s_reply_bare(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env, int type)
{
    Downpour__Envelope rep;
    s_env(ps, &rep, type, env->request_id, env->worker_id);
    s_send(ps, id, &rep, NULL, 0);
}

/* ---- checkpoints, metrics, held pulls ---------------------------------- */

/* Write the shard unless there is no --checkpoint-dir or this version is on
 * disk as finished or not. finished: the run ended (the chief's SHUTDOWN),
 * so the same flags do not silently restart it. */
static int s_checkpoint(s_ps_t *ps, int finished, char *err)
{
    if (!ps->cfg->checkpoint_dir[0]) return 0;
    if (ps->ckpt_version == ps->shard.version && ps->run.finished == finished) return 0;
    ps->run.finished = finished;
    if (dp_shard_checkpoint_write(&ps->shard, ps->ckpt_path, &ps->run, err) != 0) {
        /* Loud, every time: a restart would go back to what the file holds. */
        ps->ckpt_failures++;
        char held[96] = "holds no checkpoint yet";
        if (ps->ckpt_version != UINT64_MAX)
            snprintf(held, sizeof held, "holds version %" PRIu64 ", which a restart goes back to",
                     ps->ckpt_version);
        dp_log_error("shard %d: checkpoint of version %" PRIu64 " FAILED (%" PRIu64 " failure%s "
                     "so far; %s %s): %s", ps->cfg->shard_index, ps->shard.version,
                     ps->ckpt_failures, ps->ckpt_failures > 1 ? "s" : "", ps->ckpt_path, held, err);
        return -1;
    }
    ps->ckpt_version = ps->shard.version;
    dp_log_debug("shard %d: checkpoint at version %" PRIu64 " in %s", ps->cfg->shard_index,
                 ps->shard.version, ps->ckpt_path);
    return 0;
}

/* The version moved: checkpoint when --checkpoint-every says so. */
static void s_version_moved(s_ps_t *ps)
{
    long every = ps->cfg->checkpoint_every;
    char err[DP_ERR_LEN];
    if (every > 0 && ps->shard.version % (uint64_t)every == 0)
        s_checkpoint(ps, 0, err); /* a failure is logged and counted there */
}

static void s_metrics_line(s_ps_t *ps)
{
    cJSON *line = dp_metrics_line(ps->metrics);
    if (!line) return;
    const dp_shard_counts_t *c = &ps->shard.counts;
    double mean = c->applied ? (double)c->staleness_sum / (double)c->applied : 0.0;
    cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
    cJSON_AddNumberToObject(line, "version", (double)ps->shard.version);
    cJSON_AddNumberToObject(line, "applied", (double)c->applied);
    cJSON_AddNumberToObject(line, "dropped", (double)c->dropped);
    cJSON_AddNumberToObject(line, "rejected", (double)c->rejected);
    cJSON_AddNumberToObject(line, "staleness_mean", dp_metrics_round(mean, 4));
    cJSON_AddNumberToObject(line, "staleness_max", (double)c->staleness_max);
    cJSON_AddNumberToObject(line, "net_errors", (double)ps->net_errors);
    cJSON_AddNumberToObject(line, "repeats", (double)c->repeats);
    cJSON_AddNumberToObject(line, "steps_early", (double)c->steps_early);
    cJSON_AddNumberToObject(line, "early_dropped", (double)c->early_dropped);
    cJSON_AddNumberToObject(line, "auth_refused", (double)ps->auth.refused);
    cJSON_AddNumberToObject(line, "curve_refused", ps->zap ? (double)dp_zap_refused(ps->zap) : 0.0);
    cJSON_AddNumberToObject(line, "snapshots", dp_snap_alive());
    cJSON_AddNumberToObject(line, "held_pulls", ps->n_pending);
    cJSON_AddNumberToObject(line, "checkpoint_failures", (double)ps->ckpt_failures);
    if (ps->shard.dc) {
        cJSON_AddNumberToObject(line, "dc_compensated", (double)ps->shard.dc->compensated);
        cJSON_AddNumberToObject(line, "dc_fallback", (double)ps->shard.dc->fallback);
    }
    dp_metrics_write(ps->metrics, &line);
}

/* The first line of each start: a metrics file is appended to, so this
 * marks where a run (or a restart of it) begins. */
static void s_metrics_start(s_ps_t *ps)
{
    cJSON *line = dp_metrics_line(ps->metrics);
    if (!line) return;
    cJSON_AddStringToObject(line, "event", "start");
    cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
    cJSON_AddStringToObject(line, "run_id", ps->run.id);
    cJSON_AddNumberToObject(line, "version", (double)ps->shard.version);
    dp_metrics_write(ps->metrics, &line);
}

/* Answer every held pull the policy now allows, in arrival order. */
static void s_release_pending(s_ps_t *ps)
{
    int j = 0;
    for (int i = 0; i < ps->n_pending; i++) {
        s_pending_t *p = &ps->pending[i];
        if (dp_policy_pull_ready(ps->policy, p->worker, p->min_version)) {
            s_reply_params(ps, &p->identity, p->request_id, p->worker, &p->ask);
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
static void s_members_changed(s_ps_t *ps)
{
    dp_record_members(ps->rec, ps->cfg->shard_index, &ps->members);
    if (dp_policy_members_changed(ps->policy)) s_version_moved(ps);
    s_release_pending(ps);
}

/* A held pull proves nothing (its worker may have died waiting): workers
 * send HEARTBEATs while they wait and while they compute (worker/ps_beat.h). */
static void s_sweep(s_ps_t *ps, double now)
{
    if (dp_members_sweep(&ps->members, now, ps->cfg->heartbeat_timeout) > 0) s_members_changed(ps);
}

/* ---- authority (server/auth.h) ---------------------------------------- */

static dp_auth_peer_t s_peer(const s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    return (dp_auth_peer_t){zmq_msg_data(id), zmq_msg_size(id), ps->peer_key, env->session};
}

/* auth.h's "live": the ROUTER still has a peer with this routing id. */
static int s_conn_live(void *arg, const void *conn, size_t len)
{
    s_ps_t *ps = arg;
    Downpour__Envelope env;
    s_env(ps, &env, DOWNPOUR__MSG_TYPE__HEARTBEAT, 0, -1);
    return dp_auth_router_has_peer(ps->sock, conn, len, &env);
}

/* HELLO: may this connection (and key) take its worker id? Answers
 * ERR_ID_TAKEN when not. */
static int s_claim(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    char msg[DP_ERR_LEN];
    dp_auth_peer_t p = s_peer(ps, id, env);
    if (dp_auth_claim(&ps->auth, env->worker_id, &p, s_conn_live, ps, msg, sizeof msg) == 0)
        return 1;
    dp_log_warn("shard %d: HELLO refused: %s", ps->cfg->shard_index, msg);
    s_reply_error_code(ps, id, env->request_id, env->worker_id, DOWNPOUR__ERROR_CODE__ERR_ID_TAKEN,
                       msg);
    return 0;
}

/* Any other request: a worker id only on its own connection, STATS and
 * SHUTDOWN only from the chief. Answers when not; nothing else changes. */
static int s_authorized(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    if (env->type == DOWNPOUR__MSG_TYPE__HELLO) return 1; /* s_claim, once the model matched */
    char msg[DP_ERR_LEN];
    int code;
    dp_auth_peer_t p = s_peer(ps, id, env);
    if (dp_auth_check(&ps->auth, env->type, env->worker_id, env->run_token, &p, &code, msg,
                      sizeof msg) == 0)
        return 1;
    /* A refused HEARTBEAT is counted in auth_refused only: the shard's
     * rejected / malformed account for pushes and broken messages, and a
     * restarted worker's beats before its HELLO are neither. */
    if (env->type == DOWNPOUR__MSG_TYPE__HEARTBEAT)
        s_send_error(ps, id, env->request_id, env->worker_id, code, msg);
    else
        s_reply_error_code(ps, id, env->request_id, env->worker_id, code, msg);
    return 0;
}

/* --startup-timeout: every worker said HELLO by the deadline, or the shard
 * fails naming those that did not (their ids: their --task-index). */
static int s_check_startup(s_ps_t *ps, double now, char *err)
{
    if (ps->startup_deadline <= 0) return 0;
    char ids[120];
    int missing = dp_members_missing(&ps->members, ids, sizeof ids);
    if (missing == 0) ps->startup_deadline = 0; /* checked once: later silence is liveness */
    if (missing == 0 || now < ps->startup_deadline) return 0;
    return dp_err(err, "start-up: %d of %d workers never said HELLO within %g s (--startup-timeout): "
                  "worker id(s) %s; are they running with this shard (%s) in --ps?",
                  missing, ps->members.n, ps->cfg->startup_timeout, ids, ps->endpoint);
}

/* ---- request handlers ------------------------------------------------- */

static int s_same_model(const dp_model_t *m, const Downpour__Envelope *env)
{
    const Downpour__Hello *h = env->hello;
    const char *spec = h->model_spec ? h->model_spec : "";
    return env->model_fingerprint == m->fingerprint && strcmp(spec, m->spec) == 0 &&
           h->in_c == m->in_c && h->in_h == m->in_h && h->in_w == m->in_w &&
           h->n_floats == m->n_floats;
}

/* Welcome.worker_step: where a (restarted) worker resumes. */
static uint64_t s_welcome_step(const s_ps_t *ps, int wid)
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
static void s_grant_shm(s_ps_t *ps, int wid, Downpour__Welcome *wl)
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

/* A request for another model: both sides into the shard's log (the first
 * ten, then one in a thousand, so a flood cannot fill it). The reply says
 * only that the models differ: the spec and its fingerprint are all a HELLO
 * needs, so a peer that does not know them is not told. */
static void s_log_mismatch(s_ps_t *ps, const Downpour__Envelope *env)
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

static void s_on_hello(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
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
        s_reply_error_code(ps, id, env->request_id, env->worker_id,
                           DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH, msg);
        return;
    }
    if (!s_claim(ps, id, env)) return;
    dp_members_join(&ps->members, env->worker_id);
    Downpour__Envelope rep;
    s_env(ps, &rep, DOWNPOUR__MSG_TYPE__WELCOME, env->request_id, env->worker_id);
    Downpour__Welcome wl = DOWNPOUR__WELCOME__INIT;
    wl.mode = (Downpour__Mode)ps->cfg->mode;
    wl.num_workers = ps->members.n;
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
    wl.push_parts = DP_WIRE_MAX_PUSH_PARTS;
    wl.heartbeat_timeout = ps->cfg->heartbeat_timeout;
    wl.run_token = dp_auth_token_for(&ps->auth, env->worker_id);
    wl.worker_step = s_welcome_step(ps, env->worker_id);
    dp_ps_shm_revoke(ps->shm, env->worker_id); /* a grant holds for the HELLO that got it */
    dp_shard_parts_drop(&ps->parts, env->worker_id); /* it repeats a push whole, every part */
    dp_shard_early_hello(&ps->early, env->worker_id);
    if (env->hello->shm) s_grant_shm(ps, env->worker_id, &wl);
    rep.welcome = &wl;
    s_send(ps, id, &rep, NULL, 0);
    s_members_changed(ps); /* it may have been finished before */
}

/* What a PULL asks of its reply; -1 with why (its cuts outside the
 * range). dp_wire_check has seen them ascending and fewer than the limit. */
static int s_params_ask(const s_ps_t *ps, const Downpour__Envelope *env, s_params_ask_t *ask,
                        char *why)
{
    const Downpour__Pull *p = env->pull;
    ask->how = env->shm ? S_PARAMS_SHM : p->no_checksum ? S_PARAMS_NO_CRC : S_PARAMS_CRC;
    ask->bf16 = p->dtype == DOWNPOUR__DTYPE__BFLOAT16;
    ask->n_cuts = 0;
    if (ask->how == S_PARAMS_SHM) return 0; /* the slot goes whole */
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

static void s_on_pull(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    int wid = env->worker_id;
    s_params_ask_t ask;
    char why[DP_ERR_LEN];
    if (s_params_ask(ps, env, &ask, why) != 0) {
        dp_log_warn("shard %d: worker %d: %s", ps->cfg->shard_index, wid, why);
        s_reply_error(ps, id, env->request_id, wid, why);
        return;
    }
    if (dp_policy_pull_ready(ps->policy, wid, env->pull->min_version)) {
        s_reply_params(ps, id, env->request_id, wid, &ask);
        return;
    }
    /* Per worker, so one that floods pulls is refused and the others wait
     * as ever. A worker holds one pull per shard, two or three after it
     * repeated one (a restart, a lost reply). */
    if (ps->held[wid] >= DP_PS_HELD_PER_WORKER) {
        char msg[DP_ERR_LEN];
        snprintf(msg, sizeof msg,
                 "too many held pulls: worker %d has %d pulls waiting at this shard already (at "
                 "most %d)", wid, ps->held[wid], DP_PS_HELD_PER_WORKER);
        s_reply_error(ps, id, env->request_id, wid, msg);
        return;
    }
    s_pending_t *p = &ps->pending[ps->n_pending];
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
    ps->n_pending++;
    ps->held[wid]++;
}

/* A push of a (worker, step) this shard applied already (its ACK was lost,
 * or the worker repeated it after a timeout): acknowledged as APPLIED —
 * from the worker's side it was, once — with the reason saying it was a
 * repeat; counted in "repeats" only, not applied again. 1 when answered. */
static int s_push_repeated(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    if (!dp_shard_step_seen(&ps->shard, env->worker_id, env->push->step)) return 0;
    ps->shard.counts.repeats++;
    dp_push_outcome_t o = {.status = DP_PUSH_APPLIED};
    snprintf(o.reason, sizeof o.reason, "repeat: step %" PRIu64 " of worker %d was applied before",
             env->push->step, env->worker_id);
    dp_log_debug("shard %d: %s", ps->cfg->shard_index, o.reason);
    s_reply_ack(ps, id, env->request_id, env->worker_id, &o);
    return 1;
}

/* Test hook, read here only: DP_TEST_KILL_AT_VERSION=V makes the shard die
 * as by kill -9 (SIGKILL: no checkpoint, no reply, nothing flushed) on the
 * first PUSH of worker 0 (the chief) computed on version V or later, before
 * applying it. The chief has then seen that version, so a restart test
 * knows what is lost: the versions after the last checkpoint up to the one
 * logged here (in sync mode the shard's version is the push's). */
static void s_test_kill_at_version(const s_ps_t *ps, const Downpour__Envelope *env)
{
    const char *v = getenv("DP_TEST_KILL_AT_VERSION");
    if (!v || !v[0] || env->worker_id != 0 || env->push->version < strtoull(v, NULL, 10)) return;
    fprintf(stderr, "downpour-ps: DP_TEST_KILL_AT_VERSION: dying as by kill -9 at version %" PRIu64
            " (a push of worker 0 on version %" PRIu64 ")\n", ps->shard.version, env->push->version);
    raise(SIGKILL);
}

/* A gradient that passed every check (g: n slices tiling the range, all
 * finite), whole or assembled from its parts: the repeat check, the policy,
 * the record, the reply. */
static void s_push_apply(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                         const dp_grad_slice_t *g, int n_frames)
{
    int wid = env->worker_id;
    if (s_push_repeated(ps, id, env)) return;
    s_test_kill_at_version(ps, env);
    dp_push_outcome_t o;
    bool early = dp_shard_early_of(&ps->early, wid, env->push->step); /* the policy may commit it */
    dp_policy_push(ps->policy, wid, env->push->version, g, n_frames, early, &o);
    dp_record_push(ps->rec, ps->cfg->shard_index, wid, env->push->step, env->push->version, &o,
                   ps->shard.version, &ps->members);
    /* before a due checkpoint, so the file holds the step with its update */
    if (o.status == DP_PUSH_APPLIED) dp_shard_step_done(&ps->shard, wid, env->push->step);
    if (o.stepped) s_version_moved(ps);
    s_reply_ack(ps, id, env->request_id, wid, &o);
    if (o.status == DP_PUSH_APPLIED) s_release_pending(ps);
    /* after the replies: the next early step's catch-up should not delay them */
    dp_shard_early_pushed(&ps->early, wid, env->push->step);
}

/* A part of a push in parts (Push.parts > 1): the same step checks as a
 * whole push, then server/shard_parts.h checks and copies it; the part
 * that completes the push takes the whole push's path with the assembled
 * gradient, the others are answered RECEIVED (or REJECTED: the rule for a
 * bad part, ARCHITECTURE.md). */
static void s_on_push_part(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                           const dp_wire_frame_t *frames, int n_frames)
{
    char msg[DP_ERR_LEN];
    int wid = env->worker_id;
    if (dp_shard_step_check(&ps->shard, wid, env->push->step, msg, sizeof msg) != 0) {
        s_reply_error(ps, id, env->request_id, wid, msg);
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
        s_reply_ack(ps, id, env->request_id, wid, &o);
        return;
    }
    case DP_PARTS_REJECTED: {
        dp_log_debug("shard %d: worker %d: %s", ps->cfg->shard_index, wid, msg);
        if (first) ps->shard.counts.rejected++;
        dp_push_outcome_t o = {.status = DP_PUSH_REJECTED};
        snprintf(o.reason, sizeof o.reason, "%s", msg);
        s_reply_ack(ps, id, env->request_id, wid, &o);
        return;
    }
    case DP_PARTS_COMPLETE: s_push_apply(ps, id, env, &g, 1); return;
    }
}

static void s_on_push(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int n_frames)
{
    char msg[DP_ERR_LEN];
    int wid = env->worker_id;
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
        s_reply_error(ps, id, env->request_id, wid, msg);
        return;
    }
    /* Before it may count as a repeat or be recorded: a step out of reach
     * would make the worker's real pushes repeats, in the checkpoint too. */
    if (dp_shard_step_check(&ps->shard, wid, env->push->step, msg, sizeof msg) != 0) {
        s_reply_error(ps, id, env->request_id, wid, msg);
        return;
    }
    /* Handled whatever becomes of it (dropped, refused as non-finite): the
     * worker's next step follows this one. */
    dp_shard_step_handled(&ps->shard, wid, env->push->step);
    dp_shard_early_whole(&ps->early, wid, env->push->step);
    if (dp_shard_parts_whole(&ps->parts, wid, env->push->step, msg) != 0) {
        s_reply_rejected(ps, id, env->request_id, wid, msg);
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
        if (rejected) s_reply_rejected(ps, id, env->request_id, wid, msg);
        else s_reply_error(ps, id, env->request_id, wid,
                           ps->shm ? msg : "malformed: PUSH through shared memory, which this shard has not granted");
        return;
    }
    if (env->shm) n_frames = 1; /* the private copy */
    else if (dp_shard_grad_nonfinite(&ps->shard, g, n_frames)) {
        dp_wire_frame_t fw[DP_WIRE_MAX_TENSORS];
        for (int f = 0; f < n_frames; f++) fw[f] = (dp_wire_frame_t){g[f].data, g[f].len};
        dp_wire_check_finite(fw, n_frames, msg); /* names the element */
        s_reply_rejected(ps, id, env->request_id, wid, msg);
        return;
    }
    s_push_apply(ps, id, env, g, n_frames);
}

static void s_on_barrier(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    if (env->barrier->finished) dp_members_finish(&ps->members, env->worker_id);
    Downpour__Envelope rep;
    s_env(ps, &rep, DOWNPOUR__MSG_TYPE__BARRIER, env->request_id, env->worker_id);
    Downpour__Barrier b = DOWNPOUR__BARRIER__INIT;
    int joined;
    dp_members_counts(&ps->members, &joined, &b.workers_finished, &b.workers_gone);
    b.finished = env->barrier->finished;
    b.num_workers = ps->members.n;
    rep.barrier = &b;
    s_send(ps, id, &rep, NULL, 0);
    s_members_changed(ps);
}

static void s_on_stats(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    const dp_shard_counts_t *c = &ps->shard.counts;
    Downpour__Envelope rep;
    s_env(ps, &rep, DOWNPOUR__MSG_TYPE__STATS, env->request_id, env->worker_id);
    Downpour__Stats s = DOWNPOUR__STATS__INIT;
    s.applied = c->applied;
    s.dropped = c->dropped;
    s.rejected = c->rejected;
    s.version = ps->shard.version;
    s.staleness_sum = c->staleness_sum;
    s.staleness_max = c->staleness_max;
    s.staleness_mean = c->applied ? (double)c->staleness_sum / (double)c->applied : 0.0;
    s.malformed = c->malformed;
    s.steps_early = c->steps_early;
    dp_members_counts(&ps->members, &s.workers_joined, &s.workers_finished, &s.workers_gone);
    s.num_workers = ps->members.n;
    uint64_t hist[DP_STATS_HIST_BINS];
    s.n_staleness_hist = dp_staleness_fold(&ps->policy->staleness, hist, DP_STATS_HIST_BINS);
    s.staleness_hist = hist;
    rep.stats = &s;
    s_send(ps, id, &rep, NULL, 0);
}

static void s_on_shutdown(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    char err[DP_ERR_LEN];
    dp_log_info("shard %d: SHUTDOWN from worker %d", ps->cfg->shard_index, env->worker_id);
    /* The final checkpoint is on disk before the requester hears back. */
    s_checkpoint(ps, 1, err); /* a failure is logged and counted there */
    s_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__SHUTDOWN);
    ps->quit = 1;
}

/* ---- receiving: limits, validation, dispatch --------------------------- */

/* A message over the limits, already discarded by dp_wire_recv_bounded. */
static void s_refuse_oversized(s_ps_t *ps, dp_wire_rx_t *rx)
{
    char msg[DP_ERR_LEN];
    snprintf(msg, sizeof msg,
             "malformed: message of %zu bytes in %d frames refused (this shard takes at most %zu "
             "bytes in %d frames)",
             rx->n_bytes, rx->n_total, ps->max_msg, DP_WIRE_MAX_PARTS);
    if (rx->n_parts > 0) { /* the ROUTER identity: answerable */
        s_reply_error(ps, &rx->parts[0], 0, -1, msg);
        return;
    }
    ps->shard.counts.malformed++;
    ps->shard.counts.rejected++;
    dp_log_debug("shard %d: %s", ps->cfg->shard_index, msg);
}

/* May this valid envelope reach its handler? Answers it when not. */
static int s_admit(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env)
{
    char msg[DP_ERR_LEN + 128];
    int type = env->type, wid = env->worker_id;
    int admin = type == DOWNPOUR__MSG_TYPE__STATS || type == DOWNPOUR__MSG_TYPE__HEARTBEAT ||
                type == DOWNPOUR__MSG_TYPE__SHUTDOWN;
    int request = admin || type == DOWNPOUR__MSG_TYPE__HELLO || type == DOWNPOUR__MSG_TYPE__PULL ||
                  type == DOWNPOUR__MSG_TYPE__PUSH || type == DOWNPOUR__MSG_TYPE__BARRIER;
    msg[0] = 0;
    int code = DOWNPOUR__ERROR_CODE__ERR_NONE;
    if (!request)
        snprintf(msg, sizeof msg, "malformed: %s is a reply, not a request", dp_wire_type_name(type));
    /* Tools may ask STATS / HEARTBEAT / SHUTDOWN with fingerprint 0; HELLO
     * answers a mismatch itself. Neither reply names this shard's model. */
    else if (type != DOWNPOUR__MSG_TYPE__HELLO && env->model_fingerprint != ps->shard.model.fingerprint &&
             !(admin && env->model_fingerprint == 0)) {
        snprintf(msg, sizeof msg,
                 "model mismatch: fingerprint %016" PRIx64 " is not this shard's model (the "
                 "shard's log names its own)", env->model_fingerprint);
        code = DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH;
        s_log_mismatch(ps, env);
    }
    else if (!admin && (wid < 0 || wid >= ps->members.n))
        snprintf(msg, sizeof msg, "worker id %d out of range: this cluster has %d workers (--workers)",
                 wid, ps->members.n);
    if (msg[0]) {
        s_reply_error_code(ps, id, env->request_id, wid, code, msg);
        return 0;
    }
    if (!s_authorized(ps, id, env)) return 0;
    if (wid < 0 || wid >= ps->members.n) return 1; /* a tool */
    if (dp_members_heard(&ps->members, wid, dp_now())) s_members_changed(ps);
    if (type != DOWNPOUR__MSG_TYPE__PULL && type != DOWNPOUR__MSG_TYPE__PUSH &&
        type != DOWNPOUR__MSG_TYPE__BARRIER)
        return 1;
    if (ps->members.w[wid].joined) return 1;
    /* e.g. this shard restarted: the client says HELLO again and repeats */
    snprintf(msg, sizeof msg, "worker %d has not said HELLO to this shard", wid);
    s_reply_error_code(ps, id, env->request_id, wid, DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER, msg);
    return 0;
}

static void s_dispatch(s_ps_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int n_frames)
{
    /* each admitted request in arrival order (DP_LOG=debug): what a worker asked, and when */
    dp_log_debug("shard %d: %s from worker %d", ps->cfg->shard_index, dp_wire_type_name(env->type),
                 env->worker_id);
    switch (env->type) {
    case DOWNPOUR__MSG_TYPE__HELLO: s_on_hello(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__PULL: s_on_pull(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__PUSH: s_on_push(ps, id, env, frames, n_frames); break;
    case DOWNPOUR__MSG_TYPE__BARRIER: s_on_barrier(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__STATS: s_on_stats(ps, id, env); break;
    case DOWNPOUR__MSG_TYPE__HEARTBEAT: s_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__HEARTBEAT); break;
    case DOWNPOUR__MSG_TYPE__SHUTDOWN: s_on_shutdown(ps, id, env); break;
    default: break; /* s_admit let only requests through */
    }
}

/* One received multipart: limits, decode, structural checks, admission,
 * then its handler. */
static void s_handle(s_ps_t *ps, dp_wire_rx_t *rx)
{
    char err[DP_ERR_LEN];
    if (rx->n_total > rx->n_parts) {
        s_refuse_oversized(ps, rx);
        return;
    }
    zmq_msg_t *id = &rx->parts[0]; /* ROUTER always prepends the identity */
    if (rx->n_parts < 2) {
        s_reply_error(ps, id, 0, -1, "malformed: message without an envelope frame");
        return;
    }
    Downpour__Envelope *env =
        dp_wire_decode(zmq_msg_data(&rx->parts[1]), zmq_msg_size(&rx->parts[1]), err);
    if (!env) {
        s_reply_error(ps, id, 0, -1, err);
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
    if (dp_wire_check(env, frames, n_frames, err) != 0)
        s_reply_error(ps, id, env->request_id, env->worker_id, err);
    else if (s_admit(ps, id, env))
        s_dispatch(ps, id, env, frames, n_frames);
    dp_wire_destroy(&env);
}

/* ---- setup and loop --------------------------------------------------- */

static int s_setopt(void *sock, int opt, const void *v, size_t len, const char *name, char *err)
{
    if (zmq_setsockopt(sock, opt, v, len) == 0) return 0;
    return dp_err(err, "socket option %s: %s", name, zmq_strerror(errno));
}

/* CURVE on the ROUTER and its gate (before bind), with --curve-secret. */
static int s_secure(s_ps_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (!cfg->curve_secret[0]) return 0;
    dp_curve_key_t sec, pub;
    if (dp_curve_read_secret(cfg->curve_secret, &sec, &pub, err) != 0 ||
        dp_curve_serve(ps->sock, &sec, err) != 0 ||
        dp_zap_new(&ps->zap, ps->ctx, ps->sock, cfg->curve_allow, err) != 0)
        return -1;
    /* Keys named after a task own that task's worker id (server/auth.h). */
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
static int s_open_socket(s_ps_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (!(ps->ctx = zmq_ctx_new())) return dp_err(err, "ZeroMQ context: %s", zmq_strerror(errno));
    if (!(ps->sock = zmq_socket(ps->ctx, ZMQ_ROUTER)))
        return dp_err(err, "ZeroMQ socket: %s", zmq_strerror(errno));
    /* The largest legitimate message is a PUSH of this shard's range: its
     * floats, an envelope and the identity. One frame may not be larger
     * either (ZeroMQ drops a peer that sends one). */
    ps->max_msg = ps->shard.n * sizeof(float) + DP_WIRE_MAX_ENVELOPE + DP_WIRE_MAX_IDENTITY;
    int64_t maxmsg = (int64_t)ps->max_msg;
    int zero = 0, sndhwm = S_SNDHWM, rcvhwm = S_RCVHWM;
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

/* The run's checkpoint restored, if the directory holds one this run may
 * take (server/shard_checkpoint.h says which). */
static int s_restore(s_ps_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (cfg->run_id[0]) snprintf(ps->run.id, sizeof ps->run.id, "%s", cfg->run_id);
    else dp_ps_config_run_id(cfg, ps->run.id, sizeof ps->run.id);
    ps->run.resume = cfg->resume;
    if (!cfg->checkpoint_dir[0]) return 0;
    char mk[DP_ERR_LEN];
    if (dp_mkdirs(cfg->checkpoint_dir, 0755, mk) != 0)
        return dp_err(err, "--checkpoint-dir %s: %s", cfg->checkpoint_dir, mk);
    dp_shard_checkpoint_path(ps->ckpt_path, sizeof ps->ckpt_path, cfg->checkpoint_dir,
                             cfg->shard_index, cfg->shard_count);
    /* What a kill between a checkpoint's write and its rename left. */
    int stale = dp_atomic_remove_stale(ps->ckpt_path, err);
    if (stale < 0) return -1;
    if (stale > 0)
        dp_log_info("shard %d: removed %d temporary file%s an interrupted checkpoint left in %s",
                    cfg->shard_index, stale, stale > 1 ? "s" : "", cfg->checkpoint_dir);
    int r = dp_shard_checkpoint_restore(&ps->shard, ps->ckpt_path, &ps->run, err);
    if (r < 0) return -1;
    if (r == 0 && cfg->resume)
        return dp_err(err, "--resume: %s has no checkpoint of shard %d/%d to continue",
                      cfg->checkpoint_dir, cfg->shard_index, cfg->shard_count);
    if (r == 1) {
        ps->ckpt_version = ps->shard.version;
        dp_log_info("shard %d: restored version %" PRIu64 " of run %s from %s", cfg->shard_index,
                    ps->shard.version, ps->run.id, ps->ckpt_path);
        return 0;
    }
    /* A fresh start writes its version 0 at once: from then on the
     * directory holds a checkpoint of this run, so a restart that finds
     * none is a start no earlier start preceded (or a file an operator
     * removed), never a run silently begun again; and a directory that
     * cannot be written fails the start, not the run hours later. */
    char e2[DP_ERR_LEN];
    if (s_checkpoint(ps, 0, e2) != 0)
        return dp_err(err, "--checkpoint-dir %s: cannot write the first checkpoint (%s)",
                      cfg->checkpoint_dir, e2);
    return 0;
}

/* Shard, members and policy from the config; the checkpoint restored. */
static int s_setup_state(s_ps_t *ps, char *err)
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
                           cfg->delay_lr, cfg->delay_k};
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
        dp_shard_set_threads(&ps->shard, dp_ps_config_threads(cfg), err) != 0)
        return -1;
    dp_members_init(&ps->members, cfg->num_workers, cfg->shard_index, dp_now());
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
    return s_restore(ps, err);
}

/* A random, non-zero id for this start of the shard. */
static int s_draw_incarnation(s_ps_t *ps, char *err)
{
    while (ps->incarnation == 0)
        if (getrandom(&ps->incarnation, sizeof ps->incarnation, 0) != sizeof ps->incarnation &&
            errno != EINTR)
            return dp_err(err, "getrandom: %s", strerror(errno));
    return 0;
}

static int s_setup(s_ps_t *ps, const dp_ps_config_t *cfg, char *err)
{
    ps->cfg = cfg;
    ps->ckpt_version = UINT64_MAX;
    if (s_draw_incarnation(ps, err) != 0) return -1;
    if (s_setup_state(ps, err) != 0) return -1;
    ps->start_version = ps->shard.version;
    if (dp_auth_init(&ps->auth, cfg->num_workers, cfg->curve_secret[0] != 0, err) != 0) return -1;
    if (dp_metrics_new(&ps->metrics, cfg->metrics_path, err) != 0) return -1;
    if (cfg->record[0] && dp_record_ps_open(&ps->rec, cfg, ps->policy, err) != 0) return -1;
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

static void s_close_socket(s_ps_t *ps)
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

static void s_teardown(s_ps_t *ps)
{
    /* Held pulls hear why instead of timing out. */
    for (int i = 0; i < ps->n_pending; i++) {
        s_pending_t *p = &ps->pending[i];
        s_reply_error(ps, &p->identity, p->request_id, p->worker, "shard shutting down");
        dp_wire_msg_close(&p->identity);
    }
    ps->n_pending = 0;
    s_close_socket(ps);
    dp_shard_early_fini(&ps->early); /* its buffer may be a slot: none is kept past the unmap */
    dp_ps_shm_destroy(&ps->shm); /* ZeroMQ holds no buffer now */
    dp_metrics_destroy(&ps->metrics);
    dp_record_abandon(&ps->rec);
    dp_policy_destroy(&ps->policy);
    dp_members_fini(&ps->members);
    dp_auth_fini(&ps->auth);
    dp_shard_fini(&ps->shard);
    dp_shard_parts_fini(&ps->parts);
    free(ps->pending);
    free(ps->held);
    free(ps->lent); /* the context ended: ZeroMQ released every frame */
}

/* Is a message waiting? Asked through ZMQ_EVENTS, which is where ZeroMQ
 * applies the credits its I/O thread returns for the replies each peer
 * read. A receive applies them only every 100 messages and a send at most
 * once a millisecond or so (libzmq throttles both), so a loop that only
 * received and sent could queue S_SNDHWM replies to a fast peer that reads
 * every one of them and see its pipe "full": the ROUTER then drops the next
 * reply as if the peer had stopped reading (test_ps_bounds' lockstep flood
 * lost a heartbeat's answer that way, about once in 80 runs on 2 busy
 * cores). */
static int s_readable(s_ps_t *ps)
{
    int events = 0;
    size_t len = sizeof events;
    if (zmq_getsockopt(ps->sock, ZMQ_EVENTS, &events, &len) != 0) return 0;
    return (events & ZMQ_POLLIN) != 0;
}

/* Wait up to 100 ms, then handle a bounded batch of what arrived. */
static void s_poll_once(s_ps_t *ps)
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
    s_ps_t ps;
    memset(&ps, 0, sizeof ps);
    int rc = -1;
    if (s_setup(&ps, cfg, err) != 0) goto done;
    if (cfg->on_ready) cfg->on_ready(ps.endpoint, cfg->on_ready_arg);
    ps.next_metrics = dp_now() + cfg->metrics_every;
    if (cfg->startup_timeout > 0) ps.startup_deadline = dp_now() + cfg->startup_timeout;
    s_metrics_start(&ps);
    s_metrics_line(&ps);
    while (!ps.quit && !(stop_flag && *stop_flag)) {
        s_poll_once(&ps);
        double now = dp_now();
        if (s_check_startup(&ps, now, err) != 0) goto done;
        s_sweep(&ps, now);
        if (ps.metrics && now >= ps.next_metrics) {
            s_metrics_line(&ps);
            ps.next_metrics = now + cfg->metrics_every;
        }
    }
    int ck = s_checkpoint(&ps, ps.run.finished, err); /* a failure is logged and counted there */
    s_metrics_line(&ps);
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
