/* ps_harness.h: a parameter server (server/loop/ps.h) in a thread of the test
 * program, bound to a free loopback port, for the unit tests that talk to a
 * real one over ZeroMQ (test_ps, test_pipeline, test_recovery, test_auth).
 *
 *   srv_t s;
 *   srv_init(&s, DP_MODE_ASYNC, 1);    the small model, plain SGD lr 0.1, seed 7
 *   s.cfg.xxx = ...;                   anything else the case needs
 *   CHECK_EQ(srv_start(&s), 0);        returns once listening: s.endpoint
 *   ... clients on s.endpoint ...
 *   CHECK_EQ(srv_stop(&s), 0);         stop flag, join; dp_ps_run's status
 *
 * A case may set s.cfg.on_ready to a hook of its own, run on the server's
 * thread before its loop; the hook must call srv_on_ready(endpoint, &s).
 *
 * srv_stop_after(&s, T) first waits up to T seconds for the server to end
 * by itself (a SHUTDOWN); s.ended says whether it had. Every wait is
 * bounded, so a broken server fails a case instead of hanging the program.
 *
 * A raw peer speaks the wire by hand, as a hostile or buggy one would:
 * raw_dealer() opens its socket, raw_hello_init() fills a HELLO,
 * raw_push_init() a PUSH or a part of one, and raw_request() sends one
 * envelope and decodes the reply. */
#ifndef DP_TESTS_PS_HARNESS_H
#define DP_TESTS_PS_HARNESS_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "proto/wire_zmq.h"
#include "server/loop/ps.h"
#include "worker/client/ps_client.h"

/* Small enough to move in microseconds, and it has every kind of layer the
 * server shards: conv, fc, biases. Input 1x8x8. */
/* Shorthands for the client calls of a test: options with timeout t (the
 * defaults otherwise), a push of g with loss l and batch b (no step, the
 * last pull's stamp), and one with step st. */
#define PS_OPTS(t) (&(dp_ps_client_opts_t){.timeout_s = (t)})
#define PS_PUSH(g, l, b) (&(dp_ps_push_t){.grads = (g), .loss = (l), .batch = (b)})
#define PS_PUSH_STEP(st, g, l, b) \
    (&(dp_ps_push_t){.grads = (g), .loss = (l), .batch = (b), .step = (st)})

#define SRV_SMALL_SPEC "conv3x3:2 relu maxpool2 fc:4 softmax"

typedef struct {
    dp_ps_config_t cfg;
    pthread_t th;
    volatile sig_atomic_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, done, rc, started;
    int ended;                  /* srv_stop_after: it had ended by itself */
    char endpoint[256];
    char err[DP_ERR_LEN];
} srv_t;

static inline void srv_on_ready(const char *ep, void *arg)
{
    srv_t *s = arg;
    pthread_mutex_lock(&s->mu);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", ep);
    s->ready = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static inline void *srv_main(void *arg)
{
    srv_t *s = arg;
    int rc = dp_ps_run(&s->cfg, &s->stop, s->err);
    pthread_mutex_lock(&s->mu);
    s->rc = rc;
    s->done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The small model, plain SGD at lr 0.1 (so every weight is a known sum of
 * the gradients applied), seed 7, on a free loopback port. */
static inline void srv_init(srv_t *s, dp_mode_t mode, int workers)
{
    memset(s, 0, sizeof *s);
    dp_ps_config_default(&s->cfg);
    snprintf(s->cfg.bind, sizeof s->cfg.bind, "tcp://127.0.0.1:*");
    snprintf(s->cfg.model_spec, sizeof s->cfg.model_spec, "%s", SRV_SMALL_SPEC);
    s->cfg.in_c = 1;
    s->cfg.in_h = s->cfg.in_w = 8;
    s->cfg.mode = mode;
    s->cfg.num_workers = workers;
    s->cfg.optim.kind = DP_OPT_SGD;
    s->cfg.optim.lr = 0.1f;
    s->cfg.seed = 7;
}

/* Start; 0 once listening (within 10 s), -1 when setup failed (s->err says
 * why) or it never listened. */
static inline int srv_start(srv_t *s)
{
    /* A case may hook the ready call (it must call srv_on_ready(ep, s)). */
    if (!s->cfg.on_ready) s->cfg.on_ready = srv_on_ready;
    s->cfg.on_ready_arg = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->started = 1;
    pthread_create(&s->th, NULL, srv_main, s);
    double t0 = dp_now();
    pthread_mutex_lock(&s->mu);
    while (!s->ready && !s->done && dp_now() - t0 < 10) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    int ok = s->ready;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -1;
}

/* Wait (bounded) for the server to end by itself, then make sure it does;
 * dp_ps_run's status. */
static inline int srv_stop_after(srv_t *s, double wait_s)
{
    if (!s->started) return 0;
    double t0 = dp_now();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int d = s->done;
        pthread_mutex_unlock(&s->mu);
        if (d || dp_now() - t0 >= wait_s) {
            s->ended = d;
            break;
        }
        usleep(10000);
    }
    s->stop = 1;
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    s->started = 0;
    return s->rc;
}

static inline int srv_stop(srv_t *s) { return srv_stop_after(s, 0); }

/* The small model as the workers see it; exits on failure (a broken spec
 * would fail every case anyway). */
static inline void srv_small_model(dp_model_t *m)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(m, SRV_SMALL_SPEC, 1, 8, 8, err) != 0) {
        fprintf(stderr, "model: %s\n", err);
        exit(1);
    }
}

/* n uniform values in [-1, 1) from seed: a gradient to push. */
static inline void srv_fill(float *g, size_t n, uint64_t seed)
{
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) g[i] = dp_rng_uniform(&r) * 2.0f - 1.0f;
}

/* ---- an id whose connection just closed -------------------------------- */

/* The server hears that a worker's connection closed only when its I/O
 * thread does; until then a new HELLO for the id is refused as taken (a live
 * holder keeps it). SRV_REJOIN(rc, err, call) repeats call, a HELLO returning 0
 * or -1 with err filled, while it is refused that way: every 20 ms for at
 * most 5 s, so the case waits for the close, not for a guessed time. */
#define SRV_REJOIN(rc, err, call)                                                  \
    do {                                                                           \
        for (int srv_try_ = 0; srv_try_ < 250; srv_try_++) {                       \
            (rc) = (call);                                                         \
            if ((rc) == 0 || !strstr((err), "is taken")) break;                    \
            usleep(20 * 1000);                                                     \
        }                                                                          \
    } while (0)

/* ---- a raw peer --------------------------------------------------------- */

/* A DEALER on endpoint that never lingers and gives up a send or a receive
 * after timeout_ms: a silent server fails a case instead of hanging it. */
static inline void *raw_dealer(void *ctx, const char *endpoint, int timeout_ms)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_connect(sock, endpoint);
    return sock;
}

/* env as request req_id: a HELLO of worker wid for model m, in h (the
 * caller's, like the envelope). */
static inline void raw_hello_init(Downpour__Envelope *env, Downpour__Hello *h, const dp_model_t *m,
                                  int wid, uint64_t req_id)
{
    dp_wire_env_init(env, DOWNPOUR__MSG_TYPE__HELLO, req_id, wid, m->fingerprint);
    *h = (Downpour__Hello)DOWNPOUR__HELLO__INIT;
    h->model_spec = (char *)m->spec;
    h->in_c = m->in_c, h->in_h = m->in_h, h->in_w = m->in_w;
    h->n_floats = m->n_floats;
    env->hello = h;
}

/* A PUSH of one tensor, "params": the envelope and what it points at,
 * the caller's (not to be copied: env points into it). */
typedef struct {
    Downpour__Envelope env;
    Downpour__Push push;
    Downpour__TensorDesc desc, *descs[1];
    int64_t shape[1];
} raw_push_t;

/* r as request req_id of model m: worker wid's part k of K (K 0: a whole
 * push) of step st on version v, batch 1, carrying cnt floats g that start
 * at float lo of the model. */
static inline void raw_push_init(raw_push_t *r, const dp_model_t *m, int wid, uint64_t req_id,
                                 uint64_t st, uint64_t v, uint32_t k, uint32_t K, const float *g,
                                 size_t cnt, size_t lo)
{
    dp_wire_env_init(&r->env, DOWNPOUR__MSG_TYPE__PUSH, req_id, wid, m->fingerprint);
    r->push = (Downpour__Push)DOWNPOUR__PUSH__INIT;
    r->push.version = v;
    r->push.step = st;
    r->push.batch = 1;
    r->push.part = k;
    r->push.parts = K;
    r->env.push = &r->push;
    dp_wire_desc_fill(&r->desc, r->shape, "params", g, cnt, lo, 0, 0);
    r->descs[0] = &r->desc;
    r->env.n_tensors = 1;
    r->env.tensors = r->descs;
}

/* Send env alone on sock and wait for the reply (RCVTIMEO bounds it): its
 * type, or -1 when none came or it did not decode. With rep, the decoded
 * reply is the caller's (dp_wire_destroy); else it is dropped. */
static inline int raw_request(void *sock, const Downpour__Envelope *env, Downpour__Envelope **rep)
{
    if (rep) *rep = NULL;
    size_t len = downpour__envelope__get_packed_size(env);
    uint8_t *buf = dp_malloc(len ? len : 1);
    downpour__envelope__pack(env, buf);
    int sent = zmq_send(sock, buf, len, 0);
    free(buf);
    if (sent < 0) return -1;
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return -1;
    Downpour__Envelope *r = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    dp_wire_rx_fini(&rx);
    int type = r ? (int)r->type : -1;
    if (rep) *rep = r;
    else dp_wire_destroy(&r);
    return type;
}

/* One reply as a raw peer's cases look at it: its type (-1: none came or
 * it did not decode), an ACK's status and version, and the text of an
 * ERROR or an ACK's reason. */
typedef struct {
    int type;
    int status;
    uint64_t version;
    char text[DP_ERR_LEN + 200];
} raw_reply_t;

/* Receive and decode the next reply on sock (RCVTIMEO bounds the wait). */
static inline raw_reply_t raw_reply(void *sock)
{
    raw_reply_t r = {-1, 0, 0, ""};
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return r;
    Downpour__Envelope *e = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    if (e) {
        r.type = e->type;
        if (e->ack) r.status = e->ack->status, r.version = e->ack->version;
        snprintf(r.text, sizeof r.text, "%s",
                 e->error ? e->error->message : e->ack && e->ack->reason ? e->ack->reason : "");
    }
    dp_wire_destroy(&e);
    dp_wire_rx_fini(&rx);
    return r;
}

/* The server's weights (into w) and version, through a client. */
static inline uint64_t srv_weights(dp_ps_client_t *c, float *w)
{
    char err[DP_ERR_LEN];
    if (dp_ps_client_pull(c, w, err) != 0) fprintf(stderr, "  pull: %s\n", err);
    return dp_ps_client_version(c);
}

#endif
