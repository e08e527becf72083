/* ps_client: the worker's side of the wire — one DEALER per parameter-server
 * shard, pull (parameters from every shard, in parallel; whole, or in parts
 * as the forward needs them) and push (each shard's gradient slice, stamped
 * with the version it was computed on; whole, or in parts as the backward
 * makes them), and the end of a run (finish, wait for the others, stats,
 * shutdown).
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
 * After a failed call (a timeout, an interrupt) the shards that did not
 * answer get fresh sockets, so the client stays usable; its next request
 * comes on a new connection, which says HELLO again with the same session
 * (the server rebinds the id to it: server/loop/auth.h). dp_ps_client_error says
 * what kind of failure it was. Push hands ZeroMQ the caller's gradient without a copy and returns
 * only once ZeroMQ has released it. Everything a client is made with comes
 * in its options (dp_ps_client_opts_t): nothing is set per process. Not thread-safe: one client per thread.
 *
 * A pull is ps_pull.c's, a push ps_push.c's, the small requests (stats,
 * finish, shutdown) ps_client.c's; the machinery under them (the
 * exchange, liveness, rejoin, new and destroy) is ps_exchange.c's, the
 * sockets' making ps_socket.h's. */
#ifndef DP_PS_CLIENT_H
#define DP_PS_CLIENT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/episodes.h"
#include "common/model.h"
#include "common/staleness.h"
#include "proto/compress.h"
#include "proto/curve.h"
#include "proto/devmem.h"
#include "proto/wire.h" /* dp_mode_t */
#include "proto/zsock.h" /* DP_ZSOCK_MAX_SHARDS */
#include "worker/client/pull.h"

/* The servers' policy, from their WELCOMEs (every shard agrees). */
typedef struct {
    dp_mode_t mode;
    int num_workers;       /* workers the servers expect */
    int replicas;          /* R: gradients aggregated per sync step */
    int staleness;         /* S: ssp bound */
    int num_shards;
    long local_steps;      /* H of --local-steps (1: off) */
    int local_auto;        /* --local-steps auto (DyLU): H is the fastest worker's */
    int min_workers;       /* --workers MIN:MAX: MIN (num_workers is MAX); 0: a fixed crew */
} dp_ps_info_t;

/* What the shards said of one push. */
typedef struct {
    int applied, dropped, rejected;  /* shard replies of this push, summed over shards */
    uint64_t staleness_max;          /* over shards */
    double staleness_mean;           /* over shards */
    uint64_t version;                /* sum over shards of the version after this push */
    int workers_live;                /* the most workers live any shard's ACK counted */
    char reason[160];                /* first non-applied (or repeat) reason, "" if none */
    uint64_t bytes;                  /* the gradient's bytes this push moved, all shards: dense
                                      * 4 (bf16 frames: 2) a float, or the compressed encoding
                                      * (proto/compress.h); once, however often it was repeated */
    int parts;                       /* messages the push took, all shards (the shards' count:
                                      * one each when whole), once however often repeated */
    int parts_early;                 /* of them, those push_part sent during the backward */
    uint64_t env_steps;              /* an actor-critic run: its env steps after this push (the
                                      * servers' count, all workers: Ack.env_steps) */
    double crew_step_ms;             /* DyLU: the least step time any shard's ACK gave of the
                                      * crew (Ack.crew_step_ms; 0: none) */
    int account_refused;             /* shards that refused its segment's account (ERROR
                                      * ERR_ACCOUNT: not the shards' --env, --envs, --t-max),
                                      * counted in rejected too */
} dp_push_result_t;

/* Server counters (dp_ps_client_stats). */
typedef struct {
    uint64_t applied, dropped, rejected; /* shard 0's (rejected: pushes refused) */
    uint64_t requests_refused;           /* sum over shards: other requests answered with an ERROR */
    uint64_t version;                    /* sum over shards */
    double staleness_mean;               /* shard 0's, over applied pushes */
    uint64_t staleness_max;              /* shard 0's */
    uint64_t staleness_hist[DP_STATS_HIST_BINS]; /* shard 0's counts per staleness (last bin: or more) */
    size_t staleness_bins;               /* bins in use */
    uint64_t steps_early;                /* sum over shards: steps made as a push's parts came */
    /* an actor-critic run's episodes, shard 0's account (common/episodes.h) */
    uint64_t env_steps, episodes;
    double return_mean_100;
    int64_t solved_at_env_steps;         /* -1: not solved */
    uint64_t curve_at[DP_EPISODES_CURVE]; /* the run's return curve (common/episodes.h) */
    double curve_mean[DP_EPISODES_CURVE];
    int n_curve;
    /* the row table (a model with embed:D): rows held per shard, and sums */
    uint64_t rows[DP_ZSOCK_MAX_SHARDS];
    int rows_shards;                     /* entries of rows (the shards that answered) */
    uint64_t rows_evicted, row_pushes, row_pushes_rejected;
    uint64_t row_staleness_sum, row_staleness_max, rows_bytes;
} dp_ps_stats_t;

/* The crew's history as shard 0 keeps it (server/crew/membership.h). */
typedef struct {
    int join;                            /* joined (or came back); else left */
    int task;
    uint64_t version;                    /* shard 0's version then */
    int live;                            /* workers live after it */
    char why[12];                        /* hello, back, finished, leave, gone, replaced */
} dp_ps_member_event_t;

/* One epoch of an elastic crew's batches, as shard 0 dealt them
 * (server/crew/deal.h), in samples. */
typedef struct {
    uint64_t epoch, trained, repeated, retrained_after_death, batches;
} dp_ps_epoch_samples_t;

typedef struct dp_ps_membership {
    dp_ps_member_event_t *ev;            /* n events, oldest first (owned) */
    size_t n;
    dp_ps_epoch_samples_t *epochs;       /* n_epochs dealt (owned); none for a fixed crew */
    size_t n_epochs;
    uint64_t deal_foreign;               /* pushes that named no batch dealt to them */
    int live_min, live_max;              /* from the first join to the first worker done */
    int live;                            /* now */
} dp_ps_membership_t;

typedef struct dp_ps_client dp_ps_client_t;

/* How tensors travel to and from the shards. AUTO: through shared memory
 * with a shard whose endpoint is on this host (ipc, loopback) and that
 * grants it, as ZeroMQ frames otherwise; SHM: shared memory or fail; ZMQ:
 * frames always. The control messages are ZeroMQ's in every case. */
typedef enum { DP_PS_TRANSPORT_AUTO, DP_PS_TRANSPORT_SHM, DP_PS_TRANSPORT_ZMQ } dp_ps_transport_t;

/* "auto", "shm", "zmq". */
int dp_ps_transport_parse(const char *s, dp_ps_transport_t *out, char *err);

/* Tensors in frames as float32, or as bfloat16 (downpour-worker's --wire
 * bf16): half the bytes, each value rounded to 8 bits of mantissa on the
 * wire; the servers keep float32 weights and optimizer state. Shared
 * memory stays float32. */
typedef enum { DP_PS_WIRE_FP32, DP_PS_WIRE_BF16 } dp_ps_wire_t;

/* "fp32", "bf16". */
int dp_ps_wire_parse(const char *s, dp_ps_wire_t *out, char *err);

/* CRC-32 on the tensors to and from every shard. AUTO: on, except on this
 * host (loopback, ipc) and under CURVE, whose transports protect the bytes
 * already. Either way the servers check what they get (shape, range,
 * finite values). */
typedef enum { DP_PS_CRC_AUTO, DP_PS_CRC_ON, DP_PS_CRC_OFF } dp_ps_crc_t;

/* CURVE key files. */
typedef struct {
    const char *secret;  /* this worker's secret key (downpour keygen FILE); NULL: plain */
    const char *servers; /* the servers' public keys: one for every shard, or a comma list in
                          * endpoint order */
} dp_ps_curve_t;

/* What a failed call ran into (dp_ps_client_error), for a caller that
 * acts on the kind of failure rather than on its text. */
typedef enum {
    DP_PS_OK,                /* the last call did not fail */
    DP_PS_ERR_TIMEOUT,       /* a shard owing a reply was silent past timeout_s */
    DP_PS_ERR_DEFERRED,      /* a shard answered heartbeats but held the reply too long */
    DP_PS_ERR_INTERRUPTED,   /* the stop flag was raised */
    DP_PS_ERR_REFUSED,       /* a shard answered with an ERROR (its message in err) */
    DP_PS_ERR_OTHER,         /* anything else: sockets, a malformed or unexpected reply */
    DP_PS_ERR_MODEL_MISMATCH, /* a shard serves another model (ERROR ERR_MODEL_MISMATCH) */
} dp_ps_err_t;

/* What this worker trains on, for the shard that deals an elastic crew's
 * batches (server/crew/deal.h): batches of batch from samples, for epochs or
 * (epochs 0) steps a worker. batch 0: none (the worker's own order). */
typedef struct {
    uint64_t samples;
    uint32_t batch;
    uint64_t epochs, steps;
} dp_ps_deal_plan_t;

/* A batch shard 0 dealt: batch index of epoch (worker/exec/data.h), or end. */
typedef struct {
    bool end;
    uint64_t epoch, index;
} dp_ps_dealt_t;

/* Everything a client is made with; a zeroed struct is the defaults. */
typedef struct {
    double timeout_s;              /* silence allowed to a shard owing a reply; not > 0: 30 */
    dp_ps_curve_t curve;           /* .secret NULL: plain; else every socket encrypts,
                                    * authenticates the server by its key and offers ours */
    dp_ps_transport_t transport;   /* AUTO */
    dp_ps_wire_t wire;             /* FP32 */
    dp_ps_crc_t crc;               /* AUTO */
    dp_compress_conf_t compress;   /* pushes compressed (top-k, sign; error feedback kept
                                    * per shard slice by the client); zeroed: dense. A
                                    * compressed push goes in frames even to a shard reached
                                    * through shared memory (pulls still use it) */
    volatile sig_atomic_t *stop;   /* blocked calls, the first HELLO's wait included, return -1
                                    * ("interrupted") soon after *stop becomes non-zero (a
                                    * signal handler's flag); NULL: never */
    dp_ps_err_t *new_error;        /* a failed dp_ps_client_new leaves its kind here (there is
                                    * no client to ask: a library reports it); NULL: nowhere */
    dp_ps_deal_plan_t deal;        /* told in every HELLO; zeroed: none */
    uint64_t session;              /* carried by every request (dp_ps_session_new), the
                                    * heartbeat thread's too; 0: the client draws its own */
    const dp_devmem_ops_t *devmem; /* a GPU worker's device region provider (kernels/
                                    * backend.h's dp_devmem_for_device): asks a shard on this
                                    * host for its region (Hello.devregion); NULL: none (a CPU
                                    * worker). The test hook's stand-in, when set, wins */
} dp_ps_client_opts_t;

/* A new worker session: a random non-zero number, drawn once per worker
 * (downpour-worker, a library handle) and carried by every request of its
 * client and its heartbeat thread (Envelope.session). A server ties a
 * worker id to the session of the HELLO that claimed it, so the worker's
 * heartbeats count for that id whichever connection they come on, a new
 * connection of its own client (one that reset its socket) may say HELLO
 * as it again, and nobody else's do either (server/loop/auth.h). Two clients in
 * one process are two workers. Thread-safe (made in ps_socket.c). */
uint64_t dp_ps_session_new(void);


/* Shards this client reaches through shared memory. */
int dp_ps_client_shm_shards(const dp_ps_client_t *c);
/* Shards whose device region this client maps (proto/devregion.h). */
int dp_ps_client_devregion_shards(const dp_ps_client_t *c);

/* Told of every shared-memory segment the client maps (mapped 1: base,
 * bytes, read_only for the sealed parameter segment) and before it unmaps
 * one (mapped 0, same base): a device worker page-locks them
 * (cudaHostRegister) so its copies to and from them are DMA. Setting a hook
 * tells it of the segments mapped already; replacing it (NULL: none) tells
 * the old one they go, first. */
typedef void (*dp_ps_shm_hook_fn)(void *arg, void *base, size_t bytes, int read_only, int mapped);
void dp_ps_client_set_shm_hook(dp_ps_client_t *c, dp_ps_shm_hook_fn hook, void *arg);

/* endpoints "tcp://h:p[,tcp://h2:p2...]" in shard order (no empty entry,
 * at most DP_ZSOCK_MAX_SHARDS): one DEALER per shard, made with opts (NULL:
 * the defaults); HELLO to each (waiting up to timeout_s for a server that
 * is not up yet); checks that every shard runs the same policy and that
 * their ranges tile [0, m->n_floats). A model mismatch fails with
 * DP_PS_ERR_MODEL_MISMATCH and the server's line "model mismatch: this shard
 * serves another model than the worker's ..." (the server's model is in its
 * own log only); a server that does not admit our CURVE key never answers
 * (the usual "no reply" timeout). info (may be NULL) gets the policy. m
 * must outlive the client. */
int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                     int worker_id, const dp_ps_client_opts_t *opts, dp_ps_info_t *info,
                     char *err);

/* The kind of the last call's failure (DP_PS_OK after a call that did not
 * fail). */
dp_ps_err_t dp_ps_client_error(const dp_ps_client_t *c);

/* A pull: the whole parameter vector (m->n_floats) from every shard in
 * parallel, blocking while the servers defer it (sync / ssp); each shard's
 * version is kept for the next push. pull lands it in params (host);
 * pull_to lends each tensor to sink where it lies (else from a buffer of
 * the client's), every float once (again if the pull went again). */
int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err);
typedef void (*dp_ps_params_sink_fn)(void *arg, size_t off, const float *data, size_t n);
int dp_ps_client_pull_to(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err);

/* A device worker's copies between its network's device memory and a
 * shard's device region (proto/devregion.h), so that neither the weights
 * nor the gradient cross the host (worker/train/distributed.c: the
 * backend's copy_peer, then its synchronize). Each copy is done, not only
 * queued, when the call returns: the client unpins the ring entry, or
 * counts the slot's push, right after. */
typedef struct {
    /* The weights' floats [off, off + n) at src, an address on the device
     * (the ring entry a pull pinned), into the network's. */
    int (*weights_in)(void *arg, size_t off, const float *src, size_t n, char *err);
    /* The gradient's floats [off, off + n) into dst: a gradient slot on the
     * device (device 1), or host memory (0: a slice that goes another way,
     * the slot not free or the region gone). from: the push's device
     * buffer (dp_ps_push_t.d_grads), NULL: the network's gradient. */
    int (*grads_out)(void *arg, float *dst, const float *from, size_t off, size_t n, int device,
                     char *err);
    /* Put the calling thread on the device (NULL: nothing to do), before
     * the client's device work on a thread other than the one that opened
     * the device: a WELCOME's route and mapping, a pin's copy, a push's
     * event (the overlapped loop's communication thread re-HELLOs a
     * restarted shard). */
    void (*enter)(void *arg);
    void *arg;
} dp_ps_device_t;
/* Set them (NULL: none); they must outlive the client's pulls and pushes. */
void dp_ps_client_set_device(dp_ps_client_t *c, const dp_ps_device_t *dev);
/* As pull_to, and a shard's reply through its device region goes through
 * the device's weights_in instead of sink (device to device). */
int dp_ps_client_pull_device(dp_ps_client_t *c, dp_ps_params_sink_fn sink, void *arg, char *err);
/* 1 when a push can leave from the device into every shard's slot
 * (dp_ps_push_t.grads NULL): the device's copies set, every shard's device
 * region mapped, pushes dense. A push from the device is taken wherever the
 * device's copies are set and pushes are dense and whole: a shard without
 * its region then gets its slice through the host (grads_out, device 0). */
int dp_ps_client_push_on_device(const dp_ps_client_t *c);
/* What went device to device: pulls' ring entries copied by weights_in,
 * pushes' slices into a slot by grads_out. */
void dp_ps_client_device_counts(const dp_ps_client_t *c, uint64_t *pulls, uint64_t *pushes);

/* A pull in parts, as the forward needs them (net.h's on_params): pull_begin
 * asks and returns; pull_until(end) once floats [0, end) of params are in:
 * DP_PULL_OK, DP_PULL_FAILED with err, or DP_PULL_TORN (worker/client/pull.h: a
 * shard was asked again after floats of it were handed out; all are in now,
 * the forward starts again). end >= n_floats ends it. Details: ps_pull.c. */
int dp_ps_client_pull_begin(dp_ps_client_t *c, float *params, char *err);
dp_pull_status_t dp_ps_client_pull_until(dp_ps_client_t *c, size_t end, char *err);

/* An elastic crew's batches, dealt by shard 0 with the weights: every pull
 * from now on asks for the batch of push step `step` (0: none asked; the
 * same step asked again, a repeated pull, gets the same batch), and
 * dp_ps_client_dealt says what the last pull got: 0 with *out, or -1 when
 * it brought none (none asked, or a pull in parts whose shard 0 part has
 * not come: dp_ps_client_pull_until(c, 1) waits for it). A shard 0 that
 * answers such a pull without a batch fails the pull. */
void dp_ps_client_deal_step(dp_ps_client_t *c, uint64_t step);
int dp_ps_client_dealt(const dp_ps_client_t *c, dp_ps_dealt_t *out);
/* The plan told after connecting (libdownpour's downpour_deal_plan): a
 * HELLO again to shard 0 with it; -1 (err) when shard 0 refuses it. */
int dp_ps_client_plan(dp_ps_client_t *c, const dp_ps_deal_plan_t *p, char *err);

/* The last pull's PARAMS messages, over every shard (one a shard when
 * whole; a repeated reply counts again). */
uint32_t dp_ps_client_pull_parts(const dp_ps_client_t *c);

/* The versions a push is stamped with, one per shard: those a pull got. A
 * worker that pulls the next weights before it pushes the current gradient
 * keeps the stamp of the pull that gradient was computed on. */
typedef struct {
    int n;                              /* shards */
    uint64_t v[DP_ZSOCK_MAX_SHARDS];    /* shard i's version */
} dp_ps_stamp_t;

/* One push. */
typedef struct {
    const float *grads;          /* m->n_floats; untouched until the push returns. NULL: the
                                  * device's, copied out by dp_ps_device_t.grads_out (a whole
                                  * push where dp_ps_client_push_on_device says so) */
    float loss;
    int batch;
    uint64_t step;               /* the worker's step (1, 2, ...), which each shard applies
                                  * once per worker: a repeat (after a lost ACK or a restart)
                                  * is acknowledged as applied ("repeat: ..." in the reason)
                                  * without being applied again; 0: none */
    const float *d_grads;        /* grads NULL: the device buffer the gradient is in (the
                                  * overlapped loop's copy of it); NULL: the network's */
    const dp_ps_stamp_t *stamp;  /* the versions to stamp it with; NULL: the last pull's */
    const struct dp_ps_segment *segment; /* an actor-critic segment's account; NULL: none */
    uint32_t local_steps;        /* DyLU: the round's data steps (Push.local_steps; 0: none) */
    float step_ms;               /* ... and this worker's ms per local step (0: not known yet) */
} dp_ps_push_t;

/* What an actor-critic push reports of its segment (Push.env_steps ...):
 * the environment steps it took, the n episodes that ended in it (their
 * returns, and the steps into the segment at which each ended, 1 ..
 * env_steps, in order) and the environment's solved threshold. */
typedef struct dp_ps_segment {
    uint64_t env_steps;
    size_t n;
    const double *returns;
    const uint32_t *ends;
    double threshold;
} dp_ps_segment_t;

/* Each shard's slice of p->grads, stamped with p->stamp (or the versions of
 * the last pull); waits for all ACKs. A shard that restarted below a
 * stamped version gets the restored version instead, as with the last
 * pull's stamp. A shard refusing the gradient (ACK rejected, or an ERROR
 * reply) counts in res->rejected with the reason and is not a failure of
 * the call. res may be NULL. */
int dp_ps_client_push(dp_ps_client_t *c, const dp_ps_push_t *p, dp_push_result_t *res, char *err);

/* A push in parts, as the backward makes the gradient (net.h's on_grads):
 * push_begin(p) checks it (p is the caller's until push_end, which reads
 * its loss again); push_part(off, n): floats [off, off + n) of p->grads
 * are final (from the end down), and the shards' parts then complete leave
 * unawaited; push_end sends the rest and awaits every ACK as push does.
 * push is the same with one part a shard. Details: ps_push.c. */
int dp_ps_client_push_begin(dp_ps_client_t *c, const dp_ps_push_t *p, char *err);
void dp_ps_client_push_part(dp_ps_client_t *c, size_t off, size_t n);
int dp_ps_client_push_end(dp_ps_client_t *c, dp_push_result_t *res, char *err);

/* Where the caller may compute its next push's gradient (n_floats, the
 * whole model) so that no copy of it is made: the gradient slot of the one
 * shard, when it is on this host (shared memory), serves the whole model
 * and the push is not compressed; NULL otherwise (push from your own
 * buffer). Each part is to be left alone from when the push is handed it
 * until the push returns (the shard copies a part out when its notice
 * comes, and again after a restart); the buffer stays mapped until the
 * next call or dp_ps_client_destroy, even if the shard restarts meanwhile
 * (the push is then copied from it into what the new WELCOME grants).
 * Each call gives the previous answer up. */
float *dp_ps_client_push_buffer(dp_ps_client_t *c, size_t n_floats);

/* The bytes of every push so far (dp_push_result_t.bytes summed). */
uint64_t dp_ps_client_bytes_pushed(const dp_ps_client_t *c);
/* The tensor bytes every pull received: the dense weights (PARAMS), the
 * rows of dp_ps_client_rows_pull and the keys and rows of
 * dp_ps_client_rows_all, all calls. */
uint64_t dp_ps_client_bytes_pulled(const dp_ps_client_t *c);

/* ---- row tables (a model whose first layer is embed:D; server/core/ps_rows.h) --
 * The rows of keys[0..n) (no key twice) of width d into rows (n x d, the
 * keys' order), each from the shard that holds it (dp_rows_shard_of), all
 * shards in parallel; a key without a row reads as a new row would start.
 * *held (may be NULL): the keys that had a row. 0, or -1 with err (a
 * refusal names the bad key). */
int dp_ps_client_rows_pull(dp_ps_client_t *c, const uint64_t *keys, size_t n, int d, float *rows,
                           uint64_t *held, char *err);
/* Their gradients grads (n x d, keys[0..n) of the last rows_pull or fewer)
 * to the shards that hold them, stamped with the versions that pull read;
 * step (1, 2, ...): applied once per (worker, step), 0: no repeat check.
 * res as for a push (applied, dropped, rejected and reason per shard;
 * bytes: keys and rows moved). 0, or -1 with err. */
int dp_ps_client_rows_push(dp_ps_client_t *c, const uint64_t *keys, size_t n, int d,
                           const float *grads, uint64_t step, dp_push_result_t *res, char *err);

/* Every row the shards hold, in key order (the chief's --save at the end
 * of a run, when no worker pushes any more): each shard's table read by
 * scans (ROWS_PULL with RowsPull.scan, server/core/ps_rows.h) of at most page
 * keys a reply (0: DP_ROWS_DEFAULT_KEYS; a shard may list fewer), the
 * shards still reading asked in parallel, a page after the other; each
 * key checked to be its shard's and past the page before, each shard's
 * init and seed to be the first's; merged by key (a key lives on one
 * shard). t->keys and t->rows malloc'd (dp_ps_table_free). 0, or -1 with
 * err and t empty. */
typedef struct {
    uint64_t *keys;        /* n, ascending */
    float *rows;           /* n x d, the keys' order */
    size_t n;
    float init;            /* a key without a row reads uniform in [-init, init) by */
    uint64_t seed;         /* (seed, key), server/core/rows.h; init 0: zeros */
    uint64_t pages;        /* the pages read, every shard */
} dp_ps_table_t;
int dp_ps_client_rows_all(dp_ps_client_t *c, int d, uint32_t page, dp_ps_table_t *t, char *err);
void dp_ps_table_free(dp_ps_table_t *t);

/* The last step of this worker every shard has applied (from their
 * WELCOMEs): a restarted worker resumes after it. 0 for a new worker. */
uint64_t dp_ps_client_resume_step(const dp_ps_client_t *c);

/* Updates the shards lost by restarting from a checkpoint, as this client
 * saw them: the versions each had reported minus the one it restarted at. */
uint64_t dp_ps_client_updates_lost(const dp_ps_client_t *c);

/* Sum of shard versions of the last pull. */
uint64_t dp_ps_client_version(const dp_ps_client_t *c);

/* STATS from every shard: shard 0's counters (every push goes to every
 * shard), version summed over shards. The servers answer only the chief
 * (worker 0: its key under CURVE, else the run token its WELCOMEs gave it);
 * anyone else gets "STATS refused: only the chief ...". The same holds for
 * dp_ps_client_wait_all_finished and dp_ps_client_shutdown_servers. */
int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err);

/* STATS of shard 0: its membership events, live range and dealt epochs
 * into out (the chief only, as STATS). Free with dp_ps_membership_fini. */
int dp_ps_client_membership(dp_ps_client_t *c, dp_ps_membership_t *out, char *err);
/* Safe on a zeroed or finished one. */
void dp_ps_membership_fini(dp_ps_membership_t *m);

/* BARRIER to every shard: this worker is done (the servers stop counting it
 * in sync / ssp). */
int dp_ps_client_finish(dp_ps_client_t *c, char *err);
/* The same for a worker that leaves before its last step (its SIGTERM, an
 * elastic crew): BARRIER{finished, leave}, so the servers log a leave and
 * an elastic sync crew still waits for MIN live workers. */
int dp_ps_client_leave(dp_ps_client_t *c, char *err);
/* What blocked calls watch from now on (dp_ps_client_opts_t.stop; NULL:
 * nothing, each ends by its reply or its timeout). */
void dp_ps_client_set_stop(dp_ps_client_t *c, volatile sig_atomic_t *stop);
/* Pushes compressed as z says from the next one on (opts.compress, set
 * later: the library's downpour_set_compress); each shard's compressor,
 * and its residual, starts afresh. */
void dp_ps_client_set_compress(dp_ps_client_t *c, const dp_compress_conf_t *z);

/* Wait until every worker has finished (or gone silent past the servers'
 * heartbeat timeout), as shard 0 counts them (asked every 0.1 s), or
 * timeout_s passes (-1, err says how many are still running). Marks this
 * worker finished first if it was not. */
int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err);

/* SHUTDOWN every shard; each writes its final checkpoint (if it keeps any)
 * before answering. */
int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err);

void dp_ps_client_destroy(dp_ps_client_t **c_p); /* safe twice */

/* The stamp of the last pull (the one a push without a stamp carries). */
void dp_ps_client_stamp(const dp_ps_client_t *c, dp_ps_stamp_t *out);
/* Sum over shards (dp_ps_client_version's figure for that pull). */
uint64_t dp_ps_stamp_sum(const dp_ps_stamp_t *s);

#endif
