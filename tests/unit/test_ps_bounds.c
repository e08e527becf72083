/* test_ps_bounds: what one joined peer can make a shard hold or believe,
 * against a real server (tests/ps_harness.h) over loopback, the hostile
 * peer a raw DEALER speaking the wire with the project's codec:
 *  - a peer that alternates PUSH and PULL and never reads its replies pins
 *    at most DP_PS_PARAMS_PER_WORKER buffers of the shard (dp_snap_alive),
 *    is answered "busy" beyond them, and another worker is served;
 *  - a peer that floods pulls which must be held holds at most
 *    DP_PS_HELD_PER_WORKER, the rest refused, and another worker's pull
 *    still waits and is answered;
 *  - a pull in parts (Pull.cuts) is answered with one PARAMS per run, in
 *    order, of one version, each with its own CRC-32 (or in bfloat16),
 *    whose floats are the whole pull's bit for bit; cuts outside the
 *    shard's range, not ascending or too many are refused with one line,
 *    and the shard serves on unchanged; once the parts are read, every
 *    buffer they pointed into is released (one loan a reply);
 *  - a push claiming step 2^62 is refused with the reason, changes nothing,
 *    and the worker's real steps (and the checkpoint's worker_steps) go on;
 *    after a restart the first push may skip --checkpoint-every steps.
 * Every wait is on an event (a reply, a version reached), bounded. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "server/core/shard.h"
#include "server/core/shard_checkpoint.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0 /* client timeout, and the raw sockets' receive timeout */

static dp_model_t s_small;

/* ---- a raw DEALER ------------------------------------------------------ */

static void *s_raw_socket(void *ctx, const char *endpoint, int rcvhwm, int rcvbuf)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = (int)(TMO * 1000);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    if (rcvhwm) zmq_setsockopt(sock, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    if (rcvbuf) zmq_setsockopt(sock, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf);
    zmq_connect(sock, endpoint);
    return sock;
}

/* Send env (and one tensor frame when data is not NULL). 0 or -1. */
static int s_send(void *sock, const Downpour__Envelope *env, const void *data, size_t len)
{
    static uint8_t buf[1 << 16];
    size_t n = downpour__envelope__pack(env, buf);
    if (zmq_send(sock, buf, n, data ? ZMQ_SNDMORE : 0) < 0) return -1;
    if (data && zmq_send(sock, data, len, 0) < 0) return -1;
    return 0;
}

/* One reply: its type (-1 on a timeout or garbage), request id, Params
 * version and error text. flags: 0 or ZMQ_DONTWAIT. */
typedef struct {
    int type;
    uint64_t req, version;
    char text[DP_ERR_LEN + 200];
} reply_t;

static int s_recv(void *sock, reply_t *r, int flags)
{
    memset(r, 0, sizeof *r);
    r->type = -1;
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, flags, err) != 0) return -1;
    Downpour__Envelope *env = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    if (env) {
        r->type = env->type;
        r->req = env->request_id;
        if (env->params) r->version = env->params->version;
        if (env->ack) r->version = env->ack->version;
        const char *t = env->error && env->error->message ? env->error->message
                        : env->ack && env->ack->reason       ? env->ack->reason
                                                             : "";
        snprintf(r->text, sizeof r->text, "%s", t);
    }
    dp_wire_destroy(&env);
    dp_wire_rx_fini(&rx);
    return r->type;
}

static int s_hello(void *sock, const dp_model_t *m, int wid)
{
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, m, wid, 1);
    return raw_request(sock, &env, NULL);
}

/* PUSH of the whole range g (n floats) as worker wid, computed on version. */
static int s_push(void *sock, const dp_model_t *m, int wid, uint64_t req, uint64_t step,
                  uint64_t version, const float *g, size_t n)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, req, wid, m->fingerprint);
    Downpour__Push p = DOWNPOUR__PUSH__INIT;
    p.step = step;
    p.version = version;
    env.push = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", g, n, 0, 1, 0);
    dp_wire_desc_no_checksum(&d);
    env.n_tensors = 1;
    env.tensors = dv;
    return s_send(sock, &env, g, n * sizeof(float));
}

/* PULL as worker wid; with n_cuts > 0, in parts cut at cuts (Pull.cuts);
 * crc: the reply carries CRC-32s; bf16: in bfloat16. */
typedef struct {
    size_t n_cuts;
    uint64_t *cuts;
    int crc, bf16;
} pull_ask_t;

static int s_pull_ask(void *sock, const dp_model_t *m, int wid, uint64_t req,
                      uint64_t min_version, const pull_ask_t *a)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PULL, req, wid, m->fingerprint);
    Downpour__Pull p = DOWNPOUR__PULL__INIT;
    p.min_version = min_version;
    p.no_checksum = !(a && a->crc);
    if (a && a->bf16) p.dtype = DOWNPOUR__DTYPE__BFLOAT16;
    if (a) {
        p.n_cuts = a->n_cuts;
        p.cuts = a->cuts;
    }
    env.pull = &p;
    return s_send(sock, &env, NULL, 0);
}

static int s_pull(void *sock, const dp_model_t *m, int wid, uint64_t req, uint64_t min_version)
{
    return s_pull_ask(sock, m, wid, req, min_version, NULL);
}

static int s_heartbeat(void *sock, int wid, uint64_t req)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, req, wid, 0);
    return s_send(sock, &env, NULL, 0);
}

/* An async shard of a 1.1 MB model (m) for `workers` workers, started;
 * returns the snapshots alive before it, for the count its buffers must
 * return to. */
static int s_big_shard(srv_t *s, dp_model_t *m, int workers)
{
    srv_init(s, DP_MODE_ASYNC, workers);
    snprintf(s->cfg.model_spec, sizeof s->cfg.model_spec, "fc:4096 fc:4 softmax");
    s->cfg.optim.lr = 0.001f;
    char err[DP_ERR_LEN] = "";
    CHECK_EQ(dp_model_parse(m, s->cfg.model_spec, 1, 8, 8, err), 0);
    int base = dp_snap_alive();
    CHECK_EQ(srv_start(s), 0);
    return base;
}

/* ---- cases ------------------------------------------------------------- */

/* A joined peer alternates PUSH and PULL 64 times and reads nothing, on a
 * model of 1.1 MB (so its unread replies fill the kernel's buffers and
 * then ZeroMQ's queue). Before the bound, each of its PARAMS held one
 * buffer: the shard kept ~60 of them. Now: at most DP_PS_PARAMS_PER_WORKER
 * per worker on top of the shard's own (live, retired, bfloat16), the peer
 * hears "busy", the other worker is served throughout, and once the peer
 * is gone its buffers are too. */
static void test_unread_params_bounded(void)
{
    srv_t s;
    dp_model_t m;
    char err[DP_ERR_LEN] = "";
    int base = s_big_shard(&s, &m, 2);
    size_t n = m.n_floats;
    float *g = dp_calloc(n, sizeof *g), *p = dp_malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) g[i] = 1e-3f * (float)(i % 3);
    void *ctx = zmq_ctx_new();
    /* it reads nothing: one message in its queue, a small kernel buffer */
    void *bad = s_raw_socket(ctx, s.endpoint, 1, 16384);
    CHECK_EQ(s_hello(bad, &m, 1), DOWNPOUR__MSG_TYPE__WELCOME);
    const int pairs = 64;
    int sent = 0;
    for (int i = 0; i < pairs; i++) {
        if (s_push(bad, &m, 1, 100 + 2 * (uint64_t)i, 0, 0, g, n) != 0 ||
            s_pull(bad, &m, 1, 101 + 2 * (uint64_t)i, 0) != 0)
            break;
        sent++;
    }
    CHECK_EQ(sent, pairs);
    /* The other worker: served while the peer's replies pile up, until the
     * shard has applied every push the peer sent (the event waited for). */
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &m, 0, PS_OPTS(TMO), NULL, err), 0);
    int served = 0;
    double t0 = dp_now();
    while (c && dp_now() - t0 < 30) {
        if (dp_ps_client_pull(c, p, err) != 0) break;
        served++;
        if (dp_ps_client_version(c) >= (uint64_t)pairs) break;
    }
    CHECK(c && dp_ps_client_version(c) == (uint64_t)pairs);
    CHECK(served >= 1);
    int held = dp_snap_alive() - base;
    int bound = DP_SHARD_RETIRED + 2 + 2 * DP_PS_PARAMS_PER_WORKER;
    printf("  parameter buffers alive after %d unread PUSH+PULL pairs: %d (bound %d)\n", pairs, held,
           bound);
    CHECK(held <= bound);
    if (c) {
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH(g, 1, 8), &r, err), 0);
        CHECK_EQ(r.applied, 1);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_version(c), pairs + 1);
    }
    /* What the peer finds when it reads at last: its later pulls were told why. */
    int busy = 0;
    reply_t r;
    while (!busy && s_recv(bad, &r, 0) >= 0)
        if (r.type == DOWNPOUR__MSG_TYPE__ERROR && strstr(r.text, "busy: worker 1 has")) busy = 1;
    CHECK(busy);
    if (busy) printf("  the peer heard: %s\n", r.text);
    /* Gone, its buffers go with it (ZeroMQ drops its queue). */
    zmq_close(bad);
    t0 = dp_now();
    while (dp_snap_alive() - base > DP_SHARD_RETIRED + 2 + DP_PS_PARAMS_PER_WORKER &&
           dp_now() - t0 < 10)
        usleep(10 * 1000);
    CHECK(dp_snap_alive() - base <= DP_SHARD_RETIRED + 2 + DP_PS_PARAMS_PER_WORKER);
    dp_ps_client_destroy(&c);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
    CHECK_EQ(dp_snap_alive(), base);
    free(g), free(p);
}

/* The PARAMS of one pull (req), in parts or whole, checked as a worker
 * checks a message (dp_wire_check: shapes, CRC-32s) and gathered into w
 * (float32, bfloat16 widened); returns how many messages, -1 on anything
 * out of order: a part not the next, a run not the one between its cuts,
 * another version than the first part's. */
static int s_recv_params(void *sock, uint64_t req, const pull_ask_t *a, size_t n, float *w,
                         uint64_t *version)
{
    uint32_t want_parts = (uint32_t)(a ? a->n_cuts : 0) + 1, got = 0;
    for (;;) {
        dp_wire_rx_t rx;
        char err[DP_ERR_LEN];
        if (dp_wire_recv(sock, &rx, 0, err) != 0) return -1;
        Downpour__Envelope *env = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
        dp_wire_frame_t fr[DP_WIRE_MAX_TENSORS];
        int nf = rx.n_parts - 1;
        for (int f = 0; f < nf && f < DP_WIRE_MAX_TENSORS; f++) {
            fr[f].data = zmq_msg_data(&rx.parts[1 + f]);
            fr[f].len = zmq_msg_size(&rx.parts[1 + f]);
        }
        int bad = !env || dp_wire_check(env, fr, nf, err) != 0 || env->type != DOWNPOUR__MSG_TYPE__PARAMS ||
                  env->request_id != req || nf != 1;
        if (!bad) {
            const Downpour__Params *p = env->params;
            const Downpour__TensorDesc *d = env->tensors[0];
            uint64_t from = got ? a->cuts[got - 1] : 0, to = got + 1 < want_parts ? a->cuts[got] : n;
            bad = dp_wire_params_parts(p) != want_parts || p->part != got ||
                  (got && p->version != *version) || d->offset != from ||
                  dp_wire_desc_count(d) != to - from ||
                  (a && a->crc && d->checksum == DOWNPOUR__CHECKSUM__NO_CHECKSUM);
            if (!bad) {
                *version = p->version;
                if (d->dtype == DOWNPOUR__DTYPE__BFLOAT16) dp_wire_from_bf16(w + from, fr[0].data, to - from);
                else memcpy(w + from, fr[0].data, fr[0].len);
            }
        }
        if (bad) fprintf(stderr, "  PARAMS %u: out of order or malformed (%s)\n", got, env ? "" : err);
        dp_wire_destroy(&env);
        dp_wire_rx_fini(&rx);
        if (bad) return -1;
        if (++got == want_parts) return (int)got;
    }
}

/* A pull in parts against the whole pull of the same version, in float32
 * with CRC-32s and in bfloat16; then cuts a shard must refuse. */
static void test_pull_in_parts(void)
{
    srv_t s;
    dp_model_t m;
    int base = s_big_shard(&s, &m, 1);
    size_t n = m.n_floats;
    float *whole = dp_malloc(n * sizeof *whole), *parts = dp_malloc(n * sizeof *parts);
    void *ctx = zmq_ctx_new();
    void *sock = s_raw_socket(ctx, s.endpoint, 0, 0);
    CHECK_EQ(s_hello(sock, &m, 0), DOWNPOUR__MSG_TYPE__WELCOME);
    uint64_t cuts[4] = {1, 4096, 65536, n - 1}, vw = 1, vp = 2;
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        pull_ask_t a_whole = {0, NULL, 1, bf16}, a_parts = {4, cuts, 1, bf16};
        memset(whole, 0xff, n * sizeof *whole);
        memset(parts, 0xff, n * sizeof *parts);
        CHECK_EQ(s_pull_ask(sock, &m, 0, 10 + 2 * (uint64_t)bf16, 0, &a_whole), 0);
        CHECK_EQ(s_recv_params(sock, 10 + 2 * (uint64_t)bf16, &a_whole, n, whole, &vw), 1);
        CHECK_EQ(s_pull_ask(sock, &m, 0, 11 + 2 * (uint64_t)bf16, 0, &a_parts), 0);
        CHECK_EQ(s_recv_params(sock, 11 + 2 * (uint64_t)bf16, &a_parts, n, parts, &vp), 5);
        CHECK_EQ(vp, vw);
        CHECK(memcmp(whole, parts, n * sizeof *whole) == 0); /* every float, bit for bit */
    }
    /* Cuts a shard refuses: one line each, and it serves on. */
    struct {
        size_t n_cuts;
        uint64_t cuts[DP_WIRE_MAX_PULL_PARTS];
        const char *says;
    } bad[] = {
        {1, {0}, "bad PULL: cut 0 at 0 is not inside this shard's floats"},
        {2, {5, n}, "bad PULL: cut 1 at"},
        {2, {7, 7}, "malformed: PULL cuts not strictly ascending"},
        {2, {9, 3}, "malformed: PULL cuts not strictly ascending"},
        {DP_WIRE_MAX_PULL_PARTS, {0}, "malformed: PULL cut in 8 places (at most 8 parts)"},
    };
    for (uint64_t k = 0; k < DP_WIRE_MAX_PULL_PARTS; k++) bad[4].cuts[k] = 1 + k;
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        pull_ask_t a = {bad[b].n_cuts, bad[b].cuts, 0, 0};
        reply_t r;
        CHECK_EQ(s_pull_ask(sock, &m, 0, 100 + b, 0, &a), 0);
        CHECK_EQ(s_recv(sock, &r, 0), DOWNPOUR__MSG_TYPE__ERROR);
        CHECK(strstr(r.text, bad[b].says) != NULL);
        if (b == 0) printf("  a shard asked for a cut at its first float answers: %s\n", r.text);
        if (!strstr(r.text, bad[b].says)) printf("  case %zu heard: %s\n", b, r.text);
    }
    /* nothing moved the model: the same version, a pull in parts still served */
    pull_ask_t a_whole = {0, NULL, 0, 0}, a_parts = {4, cuts, 0, 0};
    CHECK_EQ(s_pull_ask(sock, &m, 0, 200, 0, &a_whole), 0);
    CHECK_EQ(s_recv_params(sock, 200, &a_whole, n, whole, &vw), 1);
    CHECK_EQ(s_pull_ask(sock, &m, 0, 201, 0, &a_parts), 0);
    CHECK_EQ(s_recv_params(sock, 201, &a_parts, n, parts, &vp), 5);
    CHECK_EQ(vp, vw);
    CHECK_EQ(vw, 0);
    CHECK(memcmp(whole, parts, n * sizeof *whole) == 0);
    /* Every part read, ZeroMQ lets go of each frame (its free callback, on
     * its I/O thread, soon after the send): the loans end, and only the
     * shard's own buffers are left (live, retired, bfloat16). */
    double t0 = dp_now();
    while (dp_snap_alive() - base > DP_SHARD_RETIRED + 2 && dp_now() - t0 < 10) usleep(10 * 1000);
    CHECK(dp_snap_alive() - base <= DP_SHARD_RETIRED + 2);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
    CHECK_EQ(dp_snap_alive(), base);
    free(whole), free(parts);
}

/* Sync, R = 2 of 2: worker 0 pushed on version 0, so pulls for version 1
 * wait for worker 1's gradient. Worker 1 (the peer) sends 5000 such pulls:
 * DP_PS_HELD_PER_WORKER are held, every later one is refused naming the
 * limit. Worker 0's own pull is then still held (the shard-wide table of
 * 4096 refused it with "too many deferred pulls"), and answered at version
 * 1 once worker 1 pushes, as are worker 1's held ones. */
static void test_held_pulls_per_worker(void)
{
    srv_t s;
    srv_init(&s, DP_MODE_SYNC, 2);
    s.cfg.heartbeat_timeout = 0; /* nobody goes silent mid-case */
    CHECK_EQ(srv_start(&s), 0);
    srv_small_model(&s_small);
    size_t n = s_small.n_floats;
    float *g = dp_calloc(n, sizeof *g);
    srv_fill(g, n, 3);
    void *ctx = zmq_ctx_new();
    void *w0 = s_raw_socket(ctx, s.endpoint, 0, 0), *bad = s_raw_socket(ctx, s.endpoint, 0, 0);
    CHECK_EQ(s_hello(w0, &s_small, 0), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK_EQ(s_hello(bad, &s_small, 1), DOWNPOUR__MSG_TYPE__WELCOME);
    reply_t r;
    CHECK_EQ(s_push(w0, &s_small, 0, 2, 1, 0, g, n), 0);
    CHECK_EQ(s_recv(w0, &r, 0), DOWNPOUR__MSG_TYPE__ACK);
    CHECK_EQ(r.version, 0); /* accumulated: version 1 needs worker 1 */
    /* The flood, in lockstep: each pull is followed by a heartbeat, whose
     * answer says the pull was handled (held: no reply of its own), so no
     * reply ever waits in a queue. The first DP_PS_HELD_PER_WORKER are
     * held, every later one refused at once. */
    const int flood = 5000;
    int refused = 0, held = 0, other = 0;
    for (int i = 0; i < flood; i++) {
        if (s_pull(bad, &s_small, 1, 1000 + (uint64_t)i, 1) != 0 || s_heartbeat(bad, 1, 99) != 0)
            break;
        int answered = 0, beat = 0;
        while (!beat && s_recv(bad, &r, 0) >= 0) {
            if (r.type == DOWNPOUR__MSG_TYPE__HEARTBEAT) {
                beat = 1;
            } else if (r.type == DOWNPOUR__MSG_TYPE__ERROR && r.req == 1000 + (uint64_t)i &&
                       strstr(r.text, "too many held pulls: worker 1 has 4 pulls waiting")) {
                answered = 1;
                if (refused++ == 0) printf("  the peer heard: %s\n", r.text);
            } else {
                answered = 1;
                if (other++ == 0) printf("  pull %d of worker 1 got: %s\n", i, r.text);
            }
        }
        if (!beat) {
            CHECK(0 && "the peer's heartbeat was not answered");
            break;
        }
        held += !answered;
    }
    CHECK_EQ(held, DP_PS_HELD_PER_WORKER);
    CHECK_EQ(refused, flood - DP_PS_HELD_PER_WORKER);
    CHECK_EQ(other, 0);
    /* Worker 0's pull waits (the heartbeat behind it is answered first). */
    CHECK_EQ(s_pull(w0, &s_small, 0, 3, 1), 0);
    CHECK_EQ(s_heartbeat(w0, 0, 4), 0);
    CHECK_EQ(s_recv(w0, &r, 0), DOWNPOUR__MSG_TYPE__HEARTBEAT);
    if (r.type == DOWNPOUR__MSG_TYPE__ERROR) fprintf(stderr, "  worker 0 heard: %s\n", r.text);
    /* Worker 1's gradient completes version 1: every held pull is answered. */
    CHECK_EQ(s_push(bad, &s_small, 1, 5, 1, 0, g, n), 0);
    CHECK_EQ(s_recv(w0, &r, 0), DOWNPOUR__MSG_TYPE__PARAMS);
    CHECK_EQ(r.req, 3);
    CHECK_EQ(r.version, 1);
    int acks = 0, params = 0;
    for (int k = 0; k < 1 + DP_PS_HELD_PER_WORKER && s_recv(bad, &r, 0) >= 0; k++) {
        acks += r.type == DOWNPOUR__MSG_TYPE__ACK;
        params += r.type == DOWNPOUR__MSG_TYPE__PARAMS && r.version == 1;
    }
    CHECK_EQ(acks, 1);
    CHECK_EQ(params, DP_PS_HELD_PER_WORKER);
    zmq_close(w0);
    zmq_close(bad);
    zmq_ctx_term(ctx);
    CHECK_EQ(srv_stop(&s), 0);
    free(g);
}

/* The step rules on a shard alone: one past the highest handled, step 0
 * always, the first push after a start may skip step_slack, no wrap. */
static void test_step_check_rules(void)
{
    srv_small_model(&s_small);
    dp_shard_t s;
    dp_optim_conf_t o;
    dp_optim_conf_default(&o);
    char why[DP_ERR_LEN] = "";
    CHECK_EQ(dp_shard_init(&s, &s_small, 0, 1, 1, &o, why), 0);
    CHECK_EQ(dp_shard_step_check(&s, 0, 1ULL << 62, why, sizeof why), 0); /* untracked */
    dp_shard_track_steps(&s, 2);
    CHECK_EQ(dp_shard_step_check(&s, 0, 0, why, sizeof why), 0);
    CHECK_EQ(dp_shard_step_check(&s, 0, 1, why, sizeof why), 0);
    CHECK_EQ(dp_shard_step_check(&s, 0, 2, why, sizeof why), -1);
    CHECK(strstr(why, "implausible step 2 of worker 0: at most 1 (one past the last handled, 0)"));
    dp_shard_step_handled(&s, 0, 1); /* e.g. dropped as stale: not applied, but handled */
    CHECK_EQ(s.worker_step[0], 0);
    CHECK_EQ(dp_shard_step_check(&s, 0, 2, why, sizeof why), 0);
    dp_shard_step_done(&s, 0, 2); /* applied: handled too */
    CHECK_EQ(s.worker_seen[0], 2);
    CHECK_EQ(dp_shard_step_check(&s, 0, 1, why, sizeof why), 0); /* a repeat */
    CHECK_EQ(dp_shard_step_check(&s, 0, 4, why, sizeof why), -1);
    CHECK_EQ(dp_shard_step_check(&s, 0, UINT64_MAX, why, sizeof why), -1);
    /* after a restore of step 10 with --checkpoint-every 5: the first push
     * may be up to 16; after it, one past it */
    s.worker_seen[1] = 10;
    s.step_slack = 5;
    CHECK_EQ(dp_shard_step_check(&s, 1, 17, why, sizeof why), -1);
    CHECK(strstr(why, "at most 16 after a restart (last handled 10, + 1 + --checkpoint-every 5)"));
    CHECK_EQ(dp_shard_step_check(&s, 1, 1ULL << 62, why, sizeof why), -1);
    CHECK_EQ(dp_shard_step_check(&s, 1, 16, why, sizeof why), 0);
    dp_shard_step_handled(&s, 1, 14);
    CHECK_EQ(dp_shard_step_check(&s, 1, 16, why, sizeof why), -1);
    CHECK_EQ(dp_shard_step_check(&s, 1, 15, why, sizeof why), 0);
    s.worker_seen[1] = UINT64_MAX - 1; /* no wrap at the top */
    CHECK_EQ(dp_shard_step_check(&s, 1, UINT64_MAX, why, sizeof why), 0);
    dp_shard_fini(&s);
}

/* meta[key] of a checkpoint into out ("" when absent). */
static void s_meta(const char *path, const char *key, char *out, size_t n)
{
    char err[DP_ERR_LEN] = "";
    char *v = dp_safetensors_read_meta(path, key, err);
    snprintf(out, n, "%s", v ? v : "");
    free(v);
}

/* The connection holding worker id 1 (a buggy or hostile worker) claims
 * step 2^62: refused with the reason, counted, nothing applied, the mark
 * unchanged; its real next step is applied (not a "repeat") and the
 * checkpoint holds the real steps. Restarted with the same flags
 * (--checkpoint-every 4), the shard tells worker 1 to resume after them and
 * lets its first push skip at most 4 steps, then one at a time again. */
static void test_step_bounded(void)
{
    srv_small_model(&s_small);
    char dir[] = "/tmp/dp_bounds_XXXXXX", path[512], v[256], err[DP_ERR_LEN] = "";
    CHECK(mkdtemp(dir) != NULL);
    dp_shard_checkpoint_path(path, sizeof path, dir, 0, 1);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    snprintf(s.cfg.checkpoint_dir, sizeof s.cfg.checkpoint_dir, "%s", dir);
    s.cfg.checkpoint_every = 4;
    CHECK_EQ(srv_start(&s), 0);
    size_t n = s_small.n_floats;
    float *g = dp_calloc(n, sizeof *g), *p = dp_malloc(n * sizeof *p);
    srv_fill(g, n, 5);
    void *ctx = zmq_ctx_new();
    void *bad = s_raw_socket(ctx, s.endpoint, 0, 0);
    CHECK_EQ(s_hello(bad, &s_small, 1), DOWNPOUR__MSG_TYPE__WELCOME);
    reply_t r;
    CHECK_EQ(s_push(bad, &s_small, 1, 2, 1, 0, g, n), 0);
    CHECK_EQ(s_recv(bad, &r, 0), DOWNPOUR__MSG_TYPE__ACK);
    CHECK_EQ(r.version, 1);
    CHECK_EQ(s_push(bad, &s_small, 1, 3, 1ULL << 62, 1, g, n), 0);
    CHECK_EQ(s_recv(bad, &r, 0), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "implausible step 4611686018427387904 of worker 1: at most 2 (one past "
                         "the last handled, 1)"));
    printf("  the peer heard: %s\n", r.text);
    CHECK_EQ(s_push(bad, &s_small, 1, 4, 3, 1, g, n), 0); /* a gap of one is refused too */
    CHECK_EQ(s_recv(bad, &r, 0), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK_EQ(s_push(bad, &s_small, 1, 5, 2, 1, g, n), 0);
    CHECK_EQ(s_recv(bad, &r, 0), DOWNPOUR__MSG_TYPE__ACK);
    CHECK_EQ(r.version, 2); /* applied; the refused ones changed nothing */
    CHECK_STR(r.text, "");  /* not a "repeat" */
    zmq_close(bad);
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, s.endpoint, &s_small, 0, PS_OPTS(TMO), NULL, err), 0);
    if (c) { /* the chief asks (only it may ask STATS) */
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.applied, 2);
        CHECK_EQ(st.rejected, 2);
        CHECK_EQ(st.version, 2);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0); /* the exit checkpoint */
    s_meta(path, "worker_steps", v, sizeof v);
    CHECK_STR(v, "0,2");
    s_meta(path, "worker_steps_seen", v, sizeof v);
    CHECK_STR(v, "0,2");
    /* Restarted with the same flags: worker 1 resumes after step 2, and its
     * first push may be up to 2 + 1 + 4; not 2^62, not 8. */
    srv_t s2;
    srv_init(&s2, DP_MODE_ASYNC, 2);
    snprintf(s2.cfg.checkpoint_dir, sizeof s2.cfg.checkpoint_dir, "%s", dir);
    s2.cfg.checkpoint_every = 4;
    CHECK_EQ(srv_start(&s2), 0);
    CHECK_EQ(dp_ps_client_new(&c, s2.endpoint, &s_small, 1, PS_OPTS(TMO), NULL, err), 0);
    if (c) {
        dp_push_result_t pr;
        CHECK_EQ(dp_ps_client_resume_step(c), 2);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(1ULL << 62, g, 1, 8), &pr, err), 0);
        CHECK_EQ(pr.rejected, 1);
        CHECK(strstr(pr.reason, "implausible step 4611686018427387904 of worker 1: at most 7 after a "
                             "restart (last handled 2, + 1 + --checkpoint-every 4)"));
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(8, g, 1, 8), &pr, err), 0);
        CHECK_EQ(pr.rejected, 1);
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(7, g, 1, 8), &pr, err), 0);
        CHECK_EQ(pr.applied, 1);
        CHECK_EQ(pr.version, 3);
        CHECK_STR(pr.reason, "");
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(9, g, 1, 8), &pr, err), 0); /* the window is closed */
        CHECK_EQ(pr.rejected, 1);
        CHECK(strstr(pr.reason, "at most 8 (one past the last handled, 7)"));
        CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(8, g, 1, 8), &pr, err), 0);
        CHECK_EQ(pr.applied, 1);
        CHECK_EQ(pr.version, 4);
    }
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s2), 0);
    s_meta(path, "worker_steps", v, sizeof v);
    CHECK_STR(v, "0,8");
    zmq_ctx_term(ctx);
    free(g), free(p);
    unlink(path);
    rmdir(dir);
}

DP_TESTS(T(test_step_check_rules), T(test_step_bounded), T(test_held_pulls_per_worker),
         T(test_unread_params_bounded), T(test_pull_in_parts))
