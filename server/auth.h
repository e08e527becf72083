/* auth: who may speak for a worker id at one shard, and who is the chief —
 * the rules, without sockets (server/ps.c feeds them; tests/unit/test_auth.c
 * drives them directly).
 *
 * Binding. A HELLO binds its worker id to the connection it came on (the
 * ROUTER routing id) and, when the server runs CURVE, to the client's public
 * key (the message's "User-Id"). Afterwards:
 *  - a request that names a worker id in range must come on the connection
 *    bound to that id; otherwise it is refused (ERR_UNKNOWN_WORKER: "say
 *    HELLO on this connection") and changes nothing;
 *  - a HELLO for an id bound to another connection is refused with
 *    ERR_ID_TAKEN while that connection is LIVE; a dead one (the worker was
 *    killed and restarted) is replaced. "Live" is asked of the caller's
 *    probe (server/ps.c: the ROUTER still has a peer with that routing id,
 *    i.e. its TCP connection has not closed; a crashed host is noticed only
 *    when the connection drops, by TCP or ZMTP heartbeats). A HELLO again on
 *    the same connection (a client re-saying HELLO) is always accepted;
 *  - under CURVE an id also belongs to the key that first claimed it, for
 *    the life of this server process: another key is refused even once the
 *    first connection is gone.
 *
 * The chief (worker 0). STATS and SHUTDOWN are obeyed only from the chief:
 * under CURVE from its key; without CURVE when they carry the run token, a
 * random number drawn at start and handed to the worker that HELLOs as 0
 * (Welcome.run_token) — nobody else is told it. Everything else gets
 * ERR_NOT_CHIEF. Each refusal is counted (refused). */
#ifndef DP_AUTH_H
#define DP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "proto/curve.h"
#include "proto/wire.h"

#define DP_AUTH_CONN_MAX 256 /* bytes of a ROUTER routing id (ZeroMQ allows 255) */

/* Who sent a message. */
typedef struct {
    const void *conn;  /* routing id of its connection */
    size_t conn_len;
    const char *key;   /* CURVE: its public key (Z85); NULL without CURVE */
} dp_auth_peer_t;

/* Is the connection with this routing id still open? 1 yes, 0 no. */
typedef int (*dp_auth_live_fn)(void *arg, const void *conn, size_t conn_len);

typedef struct {
    unsigned char conn[DP_AUTH_CONN_MAX]; /* routing id of the bound connection */
    size_t conn_len;                      /* 0: never bound */
    char key[DP_CURVE_KEY_LEN + 1];       /* CURVE: the key that owns the id, "" otherwise */
} dp_auth_slot_t;

typedef struct {
    int n;             /* worker ids [0, n) */
    dp_auth_slot_t *w; /* [n] */
    int curve;         /* the server runs CURVE: keys are checked */
    uint64_t run_token;/* random, non-zero, per start; the chief's only */
    uint64_t refused;  /* requests refused by these rules */
} dp_auth_t;

/* n worker ids; draws the run token (from the kernel's random source). */
int dp_auth_init(dp_auth_t *a, int n, int curve, char *err);
void dp_auth_fini(dp_auth_t *a); /* safe on a zeroed or finished a */

/* HELLO of worker wid (in range) from p. 0: bound to p; -1: refused, msg
 * says why (ERR_ID_TAKEN). live(arg, ...) is asked about the connection the
 * id is bound to, only when that is another one. */
int dp_auth_claim(dp_auth_t *a, int wid, const dp_auth_peer_t *p, dp_auth_live_fn live,
                  void *arg, char *msg, size_t msg_len);

/* Any request but HELLO: type (DOWNPOUR__MSG_TYPE__*), its worker id (any
 * value: out of range is left to the caller, except for the chief's
 * requests) and run token. 0: allowed; -1: refused, *code is the
 * Error.code (DOWNPOUR__ERROR_CODE__*) and msg says why. */
int dp_auth_check(dp_auth_t *a, int type, int wid, uint64_t token, const dp_auth_peer_t *p,
                  int *code, char *msg, size_t msg_len);

/* The run token for the WELCOME of worker wid: the token for 0, else 0. */
uint64_t dp_auth_token_for(const dp_auth_t *a, int wid);

/* The probe server/ps.c uses for "live": does the ROUTER sock still have a
 * peer with this routing id? Sends that peer env (a harmless HEARTBEAT the
 * client ignores) when it does; never blocks. */
int dp_auth_router_has_peer(void *sock, const void *conn, size_t conn_len,
                            const Downpour__Envelope *env);

#endif
