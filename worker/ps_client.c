/* ps_client: the worker's DEALER sockets to every parameter-server shard
 * (see ps_client.h).
 *
 * Every operation is one exchange, s_exchange(c, plan): a request to each
 * shard the plan names (all sent before any reply is awaited, so the shards
 * work in parallel), then s_wait() collects the reply of each, matched by
 * request id. Anything else from a shard — a heartbeat answer, a late reply
 * to an abandoned request — only proves it alive. The plan says what is
 * asked (a message type and a builder for each shard's body) and what is
 * done with each reply; the exchange owns the liveness rules, the stop flag
 * and the clean-up after a failure.
 *
 * Invariants: a shard's range [lo, hi) comes from its WELCOME and the ranges
 * tile [0, n_floats); push frames point into the caller's gradient and
 * c->inflight counts those ZeroMQ still holds, so push returns only once it
 * is 0; after a failed exchange the shards that did not answer get a fresh
 * socket (linger 0 drops what was queued, releasing the caller's buffer). */
#include "worker/ps_client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "proto/curve.h"
#include "proto/shm.h"

#define S_MAX_SHARDS 256
#define S_DEFER_LIMIT 20   /* an exchange gives up after this many timeouts in all */
#define S_HB_MAX_S 2.0     /* a silent shard gets a HEARTBEAT at least this often */
#define S_MAX_REPEATS 2    /* a request is repeated (after a new HELLO) at most this often */
#define S_ZMTP_IVL_MS 1000 /* ZMTP heartbeats: a PING each second ... */
#define S_ZMTP_TIMEOUT_MS 5000 /* ... and a connection silent for 5 s is dropped and redialled */

typedef struct {
    void *sock;             /* DEALER; NULL after a reconnect failed (retried next exchange) */
    char endpoint[256];     /* tcp://HOST:PORT, as given */
    uint64_t lo, hi;        /* floats this shard owns */
    uint64_t version;       /* shard version of the last pull */
    uint64_t min_version;   /* sync: the next pull waits for this version */
    int pulled;             /* a pull has completed */
    uint64_t want_req;      /* request awaited in the current exchange, 0 = none */
    int done;               /* its reply arrived */
    double last_heard;      /* dp_now() of its last message (or of our request) */
    double last_hb;         /* dp_now() of our last HEARTBEAT */
    dp_ps_info_t info;      /* from its WELCOME */
    uint64_t run_token;     /* from its WELCOME (the chief's only): its STATS / SHUTDOWN carry it */
    dp_curve_key_t server_key; /* CURVE: the shard's public key */
    /* recovery */
    uint64_t incarnation;   /* from its WELCOME; 0: unknown (a server that sends none) */
    int restarted;          /* a reply showed another incarnation, or ERR_UNKNOWN_WORKER */
    uint64_t seen_version;  /* highest version it reported (WELCOME, PARAMS, ACK) */
    uint64_t worker_step;   /* from its WELCOME: our last step it applied */
    double sent_at;         /* dp_now() when the awaited request went out */
    int repeats;            /* times the awaited request was repeated */
    int crc;                /* tensors to and from it carry a CRC-32 (see dp_ps_client_set_checksum) */
    /* shared memory (proto/shm.h): the shard's parameter slots and our
     * gradient slot, mapped when its WELCOME granted them */
    int shm;                /* tensors go through the segments */
    dp_shm_t shm_params, shm_grad;
    int torn;               /* the last shm pull's copy raced a step: pull again */
    uint16_t *push16;       /* --wire bf16: this shard's gradient slice in bfloat16 (frames only) */
} s_shard_t;

struct dp_ps_client {
    void *ctx;              /* ZeroMQ context, owned */
    int n;                  /* shards */
    s_shard_t *sh;          /* [S_MAX_SHARDS], the first n used */
    const dp_model_t *m;    /* the caller's, outlives the client */
    int worker_id;
    double timeout_s;       /* silence allowed to a shard owing a reply */
    uint64_t next_req;      /* last request id used */
    dp_ps_info_t info;      /* shard 0's WELCOME (every shard agrees) */
    int finished;           /* BARRIER finished sent and answered */
    volatile sig_atomic_t *stop; /* non-zero: blocked calls give up; NULL: never */
    atomic_int inflight;    /* push frames ZeroMQ has not released yet */
    int curve;              /* connect with CURVE: our key pair and each shard's key */
    dp_curve_key_t secret, pub;
    uint64_t updates_lost;  /* versions the shards went back by when they restarted */
    dp_ps_transport_t transport; /* how tensors travel (dp_ps_client_default_transport) */
    int bf16;               /* tensors in frames as bfloat16 (dp_ps_client_default_wire) */
    float *landing;         /* m->n_floats, made on first use: a sink's tensors that cannot
                             * be lent as received (bfloat16, misaligned, shared memory) */
};

/* dp_ps_client_default_stop_flag: what each new client's stop starts as. */
static volatile sig_atomic_t *s_default_stop;
/* dp_ps_client_default_transport: what each new client's transport starts as. */
static dp_ps_transport_t s_default_transport = DP_PS_TRANSPORT_AUTO;
/* dp_ps_client_default_wire: bfloat16 frames for each new client. */
static int s_default_bf16;

/* Storage one request points into until it is sent. */
typedef struct {
    Downpour__Envelope env;
    union {
        Downpour__Hello hello;
        Downpour__Pull pull;
        Downpour__Push push;
        Downpour__Barrier barrier;
    } body;                         /* the sub-message env points at, if any */
    Downpour__TensorDesc desc;      /* PUSH: the gradient slice */
    Downpour__TensorDesc *descs[1]; /* env.tensors */
    int64_t shape[1];               /* desc.shape */
    dp_wire_payload_t payload;      /* PUSH: the slice's bytes */
    int n_payloads;                 /* 0 or 1 */
} s_req_t;

/* Fills shard i's request: rq->env is already initialised with the plan's
 * type; the builder sets the body (and payload) it needs. */
typedef void (*s_build_fn)(dp_ps_client_t *c, int i, s_req_t *rq, void *arg);

/* Called for each matched reply; returns 0 or -1 with err (ends the wait). */
typedef int (*s_reply_fn)(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                          const dp_wire_frame_t *frames, int n_frames, void *arg, char *err);

/* One exchange: the same request type to shards [0, n_shards). */
typedef struct {
    int type;             /* DOWNPOUR__MSG_TYPE__* of every request */
    int n_shards;         /* c->n, or 1 to ask shard 0 only */
    s_build_fn build;     /* NULL: the request has no body */
    s_reply_fn on_reply;  /* takes each shard's reply */
    void *arg;            /* handed to build and on_reply */
} s_plan_t;

static void s_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- sockets ----------------------------------------------------------- */

static void s_close(s_shard_t *s)
{
    if (s->sock && zmq_close(s->sock) != 0)
        dp_log_warn("%s: closing socket: %s", s->endpoint, zmq_strerror(errno));
    s->sock = NULL;
}

int dp_ps_client_socket(void *ctx, const char *endpoint, double timeout_s,
                        const dp_ps_sock_keys_t *keys, void **out, char *err)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    *out = NULL;
    if (!sock) return dp_err(err, "%s: cannot create socket: %s", endpoint, zmq_strerror(errno));
    int zero = 0, ivl = S_ZMTP_IVL_MS, tmo = S_ZMTP_TIMEOUT_MS;
    int sndtimeo = (int)(timeout_s * 1000);
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TTL, &tmo, sizeof tmo) != 0) {
        dp_err(err, "%s: cannot set socket options: %s", endpoint, zmq_strerror(errno));
        zmq_close(sock);
        return -1;
    }
    if (keys && dp_curve_connect_as(sock, keys->server, keys->secret, keys->pub, err) != 0) {
        zmq_close(sock);
        return -1;
    }
    if (zmq_connect(sock, endpoint) != 0) {
        dp_err(err, "%s: bad ps endpoint: %s (expected tcp://HOST:PORT)", endpoint, zmq_strerror(errno));
        zmq_close(sock);
        return -1;
    }
    *out = sock;
    return 0;
}

static int s_open(dp_ps_client_t *c, int i, char *err)
{
    s_shard_t *s = &c->sh[i];
    dp_ps_sock_keys_t keys = {&c->secret, &c->pub, &s->server_key};
    return dp_ps_client_socket(c->ctx, s->endpoint, c->timeout_s, c->curve ? &keys : NULL, &s->sock,
                               err);
}

/* Replace the sockets of shards that did not answer: whatever ZeroMQ queued
 * there is dropped (and the caller's push buffer released). */
static void s_reset_unanswered(dp_ps_client_t *c)
{
    for (int i = 0; i < c->n; i++) {
        s_shard_t *s = &c->sh[i];
        if (!s->want_req || s->done) continue;
        s_close(s);
        char e2[DP_ERR_LEN];
        if (s_open(c, i, e2) != 0) dp_log_warn("%s", e2);
        s->want_req = 0;
    }
}

/* ---- the session ------------------------------------------------------- */

static uint64_t s_session;
static pthread_once_t s_session_once = PTHREAD_ONCE_INIT;

static void s_draw_session(void)
{
    /* Without the kernel's random source (it does not fail on Linux past
     * early boot) the clock still makes one process's session unlike
     * another's; it is a proof of "same process", not a key. */
    while (s_session == 0)
        if (getrandom(&s_session, sizeof s_session, 0) != (ssize_t)sizeof s_session &&
            errno != EINTR)
            s_session = (uint64_t)(dp_now() * 1e9) ^ ((uint64_t)getpid() << 32);
}

uint64_t dp_ps_session(void)
{
    pthread_once(&s_session_once, s_draw_session);
    return s_session;
}

/* ---- one exchange ------------------------------------------------------ */

static int s_send(dp_ps_client_t *c, int i, s_req_t *rq, char *err)
{
    s_shard_t *s = &c->sh[i];
    rq->env.request_id = ++c->next_req;
    rq->env.session = dp_ps_session();
    if (rq->env.type == DOWNPOUR__MSG_TYPE__STATS || rq->env.type == DOWNPOUR__MSG_TYPE__SHUTDOWN)
        rq->env.run_token = s->run_token; /* the chief's proof; 0 for anyone else */
    char e2[DP_ERR_LEN];
    if (dp_wire_send(s->sock, NULL, &rq->env, rq->n_payloads ? &rq->payload : NULL, rq->n_payloads,
                     e2) != 0)
        return dp_err(err, "%s: %s (is downpour-ps running?)", s->endpoint, e2);
    s->want_req = rq->env.request_id;
    s->done = 0;
    s->sent_at = s->last_heard = s->last_hb = dp_now();
    return 0;
}

/* The plan's request to shard i, built and sent. */
static int s_send_plan(dp_ps_client_t *c, int i, const s_plan_t *plan, char *err)
{
    s_req_t rq;
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
    env.session = dp_ps_session();
    char e2[DP_ERR_LEN];
    /* Best effort: a heartbeat that cannot go shows up as silence. */
    if (dp_wire_send(c->sh[i].sock, NULL, &env, NULL, 0, e2) != 0)
        dp_log_debug("%s: heartbeat: %s", c->sh[i].endpoint, e2);
    c->sh[i].last_hb = dp_now();
}

/* The liveness rules for shard i, which owes a reply to a request of this
 * type. A shard that restarted (a new incarnation, or ERR_UNKNOWN_WORKER)
 * is said HELLO again and asked again (1). Only a request the shard may
 * hold (a pull) lives on heartbeat answers; any other reply is
 * due within timeout_s of sending, whatever else the shard says, and a lost
 * one is asked again once (1) before it is a failure. An exchange past
 * S_DEFER_LIMIT timeouts fails too (a shard that answers heartbeats but
 * defers for ever); silent for hb_every, the shard gets a HEARTBEAT (whose
 * answer also shows its incarnation). 0: wait on; -1 with err. */
static int s_check_alive(dp_ps_client_t *c, int i, int type, double t0, double now, char *err)
{
    s_shard_t *s = &c->sh[i];
    double hb_every = c->timeout_s / 4 < S_HB_MAX_S ? c->timeout_s / 4 : S_HB_MAX_S;
    if (s->restarted) {
        if (s->repeats < S_MAX_REPEATS) return 1;
        return dp_err(err, "%s: the shard restarted %d times during one request", s->endpoint,
                      s->repeats + 1);
    }
    int held = type == DOWNPOUR__MSG_TYPE__PULL;
    if (now - (held ? s->last_heard : s->sent_at) > c->timeout_s) {
        if (type != DOWNPOUR__MSG_TYPE__HELLO && s->repeats == 0) return 1;
        return dp_err(err, "%s: no reply in %.0f s (is downpour-ps running?)", s->endpoint,
                      c->timeout_s);
    }
    if (now - t0 > S_DEFER_LIMIT * c->timeout_s)
        return dp_err(err, "%s: request still deferred after %.0f s", s->endpoint, now - t0);
    if (now - s->last_hb >= hb_every && now - s->last_heard >= hb_every) s_heartbeat(c, i);
    return 0;
}

/* Does this message say shard s restarted: another incarnation than its
 * WELCOME's (0 on either side: a server that sends none), or "say HELLO
 * again" (ERR_UNKNOWN_WORKER)? A WELCOME brings the new incarnation itself. */
static int s_shows_restart(const s_shard_t *s, const Downpour__Envelope *env)
{
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR && env->request_id == s->want_req &&
        env->error->code == DOWNPOUR__ERROR_CODE__ERR_UNKNOWN_WORKER)
        return 1;
    return env->type != DOWNPOUR__MSG_TYPE__WELCOME && env->incarnation && s->incarnation &&
           env->incarnation != s->incarnation;
}

/* One message from shard i: validated, then handed to fn if it is the
 * awaited reply. */
static int s_take(dp_ps_client_t *c, int i, dp_wire_rx_t *rx, s_reply_fn fn, void *arg, char *err)
{
    s_shard_t *s = &c->sh[i];
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
    if (!env || dp_wire_check(env, frames, nf, e2) != 0) {
        rc = dp_err(err, "%s: bad reply: %s", s->endpoint, e2);
    } else {
        s->last_heard = dp_now();
        if (s_shows_restart(s, env)) {
            s->restarted = 1; /* the exchange says HELLO again and repeats */
        } else if (env->request_id == s->want_req) { /* else a heartbeat answer or a late reply */
            s->done = 1;
            rc = fn(c, i, env, frames, nf, arg, err);
        }
    }
    dp_wire_destroy(&env);
    return rc;
}

/* Every message waiting on shard i's socket, until its reply is taken. */
static int s_drain(dp_ps_client_t *c, int i, s_reply_fn fn, void *arg, char *err)
{
    s_shard_t *s = &c->sh[i];
    while (!s->done) {
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

static void s_build_hello(dp_ps_client_t *c, int i, s_req_t *rq, void *arg);
static int s_welcome_shm(dp_ps_client_t *c, int i, const Downpour__Welcome *w, char *err);
static int s_on_welcome(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
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
    s_shard_t *s = &c->sh[i];
    dp_log_warn("%s: %s; saying HELLO again and repeating the request", s->endpoint,
                s->restarted ? "the shard restarted" : "no reply in time");
    s_plan_t hello = {.type = DOWNPOUR__MSG_TYPE__HELLO, .build = s_build_hello,
                      .on_reply = s_on_welcome};
    if (s_send_plan(c, i, &hello, err) != 0) return -1;
    while (!s->done) {
        if (c->stop && *c->stop) return dp_err(err, "interrupted");
        if (dp_now() - s->sent_at > c->timeout_s)
            return dp_err(err, "%s: no reply in %.0f s (is downpour-ps running?)", s->endpoint,
                          c->timeout_s);
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        int r = zmq_poll(&it, 1, 100);
        if (r < 0 && errno != EINTR)
            return dp_err(err, "poll on the ps sockets: %s", zmq_strerror(errno));
        if (r > 0 && s_drain(c, i, s_on_welcome, NULL, err) != 0) return -1;
    }
    return 0;
}

/* Repeat the plan's request to shard i after a new HELLO. */
static int s_repeat(dp_ps_client_t *c, int i, const s_plan_t *plan, char *err)
{
    int repeats = c->sh[i].repeats + 1;
    if (s_rejoin(c, i, err) != 0 || s_send_plan(c, i, plan, err) != 0) return -1;
    c->sh[i].repeats = repeats;
    return 0;
}

/* Collect the replies of every shard with want_req set; a shard that
 * restarted or lost the request is asked again (s_check_alive). */
static int s_wait(dp_ps_client_t *c, const s_plan_t *plan, char *err)
{
    double t0 = dp_now();
    zmq_pollitem_t items[S_MAX_SHARDS];
    int idx[S_MAX_SHARDS];
    for (;;) {
        int n = 0;
        for (int i = 0; i < c->n; i++)
            if (c->sh[i].want_req && !c->sh[i].done) {
                items[n] = (zmq_pollitem_t){c->sh[i].sock, 0, ZMQ_POLLIN, 0};
                idx[n++] = i;
            }
        if (n == 0) return 0;
        if (c->stop && *c->stop) return dp_err(err, "interrupted");
        double now = dp_now();
        for (int k = 0; k < n; k++) {
            int a = s_check_alive(c, idx[k], plan->type, t0, now, err);
            if (a < 0 || (a == 1 && s_repeat(c, idx[k], plan, err) != 0)) return -1;
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
 * endpoint), not only the first one the wait noticed. */
static void s_name_silent(const dp_ps_client_t *c, char *err)
{
    if (!strstr(err, "no reply in")) return;
    char list[DP_ERR_LEN] = "";
    size_t used = 0;
    for (int i = 0; i < c->n && used + 8 < sizeof list; i++) {
        const s_shard_t *s = &c->sh[i];
        if (!s->want_req || s->done) continue;
        used += (size_t)snprintf(list + used, sizeof list - used, "%sps shard %d at %s",
                                 used ? ", " : "", i, s->endpoint);
    }
    if (used >= sizeof list) snprintf(list + sizeof list - 4, 4, "...");
    dp_err(err, "start-up: no reply in %.0f s (is downpour-ps running?) from %s", c->timeout_s, list);
}

/* Send the plan's request to each of its shards, then wait for every reply.
 * On any failure the shards that did not answer get fresh sockets, so
 * nothing of this exchange is left queued or awaited. */
static int s_exchange(dp_ps_client_t *c, const s_plan_t *plan, char *err)
{
    for (int i = 0; i < c->n; i++) {
        c->sh[i].want_req = 0;
        c->sh[i].done = 0;
        c->sh[i].repeats = 0;
    }
    int rc = 0;
    for (int i = 0; i < plan->n_shards && rc == 0; i++) {
        /* A socket a failed reset could not reopen gets another try; a
         * shard seen restarting since the last exchange is greeted first. */
        if (!c->sh[i].sock && (rc = s_open(c, i, err)) != 0) break;
        if (c->sh[i].restarted && plan->type != DOWNPOUR__MSG_TYPE__HELLO &&
            (rc = s_rejoin(c, i, err)) != 0)
            break;
        rc = s_send_plan(c, i, plan, err);
    }
    /* ZeroMQ holds the HELLO until a server is up (and redials): a worker
     * may start first. This line tells a test (DP_LOG=debug) it has. */
    if (rc == 0 && plan->type == DOWNPOUR__MSG_TYPE__HELLO)
        dp_log_debug("worker %d: HELLO sent to %d shard(s); waiting up to %.0f s for every WELCOME",
                     c->worker_id, plan->n_shards, c->timeout_s);
    if (rc == 0) rc = s_wait(c, plan, err);
    if (rc != 0 && plan->type == DOWNPOUR__MSG_TYPE__HELLO) s_name_silent(c, err);
    if (rc != 0) s_reset_unanswered(c);
    return rc;
}

/* ---- connect ---------------------------------------------------------- */

/* ---- shared memory ----------------------------------------------------- */

/* Ask shard i for shared memory: forced, or (auto) its endpoint is on this
 * host. */
static int s_wants_shm(const dp_ps_client_t *c, int i)
{
    return c->transport == DP_PS_TRANSPORT_SHM ||
           (c->transport == DP_PS_TRANSPORT_AUTO && dp_wire_local_endpoint(c->sh[i].endpoint));
}

static void s_shm_close(s_shard_t *s)
{
    dp_shm_close(&s->shm_params);
    dp_shm_close(&s->shm_grad);
    s->shm = 0;
}

/* What a WELCOME says of shared memory: map the segments it names (each
 * checked: ours, 0600, sealed, the header and size of this shard's range;
 * the parameters read-only), or go on with frames — unless shared memory
 * was forced. */
static int s_welcome_shm(dp_ps_client_t *c, int i, const Downpour__Welcome *w, char *err)
{
    s_shard_t *s = &c->sh[i];
    s_shm_close(s); /* a restarted shard has new segments */
    if (!s_wants_shm(c, i)) return 0;
    int forced = c->transport == DP_PS_TRANSPORT_SHM;
    char e2[DP_ERR_LEN];
    size_t n = (size_t)(s->hi - s->lo);
    if (!w->shm_name || !w->shm_name[0] || !w->shm_grad_name || !w->shm_grad_name[0])
        snprintf(e2, sizeof e2, "the shard did not grant shared memory (see its log)");
    else if (n > 0 && dp_shm_open(&s->shm_params, w->shm_name, n, DP_SHM_PARAM_SLOTS, DP_SHM_READ_ONLY, e2) == 0 &&
             dp_shm_open(&s->shm_grad, w->shm_grad_name, n, 1, DP_SHM_WRITABLE, e2) == 0) {
        s->shm = 1;
        return 0;
    } else if (n == 0)
        snprintf(e2, sizeof e2, "an empty range");
    s_shm_close(s);
    if (forced) return dp_err(err, "%s: --transport shm: %s", s->endpoint, e2);
    dp_log_info("%s: tensors as ZeroMQ frames, not shared memory: %s", s->endpoint, e2);
    return 0;
}

static void s_build_hello(dp_ps_client_t *c, int i, s_req_t *rq, void *arg)
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
    rq->env.hello = h;
}

/* A higher version reported by shard s. */
static void s_seen(s_shard_t *s, uint64_t version)
{
    if (version > s->seen_version) s->seen_version = version;
}

/* What a WELCOME says for recovery: the shard's incarnation and our last
 * step it applied; after a restart, the updates lost since its checkpoint
 * (versions we saw past the one it restarted at) are counted, and the next
 * push is stamped with, and the next sync pull answered at, the restored
 * version. The restart's own start version counts, not the version now:
 * other workers may have said HELLO first and pushed it on. */
static void s_welcome_recovery(dp_ps_client_t *c, s_shard_t *s, const Downpour__Envelope *env)
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
    s_seen(s, w->version);
    s->incarnation = env->incarnation;
    s->restarted = 0;
    s->worker_step = w->worker_step;
}

static int s_on_welcome(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf, (void)arg;
    s_shard_t *s = &c->sh[i];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", s->endpoint, env->error->message);
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
                             w->shard_count};
    s->lo = w->range_lo;
    s->hi = w->range_hi;
    s->run_token = w->run_token;
    s_welcome_recovery(c, s, env);
    return s_welcome_shm(c, i, w, err);
}

/* "tcp://h:p[,tcp://h2:p2...]" into c->sh[].endpoint, c->n. */
static int s_parse_endpoints(dp_ps_client_t *c, const char *endpoints, char *err)
{
    const char *p = endpoints;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= sizeof c->sh[0].endpoint || c->n == S_MAX_SHARDS)
            return dp_err(err, "bad ps endpoints '%s' (expected tcp://h:p[,tcp://h2:p2...], at most %d)",
                          endpoints, S_MAX_SHARDS);
        memcpy(c->sh[c->n].endpoint, p, len);
        c->sh[c->n].endpoint[len] = 0;
        c->n++;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

/* After the WELCOMEs: every shard runs the same policy, and the ranges, in
 * endpoint order, tile the model's floats. */
static int s_check_shards(dp_ps_client_t *c, char *err)
{
    c->info = c->sh[0].info;
    for (int i = 1; i < c->n; i++) {
        const dp_ps_info_t *a = &c->sh[i].info, *b = &c->info;
        if (a->mode != b->mode || a->num_workers != b->num_workers || a->replicas != b->replicas ||
            a->staleness != b->staleness)
            return dp_err(err, "%s: runs %s with %d workers, R=%d, S=%d but %s runs %s with %d workers, R=%d, S=%d",
                          c->sh[i].endpoint, dp_mode_name(a->mode), a->num_workers, a->replicas,
                          a->staleness, c->sh[0].endpoint, dp_mode_name(b->mode), b->num_workers,
                          b->replicas, b->staleness);
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

/* CURVE keys from their files: ours, and the servers' (one for every shard,
 * or one per shard in endpoint order). */
int dp_ps_curve_server_key(const dp_ps_curve_t *curve, int n_shards, int i, dp_curve_key_t *out,
                           char *err)
{
    const char *p = curve->servers;
    int n = 0;
    while (*p) {
        size_t len = strcspn(p, ",");
        char path[1024];
        if (len == 0 || len >= sizeof path || n == n_shards)
            return dp_err(err, "--curve-server '%s': expected one public key file, or one per server "
                               "(%d) in --ps order",
                          curve->servers, n_shards);
        memcpy(path, p, len);
        path[len] = 0;
        /* key i, or the first: it stands for every shard when it is the only one */
        if ((n == i || n == 0) && dp_curve_read_public(path, out, err) != 0) return -1;
        n++;
        p += len + (p[len] == ',');
    }
    if (n != 1 && n != n_shards)
        return dp_err(err, "--curve-server names %d keys but there are %d servers (give one key for "
                           "all, or one per server in --ps order)",
                      n, n_shards);
    return 0;
}

/* CURVE keys from their files: ours, and each shard's server key. */
static int s_load_keys(dp_ps_client_t *c, const dp_ps_curve_t *curve, char *err)
{
    if (dp_curve_read_secret(curve->secret, &c->secret, &c->pub, err) != 0) return -1;
    for (int i = 0; i < c->n; i++)
        if (dp_ps_curve_server_key(curve, c->n, i, &c->sh[i].server_key, err) != 0) return -1;
    c->curve = 1;
    return 0;
}

static int s_default_crc(const dp_ps_client_t *c, int i);

int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                     int worker_id, double timeout_s, dp_ps_info_t *info, char *err)
{
    return dp_ps_client_new_curve(out, endpoints, m, worker_id, timeout_s, NULL, info, err);
}

int dp_ps_client_new_curve(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                           int worker_id, double timeout_s, const dp_ps_curve_t *curve,
                           dp_ps_info_t *info, char *err)
{
    *out = NULL;
    if (!endpoints || !endpoints[0]) return dp_err(err, "no ps endpoints (give tcp://HOST:PORT)");
    if (!(timeout_s > 0)) timeout_s = 30;
    dp_ps_client_t *c = dp_calloc(1, sizeof *c);
    c->m = m;
    c->worker_id = worker_id;
    c->timeout_s = timeout_s;
    c->stop = s_default_stop;
    c->transport = s_default_transport;
    c->bf16 = s_default_bf16;
    atomic_init(&c->inflight, 0);
    c->sh = dp_calloc(S_MAX_SHARDS, sizeof *c->sh);
    if (s_parse_endpoints(c, endpoints, err) != 0) goto fail;
    if (curve && s_load_keys(c, curve, err) != 0) goto fail;
    c->ctx = zmq_ctx_new();
    if (!c->ctx) {
        dp_err(err, "cannot create a ZeroMQ context: %s", zmq_strerror(errno));
        goto fail;
    }
    for (int i = 0; i < c->n; i++) {
        if (s_open(c, i, err) != 0) goto fail;
        c->sh[i].crc = s_default_crc(c, i);
    }
    /* HELLO once: ZeroMQ queues it until the server is up, so one request
     * waiting up to timeout_s covers a server that starts late. */
    s_plan_t hello = {.type = DOWNPOUR__MSG_TYPE__HELLO, .n_shards = c->n,
                      .build = s_build_hello, .on_reply = s_on_welcome};
    if (s_exchange(c, &hello, err) != 0 || s_check_shards(c, err) != 0) goto fail;
    if (info) *info = c->info;
    *out = c;
    return 0;
fail:
    dp_ps_client_destroy(&c);
    return -1;
}

/* ---- checksums ------------------------------------------------------- */

/* A CRC-32 per tensor only where the transport does not protect the bytes
 * already: not on this host (loopback, ipc: kernel memory copies) and not
 * under CURVE (every message carries a MAC). It costs ~0.2 ms per 6.6 MB
 * on each side of each transfer, more than the whole margin to a plain
 * ZeroMQ round trip. */
static int s_default_crc(const dp_ps_client_t *c, int i)
{
    return !c->curve && !dp_wire_local_endpoint(c->sh[i].endpoint);
}

void dp_ps_client_set_checksum(dp_ps_client_t *c, int on)
{
    for (int i = 0; i < c->n; i++) c->sh[i].crc = on < 0 ? s_default_crc(c, i) : on != 0;
}

/* ---- pull ------------------------------------------------------------- */

static void s_build_pull(dp_ps_client_t *c, int i, s_req_t *rq, void *arg)
{
    (void)arg;
    Downpour__Pull *p = &rq->body.pull;
    *p = (Downpour__Pull)DOWNPOUR__PULL__INIT;
    p->min_version = c->info.mode == DP_MODE_SYNC ? c->sh[i].min_version : 0;
    p->no_checksum = !c->sh[i].crc;
    rq->env.pull = p;
    rq->env.shm = c->sh[i].shm;
    if (c->bf16 && !c->sh[i].shm) p->dtype = DOWNPOUR__DTYPE__BFLOAT16;
}

/* Where a pull's weights go: into params, or each tensor lent to a sink. */
typedef struct {
    float *params;               /* NULL: to the sink */
    dp_ps_params_sink_fn sink;
    void *sink_arg;
} s_pull_dest_t;

/* The floats [off, off + n) of the vector at src, to the pull's destination:
 * src is params itself, the client's landing buffer, or a received frame. */
static void s_deliver(const s_pull_dest_t *to, size_t off, const float *src, size_t n)
{
    if (to->params) {
        if (src != to->params + off) memcpy(to->params + off, src, n * sizeof(float));
    } else
        to->sink(to->sink_arg, off, src, n);
}

/* Shard i's tensors through shared memory (s->torn set, and the rest left,
 * when a step raced the copy). */
static void s_params_from_shm(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              const s_pull_dest_t *to)
{
    s_shard_t *s = &c->sh[i];
    float *dst = to->params ? to->params : c->landing;
    for (size_t f = 0; f < env->n_tensors; f++) {
        const Downpour__TensorDesc *d = env->tensors[f];
        size_t n = d->byte_length / 4;
        if (!dp_shm_read(&s->shm_params, (int)env->params->shm_slot, env->params->shm_seq,
                         (size_t)(d->offset - s->lo), dst + d->offset, n)) {
            s->torn = 1; /* the pull goes again */
            return;
        }
        s_deliver(to, d->offset, dst + d->offset, n);
    }
}

/* A frame's floats: lent in place when they are float32 at a float-aligned
 * address (ZeroMQ's receive buffer may start anywhere), else widened or
 * copied into params or the landing buffer first. */
static void s_params_from_frame(dp_ps_client_t *c, const Downpour__TensorDesc *d,
                                const dp_wire_frame_t *fr, const s_pull_dest_t *to)
{
    size_t n = (size_t)dp_wire_desc_count(d);
    if (d->dtype != DOWNPOUR__DTYPE__BFLOAT16 && ((uintptr_t)fr->data & 3) == 0) {
        s_deliver(to, d->offset, fr->data, n);
        return;
    }
    float *dst = (to->params ? to->params : c->landing) + d->offset;
    if (d->dtype == DOWNPOUR__DTYPE__BFLOAT16) dp_wire_from_bf16(dst, fr->data, n);
    else memcpy(dst, fr->data, fr->len);
    s_deliver(to, d->offset, dst, n);
}

static int s_on_params(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    s_shard_t *s = &c->sh[i];
    const s_pull_dest_t *to = arg;
    char e2[DP_ERR_LEN];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", s->endpoint, env->error->message);
    if (env->type != DOWNPOUR__MSG_TYPE__PARAMS)
        return dp_err(err, "%s: answered PULL with %s", s->endpoint, dp_wire_type_name(env->type));
    if (dp_wire_check_range(env, s->lo, s->hi, e2) != 0)
        return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
    if (env->shm) {
        if (!s->shm || env->params->shm_slot >= DP_SHM_PARAM_SLOTS)
            return dp_err(err, "%s: PARAMS through shared memory we do not have (slot %u)",
                          s->endpoint, env->params->shm_slot);
        s_params_from_shm(c, i, env, to);
        if (s->torn) return 0;
    }
    for (int f = 0; f < nf; f++) s_params_from_frame(c, env->tensors[f], &frames[f], to);
    s->version = env->params->version;
    s_seen(s, s->version);
    s->pulled = 1;
    return 0;
}

/* A shared-memory copy is torn only when two steps land during it; a few
 * tries, then it is an error rather than a livelock. */
#define S_TORN_TRIES 16

static int s_pull(dp_ps_client_t *c, s_pull_dest_t *to, char *err)
{
    s_plan_t pull = {.type = DOWNPOUR__MSG_TYPE__PULL, .n_shards = c->n,
                     .build = s_build_pull, .on_reply = s_on_params, .arg = to};
    for (int t = 0; t < S_TORN_TRIES; t++) {
        int torn = 0;
        for (int i = 0; i < c->n; i++) c->sh[i].torn = 0;
        if (s_exchange(c, &pull, err) != 0) return -1;
        for (int i = 0; i < c->n; i++) torn |= c->sh[i].torn;
        if (!torn) return 0;
    }
    return dp_err(err, "shared memory: %d pulls in a row raced the servers' steps", S_TORN_TRIES);
}

int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err)
{
    s_pull_dest_t to = {.params = params};
    return s_pull(c, &to, err);
}

int dp_ps_client_pull_to(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err)
{
    if (!c->landing) c->landing = dp_aligned_alloc(c->m->n_floats * sizeof(float));
    s_pull_dest_t to = {.sink = sink, .sink_arg = arg};
    return s_pull(c, &to, err);
}

/* ---- push ------------------------------------------------------------- */

/* One push: what goes out, and the ACKs summed as they come back. */
typedef struct {
    const float *grads;
    uint64_t step;         /* Push.step: 1, 2, ...; 0 = none (no repeat detection) */
    float loss;
    int batch;
    dp_push_result_t *res;
    double staleness_sum;
} s_push_t;

static void s_push_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_int *)hint, 1);
}

/* Shard i's slice of the gradient, handed to ZeroMQ without a copy. */
static void s_build_push(dp_ps_client_t *c, int i, s_req_t *rq, void *arg)
{
    const s_push_t *push = arg;
    const s_shard_t *s = &c->sh[i];
    Downpour__Push *p = &rq->body.push;
    *p = (Downpour__Push)DOWNPOUR__PUSH__INIT;
    p->version = s->version;
    p->loss = push->loss;
    p->batch = push->batch;
    p->step = push->step;
    rq->env.push = p;
    size_t cnt = (size_t)(s->hi - s->lo);
    dp_wire_desc_fill(&rq->desc, rq->shape, "params", push->grads + s->lo, cnt, s->lo,
                      !s->crc || s->shm || c->bf16, 0); /* bf16: its own CRC below */
    if (!s->crc) dp_wire_desc_no_checksum(&rq->desc);
    rq->descs[0] = &rq->desc;
    rq->env.n_tensors = 1;
    rq->env.tensors = rq->descs;
    if (s->shm) { /* our slot: the shard copies it out before it looks at it */
        memcpy(dp_shm_slot(&s->shm_grad, 0), push->grads + s->lo, cnt * sizeof(float));
        dp_wire_desc_no_checksum(&rq->desc);
        rq->env.shm = 1;
        return;
    }
    atomic_fetch_add(&c->inflight, 1); /* dp_wire_send releases it, sent or not */
    if (c->bf16) { /* half the bytes: the slice rounded into our own buffer */
        s_shard_t *sw = &c->sh[i];
        if (!sw->push16) sw->push16 = dp_malloc(cnt * sizeof *sw->push16 + 2);
        dp_wire_to_bf16(sw->push16, push->grads + s->lo, cnt);
        dp_wire_desc_bf16(&rq->desc, sw->push16, s->crc);
        rq->payload = (dp_wire_payload_t){sw->push16, cnt * 2, s_push_release, &c->inflight};
    } else
        rq->payload = (dp_wire_payload_t){push->grads + s->lo, cnt * sizeof(float), s_push_release,
                                          &c->inflight};
    rq->n_payloads = 1;
}

static void s_set_reason(dp_push_result_t *r, const char *endpoint, const char *why)
{
    /* Truncation is fine: the reason is for a log line. */
    if (!r->reason[0]) {
        int n = snprintf(r->reason, sizeof r->reason, "%.60s: %s", endpoint, why);
        (void)n;
    }
}

static int s_on_ack(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_shard_t *s = &c->sh[i];
    s_push_t *push = arg;
    dp_push_result_t *r = push->res;
    uint64_t stamped = s->version;
    s->min_version = 0;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) {
        r->rejected++;
        s_set_reason(r, s->endpoint, env->error->message);
        return 0;
    }
    if (env->type != DOWNPOUR__MSG_TYPE__ACK)
        return dp_err(err, "%s: answered PUSH with %s", s->endpoint, dp_wire_type_name(env->type));
    const Downpour__Ack *a = env->ack;
    switch (a->status) {
    case DOWNPOUR__ACK_STATUS__APPLIED: r->applied++; break;
    case DOWNPOUR__ACK_STATUS__DROPPED: r->dropped++; break;
    case DOWNPOUR__ACK_STATUS__REJECTED: r->rejected++; break;
    default: return dp_err(err, "%s: ACK with unknown status %d", s->endpoint, (int)a->status);
    }
    if (a->status != DOWNPOUR__ACK_STATUS__APPLIED)
        s_set_reason(r, s->endpoint, a->reason && a->reason[0] ? a->reason : "no reason given");
    else if (a->reason && a->reason[0]) /* "repeat: ...": applied before, not again */
        s_set_reason(r, s->endpoint, a->reason);
    /* Sync: our gradient is in this version's aggregate (applied, or a
     * duplicate of one that is) — the next pull waits for the step. */
    if (a->status == DOWNPOUR__ACK_STATUS__APPLIED ||
        (a->status == DOWNPOUR__ACK_STATUS__DROPPED && a->staleness == 0))
        s->min_version = stamped + 1;
    if (a->staleness > r->staleness_max) r->staleness_max = a->staleness;
    push->staleness_sum += (double)a->staleness;
    r->version += a->version;
    s_seen(s, a->version);
    return 0;
}

/* Wait (bounded) until ZeroMQ has let go of every push frame. */
static int s_wait_released(dp_ps_client_t *c, char *err)
{
    double t0 = dp_now();
    while (atomic_load(&c->inflight) > 0) {
        if (dp_now() - t0 > c->timeout_s)
            return dp_err(err, "ZeroMQ still holds %d gradient frames after %.0f s",
                          atomic_load(&c->inflight), c->timeout_s);
        s_sleep(50e-6);
    }
    return 0;
}

int dp_ps_client_push(dp_ps_client_t *c, const float *grads, float loss, int batch,
                      dp_push_result_t *res, char *err)
{
    return dp_ps_client_push_step(c, 0, grads, loss, batch, res, err);
}

int dp_ps_client_push_step(dp_ps_client_t *c, uint64_t step, const float *grads, float loss,
                           int batch, dp_push_result_t *res, char *err)
{
    dp_push_result_t local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    for (int i = 0; i < c->n; i++)
        if (!c->sh[i].pulled)
            return dp_err(err, "push before the first pull (the gradient needs a version)");
    s_push_t push = {grads, step, loss, batch, res, 0};
    s_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__PUSH, .n_shards = c->n,
                     .build = s_build_push, .on_reply = s_on_ack, .arg = &push};
    int rc = s_exchange(c, &plan, err);
    char e2[DP_ERR_LEN];
    if (s_wait_released(c, e2) != 0) {
        if (rc == 0) rc = dp_err(err, "%s", e2);
        dp_log_error("%s", e2);
    }
    if (rc == 0) res->staleness_mean = push.staleness_sum / c->n;
    return rc;
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

static int s_on_stats(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_stats_acc_t *a = arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", c->sh[i].endpoint, env->error->message);
    if (env->type != DOWNPOUR__MSG_TYPE__STATS || !env->stats)
        return dp_err(err, "%s: answered STATS with %s", c->sh[i].endpoint,
                      dp_wire_type_name(env->type));
    const Downpour__Stats *s = env->stats;
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
    }
    a->st.version += s->version;
    return 0;
}

/* STATS to every shard, or to shard 0 only (its worker counts suffice). */
static int s_stats(dp_ps_client_t *c, s_stats_acc_t *a, int only_first, char *err)
{
    memset(a, 0, sizeof *a);
    s_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__STATS, .n_shards = only_first ? 1 : c->n,
                     .on_reply = s_on_stats, .arg = a};
    return s_exchange(c, &plan, err);
}

int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err)
{
    s_stats_acc_t a;
    if (s_stats(c, &a, 0, err) != 0) return -1;
    *out = a.st;
    return 0;
}

/* A reply without a body of interest: the request's own type, or ERROR. */
static int s_on_bare(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                     const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    int want = *(const int *)arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", c->sh[i].endpoint, env->error->message);
    if ((int)env->type != want)
        return dp_err(err, "%s: answered %s with %s", c->sh[i].endpoint, dp_wire_type_name(want),
                      dp_wire_type_name(env->type));
    return 0;
}

static void s_build_finished(dp_ps_client_t *c, int i, s_req_t *rq, void *arg)
{
    (void)c, (void)i, (void)arg;
    Downpour__Barrier *b = &rq->body.barrier;
    *b = (Downpour__Barrier)DOWNPOUR__BARRIER__INIT;
    b->finished = 1;
    rq->env.barrier = b;
}

int dp_ps_client_finish(dp_ps_client_t *c, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__BARRIER; /* the reply's type */
    s_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__BARRIER, .n_shards = c->n,
                     .build = s_build_finished, .on_reply = s_on_bare, .arg = &want};
    if (s_exchange(c, &plan, err) != 0) return -1;
    c->finished = 1;
    return 0;
}

int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err)
{
    if (!c->finished && dp_ps_client_finish(c, err) != 0) return -1;
    double t0 = dp_now();
    for (;;) {
        s_stats_acc_t a;
        if (s_stats(c, &a, 1, err) != 0) return -1;
        int done = a.finished + a.gone;
        if (done >= a.num_workers) return 0;
        if (dp_now() - t0 >= timeout_s)
            return dp_err(err, "%d of %d workers still running after %.0f s",
                          a.num_workers - done, a.num_workers, timeout_s);
        if (c->stop && *c->stop) return dp_err(err, "interrupted");
        s_sleep(0.1);
    }
}

int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err)
{
    int want = DOWNPOUR__MSG_TYPE__SHUTDOWN; /* the reply's type */
    s_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__SHUTDOWN, .n_shards = c->n,
                     .on_reply = s_on_bare, .arg = &want};
    return s_exchange(c, &plan, err);
}

void dp_ps_client_default_transport(dp_ps_transport_t t)
{
    s_default_transport = t;
}

void dp_ps_client_default_wire(int bf16)
{
    s_default_bf16 = bf16;
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

void dp_ps_client_default_stop_flag(volatile sig_atomic_t *flag)
{
    s_default_stop = flag;
}

void dp_ps_client_set_stop_flag(dp_ps_client_t *c, volatile sig_atomic_t *flag)
{
    c->stop = flag;
}

void dp_ps_client_destroy(dp_ps_client_t **c_p)
{
    if (!c_p || !*c_p) return;
    dp_ps_client_t *c = *c_p;
    for (int i = 0; i < c->n; i++) {
        s_close(&c->sh[i]);
        s_shm_close(&c->sh[i]);
        free(c->sh[i].push16);
    }
    /* zmq_ctx_term may be interrupted by a signal; it is then to be retried. */
    while (c->ctx && zmq_ctx_term(c->ctx) != 0) {
        if (errno != EINTR) {
            dp_log_warn("closing the ZeroMQ context: %s", zmq_strerror(errno));
            break;
        }
    }
    free(c->sh);
    free(c->landing);
    free(c);
    *c_p = NULL;
}

/* ---- pushing on an earlier pull's versions ---------------------------- */

_Static_assert(DP_PS_STAMP_MAX >= S_MAX_SHARDS, "a stamp holds every shard's version");

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

/* The push reads each shard's stamp from sh[i].version, so it is swapped in
 * for the push and the last pull's put back after. A shard that restarted
 * meanwhile (another incarnation, or its version lowered by s_on_welcome)
 * keeps the lower of the two: the next push is stamped with the restored
 * version, as after a plain push. */
int dp_ps_client_push_stamped(dp_ps_client_t *c, const dp_ps_stamp_t *stamp, uint64_t step,
                              const float *grads, float loss, int batch, dp_push_result_t *res,
                              char *err)
{
    if (stamp->n != c->n)
        return dp_err(err, "push stamped for %d shard(s) on a client of %d", stamp->n, c->n);
    uint64_t last[S_MAX_SHARDS], used[S_MAX_SHARDS], inc[S_MAX_SHARDS];
    for (int i = 0; i < c->n; i++) {
        s_shard_t *s = &c->sh[i];
        last[i] = s->version;
        inc[i] = s->incarnation;
        used[i] = stamp->v[i] < last[i] ? stamp->v[i] : last[i];
        s->version = used[i];
    }
    int rc = dp_ps_client_push_step(c, step, grads, loss, batch, res, err);
    for (int i = 0; i < c->n; i++) {
        s_shard_t *s = &c->sh[i];
        int restarted = s->incarnation != inc[i] || s->version != used[i];
        s->version = restarted && s->version < last[i] ? s->version : last[i];
    }
    return rc;
}
