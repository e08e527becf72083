/* shard: one parameter-server shard's state and its update, without sockets —
 * the float range it owns, those parameters and their optimizer state, the
 * version, the counters, and the snapshots PARAMS replies send. The event
 * loop (server/loop/ps.c) drives it through a policy (server/core/policy.h); a
 * simulator can drive the very same code with no network at all.
 *
 * Invariants:
 *  - w holds floats [lo, hi) of the flat parameter vector (model parameters
 *    in dp_model_t order), initialised by dp_model_init_params over the FULL
 *    vector with the seed, so any sharding and the standalone trainer start
 *    from identical weights.
 *  - version counts optimizer steps of this shard; a step with lr scheduled
 *    at the version before it makes Adam's t the version after it.
 *  - w, state and version change only in dp_shard_step / dp_shard_step_mean
 *    and dp_shard_adopt (an early step's commit, server/core/shard_early.h), and
 *    a checkpoint restore (server/core/shard_checkpoint.h); acc only in
 *    dp_shard_step_mean, dp_shard_accumulate and a sync dp_shard_adopt.
 *  - w is the data of snap, the current version's buffer, which PARAMS
 *    replies hand to ZeroMQ as they are (no copy). A step writes w in place
 *    only while nobody else holds snap; otherwise it writes the new version
 *    into another buffer (one of the retired ones ZeroMQ has let go of, or a
 *    new one) and that becomes snap: a reply in flight never sees a torn
 *    vector, and steady state allocates nothing. At most DP_SHARD_RETIRED
 *    old buffers are kept for reuse.
 *  - Floats of state tensors (a tensor table's dp_param_t.trainable 0:
 *    batch norm's running statistics, counters) are not stepped: a push
 *    carries the worker's current value there, and a step sets them to it
 *    (async, ssp: the pushed value, in the order pushes are applied; sync:
 *    the mean of the R values). The optimizer's state for them is unused.
 *  - Gradients handed in are already valid: their slices tile [lo, hi)
 *    exactly and every float is finite (the loop checks that with
 *    proto/wire.h before anything here runs). */
#ifndef DP_SHARD_H
#define DP_SHARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "kernels/optim.h"
#include "kernels/optim_dev.h"

/* Part of a gradient: floats [offset, offset + len / 4) of the flat vector.
 * data may sit at any byte address (ZeroMQ's zero-copy receive). */
typedef struct {
    const void *data;
    size_t len;            /* bytes */
    uint64_t offset;       /* first float, in the flat vector */
} dp_grad_slice_t;

/* What the shard counts (reported by STATS and the metrics lines). */
typedef struct {
    uint64_t applied;       /* gradients used: applied (async, ssp) or accumulated (sync) */
    uint64_t dropped;       /* valid but not used: stale or duplicate (sync) */
    uint64_t rejected;      /* pushes refused: ACK rejected, or an ERROR to a worker's PUSH */
    uint64_t requests_refused; /* every other request answered with an ERROR (not admitted, no
                                * HELLO, a bad pull, a refused HELLO, a broken message) */
    uint64_t malformed;     /* messages answered with ERROR (pushes and requests alike) */
    uint64_t staleness_sum; /* async / ssp: over applied gradients */
    uint64_t staleness_max;
    uint64_t repeats;       /* pushes of a (worker, step) already applied: acknowledged, not applied */
    uint64_t steps_early;   /* steps made early (server/core/shard_early.h) and committed */
    uint64_t early_dropped; /* early steps given up (their work wasted) */
} dp_shard_counts_t;

/* Floats [lo, hi) local to a shard of the model's parameter `param`. */
typedef struct {
    size_t lo, hi;
    int param;
} dp_shard_bound_t;

/* A buffer of the shard's n parameters: the live one (dp_shard_t.snap), or
 * an older version still held by replies in flight, or a retired one kept
 * for reuse. Freed by the last dp_snap_unref (which may run on ZeroMQ's I/O
 * thread, hence the atomic count). version and crc are the main thread's. */
typedef struct {
    atomic_int refs;
    uint64_t version;      /* the version data holds (while it is the live buffer) */
    uint32_t crc;          /* CRC-32 of data at version, when crc_ok */
    int crc_ok;            /* crc is computed for this version */
    size_t n;
    float *data;           /* n floats, 64-byte aligned */
    int owned;             /* data is heap memory freed with the buffer (else a shm slot) */
    int slot;              /* shm slot index (proto/shm.h), or -1 */
} dp_snap_t;

#define DP_SHARD_RETIRED 2 /* old buffers kept for the next out-of-place step */

typedef struct dp_pool dp_pool_t;
typedef struct dp_shard_dc dp_shard_dc_t;

typedef struct {
    dp_model_t model;
    dp_optim_conf_t optim;
    int index, count;      /* shard index of count */
    size_t lo, hi, n;      /* the float range and its length */
    float *w;              /* n floats: live parameters, snap->data */
    float *state;          /* n * state_per floats of optimizer state */
    int state_per;
    float *acc;            /* sync: n floats, the sum of this version's gradients */
    int acc_count;         /* gradients in acc */
    float *scratch;        /* n floats: a gradient gathered / realigned */
    uint64_t version;
    dp_shard_counts_t counts;
    dp_snap_t *snap;       /* the live buffer, holding w (our reference) */
    dp_snap_t *snap16;     /* w in bfloat16 at snap16->version (our reference), or NULL */
    dp_snap_t *retired[DP_SHARD_RETIRED]; /* older buffers (our references), or NULL */
    dp_pool_t *pool;       /* threads of the optimizer sweep (NULL: the caller's only) */
    /* Called after each step with the new live buffer (the shm publisher);
     * NULL: none. */
    void (*on_step)(void *arg, dp_snap_t *snap);
    void *on_step_arg;
    /* Where a step that must not write in place gets its buffer: a
     * callback that may offer one (shm slots), else the retired list or
     * the heap. NULL: retired list or heap. */
    dp_snap_t *(*take_buffer)(void *arg);
    void *take_buffer_arg;
    uint64_t *worker_step; /* per worker: the last Push.step applied here (0: none), so a
                              repeated push is applied once and a restarted worker resumes;
                              NULL until dp_shard_track_steps */
    uint64_t *worker_seen; /* per worker: the highest Push.step handled here (applied,
                              dropped or refused once its step passed), >= worker_step;
                              the next step may be at most one past it */
    unsigned char *step_first; /* per worker: 1 until its first stepped push since this shard
                                  started, which may also skip step_slack steps */
    uint64_t step_slack;   /* steps a worker may have made that a restore lost
                              (--checkpoint-every); 0: none */
    int n_workers;         /* entries of worker_step, worker_seen and step_first */
    size_t (*state_ranges)[2]; /* [lo, hi) local to the shard: floats of the model's state
                                  tensors (dp_param_t.trainable 0), which a step sets to the
                                  pushed value (sync: the mean of the R pushed) instead of
                                  stepping them */
    int n_state_ranges;
    dp_shard_bound_t *bounded; /* the state floats that are variances or counts (never
                                  negative), as ranges local to the shard */
    int n_bounded;
    dp_shard_dc_t *dc;     /* delay compensation (server/core/shard_dc.h), NULL when off */
    dp_snap_t *spare;      /* a buffer handed back (a dropped early step's), which the next
                              step that needs one takes first (our reference), or NULL */
    /* --device (dp_shard_set_device): the live weights and the optimizer
     * state kept and stepped on a device (kernels/optim_dev.h); NULL: on
     * the host. With one, w is still the live version's host copy (copied
     * off the device after each step, what replies and checkpoints read),
     * but state is the host's copy only as of dp_shard_device_state. */
    dp_optim_dev_t *dev;   /* ours (destroyed by fini) */
    float *d_w;            /* n floats on dev: the live weights */
    float *d_state;        /* n * state_per floats on dev (NULL without state) */
    float *d_g;            /* n floats on dev: the step's gradient (an early step's parts
                              too: any other step drops that first) */
    const float *d_g_of;   /* the host gradient whose upload d_g holds, compensated there
                              (dp_shard_dc_apply): the next step by it takes d_g as it is;
                              NULL: none (every step clears it) */
    float *ahead;          /* n floats on the host: an early sync step's mean on its way up
                              (NULL until the first) */
} dp_shard_t;

/* The float range shard i of k owns out of n: [floor(i*n/k), floor((i+1)*n/k)). */
void dp_shard_range(size_t n, int i, int k, size_t *lo, size_t *hi);

/* Shard index of count over model m, initialised from seed, stepped by
 * optim. -1 with err on a bad index / count. */
int dp_shard_init(dp_shard_t *s, const dp_model_t *m, int index, int count, uint64_t seed,
                  const dp_optim_conf_t *optim, char *err);
/* The same with the full vector's initial values given (full[0..m->n_floats):
 * a --init file's), instead of drawn from a seed. */
int dp_shard_init_values(dp_shard_t *s, const dp_model_t *m, int index, int count,
                         const float *full, const dp_optim_conf_t *optim, char *err);
/* Frees what init allocated; safe on a zeroed or finished shard. A snapshot
 * still held elsewhere lives until its last reference goes. */
void dp_shard_fini(dp_shard_t *s);

/* The optimizer sweep on n_threads threads (the caller's and n_threads - 1
 * more); 1 (the default) runs it on the caller only. Element-wise, so the
 * result has the same bits whatever the count. */
int dp_shard_set_threads(dp_shard_t *s, int n_threads, char *err);

/* A heap buffer of n floats with one reference (the caller's). */
dp_snap_t *dp_snap_new(size_t n);
/* Heap buffers of parameters alive in this process (live, retired, bfloat16
 * and those only replies in flight still hold): what the shard's memory
 * bound counts (server/loop/ps.c, docs/SECURITY.md "Limits"). */
int dp_snap_alive(void);

/* Keep the last applied and the highest handled step of n_workers workers
 * (all 0). */
void dp_shard_track_steps(dp_shard_t *s, int n_workers);
/* Is this step of a worker plausible? A worker numbers its steps 1, 2, 3,
 * ... and repeats only steps it sent, so its next one is at most one past
 * the highest this shard handled from it; only its first since the shard
 * started may skip step_slack more (the steps a restore lost). Step 0 (no
 * step) and untracked shards always are. 0 yes; -1 with why (n bytes). */
int dp_shard_step_check(const dp_shard_t *s, int worker, uint64_t step, char *why, size_t n);
/* A plausible step of the worker was handled (whatever became of its push). */
void dp_shard_step_handled(dp_shard_t *s, int worker, uint64_t step);
/* Was this worker's step applied already? Step 0 (a push without a step)
 * and untracked shards never are. */
int dp_shard_step_seen(const dp_shard_t *s, int worker, uint64_t step);
/* The worker's step was applied (kept when it is the newest). */
void dp_shard_step_done(dp_shard_t *s, int worker, uint64_t step);

/* The learning rate of the next step (the schedule at the current version). */
float dp_shard_lr(const dp_shard_t *s);

/* A gradient with bfloat16 slices (bf16[f] set: g[f].len bytes of 2-byte
 * elements): all of it widened (or copied) into scratch, g[0] made that one
 * float32 slice of the whole range, 1 returned (the new slice count); n
 * when no slice is bf16 (g untouched). The slices must tile the range
 * (dp_wire_check_range). */
int dp_shard_widen(dp_shard_t *s, dp_grad_slice_t *g, const int *bf16, int n);

/* The current version in bfloat16 (n uint16 in data), made once per
 * version, with a reference for the caller (dp_snap_unref). */
dp_snap_t *dp_shard_snapshot_bf16(dp_shard_t *s);

/* Does every float of g (n slices) pass the wire's finite check? Split over
 * the sweep's threads. 0 yes, 1 no (the caller names the element through
 * dp_wire_check_finite). */
int dp_shard_grad_nonfinite(dp_shard_t *s, const dp_grad_slice_t *g, int n);

/* A push sets the state floats to the worker's values (above): those of a
 * variance or a count (a state tensor named *.running_var,
 * *.num_batches_tracked or *.count: batch norm's, obsnorm's) must not be
 * negative, or every worker's next forward takes the square root of a
 * negative number. 0 when g (n slices tiling the range) keeps them so;
 * else -1 and err names the tensor, the element and the value. */
int dp_shard_state_check(const dp_shard_t *s, const dp_grad_slice_t *g, int n, char *err);

/* scratch[off, off + cnt) = src[off, off + cnt), each block checked finite
 * as it is copied (dp_wire_copy_finite), split over the sweep's threads:
 * a gradient from memory another process may write (shared memory) is
 * checked and applied only as this private copy. -1 with err naming the
 * first bad element. */
int dp_shard_copy_grad(dp_shard_t *s, const float *src, size_t off, size_t cnt, char *err);

/* Part k of nk of the shard's range, as the sweep's threads split it (cut
 * at multiples of 16 floats): [*lo, *hi); 0 when the part is empty. */
int dp_shard_part(const dp_shard_t *s, int k, int nk, size_t *lo, size_t *hi);

/* Keep w and the optimizer state on dev from now on (the shard owns dev
 * then, also on failure): both copied up, and every step (dp_shard_step,
 * dp_shard_step_mean, an early step's parts and its commit) is one fused
 * step there, the new version copied off into the live host buffer; delay
 * compensation's saved weights and MS move there too (server/core/shard_dc.h)
 * and its transform runs there before the step. The same bits as on the
 * host for the "cpu" stand-in (tests/unit/test_shard_device.c). */
int dp_shard_set_device(dp_shard_t *s, dp_optim_dev_t *dev, char *err);
/* With a device: the optimizer state (and DC-ASGD-a's MS) copied off it
 * into s->state (and s->dc->ms): a checkpoint's; those host copies are the
 * only thing written, hence const. Or, after w, state and MS were written
 * on the host (a restore), all copied up. Nothing without one. */
void dp_shard_device_state(const dp_shard_t *s);
void dp_shard_device_reload(dp_shard_t *s);

/* One optimizer step of the whole range by gradient g (n slices) at lr. */
void dp_shard_step(dp_shard_t *s, const dp_grad_slice_t *g, int n, float lr);

/* For the early step (server/core/shard_early.h), which steps a push before it
 * is whole into a version of its own: */
/* A buffer of n floats for a next version (ours: the reference goes to the
 * caller): the spare, the owner's (shm slots), a retired one nobody holds,
 * or a new one. */
dp_snap_t *dp_shard_take_buffer(dp_shard_t *s);
/* Hand b (one of dp_shard_take_buffer's, unused) back as the spare. */
void dp_shard_keep_spare(dp_shard_t *s, dp_snap_t *b);
/* Floats [lo, hi) of the range (local to the shard) stepped from the live
 * weights into next (n floats) as step version + 1 at lr: by g (the
 * shard's n floats, on the host) when count is 0, else by the mean of
 * acc's count - 1 gradients and g ((acc + g) x 1/count, acc untouched);
 * the optimizer state of those floats copied from the live state into
 * state (n * state_per floats) and stepped there. The live weights, state
 * and acc are only read. With a device, next and state are the device's
 * (n and n * state_per floats of it): the part is copied up into d_g and
 * stepped there. */
void dp_shard_step_ahead(dp_shard_t *s, float *next, float *state, const float *g, int count,
                         float lr, uint64_t version, size_t lo, size_t hi);
/* next (every float stepped by dp_shard_step_ahead from this version;
 * ours: its reference) becomes the live buffer at the next version and
 * *state the live optimizer state, *state getting the old one; of_acc:
 * the step was sync's mean of acc, which is cleared. With a device, the
 * early step stepped into *d_next and *state there: they become the
 * device's live weights and state (the old ones handed back in their
 * place, nothing copied on the device) and next, a host buffer, gets the
 * new version copied off; d_next is NULL without one. */
void dp_shard_adopt(dp_shard_t *s, dp_snap_t *next, float **state, float **d_next, bool of_acc);

/* Sync: add g to acc (acc_count + 1). */
void dp_shard_accumulate(dp_shard_t *s, const dp_grad_slice_t *g, int n);
/* Sync: one step by the mean of acc at the scheduled lr; acc cleared.
 * Nothing happens when acc is empty. */
void dp_shard_step_mean(dp_shard_t *s);

/* The current version's buffer (the live one: no copy), with one
 * reference for the caller, to be released by dp_snap_unref. */
dp_snap_t *dp_shard_snapshot(dp_shard_t *s);
/* Its CRC-32, computed on first use per version (main thread only). */
uint32_t dp_snap_crc(dp_snap_t *snap);
/* Drop one reference of hint (a dp_snap_t); the signature is ZeroMQ's free
 * callback's, so a reply can hand it over as is. data is ignored. */
void dp_snap_unref(void *data, void *hint);

#endif
