/* ps_socket: what a socket to a shard is made from, for the client
 * (ps_exchange.c) and the heartbeat thread (ps_beat.c): the endpoint list,
 * the CURVE keys, the DEALER itself, and a worker's session (drawn here,
 * dp_ps_session_new in ps_client.h). */
#ifndef DP_PS_SOCKET_H
#define DP_PS_SOCKET_H

#include <stdint.h>

#include "proto/curve.h"
#include "proto/zsock.h" /* DP_ZSOCK_ENDPOINT_LEN */
#include "worker/client/ps_client.h" /* dp_ps_curve_t */

/* The CURVE keys of one socket to a shard: ours and that shard's. */
typedef struct {
    const dp_curve_key_t *secret, *pub, *server;
} dp_ps_sock_keys_t;

/* A DEALER connected to endpoint with the client's options (linger 0, send
 * timeout, ZMTP heartbeats, CURVE when keys is not NULL); every socket to a
 * shard is made here, the heartbeat thread's too. mon (NULL: none): a PAIR
 * into *mon that receives the socket's connect and handshake events
 * (zmq_socket_monitor), connected before the socket dials so that none is
 * missed; the caller closes it after the socket. */
int dp_ps_client_socket(void *ctx, const char *endpoint, double timeout_s,
                        const dp_ps_sock_keys_t *keys, void **mon, void **out, char *err);

/* The endpoint list into endpoints[DP_ZSOCK_MAX_SHARDS], as the client
 * reads it (the heartbeat thread too): returns how many, or -1 with
 * "bad ps endpoints '...': entry 2 is empty (...)". */
int dp_ps_endpoints_parse(const char *list, char (*endpoints)[DP_ZSOCK_ENDPOINT_LEN], char *err);

/* The CURVE keys for n_shards shards, read from curve's files: our pair and
 * each shard's server key (curve->servers: one file for every shard, or one
 * per shard in endpoint order) into server[0..n_shards). */
int dp_ps_curve_load(const dp_ps_curve_t *curve, int n_shards, dp_curve_key_t *secret,
                     dp_curve_key_t *pub, dp_curve_key_t *server, char *err);

#endif
