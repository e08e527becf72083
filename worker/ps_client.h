/* ps_client: the worker's side of the wire — one DEALER per parameter-server
 * shard, pull (parameters from every shard, in parallel) and push (each
 * shard's gradient slice, stamped with the version it was computed on).
 *
 * Invariants: every call is bounded in time — a shard that does not answer
 * within timeout_s gives "ENDPOINT: no reply in N s (is downpour-ps
 * running?)"; while a shard defers a pull (sync / ssp) the client sends
 * HEARTBEATs, and keeps waiting as long as the shard answers them (up to 20
 * timeouts in all). Push hands ZeroMQ the caller's gradient without a copy
 * and returns only once ZeroMQ has released it. Not thread-safe: one
 * client per thread. */
#ifndef DP_PS_CLIENT_H
#define DP_PS_CLIENT_H

#include <signal.h>
#include <stdint.h>

#include "common/model.h"
#include "proto/wire.h" /* dp_mode_t */

typedef struct {
    dp_mode_t mode;
    int num_workers, replicas, staleness, num_shards;
} dp_ps_info_t;

typedef struct {
    int applied, dropped, rejected;  /* shard replies of this push, summed over shards */
    uint64_t staleness_max;          /* over shards */
    double staleness_mean;           /* over shards */
    uint64_t version;                /* sum over shards of the version after this push */
    char reason[160];                /* first non-applied reason, "" if none */
} dp_push_result_t;

typedef struct {
    uint64_t applied, dropped, rejected, version;
    double staleness_mean;
    uint64_t staleness_max;
} dp_ps_stats_t;

typedef struct dp_ps_client dp_ps_client_t;

/* endpoints "tcp://h:p[,tcp://h2:p2...]" in shard order: one DEALER per
 * shard; HELLO to each (waiting up to timeout_s for a server that is not up
 * yet); checks that the shards' ranges tile [0, m->n_floats). A model
 * mismatch fails with the server's line "model mismatch: worker has ...,
 * server has ...". m must outlive the client. */
int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                         int worker_id, double timeout_s, dp_ps_info_t *info, char *err);

/* Whole parameter vector into params (host, m->n_floats), requests to all
 * shards in parallel; blocks while the servers defer the reply (sync /
 * ssp); remembers each shard's version for the next push. */
int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err);

/* Each shard's slice of grads, stamped with the versions of the last pull;
 * waits for all ACKs. grads must stay untouched until it returns. A shard
 * refusing the gradient (ACK rejected, or an ERROR reply) counts in
 * res->rejected with the reason and is not a failure of the call. */
int dp_ps_client_push(dp_ps_client_t *c, const float *grads, float loss, int batch,
                      dp_push_result_t *res, char *err);

/* Sum of shard versions of the last pull. */
uint64_t dp_ps_client_version(const dp_ps_client_t *c);

/* Shard 0's counters (every push goes to every shard), version summed over
 * shards. */
int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err);

/* This worker is done (the server stops counting it in sync / ssp). */
int dp_ps_client_finish(dp_ps_client_t *c, char *err);

/* Wait until every worker has finished (or gone silent past the servers'
 * heartbeat timeout), or timeout_s passes (-1, err says how many are still
 * running). Marks this worker finished first if it was not. */
int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err);

/* SHUTDOWN every shard; each writes its final checkpoint before answering. */
int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err);

/* Blocked calls return -1 ("interrupted") soon after *flag becomes non-zero
 * (e.g. set by a SIGTERM handler). NULL: never. */
void dp_ps_client_set_stop_flag(dp_ps_client_t *c, volatile sig_atomic_t *flag);

void dp_ps_client_destroy(dp_ps_client_t **c_p); /* safe twice */

#endif
