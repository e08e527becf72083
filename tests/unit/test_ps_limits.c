/* test_ps_limits: the limits of a shard's socket that docs/SECURITY.md's "Limits"
 * promises, from a raw peer (a DEALER sending bytes, no codec needed):
 *  - a frame larger than the shard's largest message (ZMQ_MAXMSGSIZE) makes
 *    ZeroMQ drop the peer: its connection is closed (the peer's socket
 *    monitor sees DISCONNECTED) and nothing answers; a frame of exactly that
 *    size is read and answered (an ERROR: it is no envelope); the shard
 *    serves a well-formed client after both;
 *  - ZMQ_RCVHWM (8): while the shard's loop is held (its ready hook waits),
 *    one peer sending as fast as ZeroMQ lets it hands the shard at most 8
 *    messages plus what the kernel's socket buffers and both ends' pipes
 *    hold (16 fewer than it tries); released, the shard answers.
 * Both are driven, not timed: the drop is an event awaited (bounded), and
 * the flood stops when the peer's sends have made no progress for 1 s
 * (with the cap in place they can never progress past the bound). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/wire_zmq.h"
#include "server/loop/ps.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0 /* client timeout in these tests */

/* The shard's largest message, as server/loop/ps.c computes it: its range as
 * floats plus an envelope and an identity. */
static size_t s_max_msg(const dp_model_t *m) { return m->n_floats * sizeof(float) + DP_WIRE_MAX_ENVELOPE + DP_WIRE_MAX_IDENTITY; }

/* A raw DEALER on endpoint with a monitor of its connects and disconnects
 * (*mon, a PAIR); SNDHWM 1 so that it queues nothing of its own. */
static void *s_peer(void *ctx, const char *endpoint, void **mon, int tag)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, one = 1, tmo = 5000;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &one, sizeof one);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://dp-limits-mon-%d", tag);
    zmq_socket_monitor(sock, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    *mon = zmq_socket(ctx, ZMQ_PAIR);
    zmq_setsockopt(*mon, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(*mon, addr);
    zmq_connect(sock, endpoint);
    return sock;
}

/* The next monitor event within limit_s seconds, or -1. */
static int s_event(void *mon, double limit_s)
{
    zmq_pollitem_t it = {mon, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, (long)(limit_s * 1000)) <= 0) return -1;
    zmq_msg_t m;
    zmq_msg_init(&m);
    int ev = -1;
    if (zmq_msg_recv(&m, mon, 0) >= 6) {
        uint16_t e;
        memcpy(&e, zmq_msg_data(&m), sizeof e);
        ev = e;
    }
    while (zmq_msg_more(&m)) zmq_msg_recv(&m, mon, 0); /* the endpoint frame */
    zmq_msg_close(&m);
    return ev;
}

/* Wait (bounded) for event want, skipping others. */
static int s_await(void *mon, int want, double limit_s)
{
    double t0 = dp_now();
    for (;;) {
        double left = limit_s - (dp_now() - t0);
        if (left <= 0) return 0;
        int ev = s_event(mon, left);
        if (ev == want) return 1;
        if (ev < 0) return 0;
    }
}

/* One frame of len bytes from buf, without a copy (buf outlives it). */
static int s_send_frame(void *sock, const void *buf, size_t len, int flags)
{
    zmq_msg_t m;
    zmq_msg_init_data(&m, (void *)buf, len, NULL, NULL);
    int rc = zmq_msg_send(&m, sock, flags);
    if (rc < 0) zmq_msg_close(&m);
    return rc < 0 ? -1 : 0;
}

/* A reply within the socket's RCVTIMEO: its envelope's type, or -1. */
static int s_reply_type(void *sock)
{
    dp_wire_rx_t rx;
    char err[DP_ERR_LEN];
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return -1;
    Downpour__Envelope *env = rx.n_parts > 0 ? dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err) : NULL;
    int type = env ? (int)env->type : -1;
    dp_wire_destroy(&env);
    dp_wire_rx_fini(&rx);
    return type;
}

/* A well-formed client joins and pulls. */
static int s_serves(const char *endpoint, const dp_model_t *m, int worker)
{
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    float *p = dp_malloc(m->n_floats * sizeof(float));
    int ok = dp_ps_client_new(&c, endpoint, m, worker, PS_OPTS(TMO), NULL, err) == 0 && dp_ps_client_pull(c, p, err) == 0;
    if (!ok) fprintf(stderr, "  client: %s\n", err);
    dp_ps_client_destroy(&c);
    free(p);
    return ok;
}

/* ---- cases ------------------------------------------------------------- */

static void test_oversized_frame_drops_peer(void)
{
    dp_model_t m;
    srv_small_model(&m);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    CHECK_EQ(srv_start(&s), 0);
    size_t max = s_max_msg(&m);
    uint8_t *buf = dp_calloc(max + 1, 1);
    void *ctx = zmq_ctx_new(), *mon_a, *mon_b;
    /* Exactly the limit: read, and answered as the malformed bytes they are. */
    void *a = s_peer(ctx, s.endpoint, &mon_a, 1);
    CHECK(s_await(mon_a, ZMQ_EVENT_CONNECTED, TMO));
    CHECK_EQ(s_send_frame(a, buf, max, 0), 0);
    CHECK_EQ(s_reply_type(a), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK_EQ(s_event(mon_a, 0.2), -1); /* still connected */
    /* One byte more: ZeroMQ closes the connection, nobody answers. */
    void *b = s_peer(ctx, s.endpoint, &mon_b, 2);
    CHECK(s_await(mon_b, ZMQ_EVENT_CONNECTED, TMO));
    CHECK_EQ(s_send_frame(b, buf, max + 1, 0), 0);
    CHECK(s_await(mon_b, ZMQ_EVENT_DISCONNECTED, TMO));
    int rto = 200;
    zmq_setsockopt(b, ZMQ_RCVTIMEO, &rto, sizeof rto);
    CHECK_EQ(s_reply_type(b), -1);
    CHECK(s_serves(s.endpoint, &m, 0));
    zmq_close(a), zmq_close(b), zmq_close(mon_a), zmq_close(mon_b);
    zmq_ctx_term(ctx);
    free(buf);
    CHECK_EQ(srv_stop(&s), 0);
}

/* The ready hook holds the server's loop until released (bounded). */
static pthread_mutex_t s_hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s_hold_cv = PTHREAD_COND_INITIALIZER;
static int s_held = 1;

static void s_hold_on_ready(const char *ep, void *arg)
{
    srv_on_ready(ep, arg);
    double t0 = dp_now();
    pthread_mutex_lock(&s_hold_mu);
    while (s_held && dp_now() - t0 < 60) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s_hold_cv, &s_hold_mu, &ts);
    }
    pthread_mutex_unlock(&s_hold_mu);
}

static void s_release(void)
{
    pthread_mutex_lock(&s_hold_mu);
    s_held = 0;
    pthread_cond_broadcast(&s_hold_cv);
    pthread_mutex_unlock(&s_hold_mu);
}

/* The third field of a /proc/sys/net/ipv4/tcp_[rw]mem file: the most a
 * socket's buffer grows to (6 MB if unreadable, Linux's usual figure). */
static long s_tcp_mem_max(const char *path)
{
    long lo, def, hi;
    FILE *f = fopen(path, "r");
    int ok = f && fscanf(f, "%ld %ld %ld", &lo, &def, &hi) == 3;
    if (f) fclose(f);
    return ok ? hi : 6L << 20;
}

static void test_rcvhwm_caps_one_peer(void)
{
    /* Frames of 4 MB (the shard takes 5.3 MB): the kernel's buffers then
     * hold only a few of them. */
    dp_model_t m;
    char err[DP_ERR_LEN];
    const char *spec = "fc:16384 softmax";
    CHECK_EQ(dp_model_parse(&m, spec, 1, 8, 8, err), 0);
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 2);
    snprintf(s.cfg.model_spec, sizeof s.cfg.model_spec, "%s", spec);
    s.cfg.on_ready = s_hold_on_ready;
    CHECK_EQ(srv_start(&s), 0);
    const size_t len = 4u << 20;
    CHECK(len <= s_max_msg(&m));
    uint8_t *buf = dp_calloc(len, 1);
    void *ctx = zmq_ctx_new(), *mon;
    void *peer = s_peer(ctx, s.endpoint, &mon, 3);
    CHECK(s_await(mon, ZMQ_EVENT_CONNECTED, TMO));
    /* The cap, its pipe's message in the server's decoder, the kernel's two
     * buffers, the peer's SNDHWM 1 and the message its encoder holds. */
    long kernel = s_tcp_mem_max("/proc/sys/net/ipv4/tcp_rmem") + s_tcp_mem_max("/proc/sys/net/ipv4/tcp_wmem");
    int bound = 8 + 1 + (int)((kernel + (long)len - 1) / (long)len) + 1 + 1 + 2;
    /* Send until the sends make no progress for 1 s, or 16 past the bound. */
    const int tries = bound + 16;
    int sent = 0;
    double last = dp_now();
    while (sent < tries && dp_now() - last < 1.0) {
        if (s_send_frame(peer, buf, len, ZMQ_DONTWAIT) == 0) {
            sent++;
            last = dp_now();
        } else if (errno == EAGAIN) {
            usleep(5000);
        } else {
            break;
        }
    }
    fprintf(stderr, "  one peer handed the held shard %d of %d messages of %zu bytes (bound %d)\n", sent, tries,
            len, bound);
    CHECK(sent >= 8);
    CHECK(sent <= bound);
    s_release();
    /* Released, the shard reads them (each an ERROR back) and serves. */
    CHECK_EQ(s_reply_type(peer), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(s_serves(s.endpoint, &m, 0));
    zmq_close(peer), zmq_close(mon);
    zmq_ctx_term(ctx);
    free(buf);
    CHECK_EQ(srv_stop(&s), 0);
}

DP_TESTS(T(test_oversized_frame_drops_peer), T(test_rcvhwm_caps_one_peer))
