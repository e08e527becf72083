/* ps_exchange: the client's machinery — sockets, one exchange, liveness,
 * rejoin, new and destroy (see ps_exchange.h). */
#include "worker/client/ps_exchange.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/opts.h"
#include "common/util.h"
#include "proto/curve.h"
#include "proto/zsock.h"

#define S_DEFER_LIMIT 20   /* an exchange gives up after this many timeouts in all */
#define S_HB_MAX_S 2.0     /* a silent shard gets a HEARTBEAT at least this often */
#define S_MAX_REPEATS 2    /* a request is repeated (after a new HELLO) at most this often */

/* ---- sockets ----------------------------------------------------------- */

static void s_close(dp_ps_shard_t *s)
{
    if (s->sock && zmq_close(s->sock) != 0)
        dp_log_warn("%s: closing socket: %s", s->endpoint, zmq_strerror(errno));
    s->sock = NULL;
    if (s->mon) zmq_close(s->mon);
    s->mon = NULL;
}

static int s_open(dp_ps_client_t *c, int i, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    dp_ps_sock_keys_t keys = {&c->secret, &c->pub, &s->server_key};
    s->seen = 0;
    return dp_ps_client_socket(c->ctx, s->endpoint, c->timeout_s, c->curve ? &keys : NULL, &s->mon,
                               &s->sock, err);
}

/* Shard i's socket events so far into its seen bits. */
static void s_read_events(dp_ps_shard_t *s)
{
    while (s->mon) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f);
            return;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&f) >= 2) memcpy(&ev, zmq_msg_data(&f), 2);
        int more = zmq_msg_more(&f);
        zmq_msg_close(&f);
        while (more) { /* the event's second frame: the endpoint */
            zmq_msg_init(&f);
            more = zmq_msg_recv(&f, s->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        if (ev == ZMQ_EVENT_CONNECTED) s->seen |= DP_PS_SEEN_CONNECTED;
        else if (ev == ZMQ_EVENT_CONNECT_RETRIED) s->seen |= DP_PS_SEEN_RETRIED;
        else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) s->seen |= DP_PS_SEEN_AUTH;
        else if (ev) s->seen |= DP_PS_SEEN_HANDSHAKE;
    }
}

/* Why shard i is silent, as its socket's events tell: a refused CURVE
 * key, a handshake that failed, or nothing known (is it running?). */
static const char *s_why_silent(const dp_ps_client_t *c, int i)
{
    int seen = c->sh[i].seen;
    if (seen & DP_PS_SEEN_AUTH)
        return "the server refused this worker's CURVE key: its public key is not in the server's "
               "--curve-allow";
    if ((seen & DP_PS_SEEN_HANDSHAKE) && c->curve)
        return "the CURVE handshake failed: is --curve-server this server's public key?";
    if (seen & DP_PS_SEEN_HANDSHAKE)
        return "the handshake failed: the server likely speaks CURVE; give --curve-secret and "
               "--curve-server";
    return "is downpour-ps running?";
}

/* A HELLO awaited from shard i: its events read, and, once a client, a
 * line when the server is not there yet (the worker waits for it, quietly
 * otherwise: ZeroMQ redials). */
static void s_hello_events(dp_ps_client_t *c, int i)
{
    dp_ps_shard_t *s = &c->sh[i];
    s_read_events(s);
    if (s->told_waiting || !(s->seen & DP_PS_SEEN_RETRIED) || (s->seen & DP_PS_SEEN_CONNECTED)) return;
    s->told_waiting = true;
    dp_log_info("worker %d: waiting for ps shard %d at %s: nothing listens there yet (up to %.0f s)",
                c->worker_id, i, s->endpoint, c->timeout_s);
}

/* Replace the sockets of shards that did not answer: whatever ZeroMQ queued
 * there is dropped (and the caller's push buffer released). */
static void s_reset_unanswered(dp_ps_client_t *c)
{
    for (int i = 0; i < c->n; i++) {
        if (!c->aw[i].want_req || c->aw[i].done) continue;
        s_close(&c->sh[i]);
        char e2[DP_ERR_LEN];
        if (s_open(c, i, e2) != 0) dp_log_warn("%s", e2);
        c->sh[i].reconnected = true;
        c->aw[i].want_req = 0;
    }
}

/* ---- one exchange ------------------------------------------------------ */

static int s_interrupted(dp_ps_client_t *c, char *err)
{
    c->code = DP_PS_ERR_INTERRUPTED;
    return dp_err(err, "interrupted");
}

int dp_ps_refused(dp_ps_client_t *c, int i, const Downpour__Envelope *env, char *err)
{
    c->code = env->error->code == DOWNPOUR__ERROR_CODE__ERR_MODEL_MISMATCH ? DP_PS_ERR_MODEL_MISMATCH
                                                                           : DP_PS_ERR_REFUSED;
    return dp_err(err, "%s: %s", c->sh[i].endpoint, env->error->message);
}

int dp_ps_send_only(dp_ps_client_t *c, int i, dp_ps_req_t *rq, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    rq->env.request_id = ++c->next_req;
    rq->env.session = c->session;
    if (rq->env.type == DOWNPOUR__MSG_TYPE__STATS || rq->env.type == DOWNPOUR__MSG_TYPE__SHUTDOWN)
        rq->env.run_token = s->run_token; /* the chief's proof; 0 for anyone else */
    char e2[DP_ERR_LEN];
    if (dp_wire_send(s->sock, NULL, &rq->env, rq->n_payloads ? rq->payload : NULL, rq->n_payloads,
                     e2) != 0)
        return dp_err(err, "%s: %s (is downpour-ps running?)", s->endpoint, e2);
    return 0;
}

/* Shard i's awaited request is req, sent now. */
static void s_awaiting(dp_ps_client_t *c, int i, uint64_t req)
{
    c->aw[i].want_req = req;
    c->aw[i].done = false;
    c->aw[i].sent_at = c->sh[i].last_heard = c->sh[i].last_hb = dp_now();
}

static int s_send(dp_ps_client_t *c, int i, dp_ps_req_t *rq, char *err)
{
    if (dp_ps_send_only(c, i, rq, err) != 0) return -1;
    s_awaiting(c, i, rq->env.request_id);
    return 0;
}

void dp_ps_await_sent(dp_ps_client_t *c, int i, uint64_t req)
{
    c->aw[i].early_req = req;
}

void dp_ps_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The plan's request to shard i, built and sent. */
static int s_send_plan(dp_ps_client_t *c, int i, const dp_ps_plan_t *plan, char *err)
{
    dp_ps_req_t rq;
    memset(&rq, 0, sizeof rq);
    dp_wire_env_init(&rq.env, plan->type, 0, c->worker_id, c->m->fingerprint);
    if (plan->build) plan->build(c, i, &rq, plan->arg);
    return s_send(c, i, &rq, err);
}

static void s_heartbeat(dp_ps_client_t *c, int i)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, ++c->next_req, c->worker_id,
                     c->m->fingerprint);
    env.session = c->session;
    char e2[DP_ERR_LEN];
    /* Best effort: a heartbeat that cannot go shows up as silence. */
    if (dp_wire_send(c->sh[i].sock, NULL, &env, NULL, 0, e2) != 0)
        dp_log_debug("%s: heartbeat: %s", c->sh[i].endpoint, e2);
    c->sh[i].last_hb = dp_now();
}

/* What the liveness rules say of a shard owing a reply. */
typedef enum {
    S_WAIT_ON, /* it may still answer */
    S_REPEAT,  /* say HELLO again and repeat the request */
    S_GIVE_UP, /* the exchange fails (err says why) */
} s_alive_t;

/* The liveness rules for shard i, which owes a reply to a request of this
 * type. A shard that restarted (a new incarnation, or ERR_UNKNOWN_WORKER)
 * is said HELLO again and asked again. Only a request the shard may
 * hold (a pull) lives on heartbeat answers; any other reply is
 * due within timeout_s of sending, whatever else the shard says, and a lost
 * one is asked again once before it is a failure. An exchange past
 * S_DEFER_LIMIT timeouts fails too (a shard that answers heartbeats but
 * defers for ever); silent for hb_every, the shard gets a HEARTBEAT (whose
 * answer also shows its incarnation). */
static s_alive_t s_check_alive(dp_ps_client_t *c, int i, int type, double t0, double now, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    const dp_ps_await_t *aw = &c->aw[i];
    double hb_every = c->timeout_s / 4 < S_HB_MAX_S ? c->timeout_s / 4 : S_HB_MAX_S;
    if (s->restarted) {
        if (aw->repeats < S_MAX_REPEATS) return S_REPEAT;
        dp_err(err, "%s: the shard restarted %d times during one request", s->endpoint,
               aw->repeats + 1);
        return S_GIVE_UP;
    }
    bool held = type == DOWNPOUR__MSG_TYPE__PULL;
    if (type == DOWNPOUR__MSG_TYPE__HELLO) s_hello_events(c, i);
    if (now - (held ? s->last_heard : aw->sent_at) > c->timeout_s) {
        if (type != DOWNPOUR__MSG_TYPE__HELLO && aw->repeats == 0) return S_REPEAT;
        c->code = DP_PS_ERR_TIMEOUT;
        s_read_events(s);
        dp_err(err, "%s: no reply in %.0f s (%s)", s->endpoint, c->timeout_s, s_why_silent(c, i));
        return S_GIVE_UP;
    }
    if (now - t0 > S_DEFER_LIMIT * c->timeout_s) {
        c->code = DP_PS_ERR_DEFERRED;
        dp_err(err, "%s: request still deferred after %.0f s", s->endpoint, now - t0);
        return S_GIVE_UP;
    }
    if (now - s->last_hb >= hb_every && now - s->last_heard >= hb_every) s_heartbeat(c, i);
    return S_WAIT_ON;
}

/* Does this message say shard s restarted: another incarnation than its
 * WELCOME's (0 on either side: a server that sends none), or "say HELLO
 * again" (ERR_UNKNOWN_WORKER)? A WELCOME brings the new incarnation itself. */
static bool s_shows_restart(const dp_ps_shard_t *s, uint64_t want_req,
                            const Downpour__Envelope *env)
{
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR && env->request_id == want_req &&
        env->error->code == DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER)
        return true;
    return env->type != DOWNPOUR__MSG_TYPE__WELCOME && env->incarnation && s->incarnation &&
           env->incarnation != s->incarnation;
}

/* One message from shard i: validated, then handed to fn if it is the
 * awaited reply, whose outcome fn returns: done, more to come (a pull's
 * parts), again (after a new HELLO), or failed. */
static int s_take(dp_ps_client_t *c, int i, dp_wire_rx_t *rx, dp_ps_reply_fn fn, void *arg, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    if (rx->n_parts < 1 || rx->n_total > rx->n_parts)
        return dp_err(err, "%s: malformed reply: %d frames", s->endpoint, rx->n_total);
    char e2[DP_ERR_LEN];
    Downpour__Envelope *env = dp_wire_decode(zmq_msg_data(&rx->parts[0]), zmq_msg_size(&rx->parts[0]), e2);
    dp_wire_frame_t frames[DP_WIRE_MAX_TENSORS];
    int nf = rx->n_parts - 1;
    for (int f = 0; f < nf && f < DP_WIRE_MAX_TENSORS; f++) {
        frames[f].data = zmq_msg_data(&rx->parts[1 + f]);
        frames[f].len = zmq_msg_size(&rx->parts[1 + f]);
    }
    int rc = 0;
    dp_ps_await_t *aw = &c->aw[i];
    if (!env || dp_wire_check(env, frames, nf, e2) != 0) {
        rc = dp_err(err, "%s: bad reply: %s", s->endpoint, e2);
    } else {
        s->last_heard = dp_now();
        if (s_shows_restart(s, aw->want_req, env)) {
            s->restarted = true; /* the exchange says HELLO again and repeats */
        } else if (env->request_id == aw->want_req) { /* else a heartbeat answer or a late reply */
            dp_ps_reply_t r = fn(c, i, env, frames, nf, arg, err);
            aw->done = r == DP_PS_REPLY_DONE || r == DP_PS_REPLY_FAILED;
            if (r == DP_PS_REPLY_AGAIN) s->restarted = true;
            rc = r == DP_PS_REPLY_FAILED ? -1 : 0;
        }
    }
    dp_wire_destroy(&env);
    return rc;
}

/* Every message waiting on shard i's socket, until its reply is taken. */
static int s_drain(dp_ps_client_t *c, int i, dp_ps_reply_fn fn, void *arg, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    while (!c->aw[i].done) {
        dp_wire_rx_t rx;
        char e2[DP_ERR_LEN];
        if (dp_wire_recv(s->sock, &rx, ZMQ_DONTWAIT, e2) != 0) {
            if (errno == EAGAIN || errno == EINTR) return 0;
            return dp_err(err, "%s: %s", s->endpoint, e2);
        }
        int rc = s_take(c, i, &rx, fn, arg, err);
        dp_wire_rx_fini(&rx);
        if (rc != 0) return -1;
    }
    return 0;
}

static void s_build_hello(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg);
static int s_welcome_shm(dp_ps_client_t *c, int i, const Downpour__Welcome *w, char *err);
static dp_ps_reply_t s_on_welcome(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                  const dp_wire_frame_t *frames, int nf, void *arg, char *err);

/* Shard i restarted or lost our request: HELLO again and take its WELCOME —
 * its incarnation, and the version it restarted at (s_on_welcome counts the
 * updates lost). Waits up to timeout_s for a shard that is coming back. The
 * socket stays: ZeroMQ redials a restarted server by itself (ZMTP heartbeats
 * drop a dead connection), and the worker keeps one connection per shard,
 * which the server may bind its id to. Whatever was still queued on it
 * reaches the new server before the HELLO and is refused there
 * (ERR_UNKNOWN_WORKER, to a request id no longer awaited). */
static int s_rejoin(dp_ps_client_t *c, int i, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    if (s->restarted || !s->reconnected)
        dp_log_warn("%s: %s; saying HELLO again and repeating the request", s->endpoint,
                    s->restarted ? "the shard restarted" : "no reply in time");
    else
        dp_log_info("%s: a new connection after a request that did not complete; saying HELLO "
                    "on it first", s->endpoint);
    dp_ps_plan_t hello = {.type = DOWNPOUR__MSG_TYPE__HELLO, .build = s_build_hello,
                      .on_reply = s_on_welcome};
    if (s_send_plan(c, i, &hello, err) != 0) return -1;
    while (!c->aw[i].done) {
        if (c->stop && *c->stop) return s_interrupted(c, err);
        s_hello_events(c, i);
        if (dp_now() - c->aw[i].sent_at > c->timeout_s) {
            c->code = DP_PS_ERR_TIMEOUT;
            return dp_err(err, "%s: no reply in %.0f s (%s)", s->endpoint, c->timeout_s,
                          s_why_silent(c, i));
        }
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        int r = zmq_poll(&it, 1, 100);
        if (r < 0 && errno != EINTR)
            return dp_err(err, "poll on the ps sockets: %s", zmq_strerror(errno));
        if (r > 0 && s_drain(c, i, s_on_welcome, NULL, err) != 0) return -1;
    }
    return 0;
}

/* Repeat the plan's request to shard i after a new HELLO (with all that
 * precedes it: a push's every part). */
static int s_repeat(dp_ps_client_t *c, int i, const dp_ps_plan_t *plan, char *err)
{
    int repeats = c->aw[i].repeats + 1;
    if (s_rejoin(c, i, err) != 0 ||
        (plan->before && plan->before(c, i, true, plan->arg, err) != 0) ||
        s_send_plan(c, i, plan, err) != 0)
        return -1;
    c->aw[i].repeats = repeats;
    return 0;
}

/* Collect the replies of every shard with want_req set, or until the
 * plan has enough; a shard that restarted or lost the request is asked
 * again (s_check_alive). What came while the caller was away (a wait
 * resumed) is taken before the liveness rules look at the clock. */
static int s_wait(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err)
{
    double t0 = dp_now();
    zmq_pollitem_t items[DP_ZSOCK_MAX_SHARDS];
    int idx[DP_ZSOCK_MAX_SHARDS];
    for (int i = 0; i < c->n; i++)
        if (c->aw[i].want_req && !c->aw[i].done && c->sh[i].sock &&
            s_drain(c, i, plan->on_reply, plan->arg, err) != 0)
            return -1;
    for (;;) {
        int n = 0;
        for (int i = 0; i < c->n; i++)
            if (c->aw[i].want_req && !c->aw[i].done) {
                items[n] = (zmq_pollitem_t){c->sh[i].sock, 0, ZMQ_POLLIN, 0};
                idx[n++] = i;
            }
        if (n == 0 || (plan->enough && plan->enough(c, plan->arg))) return 0;
        if (c->stop && *c->stop) return s_interrupted(c, err);
        double now = dp_now();
        for (int k = 0; k < n; k++) {
            s_alive_t a = s_check_alive(c, idx[k], plan->type, t0, now, err);
            if (a == S_GIVE_UP || (a == S_REPEAT && s_repeat(c, idx[k], plan, err) != 0))
                return -1;
        }
        int r = zmq_poll(items, n, 100);
        if (r < 0) {
            if (errno == EINTR) continue;
            return dp_err(err, "poll on the ps sockets: %s", zmq_strerror(errno));
        }
        for (int k = 0; k < n && r > 0; k++)
            if ((items[k].revents & ZMQ_POLLIN) &&
                s_drain(c, idx[k], plan->on_reply, plan->arg, err) != 0)
                return -1;
    }
}

/* A HELLO that got no reply: name every shard still silent (role and
 * endpoint), not only the first one the wait noticed, and why it likely
 * is (s_why_silent): once when it is the same for all, else each's. */
static void s_name_silent(dp_ps_client_t *c, char *err)
{
    if (c->code != DP_PS_ERR_TIMEOUT) return;
    const char *why = NULL;
    bool same = true;
    for (int i = 0; i < c->n; i++) {
        if (!c->aw[i].want_req || c->aw[i].done) continue;
        s_read_events(&c->sh[i]);
        if (why && strcmp(why, s_why_silent(c, i)) != 0) same = false;
        why = s_why_silent(c, i);
    }
    char list[DP_ERR_LEN] = "";
    size_t used = 0;
    for (int i = 0; i < c->n && used + 8 < sizeof list; i++) {
        if (!c->aw[i].want_req || c->aw[i].done) continue;
        used += (size_t)snprintf(list + used, sizeof list - used, "%sps shard %d at %s%s%s%s",
                                 used ? ", " : "", i, c->sh[i].endpoint, same ? "" : " (",
                                 same ? "" : s_why_silent(c, i), same ? "" : ")");
    }
    if (used >= sizeof list) snprintf(list + sizeof list - 4, 4, "...");
    if (same && why) dp_err(err, "start-up: no reply in %.0f s (%s) from %s", c->timeout_s, why, list);
    else dp_err(err, "start-up: no reply in %.0f s from %s", c->timeout_s, list);
}

/* The end of a failed exchange: its kind, the silent shards named (a
 * HELLO), and fresh sockets for the shards that did not answer. */
static int s_failed(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err)
{
    if (c->code == DP_PS_OK) c->code = DP_PS_ERR_OTHER;
    if (plan->type == DOWNPOUR__MSG_TYPE__HELLO) s_name_silent(c, err);
    s_reset_unanswered(c);
    return -1;
}

int dp_ps_exchange_send(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err)
{
    uint64_t early[DP_ZSOCK_MAX_SHARDS]; /* this exchange's only: taken and cleared */
    for (int i = 0; i < c->n; i++) {
        early[i] = c->aw[i].early_req;
        c->aw[i] = (dp_ps_await_t){0};
    }
    c->code = DP_PS_OK;
    int rc = 0;
    for (int i = 0; i < plan->n_shards && rc == 0; i++) {
        if (plan->skip && plan->skip(c, i, plan->arg)) continue; /* want_req 0: not awaited */
        /* A socket a failed reset could not reopen gets another try; a
         * shard seen restarting since the last exchange is greeted first. */
        if (!c->sh[i].sock && (rc = s_open(c, i, err)) != 0) break;
        bool again = (c->sh[i].restarted || c->sh[i].reconnected) &&
                     plan->type != DOWNPOUR__MSG_TYPE__HELLO;
        if (again && (rc = s_rejoin(c, i, err)) != 0) break;
        if (plan->before && (rc = plan->before(c, i, again, plan->arg, err)) != 0) {
            c->aw[i].want_req = UINT64_MAX; /* parts may be queued: its socket is reset too */
            break;
        }
        if (early[i] && !again) { /* sent already: awaited from now on */
            s_awaiting(c, i, early[i]);
            continue;
        }
        rc = s_send_plan(c, i, plan, err);
    }
    if (rc != 0) return s_failed(c, plan, err);
    /* ZeroMQ holds the HELLO until a server is up (and redials): a worker
     * may start first. This line tells a test (DP_LOG=debug) it has. */
    if (plan->type == DOWNPOUR__MSG_TYPE__HELLO)
        dp_log_debug("worker %d: HELLO sent to %d shard(s); waiting up to %.0f s for every WELCOME",
                     c->worker_id, plan->n_shards, c->timeout_s);
    return 0;
}

int dp_ps_exchange_wait(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err)
{
    c->code = DP_PS_OK;
    return s_wait(c, plan, err) != 0 ? s_failed(c, plan, err) : 0;
}

int dp_ps_exchange(dp_ps_client_t *c, const dp_ps_plan_t *plan, char *err)
{
    if (dp_ps_exchange_send(c, plan, err) != 0) return -1;
    return dp_ps_exchange_wait(c, plan, err);
}

/* ---- shared memory ----------------------------------------------------- */

/* Ask shard i for shared memory: forced, or (auto) its endpoint is on this
 * host. */
static bool s_wants_shm(const dp_ps_client_t *c, int i)
{
    return c->transport == DP_PS_TRANSPORT_SHM ||
           (c->transport == DP_PS_TRANSPORT_AUTO && dp_zsock_local_endpoint(c->sh[i].endpoint));
}

/* Shard i's segments unmapped; but the gradient segment the caller is
 * computing its push in (dp_ps_client_push_buffer) stays mapped, kept
 * aside, until the caller gives that buffer up: the push then goes from
 * there to whatever the new WELCOME grants. */
static void s_shm_tell(const dp_ps_client_t *c, const dp_shm_t *m, int read_only, int mapped)
{
    if (c->shm_hook && m->base) c->shm_hook(c->shm_hook_arg, m->base, m->bytes, read_only, mapped);
}

/* The hook hears of it before the pages go (a device unlocks them). */
static void s_shm_unmap(dp_ps_client_t *c, dp_shm_t *m, int read_only)
{
    s_shm_tell(c, m, read_only, 0);
    dp_shm_close(m);
}

static void s_shm_close(dp_ps_client_t *c, dp_ps_shard_t *s)
{
    s_shm_unmap(c, &s->shm_params, 1);
    if (s->shm_grad.base && c->grad_lent == dp_shm_slot(&s->shm_grad, 0)) {
        c->grad_kept = s->shm_grad; /* empty: lent only while it is */
        memset(&s->shm_grad, 0, sizeof s->shm_grad);
    }
    s_shm_unmap(c, &s->shm_grad, 0);
    s->shm = false;
}

void dp_ps_client_set_shm_hook(dp_ps_client_t *c, dp_ps_shm_hook_fn hook, void *arg)
{
    for (int i = 0; i < c->n; i++) {
        s_shm_tell(c, &c->sh[i].shm_params, 1, 0);
        s_shm_tell(c, &c->sh[i].shm_grad, 0, 0);
    }
    s_shm_tell(c, &c->grad_kept, 0, 0);
    c->shm_hook = hook;
    c->shm_hook_arg = arg;
    for (int i = 0; i < c->n; i++) {
        s_shm_tell(c, &c->sh[i].shm_params, 1, 1);
        s_shm_tell(c, &c->sh[i].shm_grad, 0, 1);
    }
    s_shm_tell(c, &c->grad_kept, 0, 1);
}

float *dp_ps_client_push_buffer(dp_ps_client_t *c, size_t n_floats)
{
    c->grad_lent = NULL; /* the last answer is given up */
    if (atomic_load(&c->inflight) == 0) /* and ZeroMQ holds no frame of it */
        s_shm_unmap(c, &c->grad_kept, 0);
    if (c->grad_kept.base) return NULL;
    const dp_ps_shard_t *s = &c->sh[0];
    /* one shard: its range is the whole model (the ranges tile it) */
    bool one = c->n == 1 && s->shm && n_floats == c->m->n_floats &&
               c->compress.kind == DP_COMPRESS_NONE;
    c->grad_lent = one ? dp_shm_slot(&s->shm_grad, 0) : NULL;
    return c->grad_lent;
}

/* What a WELCOME says of shared memory: map the segments it names (each
 * checked: ours, 0600, sealed, the header and size of this shard's range;
 * the parameters read-only), or go on with frames — unless shared memory
 * was forced. */
static int s_welcome_shm(dp_ps_client_t *c, int i, const Downpour__Welcome *w, char *err)
{
    dp_ps_shard_t *s = &c->sh[i];
    s_shm_close(c, s); /* a restarted shard has new segments */
    if (!s_wants_shm(c, i)) return 0;
    bool forced = c->transport == DP_PS_TRANSPORT_SHM;
    char e2[DP_ERR_LEN];
    size_t n = (size_t)(s->hi - s->lo);
    if (!w->shm_name || !w->shm_name[0] || !w->shm_grad_name || !w->shm_grad_name[0])
        snprintf(e2, sizeof e2, "the shard did not grant shared memory (see its log)");
    else if (n > 0 && dp_shm_open(&s->shm_params, w->shm_name, n, DP_SHM_PARAM_SLOTS, DP_SHM_READ_ONLY, e2) == 0 &&
             dp_shm_open(&s->shm_grad, w->shm_grad_name, n, 1, DP_SHM_WRITABLE, e2) == 0) {
        s->shm = true;
        s_shm_tell(c, &s->shm_params, 1, 1);
        s_shm_tell(c, &s->shm_grad, 0, 1);
        return 0;
    } else if (n == 0)
        snprintf(e2, sizeof e2, "an empty range");
    s_shm_close(c, s);
    if (forced) return dp_err(err, "%s: --transport shm: %s", s->endpoint, e2);
    dp_log_info("%s: tensors as ZeroMQ frames, not shared memory: %s", s->endpoint, e2);
    return 0;
}

static void s_build_hello(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    (void)i, (void)arg;
    Downpour__Hello *h = &rq->body.hello;
    *h = (Downpour__Hello)DOWNPOUR__HELLO__INIT;
    h->model_spec = (char *)c->m->spec;
    h->in_c = c->m->in_c;
    h->in_h = c->m->in_h;
    h->in_w = c->m->in_w;
    h->n_floats = c->m->n_floats;
    h->shm = s_wants_shm(c, i);
    h->devregion = h->shm && dp_ps_devmem(c) != NULL; /* a provider: ps_devregion.c */
    if (c->has_plan) h->deal = &c->deal_plan;
    rq->env.hello = h;
}

void dp_ps_frame_released(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_int *)hint, 1);
}

int dp_ps_wait_released(dp_ps_client_t *c, char *err)
{
    double t0 = dp_now();
    while (atomic_load(&c->inflight) > 0) {
        if (dp_now() - t0 > c->timeout_s) {
            c->code = DP_PS_ERR_OTHER;
            return dp_err(err, "ZeroMQ still holds %d request frames after %.0f s",
                          atomic_load(&c->inflight), c->timeout_s);
        }
        dp_ps_sleep(50e-6);
    }
    return 0;
}

void dp_ps_seen(dp_ps_shard_t *s, uint64_t version)
{
    if (version > s->seen_version) s->seen_version = version;
}

/* What a WELCOME says for recovery: the shard's incarnation and our last
 * step it applied; after a restart, the updates lost since its checkpoint
 * (versions we saw past the one it restarted at) are counted, and the next
 * push is stamped with, and the next sync pull answered at, the restored
 * version. The restart's own start version counts, not the version now:
 * other workers may have said HELLO first and pushed it on. */
static void s_welcome_recovery(dp_ps_client_t *c, dp_ps_shard_t *s, const Downpour__Envelope *env)
{
    const Downpour__Welcome *w = env->welcome;
    uint64_t back = w->version;
    if (s->incarnation && env->incarnation != s->incarnation && w->start_version < back)
        back = w->start_version;
    if (back < s->seen_version) {
        uint64_t lost = s->seen_version - back;
        c->updates_lost += lost;
        dp_log_warn("%s: the shard restarted at version %" PRIu64 ", %" PRIu64
                    " update(s) since its checkpoint lost (%" PRIu64 " in this run)",
                    s->endpoint, back, lost, c->updates_lost);
        s->seen_version = w->version;
        s->min_version = 0;
    }
    if (!s->pulled || w->version < s->version) s->version = w->version;
    dp_ps_seen(s, w->version);
    s->incarnation = env->incarnation;
    s->restarted = false;
    s->reconnected = false;
    s->worker_step = w->worker_step;
}

static dp_ps_reply_t s_on_welcome(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                                  const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf, (void)arg;
    dp_ps_shard_t *s = &c->sh[i];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if (env->type != DOWNPOUR__MSG_TYPE__WELCOME)
        return dp_err(err, "%s: answered HELLO with %s", s->endpoint, dp_wire_type_name(env->type));
    const Downpour__Welcome *w = env->welcome;
    if (w->shard_count != c->n || w->shard_index != i)
        return dp_err(err, "%s: is shard %d of %d, but it is listed at position %d of %d in the ps endpoints",
                      s->endpoint, w->shard_index, w->shard_count, i, c->n);
    if (w->n_floats != c->m->n_floats || w->range_lo > w->range_hi || w->range_hi > w->n_floats)
        return dp_err(err, "%s: bad range [%" PRIu64 ", %" PRIu64 ") of %" PRIu64 " floats (model has %zu)",
                      s->endpoint, w->range_lo, w->range_hi, w->n_floats, c->m->n_floats);
    if (w->mode < DOWNPOUR__MODE__SYNC || w->mode > DOWNPOUR__MODE__SSP)
        return dp_err(err, "%s: unknown mode %d", s->endpoint, (int)w->mode);
    /* Replies come in any order: compared across shards once all are in. */
    s->info = (dp_ps_info_t){(dp_mode_t)w->mode, w->num_workers, w->replicas, w->staleness,
                             w->shard_count, w->local_steps > 1 ? (long)w->local_steps : 1,
                             w->local_steps > 1 && w->local_steps_auto, w->min_workers};
    s->lo = w->range_lo;
    s->hi = w->range_hi;
    s->run_token = w->run_token;
    s->push_parts = w->push_parts;
    s_welcome_recovery(c, s, env);
    dp_ps_devr_welcome(c, i, w); /* a restarted shard's new generation re-mapped */
    return s_welcome_shm(c, i, w, err) != 0 ? DP_PS_REPLY_FAILED : DP_PS_REPLY_DONE;
}


/* ---- connect ---------------------------------------------------------- */

/* After the WELCOMEs: every shard runs the same policy, and the ranges, in
 * endpoint order, tile the model's floats. */
static int s_check_shards(dp_ps_client_t *c, char *err)
{
    c->info = c->sh[0].info;
    for (int i = 1; i < c->n; i++) {
        const dp_ps_info_t *a = &c->sh[i].info, *b = &c->info;
        if (a->local_steps != b->local_steps || a->local_auto != b->local_auto)
            return dp_err(err, "%s: runs --local-steps %ld but %s runs --local-steps %ld",
                          c->sh[i].endpoint, a->local_steps, c->sh[0].endpoint, b->local_steps);
        if (a->mode != b->mode || a->num_workers != b->num_workers || a->replicas != b->replicas ||
            a->staleness != b->staleness || a->min_workers != b->min_workers) {
            char ca[32], cb[32];
            dp_opts_crew_name(a->min_workers, a->num_workers, ca, sizeof ca);
            dp_opts_crew_name(b->min_workers, b->num_workers, cb, sizeof cb);
            return dp_err(err, "%s: runs %s with %s workers, R=%d, S=%d but %s runs %s with %s workers, R=%d, S=%d",
                          c->sh[i].endpoint, dp_mode_name(a->mode), ca, a->replicas, a->staleness,
                          c->sh[0].endpoint, dp_mode_name(b->mode), cb, b->replicas, b->staleness);
        }
    }
    uint64_t at = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->sh[i].lo != at)
            return dp_err(err, "%s: holds floats [%" PRIu64 ", %" PRIu64 ") but the previous shard ends at %" PRIu64
                               " (are the ps endpoints in shard order?)",
                          c->sh[i].endpoint, c->sh[i].lo, c->sh[i].hi, at);
        at = c->sh[i].hi;
    }
    if (at != c->m->n_floats)
        return dp_err(err, "the %d ps shards hold floats [0, %" PRIu64 ") but the model has %zu (missing a shard?)",
                      c->n, at, c->m->n_floats);
    return 0;
}

/* CURVE keys from their files: ours, and each shard's server key. */
static int s_load_keys(dp_ps_client_t *c, const dp_ps_curve_t *curve, char *err)
{
    dp_curve_key_t *server = dp_malloc((size_t)c->n * sizeof *server);
    int rc = dp_ps_curve_load(curve, c->n, &c->secret, &c->pub, server, err);
    for (int i = 0; rc == 0 && i < c->n; i++) c->sh[i].server_key = server[i];
    free(server);
    c->curve = rc == 0;
    return rc;
}

/* A CRC-32 per tensor only where the transport does not protect the bytes
 * already: not on this host (loopback, ipc: kernel memory copies) and not
 * under CURVE (every message carries a MAC). It costs ~0.2 ms per 6.6 MB
 * on each side of each transfer, more than the whole margin to a plain
 * ZeroMQ round trip. */
static bool s_default_crc(const dp_ps_client_t *c, int i)
{
    return !c->curve && !dp_zsock_local_endpoint(c->sh[i].endpoint);
}

static bool s_crc(const dp_ps_client_t *c, dp_ps_crc_t crc, int i)
{
    return crc == DP_PS_CRC_AUTO ? s_default_crc(c, i) : crc == DP_PS_CRC_ON;
}

static void s_set_plan(dp_ps_client_t *c, const dp_ps_deal_plan_t *p)
{
    c->has_plan = p->batch != 0;
    downpour__deal_plan__init(&c->deal_plan);
    c->deal_plan.samples = p->samples;
    c->deal_plan.batch = p->batch;
    c->deal_plan.epochs = p->epochs;
    c->deal_plan.steps = p->steps;
}

/* A plan told after connecting (a library client's sampler): HELLO again
 * to shard 0 alone, which deals; a plan that differs from the run's is
 * refused there (ERR_MODEL_MISMATCH, one line) and this client keeps none. */
int dp_ps_client_plan(dp_ps_client_t *c, const dp_ps_deal_plan_t *p, char *err)
{
    s_set_plan(c, p);
    dp_ps_plan_t hello = {.type = DOWNPOUR__MSG_TYPE__HELLO, .n_shards = 1,
                          .build = s_build_hello, .on_reply = s_on_welcome};
    if (dp_ps_exchange(c, &hello, err) == 0) return 0;
    c->has_plan = false;
    return -1;
}

int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                     int worker_id, const dp_ps_client_opts_t *opts, dp_ps_info_t *info,
                     char *err)
{
    static const dp_ps_client_opts_t defaults = {0};
    if (!opts) opts = &defaults;
    *out = NULL;
    if (opts->compress.kind != DP_COMPRESS_NONE && dp_model_has_state(m))
        return dp_err(err, "%s", DP_COMPRESS_STATE_REFUSED);
    dp_ps_client_t *c = dp_calloc(1, sizeof *c);
    c->m = m;
    c->worker_id = worker_id;
    c->session = opts->session ? opts->session : dp_ps_session_new();
    c->timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 30;
    c->stop = opts->stop;
    c->transport = opts->transport;
    c->devmem = opts->devmem;
    c->bf16 = opts->wire == DP_PS_WIRE_BF16;
    c->compress = opts->compress;
    s_set_plan(c, &opts->deal);
    atomic_init(&c->inflight, 0);
    c->sh = dp_calloc(DP_ZSOCK_MAX_SHARDS, sizeof *c->sh);
    c->aw = dp_calloc(DP_ZSOCK_MAX_SHARDS, sizeof *c->aw);
    char (*eps)[DP_ZSOCK_ENDPOINT_LEN] = dp_malloc(DP_ZSOCK_MAX_SHARDS * sizeof *eps);
    c->n = dp_ps_endpoints_parse(endpoints ? endpoints : "", eps, err);
    for (int i = 0; i < c->n; i++) memcpy(c->sh[i].endpoint, eps[i], sizeof eps[i]);
    free(eps);
    if (c->n < 0) {
        c->n = 0;
        goto fail;
    }
    if (opts->curve.secret && s_load_keys(c, &opts->curve, err) != 0) goto fail;
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        dp_err(err, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto fail;
    }
    for (int i = 0; i < c->n; i++) {
        if (s_open(c, i, err) != 0) goto fail;
        c->sh[i].crc = s_crc(c, opts->crc, i);
    }
    /* HELLO once: ZeroMQ queues it until the server is up, so one request
     * waiting up to timeout_s covers a server that starts late. */
    dp_ps_plan_t hello = {.type = DOWNPOUR__MSG_TYPE__HELLO, .n_shards = c->n,
                          .build = s_build_hello, .on_reply = s_on_welcome};
    if (dp_ps_exchange(c, &hello, err) != 0 || s_check_shards(c, err) != 0) goto fail;
    if (info) *info = c->info;
    *out = c;
    return 0;
fail:
    if (opts->new_error) *opts->new_error = c->code == DP_PS_OK ? DP_PS_ERR_OTHER : c->code;
    dp_ps_client_destroy(&c);
    return -1;
}

dp_ps_err_t dp_ps_client_error(const dp_ps_client_t *c)
{
    return c->code;
}

void dp_ps_client_destroy(dp_ps_client_t **c_p)
{
    if (!c_p || !*c_p) return;
    dp_ps_client_t *c = *c_p;
    for (int i = 0; i < c->n; i++) {
        s_close(&c->sh[i]);
        s_shm_close(c, &c->sh[i]);
        dp_ps_devr_close(&c->sh[i]);
        free(c->sh[i].push16);
        if (c->sh[i].z) dp_compressor_fini(c->sh[i].z);
        free(c->sh[i].z);
    }
    dp_zsock_ctx_term(&c->ctx, "ps client"); /* before the unmap: no frame points into it */
    c->grad_lent = NULL;
    s_shm_unmap(c, &c->grad_kept, 0);
    free(c->sh);
    free(c->aw);
    free(c->landing);
    free(c->grads_host);
    free(c->pull_room);
    free(c->push_room);
    dp_ps_rows_req_free(c->rows);
    free(c);
    *c_p = NULL;
}
