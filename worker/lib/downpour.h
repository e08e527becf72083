/* downpour.h: Downpour's client library (libdownpour.so) — a training loop
 * of your own, in C or through the Python package `downpour`, as a worker
 * of downpour-ps shards.
 *
 * It is the C worker's own client (worker/client/ps_client.h), not a second one:
 * the same HELLO and model check, pulls from every shard in parallel,
 * pushes stamped with the versions they were computed on, heartbeats from
 * a thread of its own, CURVE, shared memory on this host, bfloat16 on the
 * wire; a shard that restarts is greeted again and the request repeated,
 * and a repeated push (same step) is applied once.
 *
 * A client is one worker (its task index) of one model: a table of named
 * float32 tensors (downpour_connect_table, the servers started with
 * `downpour-ps --init FILE.safetensors` holding the same table) or a
 * Downpour model spec (downpour_connect_spec, servers started with
 * `--model SPEC`). The model's parameters are one flat float vector, the
 * tensors laid out one after the other in table order (downpour_tensor
 * gives each one's offset).
 *
 *     downpour_opts_t o;
 *     downpour_opts_init(&o);
 *     o.endpoints = "tcp://10.0.0.1:5555,tcp://10.0.0.2:5555";
 *     o.task_index = 1;
 *     downpour_t *h;
 *     if (downpour_connect_table(&h, tensors, n, &o) != 0) {
 *         fprintf(stderr, "%s\n", downpour_last_error()); exit(1);
 *     }
 *     for (uint64_t step = 1; step <= steps; step++) {
 *         downpour_pull(h, params);                // the servers' weights
 *         loss = my_gradient(params, grads);       // your model, your data
 *         downpour_push(h, grads, loss, batch, step, NULL);
 *     }
 *     downpour_finish(h);
 *     downpour_close(h);
 *
 * A push's vector holds, at a trainable tensor, its gradient; at a state
 * tensor (trainable 0: batch norm's running statistics, counters), the
 * worker's current value of it, which the servers combine instead of
 * stepping (README.md, "Bring your own model").
 *
 * Errors: a call that fails returns -1; downpour_last_error() is its one
 * line (for the calling thread) and downpour_last_error_code() its kind. A
 * push the servers refuse (a non-finite gradient, a bad shape) is not a
 * failure of the call: res->rejected counts it, res->reason says why.
 *
 * Threads: one client per thread (a client is not thread-safe); different
 * clients may be used from different threads. Every blocking call is
 * bounded by the timeout (a pull the servers hold in sync / ssp by 20 of
 * them, as long as the shards answer heartbeats).
 *
 * Versions: DOWNPOUR_API_VERSION counts incompatible changes of this
 * header; the library's soname is libdownpour.so.DOWNPOUR_API_VERSION.
 * Structs that may grow (downpour_opts_t) are filled by their _init call
 * first, which stamps the version they were compiled with. */
#ifndef DOWNPOUR_H
#define DOWNPOUR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DOWNPOUR_API_VERSION 1
#define DOWNPOUR_VERSION "1.0.0"  /* the library's: API.MINOR.PATCH */
#define DOWNPOUR_NAME_LEN 96       /* a tensor name, NUL included, at most */
#define DOWNPOUR_MAX_DIMS 8
#define DOWNPOUR_MAX_TENSORS 1024

/* The library's DOWNPOUR_VERSION and DOWNPOUR_API_VERSION, as built (a
 * program checks they are those it was compiled with). */
const char *downpour_version(void);
int downpour_api_version(void);

typedef struct downpour downpour_t;

/* What a failed call ran into (downpour_last_error_code). */
typedef enum {
    DOWNPOUR_OK = 0,
    DOWNPOUR_ERR_TIMEOUT = 1,     /* a shard owing a reply was silent past the timeout */
    DOWNPOUR_ERR_DEFERRED = 2,    /* a shard answered heartbeats but held the reply too long */
    DOWNPOUR_ERR_INTERRUPTED = 3, /* downpour_interrupt was called */
    DOWNPOUR_ERR_REFUSED = 4,     /* a shard answered with an error: STATS refused to a
                                   * worker that is not the chief, a bad push, ... */
    DOWNPOUR_ERR_ARGS = 5,        /* bad arguments: a table, an option, a missing key file */
    DOWNPOUR_ERR_OTHER = 6,       /* anything else */
    DOWNPOUR_ERR_MODEL_MISMATCH = 7, /* a shard serves another model (table or spec) than
                                      * this client's: connecting again will not help */
} downpour_err_t;

/* The calling thread's last failure: one line ("" when none), valid until
 * its next call into the library. */
const char *downpour_last_error(void);
downpour_err_t downpour_last_error_code(void);

/* How a client connects; downpour_opts_init gives the defaults. */
typedef struct {
    int api;                  /* DOWNPOUR_API_VERSION, set by downpour_opts_init */
    const char *endpoints;    /* "tcp://h:p[,tcp://h2:p2...]" in shard order; NULL: the ps
                               * job of the TF_CONFIG environment variable */
    int task_index;           /* this worker (0 is the chief); -1: TF_CONFIG's task */
    double timeout_s;         /* silence allowed to a shard owing a reply (30) */
    const char *curve_secret; /* CURVE: this worker's secret key file (downpour keygen);
                               * NULL: plain TCP */
    const char *curve_server; /* CURVE: the servers' public key file, or a comma list in
                               * endpoint order */
    const char *wire;         /* "fp32" (NULL) or "bf16": tensors in frames as bfloat16 */
    const char *transport;    /* "auto" (NULL: shared memory with a shard on this host),
                               * "shm" or "zmq" */
} downpour_opts_t;

void downpour_opts_init(downpour_opts_t *o);

/* One tensor of a table. */
typedef struct {
    const char *name;         /* a state_dict key: printable ASCII, no spaces or quotes,
                               * shorter than DOWNPOUR_NAME_LEN, unique */
    int ndim;                 /* 0 (a scalar) .. DOWNPOUR_MAX_DIMS */
    const int64_t *shape;     /* [ndim] */
    int trainable;            /* 1: trained by gradients; 0: state (see above) */
} downpour_tensor_t;

/* Connect to the shards as worker o->task_index of the table t[0..n) (the
 * order of the flat vector) and say HELLO to each (waiting up to the
 * timeout for a server that is not up yet). The servers must hold the same
 * table (names, shapes, order, trainable flags): a server holding another
 * model answers "model mismatch: ..." (DOWNPOUR_ERR_MODEL_MISMATCH). *out is NULL
 * after a failure. */
int downpour_connect_table(downpour_t **out, const downpour_tensor_t *t, int n,
                           const downpour_opts_t *o);

/* The same table with a row table of width rows_width beside it (a sparse
 * embedding: rows addressed by 64-bit keys, held by the servers and pulled
 * and pushed by key, downpour_rows_pull / downpour_rows_push). The servers'
 * --init file says the same width in its metadata ("downpour.rows": D);
 * rows_width 0 is downpour_connect_table. */
int downpour_connect_table_rows(downpour_t **out, const downpour_tensor_t *t, int n,
                                int rows_width, const downpour_opts_t *o);

/* The same for servers running a Downpour model spec (`downpour-ps --model
 * SPEC --input CxHxW`): its tensors are the spec's (conv1.weight, ...). */
int downpour_connect_spec(downpour_t **out, const char *spec, int in_c, int in_h, int in_w,
                          const downpour_opts_t *o);

/* Consistency modes (the servers' --mode). */
typedef enum { DOWNPOUR_SYNC = 1, DOWNPOUR_ASYNC = 2, DOWNPOUR_SSP = 3 } downpour_mode_t;

/* The servers' policy, from their WELCOMEs, and where this worker stands. */
typedef struct {
    downpour_mode_t mode;
    int num_workers;          /* workers the servers expect */
    int replicas;             /* sync: gradients aggregated per step */
    int staleness;            /* ssp: bound */
    int num_shards;
    int task_index;           /* this worker */
    uint64_t resume_step;     /* the last step of this worker every shard has applied: a
                               * restarted worker goes on after it (0: a new worker) */
    long local_steps;         /* the servers' --local-steps H: each push is the weights
                               * pulled minus those reached after H steps of the caller's
                               * own optimizer, and the servers step by their outer one (1:
                               * every push a gradient) */
} downpour_info_t;

int downpour_info(const downpour_t *h, downpour_info_t *out);

/* "sync", "async", "ssp". */
const char *downpour_mode_name(downpour_mode_t m);

/* The flat vector: its floats, and each tensor's place in it. */
size_t downpour_num_floats(const downpour_t *h);
int downpour_num_tensors(const downpour_t *h);

typedef struct {
    char name[DOWNPOUR_NAME_LEN];
    int ndim;
    int64_t shape[DOWNPOUR_MAX_DIMS]; /* [ndim] */
    size_t offset;            /* in floats, into the flat vector */
    size_t count;             /* floats */
    int trainable;
} downpour_tensor_info_t;

/* Tensor i (0 .. downpour_num_tensors - 1). */
int downpour_tensor(const downpour_t *h, int i, downpour_tensor_info_t *out);

/* The servers' current weights into params[downpour_num_floats]. Blocks
 * while the servers hold the pull (sync: until the step this worker's last
 * push belongs to is applied; ssp: while it is too far ahead). */
int downpour_pull(downpour_t *h, float *params);

/* The same pull, each tensor straight into its own buffer: dst[i] (count
 * floats of tensor i, or NULL to leave tensor i out) for every tensor i.
 * One copy from what arrived into dst, no buffer in between. */
int downpour_pull_tensors(downpour_t *h, float *const *dst);

/* The version (summed over shards) the last pull got: the one the next
 * push is stamped with. */
uint64_t downpour_version_pulled(const downpour_t *h);


/* What the shards said of one push. */
typedef struct {
    int applied, dropped, rejected; /* shard replies, summed over shards */
    uint64_t staleness_max;   /* over shards */
    double staleness_mean;    /* over shards */
    uint64_t version;         /* summed over shards, after the push */
    char reason[160];         /* the first reason a shard gave for not applying it, or
                               * "repeat: ..." for a step it had applied already; "" */
} downpour_push_result_t;

/* grads[downpour_num_floats] (untouched, and not kept after the call), as
 * step `step` (1, 2, ...: each shard applies a step of a worker once) of
 * this worker, computed on the weights of the last pull, with its loss
 * and batch size. A refusal is in res (may be NULL), not a failure. */
int downpour_push(downpour_t *h, const float *grads, float loss, int batch, uint64_t step,
                  downpour_push_result_t *res);

/* --local-steps auto (DyLU, common/dylu.h): the servers set no H; each
 * worker's rounds follow its speed against the crew's fastest.
 * downpour_local_auto: 1 when the servers run it (info.local_steps is then
 * the fastest worker's H), else 0.
 * downpour_round_steps: the data steps of this worker's next round: H
 * until its own step time and the crew's are known, then H x the
 * fastest's time / its own (at least 1); info.local_steps without auto.
 * downpour_push_round: before each downpour_push of a round, its data
 * steps (1 .. H) and the round's compute ms per step (the caller's clock
 * around its training steps, not the pull or push; 0: not measured), which
 * the library folds into this worker's step time and sends with the
 * push; the push's ACKs bring the crew's fastest. Without auto, or out of
 * range: -1, DOWNPOUR_ERR_ARGS. */
int downpour_local_auto(const downpour_t *h);
long downpour_round_steps(const downpour_t *h);
int downpour_push_round(downpour_t *h, uint32_t steps, double round_ms);

/* An elastic crew's batches, dealt by shard 0 (the servers' --workers
 * MIN:MAX), as downpour-worker trains them: batches of `batch` from
 * `samples`, for `epochs` epochs or (epochs 0) `steps` steps a worker; the
 * chief's plan is the run's, and another worker's that differs is refused
 * (DOWNPOUR_ERR_MODEL_MISMATCH, one line: "deal plan: ..."). From then on
 * every pull asks for the batch of this worker's next push step (the last
 * step pushed + 1), a repeated pull gets the same batch, and the push of
 * that step acknowledges it; a batch of a worker that dies goes to another.
 * samples at most INT_MAX. */
int downpour_deal_plan(downpour_t *h, uint64_t samples, uint32_t batch, uint64_t epochs,
                       uint64_t steps);

/* The batch the last pull was dealt: batch `index` of epoch `epoch`, to be
 * pushed as `step`; end: every batch of the run is trained (stop pulling,
 * finish). -1 when the last pull brought none. */
typedef struct {
    int end;
    uint64_t step, epoch, index;
} downpour_dealt_t;

int downpour_dealt(const downpour_t *h, downpour_dealt_t *out);

/* The samples of a dealt batch: idx[batch] gets the positions [index *
 * batch, (index + 1) * batch) of epoch `epoch`'s permutation of
 * 0 .. samples - 1 drawn from seed, as downpour-worker's --seed draws it
 * (every worker of the crew gives the same seed). */
int downpour_deal_indices(uint64_t samples, uint32_t batch, uint64_t seed, uint64_t epoch,
                          uint64_t index, int64_t *idx);
/* The whole of epoch `epoch`'s permutation, perm[samples]: batch `index`
 * is perm[index * batch .. (index + 1) * batch), what downpour_deal_indices
 * gives. A loop over many batches of an epoch draws it once and slices it
 * (the Python client does), where downpour_deal_indices draws it a call. */
int downpour_deal_permutation(uint64_t samples, uint64_t seed, uint64_t epoch, int64_t *perm);

/* The row table's width D (a spec's embed:D or downpour_connect_table_rows'
 * rows_width; 0: the model has none). */
int downpour_rows_width(const downpour_t *h);
/* The rows of keys[0..n) (distinct) into rows[n * D], from the shards that
 * hold them, in parallel; a key without a row reads as its initial value.
 * In sync, after this step's downpour_pull. */
int downpour_rows_pull(downpour_t *h, const uint64_t *keys, size_t n, float *rows);
/* The gradients grads[n * D] of rows of keys[0..n) (keys of the last
 * downpour_rows_pull, or fewer) as step `step` (1, 2, ...: applied once;
 * before this step's downpour_push, which in sync applies them with it). A
 * refusal is in res (may be NULL), not a failure. */
int downpour_rows_push(downpour_t *h, const uint64_t *keys, size_t n, const float *grads,
                       uint64_t step, downpour_push_result_t *res);

/* Pushes from the next on compressed, as downpour-worker's --compress and
 * --error-feedback: compress "none" (or NULL), "topk:F" (the fraction F of
 * each shard's slice with the largest magnitudes) or "sign" (1 bit a float
 * and a scale); error_feedback "on" (or NULL: what was not sent is added
 * to the next push) or "off". With the servers' --local-steps it is the
 * pseudo-gradient that is compressed. -1 for a value it does not know. */
int downpour_set_compress(downpour_t *h, const char *compress, const char *error_feedback);

/* Updates lost when a shard restarted from an older checkpoint. */
uint64_t downpour_updates_lost(const downpour_t *h);

/* The servers' counters (the chief only: another worker's STATS are refused). */
#define DOWNPOUR_STATS_BINS 1024
typedef struct {
    uint64_t applied, dropped, rejected; /* shard 0's */
    uint64_t version;         /* summed over shards */
    double staleness_mean;    /* over applied pushes, shard 0's */
    uint64_t staleness_max;
    uint64_t staleness_hist[DOWNPOUR_STATS_BINS]; /* pushes per staleness (last bin: or more) */
    int staleness_bins;       /* bins in use */
} downpour_stats_t;

int downpour_stats(downpour_t *h, downpour_stats_t *out);

/* One epoch of the batches shard 0 dealt (downpour_deal_plan), in samples:
 * trained (each sample once however the crew changed), repeated (a batch
 * pushed twice: a late push of a reclaimed lease), retrained_after_death
 * (batches a dead worker held, dealt again), batches dealt. */
typedef struct {
    uint64_t epoch, trained, repeated, retrained_after_death, batches;
} downpour_epoch_samples_t;

/* The chief: the epochs dealt so far, oldest first, into out[0, cap); *n
 * (may be NULL) the number shard 0 has, which may exceed cap. None for a
 * crew without a plan. */
int downpour_epoch_samples(downpour_t *h, downpour_epoch_samples_t *out, size_t cap, size_t *n);

/* This worker is done: the servers stop counting it (sync, ssp). */
int downpour_finish(downpour_t *h);
/* The same for a client that leaves before its last step (Ctrl-C, SIGTERM):
 * the servers log a leave, and an elastic sync crew (--workers MIN:MAX)
 * still waits for MIN live workers. */
int downpour_leave(downpour_t *h);

/* The chief: wait until every worker has finished (or gone silent past the
 * servers' heartbeat timeout), at most timeout_s; finishes this one first. */
int downpour_wait_all(downpour_t *h, double timeout_s);

/* The chief: stop every shard (each writes its final checkpoint first). */
int downpour_shutdown(downpour_t *h);

/* Make the call blocked on h (from another thread or a signal handler:
 * async-signal-safe) return -1 soon with DOWNPOUR_ERR_INTERRUPTED; the
 * client stays usable after downpour_interrupt_clear. */
void downpour_interrupt(downpour_t *h);
void downpour_interrupt_clear(downpour_t *h);

/* Close the sockets, stop the heartbeats, free h (NULL: nothing). */
void downpour_close(downpour_t *h);

#ifdef __cplusplus
}
#endif

#endif
