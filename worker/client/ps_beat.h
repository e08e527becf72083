/* ps_beat: the worker's heartbeat thread — a HEARTBEAT to every
 * parameter-server shard once a second, from the worker's start (before it
 * loads data or opens a GPU) to its end, on sockets of its own.
 *
 * Why a thread: the servers drop a worker silent for --heartbeat-timeout
 * (5 s by default) so that a dead sync worker stops holding every step; a
 * live worker must therefore be heard while it initialises a device,
 * computes a long first step or waits on a held pull, which the request
 * loop cannot promise. A worker killed stops beating at once, so the bound
 * is the timeout plus one beat: 6 s with the defaults.
 *
 * The beats carry the worker id, fingerprint 0 (servers accept that on
 * HEARTBEAT) and the worker's session (dp_ps_session_new, the one its
 * client's requests carry: dp_ps_client_opts_t.session): a server counts
 * them for the id only when its HELLO came from the same session (or,
 * under CURVE, when they come with the id's key, which the beats go with),
 * so nobody else's beats keep a dead worker counted (server/loop/auth.h).
 * Replies are read and discarded; a shard that is down just queues a few
 * beats (ZeroMQ redials). */
#ifndef DP_PS_BEAT_H
#define DP_PS_BEAT_H

#include "worker/client/ps_client.h" /* dp_ps_curve_t */

#define DP_PS_BEAT_EVERY_S 1.0

typedef struct dp_ps_beat dp_ps_beat_t;

/* Start beating to endpoints ("tcp://h:p[,tcp://h2:p2...]", read as the
 * client reads them: dp_ps_endpoints_parse) as worker_id of session, with CURVE when
 * curve names a secret key (the keys loaded as the client loads them:
 * dp_ps_curve_load). 0, or -1 with err (no thread left behind). */
int dp_ps_beat_new(dp_ps_beat_t **out, const char *endpoints, int worker_id, uint64_t session,
                   const dp_ps_curve_t *curve, char *err);

/* Stop the thread (within 0.1 s) and free; safe twice. */
void dp_ps_beat_destroy(dp_ps_beat_t **b_p);

#endif
