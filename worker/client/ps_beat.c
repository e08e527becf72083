/* ps_beat: the worker's heartbeat thread (see ps_beat.h). The sockets are
 * made and used by the thread alone; the main thread only sets `stop`. */
#include "worker/client/ps_beat.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/util.h"
#include "proto/wire_zmq.h"
#include "proto/zsock.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_socket.h"

struct dp_ps_beat {
    void *ctx;             /* ZeroMQ context of the thread's sockets */
    int n;                 /* shards */
    char (*endpoints)[DP_ZSOCK_ENDPOINT_LEN]; /* [n] */
    int worker_id;
    uint64_t session;      /* the client's (dp_ps_beat_new) */
    int curve;             /* CURVE: our key pair and each shard's key */
    dp_curve_key_t secret, pub, *server; /* server: [n] */
    atomic_int stop;       /* set by dp_ps_beat_destroy */
    pthread_t thread;
    int started;
};

/* One HEARTBEAT to sock; then what came back, read and dropped. */
static void s_beat(dp_ps_beat_t *b, void *sock, uint64_t req)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, req, b->worker_id, 0);
    env.session = b->session; /* what ties these beats to our HELLO's connection */
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &env, NULL, 0, err) != 0) dp_log_debug("heartbeat: %s", err);
    dp_wire_rx_t rx;
    while (dp_wire_recv(sock, &rx, ZMQ_DONTWAIT, err) == 0) dp_wire_rx_fini(&rx);
}

static void *s_run(void *arg)
{
    dp_ps_beat_t *b = arg;
    void **socks = dp_calloc((size_t)b->n, sizeof *socks);
    int n = 0;
    char err[DP_ERR_LEN];
    for (int i = 0; i < b->n; i++) {
        /* a short send timeout: a beat never blocks the next one for long */
        dp_ps_sock_keys_t keys = {&b->secret, &b->pub, b->curve ? &b->server[i] : NULL};
        if (dp_ps_client_socket(b->ctx, b->endpoints[i], 0.1, b->curve ? &keys : NULL, NULL, &socks[n],
                                err) == 0)
            n++;
        else
            dp_log_warn("heartbeats: %s", err);
    }
    uint64_t req = 0;
    double next = 0;
    while (!atomic_load(&b->stop)) {
        double now = dp_now();
        if (now >= next) {
            req++;
            for (int i = 0; i < n; i++) s_beat(b, socks[i], req);
            next = now + DP_PS_BEAT_EVERY_S;
        }
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    for (int i = 0; i < n; i++) zmq_close(socks[i]);
    free(socks);
    return NULL;
}

int dp_ps_beat_new(dp_ps_beat_t **out, const char *endpoints, int worker_id, uint64_t session,
                   const dp_ps_curve_t *curve, char *err)
{
    *out = NULL;
    dp_ps_beat_t *b = dp_calloc(1, sizeof *b);
    b->worker_id = worker_id;
    b->session = session;
    atomic_init(&b->stop, 0);
    b->endpoints = dp_malloc(DP_ZSOCK_MAX_SHARDS * sizeof *b->endpoints);
    char e2[DP_ERR_LEN];
    /* Read here, so that a bad list or key file is an error of
     * dp_ps_beat_new, not of the thread. */
    if ((b->n = dp_ps_endpoints_parse(endpoints, b->endpoints, e2)) < 0) {
        b->n = 0;
        dp_err(err, "heartbeats: %s", e2);
        dp_ps_beat_destroy(&b);
        return -1;
    }
    if (curve && curve->secret) {
        b->server = dp_malloc((size_t)b->n * sizeof *b->server);
        if (dp_ps_curve_load(curve, b->n, &b->secret, &b->pub, b->server, err) != 0) {
            dp_ps_beat_destroy(&b);
            return -1;
        }
        b->curve = 1;
    }
    if (!(b->ctx = zmq_ctx_new())) {
        dp_err(err, "heartbeats: ZeroMQ context: %s", zmq_strerror(errno));
        dp_ps_beat_destroy(&b);
        return -1;
    }
    if (pthread_create(&b->thread, NULL, s_run, b) != 0) {
        dp_err(err, "cannot start the heartbeat thread");
        dp_ps_beat_destroy(&b);
        return -1;
    }
    b->started = 1;
    *out = b;
    return 0;
}

void dp_ps_beat_destroy(dp_ps_beat_t **b_p)
{
    if (!b_p || !*b_p) return;
    dp_ps_beat_t *b = *b_p;
    atomic_store(&b->stop, 1);
    if (b->started) pthread_join(b->thread, NULL);
    dp_zsock_ctx_term(&b->ctx, "heartbeats");
    free(b->endpoints);
    free(b->server);
    free(b);
    *b_p = NULL;
}
