/* shard_dc: a shard's delay compensation (DC-ASGD, Zheng et al. ICML 2017;
 * the rule is kernels/optim.h's dp_optim_dc_range): the weights each worker
 * pulled, so a gradient can be compensated for the steps the shard took
 * since, and DC-ASGD-a's mean square MS.
 *
 * The weights a gradient was computed on are the version its push is
 * stamped with. When the shard answers a worker's pull it copies the
 * weights it sends into one of that worker's DP_DC_SLOTS slots (n floats
 * each, made on first use); a push whose stamp matches a slot's version is
 * compensated against it and frees the slot. A worker in turn (pull, then
 * push) uses one slot: n floats of memory per worker per shard. A worker
 * with --overlap pulls step k+1's weights before it pushes step k's
 * gradient, so it holds a second slot: 2n. A push no slot matches (the
 * shard restarted and the slots are gone, or the worker is more than two
 * pulls ahead) is applied uncompensated and counted in fallback.
 * Slots are not checkpointed; MS is (server/core/shard_checkpoint.h).
 *
 * With --wire bf16 the slot holds the float32 weights of the version, not
 * the bfloat16 rounding of them the worker computed on.
 *
 * On a device shard (dp_shard_set_device) the slots and MS live on the
 * device: a pull's weights are copied device to device from d_w, and a
 * push is copied up into d_g and compensated there (the optim_dev table's
 * dc, the same rule), which the step then takes as it is; ms is MS's host
 * copy only as of dp_shard_device_state (checkpoints). */
#ifndef DP_SHARD_DC_H
#define DP_SHARD_DC_H

#include <stdint.h>

#include "server/core/shard.h"

#define DP_DC_SLOTS 2 /* per worker: its last two pulls (overlap holds two) */

typedef struct {
    uint64_t version;      /* the version w holds */
    int held;              /* a pull not yet used by a push */
    float *w;              /* n floats (the device's on a device shard), NULL until first used */
} dp_dc_slot_t;

struct dp_shard_dc {
    int n_workers;
    dp_dc_slot_t *slot;    /* [n_workers * DP_DC_SLOTS] */
    float *ms;             /* DP_DC_ADAPTIVE: n floats of MS, else NULL */
    float *d_ms;           /* a device shard's MS on the device (n floats), else NULL */
    uint64_t compensated;  /* pushes compensated */
    uint64_t fallback;     /* pushes applied uncompensated: no slot held their version */
};

/* s->dc for n_workers workers when s->optim.dc is on (MS zero); nothing
 * when it is off. */
void dp_shard_dc_init(dp_shard_t *s, int n_workers);
/* Frees s->dc; safe when off and twice. Before s->dev goes. */
void dp_shard_dc_fini(dp_shard_t *s);
/* The shard just went onto s->dev (dp_shard_set_device): the slots' weights
 * and MS moved there. Nothing when off. */
void dp_shard_dc_to_device(dp_shard_t *s);

/* The worker was sent the current version's weights. */
void dp_shard_dc_pulled(dp_shard_t *s, int worker);
/* Replay: the worker's slot holds w (n floats of this shard's range) at
 * version, as in the recorded run; forget: it holds nothing (the recorded
 * push fell back). */
void dp_shard_dc_hold(dp_shard_t *s, int worker, uint64_t version, const float *w);
void dp_shard_dc_forget(dp_shard_t *s, int worker);

/* The worker's gradient g (n slices tiling the range) computed on version,
 * about to be applied to the current weights: compensated into scratch,
 * *one made that single slice and 1 returned; or 0 (fallback, counted; g
 * is applied as it is). MS follows g in both cases. The shard's sweep
 * threads share the work. */
int dp_shard_dc_apply(dp_shard_t *s, int worker, uint64_t version, const dp_grad_slice_t *g, int n,
                      dp_grad_slice_t *one);

/* On a device shard, g (n slices) compensated there by dp_shard_dc_apply
 * is only in d_g: copied off into scratch for whoever reads it on the host
 * (a recorded step's gradient norm), *one made that slice (the step by it
 * still takes d_g as it is) and 1 returned; else 0, nothing done. */
int dp_shard_dc_host(dp_shard_t *s, const dp_grad_slice_t *g, int n, dp_grad_slice_t *one);

#endif
