/* ps_client: the worker's side of the wire — one DEALER per parameter-server
 * shard, pull (parameters from every shard, in parallel) and push (each
 * shard's gradient slice, stamped with the version it was computed on), and
 * the end of a run (finish, wait for the others, stats, shutdown).
 *
 * Every call sends its request to all the shards it concerns before waiting
 * for any reply. Invariants: every call is bounded in time. A shard that
 * owes a reply and has not answered for a while gets HEARTBEATs. Only a
 * pull, which the shard may hold (sync / ssp), waits on as long as the shard answers
 * them, up to 20 timeouts in all ("request still deferred after N s"); any
 * other reply is due within timeout_s of the request.
 *
 * Recovery: every reply carries the server's incarnation. When a reply
 * shows a new one (the shard restarted), or the shard answers
 * ERR_UNKNOWN_WORKER, or the awaited reply does not come within timeout_s,
 * the client says HELLO to that shard again (same socket) and repeats
 * the request (pulls are idempotent; a push carries its step, which the
 * shard applies once). A restarted shard must answer that HELLO within
 * timeout_s; a second timeout of one request, or no answer to the HELLO,
 * fails with "ENDPOINT: no reply in N s (is downpour-ps running?)". A
 * shard that restarted at a version below the highest it had reported lost
 * the updates in between: they are counted (dp_ps_client_updates_lost) and
 * the repeated push is stamped with the restored version.
 *
 * After a failed call the shards that did not answer get fresh sockets, so
 * the client stays usable. Push hands ZeroMQ the caller's
 * gradient without a copy and returns only once ZeroMQ has released it.
 * Not thread-safe: one client per thread. */
#ifndef DP_PS_CLIENT_H
#define DP_PS_CLIENT_H

#include <signal.h>
#include <stdint.h>

#include "common/model.h"
#include "common/staleness.h"
#include "proto/curve.h"
#include "proto/wire.h" /* dp_mode_t */

/* The servers' policy, from their WELCOMEs (every shard agrees). */
typedef struct {
    dp_mode_t mode;
    int num_workers;       /* workers the servers expect */
    int replicas;          /* R: gradients aggregated per sync step */
    int staleness;         /* S: ssp bound */
    int num_shards;
} dp_ps_info_t;

/* What the shards said of one push. */
typedef struct {
    int applied, dropped, rejected;  /* shard replies of this push, summed over shards */
    uint64_t staleness_max;          /* over shards */
    double staleness_mean;           /* over shards */
    uint64_t version;                /* sum over shards of the version after this push */
    char reason[160];                /* first non-applied (or repeat) reason, "" if none */
} dp_push_result_t;

/* Server counters (dp_ps_client_stats). */
typedef struct {
    uint64_t applied, dropped, rejected; /* shard 0's (rejected counts malformed messages too) */
    uint64_t version;                    /* sum over shards */
    double staleness_mean;               /* shard 0's, over applied pushes */
    uint64_t staleness_max;              /* shard 0's */
    uint64_t staleness_hist[DP_STATS_HIST_BINS]; /* shard 0's counts per staleness (last bin: or more) */
    size_t staleness_bins;               /* bins in use */
} dp_ps_stats_t;

typedef struct dp_ps_client dp_ps_client_t;

/* How tensors travel to and from the shards. AUTO: through shared memory
 * with a shard whose endpoint is on this host (ipc, loopback) and that
 * grants it, as ZeroMQ frames otherwise; SHM: shared memory or fail; ZMQ:
 * frames always. The control messages are ZeroMQ's in every case. */
typedef enum { DP_PS_TRANSPORT_AUTO, DP_PS_TRANSPORT_SHM, DP_PS_TRANSPORT_ZMQ } dp_ps_transport_t;

/* "auto", "shm", "zmq". */
int dp_ps_transport_parse(const char *s, dp_ps_transport_t *out, char *err);
/* The transport each client created from now on uses (per process, like
 * dp_ps_client_default_stop_flag; downpour-worker's --transport sets it).
 * Default AUTO. */
void dp_ps_client_default_transport(dp_ps_transport_t t);
/* Tensors in frames as bfloat16 (1) or float32 (0, the default) for each
 * client created from now on (downpour-worker's --wire): half the bytes,
 * each value rounded to 8 bits of mantissa on the wire; the servers keep
 * float32 weights and optimizer state. Shared memory stays float32. */
void dp_ps_client_default_wire(int bf16);
/* Shards this client reaches through shared memory. */
int dp_ps_client_shm_shards(const dp_ps_client_t *c);

/* This process's session: a random non-zero number drawn once (the first
 * call), carried by every request of its clients and heartbeat threads
 * (Envelope.session). A server ties a worker id to the session of the HELLO
 * that claimed it, so the heartbeats of this process count for that id
 * whichever connection they come on, and nobody else's do (server/auth.h).
 * Thread-safe. */
uint64_t dp_ps_session(void);

/* endpoints "tcp://h:p[,tcp://h2:p2...]" in shard order: one DEALER per
 * shard; HELLO to each (waiting up to timeout_s, 30 if not > 0, for a server
 * that is not up yet); checks that every shard runs the same policy and
 * that their ranges tile [0, m->n_floats). A model mismatch fails with the
 * server's line "model mismatch: this shard serves another model than the
 * worker's ..." (the server's model is in its own log only). info
 * (may be NULL) gets the policy. m must outlive the client. */
int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                     int worker_id, double timeout_s, dp_ps_info_t *info, char *err);

/* CURVE key files for dp_ps_client_new_curve. */
typedef struct {
    const char *secret;  /* this worker's secret key (downpour keygen FILE) */
    const char *servers; /* the servers' public keys: one for every shard, or a comma list in
                          * endpoint order */
} dp_ps_curve_t;

/* dp_ps_client_new over CURVE (curve NULL: plain): every socket encrypts,
 * authenticates the server by its key and offers ours. A server that does
 * not admit our key never answers (the usual "no reply" timeout). */
int dp_ps_client_new_curve(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                           int worker_id, double timeout_s, const dp_ps_curve_t *curve,
                           dp_ps_info_t *info, char *err);

/* Whole parameter vector into params (host, m->n_floats), requests to all
 * shards in parallel; blocks while the servers defer the reply (sync /
 * ssp); remembers each shard's version for the next push. */
int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err);

/* Receives the [off, off + n) floats of the parameter vector; data is valid
 * only during the call. */
typedef void (*dp_ps_params_sink_fn)(void *arg, size_t off, const float *data, size_t n);

/* The same pull without the copy into a caller's buffer: each received
 * tensor is lent to sink where it lies in ZeroMQ's receive buffer (float32
 * frames at an aligned address), else first widened or copied into a
 * buffer of the client's own. Every float of the vector reaches the sink
 * once per pull (more often when a shared-memory copy raced a step and the
 * pull went again). */
int dp_ps_client_pull_to(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err);

/* Each shard's slice of grads, stamped with the versions of the last pull;
 * waits for all ACKs. grads must stay untouched until it returns. A shard
 * refusing the gradient (ACK rejected, or an ERROR reply) counts in
 * res->rejected with the reason and is not a failure of the call. */
int dp_ps_client_push(dp_ps_client_t *c, const float *grads, float loss, int batch,
                      dp_push_result_t *res, char *err);

/* The same with the worker's step (1, 2, ...; 0 = none), which each shard
 * applies once per worker: a repeat (after a lost ACK or a restart) is
 * acknowledged as applied ("repeat: ..." in the reason) without being
 * applied again. */
int dp_ps_client_push_step(dp_ps_client_t *c, uint64_t step, const float *grads, float loss,
                           int batch, dp_push_result_t *res, char *err);

/* The last step of this worker every shard has applied (from their
 * WELCOMEs): a restarted worker resumes after it. 0 for a new worker. */
uint64_t dp_ps_client_resume_step(const dp_ps_client_t *c);

/* Updates the shards lost by restarting from a checkpoint, as this client
 * saw them: the versions each had reported minus the one it restarted at. */
uint64_t dp_ps_client_updates_lost(const dp_ps_client_t *c);

/* The CURVE keys of one socket to a shard: ours and that shard's. */
typedef struct {
    const dp_curve_key_t *secret, *pub, *server;
} dp_ps_sock_keys_t;

/* A DEALER connected to endpoint with the client's options (linger 0, send
 * timeout, ZMTP heartbeats, CURVE when keys is not NULL); every socket to a
 * shard is made here, the heartbeat thread's too. */
int dp_ps_client_socket(void *ctx, const char *endpoint, double timeout_s,
                        const dp_ps_sock_keys_t *keys, void **out, char *err);

/* Shard i's server key from curve->servers (one file for every shard, or
 * one per shard in endpoint order), read into out. */
int dp_ps_curve_server_key(const dp_ps_curve_t *curve, int n_shards, int i, dp_curve_key_t *out,
                           char *err);

/* CRC-32 on the tensors to and from every shard: 1 on, 0 off, -1 the
 * default (on, except on this host — loopback, ipc — and under CURVE, whose
 * transports protect the bytes already). Either way the servers check
 * what they get (shape, range, finite values). */
void dp_ps_client_set_checksum(dp_ps_client_t *c, int on);

/* Sum of shard versions of the last pull. */
uint64_t dp_ps_client_version(const dp_ps_client_t *c);

/* STATS from every shard: shard 0's counters (every push goes to every
 * shard), version summed over shards. The servers answer only the chief
 * (worker 0: its key under CURVE, else the run token its WELCOMEs gave it);
 * anyone else gets "STATS refused: only the chief ...". The same holds for
 * dp_ps_client_wait_all_finished and dp_ps_client_shutdown_servers. */
int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err);

/* BARRIER to every shard: this worker is done (the servers stop counting it
 * in sync / ssp). */
int dp_ps_client_finish(dp_ps_client_t *c, char *err);

/* Wait until every worker has finished (or gone silent past the servers'
 * heartbeat timeout), as shard 0 counts them (asked every 0.1 s), or
 * timeout_s passes (-1, err says how many are still running). Marks this
 * worker finished first if it was not. */
int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err);

/* SHUTDOWN every shard; each writes its final checkpoint (if it keeps any)
 * before answering. */
int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err);

/* Blocked calls return -1 ("interrupted") soon after *flag becomes non-zero
 * (e.g. set by a SIGTERM handler). NULL: never. */
void dp_ps_client_set_stop_flag(dp_ps_client_t *c, volatile sig_atomic_t *flag);
/* The stop flag each client created from now on starts with, so that its
 * first wait (the HELLO, up to timeout_s) is interrupted too. Signals are
 * per process, and so is this; NULL (the default): none. */
void dp_ps_client_default_stop_flag(volatile sig_atomic_t *flag);

void dp_ps_client_destroy(dp_ps_client_t **c_p); /* safe twice */

/* ---- pushing on an earlier pull's versions (worker/pipeline.h) ---------- */

/* The versions a push is stamped with, one per shard: those a pull got. A
 * worker that pulls the next weights before it pushes the current gradient
 * keeps the stamp of the pull that gradient was computed on. */
#define DP_PS_STAMP_MAX 256
typedef struct {
    int n;                          /* shards */
    uint64_t v[DP_PS_STAMP_MAX];    /* shard i's version */
} dp_ps_stamp_t;

/* The stamp of the last pull (the one a plain push would carry). */
void dp_ps_client_stamp(const dp_ps_client_t *c, dp_ps_stamp_t *out);
/* Sum over shards (dp_ps_client_version's figure for that pull). */
uint64_t dp_ps_stamp_sum(const dp_ps_stamp_t *s);

/* dp_ps_client_push_step stamped with stamp instead of the last pull's
 * versions; the client's own versions are as before afterwards. A shard
 * that restarted below a stamped version since (its versions went back)
 * gets the restored version instead, as a plain push would. */
int dp_ps_client_push_stamped(dp_ps_client_t *c, const dp_ps_stamp_t *stamp, uint64_t step,
                              const float *grads, float loss, int batch, dp_push_result_t *res,
                              char *err);

#endif
