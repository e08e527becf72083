/* auth: who may speak for a worker id at one shard, and who is the chief —
 * the rules, without sockets (server/loop/ps.c feeds them; tests/unit/test_auth.c
 * drives them directly).
 *
 * Binding. A HELLO binds its worker id to the connection it came on (the
 * ROUTER routing id) and, when the server runs CURVE, to the client's public
 * key (the message's "User-Id"). Afterwards:
 *  - a request that names a worker id in range must come on the connection
 *    bound to that id; otherwise it is refused (ERR_UNKNOWN_WORKER: "say
 *    HELLO on this connection") and changes nothing;
 *  - a HELLO for an id bound to another connection is refused with
 *    ERR_ID_TAKEN while that connection is LIVE, unless it carries the
 *    session (below) of the HELLO that bound it: that is the same worker's
 *    client on a new connection (after an interrupted or timed-out request
 *    it resets its socket), and the id moves to the new connection; a dead
 *    one (the worker was killed and restarted) is replaced. "Live" is asked of the caller's
 *    probe (server/loop/ps.c: the ROUTER still has a peer with that routing id,
 *    i.e. its TCP connection has not closed; a crashed host is noticed only
 *    when the connection drops, by TCP or ZMTP heartbeats). A HELLO again on
 *    the same connection (a client re-saying HELLO) is always accepted;
 *  - under CURVE an id belongs to a key (below): another key is refused,
 *    even once the first connection is gone.
 *
 * Keys (CURVE). The operator names the task of each key by the name of its
 * file in --curve-allow, as `downpour local --secure`, the Kubernetes
 * Secret and the systemd drop-ins do: `chief-0.pub` is worker 0,
 * `worker-I.pub` is worker I (I + 1 when the list has a chief-0.pub, as
 * TF_CONFIG folds a chief in: common/cluster.h). Such a key owns its id
 * from the start (dp_auth_name_keys), whoever connects first, in every
 * server process given that list (so after a restart too), and may speak
 * as no other id. A key under any other name may take only an id that no
 * named key owns, never 0, and then owns it for the life of this server
 * process (first come). The list must name the chief: otherwise any
 * admitted key could make itself the chief (STATS, SHUTDOWN), so it is
 * refused at start.
 *
 * Heartbeats. A HEARTBEAT may come on a connection of its own (the
 * worker's heartbeat thread, worker/client/ps_beat.h) but counts for its id only
 * from whoever holds that id: under CURVE from a key that may be that id;
 * without CURVE on the bound connection, or carrying the session
 * (Envelope.session, random per worker: its client and heartbeat thread) of the HELLO that bound
 * it. An id nobody has bound yet (a worker starting) takes the heartbeats
 * of anyone who could say HELLO as it. Anything else is refused
 * (ERR_UNKNOWN_WORKER), so a dead worker's id cannot be kept alive by
 * another peer's beats.
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
    uint64_t session;  /* the message's Envelope.session (0: none) */
} dp_auth_peer_t;

/* Is the connection with this routing id still open? 1 yes, 0 no. */
typedef int (*dp_auth_live_fn)(void *arg, const void *conn, size_t conn_len);

typedef struct {
    unsigned char conn[DP_AUTH_CONN_MAX]; /* routing id of the bound connection */
    size_t conn_len;                      /* 0: never bound */
    uint64_t session;                     /* Envelope.session of the HELLO that bound it */
    char key[DP_CURVE_KEY_LEN + 1];       /* CURVE: the key that owns the id, "" otherwise */
    int named;                            /* key is the allow list's for this id (fixed) */
} dp_auth_slot_t;

/* An allowed key named after its task (dp_auth_name_keys). */
typedef struct {
    char key[DP_CURVE_KEY_LEN + 1];
    char file[DP_CURVE_NAME_LEN];         /* "worker-1.pub" */
    int id;                               /* the worker id it is; -1: a task beyond --workers */
} dp_auth_named_t;

/* One entry of the allow list, as server/loop/ps.c reads it from the gate. */
typedef struct {
    const char *key;   /* Z85 */
    const char *file;  /* its file's name, without the directory */
} dp_auth_key_t;

typedef struct {
    int n;             /* worker ids [0, n) */
    dp_auth_slot_t *w; /* [n] */
    int curve;         /* the server runs CURVE: keys are checked */
    dp_auth_named_t *named; /* CURVE: the keys named after a task */
    int n_named;
    uint64_t run_token;/* random, non-zero, per start; the chief's only */
    uint64_t refused;  /* requests refused by these rules */
} dp_auth_t;

/* n worker ids; draws the run token (from the kernel's random source). */
int dp_auth_init(dp_auth_t *a, int n, int curve, char *err);
void dp_auth_fini(dp_auth_t *a); /* safe on a zeroed or finished a */

/* CURVE: the allow list (n keys and their files' names). Each key named
 * after a task (chief-0.pub, worker-I.pub) gets that task's id for good;
 * a name beyond --workers is logged and gives no id at all. -1 with err:
 * two keys named for one id, one key named for two, a chief-N.pub with N >
 * 0, or no key named for the chief (worker 0). */
int dp_auth_name_keys(dp_auth_t *a, const dp_auth_key_t *keys, int n, char *err);

/* SIGHUP: the allow list's keys (n) anew, checked as dp_auth_name_keys
 * checks them (-1 with err: a changes nothing). Each id bound to a key
 * that is still listed (and, if its id is named now, is the key named)
 * stays bound; any other bound id is dropped (dropped[i] = 1, the id free
 * again) and its key can claim nothing. The run token stays. */
int dp_auth_rekey(dp_auth_t *a, const dp_auth_key_t *keys, int n, unsigned char *dropped,
                  char *err);

/* HELLO of worker wid (in range) from p. 0: bound to p; -1: refused, msg
 * says why (ERR_ID_TAKEN). live(arg, ...) is asked about the connection the
 * id is bound to, only when that is another one. */
int dp_auth_claim(dp_auth_t *a, int wid, const dp_auth_peer_t *p, dp_auth_live_fn live,
                  void *arg, char *msg, size_t msg_len);

/* Who may send a request: each request type's row of the shard's message
 * table (server/loop/ps_msgs.c) names one, and admission
 * (server/loop/ps_admit.c) and dp_auth_check follow it.
 *   ANYONE  HELLO: any peer, before it said anything; its handler checks
 *           the model and dp_auth_claim binds the id. The worker id must
 *           be in range.
 *   WORKER  a worker that said HELLO to this shard, on the connection that
 *           said it (ERR_UNKNOWN_WORKER otherwise); the model's fingerprint.
 *   BEAT    HEARTBEAT: the id's holder on any of its connections (above);
 *           a tool's (id out of range, fingerprint 0 allowed) speaks for
 *           nobody and is answered.
 *   CHIEF   STATS, SHUTDOWN: the chief (ERR_NOT_CHIEF otherwise), from a
 *           tool too (id out of range, fingerprint 0 allowed); an id in
 *           range must be on its own connection, as WORKER's. */
typedef enum {
    DP_AUTH_ANYONE,
    DP_AUTH_WORKER,
    DP_AUTH_BEAT,
    DP_AUTH_CHIEF,
} dp_auth_who_t;

/* Any request but HELLO: who may send it (above), its type
 * (DOWNPOUR__MSG_TYPE__*, for the message), its worker id (any value: out
 * of range is left to the caller, except for the chief's requests) and run
 * token. 0: allowed; -1: refused, *code is the Error.code
 * (DOWNPOUR__ERROR_CODE__*) and msg says why. */
int dp_auth_check(dp_auth_t *a, dp_auth_who_t who, int type, int wid, uint64_t token,
                  const dp_auth_peer_t *p, int *code, char *msg, size_t msg_len);

/* The run token for the WELCOME of worker wid: the token for 0, else 0. */
uint64_t dp_auth_token_for(const dp_auth_t *a, int wid);

/* The probe server/loop/ps.c uses for "live": does the ROUTER sock still have a
 * peer with this routing id? Sends that peer env (a harmless HEARTBEAT the
 * client ignores) when it does; never blocks. */
int dp_auth_router_has_peer(void *sock, const void *conn, size_t conn_len,
                            const Downpour__Envelope *env);

#endif
