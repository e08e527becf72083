/* ps_socket: the sockets to the shards and what they are made from — the
 * endpoint list, the CURVE keys, a worker's session — shared by the
 * client (ps_exchange.c) and the heartbeat thread (ps_beat.c); see
 * ps_socket.h. */
#include "worker/client/ps_socket.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "common/util.h"
#include "proto/zsock.h"

/* sock's connect and handshake events into a new PAIR, *mon. */
static int s_monitor(void *ctx, void *sock, void **mon)
{
    static atomic_uint made;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://dp-ps-client-events-%u", atomic_fetch_add(&made, 1));
    int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    *mon = NULL;
    if (zmq_socket_monitor(sock, ep, events) != 0) return -1;
    void *pair = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0;
    if (!pair || zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_connect(pair, ep) != 0) {
        if (pair) zmq_close(pair);
        zmq_socket_monitor(sock, NULL, 0);
        return -1;
    }
    *mon = pair;
    return 0;
}

int dp_ps_client_socket(void *ctx, const char *endpoint, double timeout_s,
                        const dp_ps_sock_keys_t *keys, void **mon, void **out, char *err)
{
    void *sock = zmq_socket(ctx, ZMQ_DEALER);
    *out = NULL;
    if (!sock) return dp_err(err, "%s: cannot create socket: %s", endpoint, zmq_strerror(errno));
    int zero = 0;
    int sndtimeo = (int)(timeout_s * 1000);
    char e2[DP_ERR_LEN];
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo) != 0) {
        dp_err(err, "%s: cannot set socket options: %s", endpoint, zmq_strerror(errno));
        zmq_close(sock);
        return -1;
    }
    /* TTL too: the server drops a connection of ours silent for as long */
    if (dp_zsock_heartbeats(sock, 1, e2) != 0) {
        dp_err(err, "%s: %s", endpoint, e2);
        zmq_close(sock);
        return -1;
    }
    if (keys && dp_curve_connect_as(sock, keys->server, keys->secret, keys->pub, err) != 0) {
        zmq_close(sock);
        return -1;
    }
    if (mon && s_monitor(ctx, sock, mon) != 0) {
        dp_err(err, "%s: cannot watch the socket's events: %s", endpoint, zmq_strerror(errno));
        zmq_close(sock);
        return -1;
    }
    if (zmq_connect(sock, endpoint) != 0) {
        dp_err(err, "%s: bad ps endpoint: %s (expected tcp://HOST:PORT)", endpoint, zmq_strerror(errno));
        zmq_close(sock);
        if (mon && *mon) zmq_close(*mon);
        if (mon) *mon = NULL;
        return -1;
    }
    *out = sock;
    return 0;
}

uint64_t dp_ps_session_new(void)
{
    /* Without the kernel's random source (it does not fail on Linux past
     * early boot) the clock and a counter still make one worker's session
     * unlike another's; it is a proof of "the same worker", not a key. */
    static atomic_uint_fast64_t drawn;
    uint64_t s = 0;
    while (s == 0)
        if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s && errno != EINTR)
            s = (uint64_t)(dp_now() * 1e9) ^ ((uint64_t)getpid() << 32) ^
                (atomic_fetch_add(&drawn, 1) * 0x9e3779b97f4a7c15ULL);
    return s;
}

int dp_ps_endpoints_parse(const char *list, char (*endpoints)[DP_ZSOCK_ENDPOINT_LEN], char *err)
{
    char e2[DP_ERR_LEN];
    int n = dp_zsock_split(list, endpoints[0], DP_ZSOCK_ENDPOINT_LEN, DP_ZSOCK_MAX_SHARDS, e2);
    if (n < 0)
        return dp_err(err, "bad ps endpoints '%s': %s (expected tcp://h:p[,tcp://h2:p2...])", list,
                      e2);
    if (n == 0) return dp_err(err, "no ps endpoints (give tcp://HOST:PORT)");
    return n;
}

int dp_ps_curve_load(const dp_ps_curve_t *curve, int n_shards, dp_curve_key_t *secret,
                     dp_curve_key_t *pub, dp_curve_key_t *server, char *err)
{
    if (dp_curve_read_secret(curve->secret, secret, pub, err) != 0) return -1;
    char (*paths)[1024] = dp_malloc((size_t)DP_ZSOCK_MAX_SHARDS * sizeof *paths);
    char e2[DP_ERR_LEN];
    int n = dp_zsock_split(curve->servers ? curve->servers : "", paths[0], sizeof paths[0],
                           DP_ZSOCK_MAX_SHARDS, e2);
    int rc = 0;
    if (n < 0)
        rc = dp_err(err, "--curve-server '%s': %s (expected one public key file, or one per "
                         "server (%d) in --ps order)",
                    curve->servers, e2, n_shards);
    else if (n != 1 && n != n_shards)
        rc = dp_err(err, "--curve-server names %d keys but there are %d servers (give one key for "
                         "all, or one per server in --ps order)",
                    n, n_shards);
    /* one file stands for every shard when it is the only one */
    for (int i = 0; rc == 0 && i < n_shards; i++)
        if (dp_curve_read_public(paths[n == 1 ? 0 : i], &server[i], err) != 0) rc = -1;
    free(paths);
    return rc;
}
