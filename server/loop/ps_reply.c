/* ps_reply: downpour-ps's replies (server/loop/ps_loop.h) — every reply built
 * by dp_ps_env (the shard's fingerprint and incarnation stamped), ERROR
 * with its code (counted as malformed or not), PARAMS handing ZeroMQ the
 * live buffer itself (lent per worker: DP_PS_PARAMS_PER_WORKER at most),
 * ACK with the policy's decision. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/util.h"
#include "server/core/shard_dc.h"
#include "server/loop/ps_loop.h"

void dp_ps_send(dp_ps_loop_t *ps, zmq_msg_t *id, Downpour__Envelope *env,
                const dp_wire_payload_t *pl, int n_pl)
{
    char err[DP_ERR_LEN];
    if (dp_wire_send(ps->sock, id, env, pl, n_pl, err) == 0) return;
    ps->net_errors++;
    dp_log_warn("shard %d: reply %s not sent: %s", ps->cfg->shard_index,
                dp_wire_type_name(env->type), err);
}

void dp_ps_env(const dp_ps_loop_t *ps, Downpour__Envelope *env, int type, uint64_t req, int worker)
{
    dp_wire_env_init(env, type, req, worker, ps->shard.model.fingerprint);
    env->incarnation = ps->incarnation;
}

/* ERROR with Error.code (DOWNPOUR__ERROR_CODE__*), not counted. */
void dp_ps_send_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                      const char *msg)
{
    dp_log_debug("shard %d: ERROR to worker %d: %s", ps->cfg->shard_index, worker, msg);
    Downpour__Envelope env;
    dp_ps_env(ps, &env, DOWNPOUR__MSG_TYPE__ERROR, req, worker);
    Downpour__Error e = DOWNPOUR__ERROR__INIT;
    e.message = (char *)msg;
    e.code = (Downpour__ErrorCode)code;
    env.error = &e;
    dp_ps_send(ps, id, &env, NULL, 0);
}

/* ERROR with Error.code, counted as malformed and as a refused request
 * (not in rejected: that counts pushes, dp_ps_reply_push_error). */
void dp_ps_reply_error_code(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                            const char *msg)
{
    ps->shard.counts.malformed++;
    ps->shard.counts.requests_refused++;
    dp_ps_send_error(ps, id, req, worker, code, msg);
}

void dp_ps_reply_push_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                            const char *msg)
{
    dp_ps_reply_push_error_code(ps, id, req, worker, DOWNPOUR__ERROR_CODE__ERR_NONE, msg);
}

void dp_ps_reply_push_error_code(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, int code,
                                 const char *msg)
{
    ps->shard.counts.malformed++;
    ps->shard.counts.rejected++;
    dp_ps_send_error(ps, id, req, worker, code, msg);
}

void dp_ps_reply_error(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker, const char *msg)
{
    dp_ps_reply_error_code(ps, id, req, worker, DOWNPOUR__ERROR_CODE__ERR_NONE, msg);
}

/* ZeroMQ's free callback of a PARAMS frame (on its I/O thread): the buffer's
 * reference goes, the worker's slot is free again. */
static void s_lent_release(void *data, void *hint)
{
    (void)data;
    dp_ps_lent_t *l = hint;
    if (atomic_fetch_sub_explicit(&l->frames, 1, memory_order_acq_rel) != 1) return;
    dp_snap_t *snap = l->snap;
    l->snap = NULL;
    dp_snap_unref(NULL, snap);
    atomic_store_explicit(&l->busy, 0, memory_order_release);
}

/* A free slot of the worker's, or NULL: it has DP_PS_PARAMS_PER_WORKER
 * PARAMS frames ZeroMQ could not send yet (it does not read them). */
static dp_ps_lent_t *s_lend(dp_ps_loop_t *ps, int worker)
{
    dp_ps_lent_t *l = ps->lent + (size_t)worker * DP_PS_PARAMS_PER_WORKER;
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
void dp_ps_reply_params(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                        const dp_ps_params_ask_t *ask, const Downpour__Deal *deal)
{
    int bf16 = ask->bf16 && ask->how != DP_PS_PARAMS_SHM && ask->how != DP_PS_PARAMS_DEVREGION;
    dp_snap_t *s = bf16 ? dp_shard_snapshot_bf16(&ps->shard) : dp_shard_snapshot(&ps->shard);
    uint64_t lo = ps->shard.lo, hi = lo + ps->shard.n; /* s->n counts bfloat16 pairs */
    Downpour__Envelope env;
    dp_ps_env(ps, &env, DOWNPOUR__MSG_TYPE__PARAMS, req, worker);
    Downpour__Params p = DOWNPOUR__PARAMS__INIT;
    p.version = s->version;
    p.deal = (Downpour__Deal *)deal;
    env.params = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    int crc = ask->how == DP_PS_PARAMS_CRC;
    env.n_tensors = 1;
    env.tensors = dv;
    if (ask->how == DP_PS_PARAMS_SHM && ps->shm && dp_ps_shm_params(ps->shm, &p.shm_slot, &p.shm_seq)) {
        dp_wire_desc_fill(&d, shape, "params", NULL, hi - lo, lo, 1, 0);
        dp_wire_desc_no_checksum(&d);
        env.shm = 1; /* the reader copies the slot itself */
        dp_shard_dc_pulled(&ps->shard, worker);
        dp_ps_send(ps, id, &env, NULL, 0);
        dp_snap_unref(NULL, s);
        return;
    }
    /* The device region: the version into the ring, the worker pins it
     * and copies it (a GPU worker reads it in place); a busy ring (every
     * other entry pinned) answers in frames instead. */
    if (ask->how == DP_PS_PARAMS_DEVREGION && ps->devr && dp_ps_devr_publish(ps->devr, s)) {
        dp_wire_desc_fill(&d, shape, "params", NULL, hi - lo, lo, 1, 0);
        dp_wire_desc_no_checksum(&d);
        env.devregion = 1;
        dp_shard_dc_pulled(&ps->shard, worker);
        dp_ps_send(ps, id, &env, NULL, 0);
        dp_snap_unref(NULL, s);
        return;
    }
    dp_ps_lent_t *l = s_lend(ps, worker);
    if (!l) {
        dp_snap_unref(NULL, s);
        char msg[DP_ERR_LEN];
        snprintf(msg, sizeof msg,
                 "busy: worker %d has %d PARAMS replies this shard could not send yet (is it "
                 "reading its replies?); pull again once they are read",
                 worker, DP_PS_PARAMS_PER_WORKER);
        dp_ps_reply_error(ps, id, req, worker, msg);
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
        if (k == 1) p.deal = NULL; /* with the first part only */
        dp_wire_payload_t pl = {(void *)at, (b - a) * esize, s_lent_release, l};
        dp_ps_send(ps, id, &env, &pl, 1);
    }
}

void dp_ps_reply_ack(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                     const dp_push_outcome_t *o)
{
    Downpour__Envelope env;
    dp_ps_env(ps, &env, DOWNPOUR__MSG_TYPE__ACK, req, worker);
    Downpour__Ack a = DOWNPOUR__ACK__INIT;
    a.status = (Downpour__AckStatus)o->status; /* same numbers, policy.h */
    a.reason = (char *)o->reason;
    a.staleness = o->staleness;
    a.version = ps->shard.version;
    a.workers_live = ps->membership.live; /* noted at every change: no count per push */
    a.env_steps = ps->episodes.env_steps;
    if (ps->cfg->local_auto) a.crew_step_ms = (float)dp_dylu_fastest(&ps->speeds); /* DyLU */
    env.ack = &a;
    dp_ps_send(ps, id, &env, NULL, 0);
}

/* A push refused before the policy saw it. */
void dp_ps_reply_rejected(dp_ps_loop_t *ps, zmq_msg_t *id, uint64_t req, int worker,
                          const char *why)
{
    ps->shard.counts.rejected++;
    dp_push_outcome_t o = {.status = DP_PUSH_REJECTED};
    snprintf(o.reason, sizeof o.reason, "%s", why);
    dp_ps_reply_ack(ps, id, req, worker, &o);
}

void dp_ps_reply_bare(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env, int type)
{
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, type, env->request_id, env->worker_id);
    dp_ps_send(ps, id, &rep, NULL, 0);
}
