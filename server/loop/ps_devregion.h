/* ps_devregion: a shard's device region for co-located workers
 * (proto/devregion.h) — made at the first Hello.devregion the shard grants,
 * when it has a device region provider: the CPU stand-in under the test
 * hook DP_TEST_DEVMEM=standin (proto/devmem.h), else CUDA IPC for a shard
 * run with --device cuda:N (its ring on that device). Each version a PULL
 * through the region asks for is published into the ring first: a host
 * copy of the snapshot, or on a device shard whose ring is on its device a
 * device-to-device copy of its live weights (d_w) while they are the
 * snapshot's version; a PUSH through the region is its worker's slot,
 * taken (copied out, checked by proto/devregion's rules) before anything
 * else looks at the push, so a push that is refused later still leaves the
 * slot free for the next one.
 *
 * Invariants: a worker's slot is its worker id's; a push is taken only from
 * a worker whose last HELLO was granted the region; the taken gradient is
 * this module's copy (x->scratch), never the slot; the region is retired on
 * destroy and its memory freed only once no worker says it maps it. No
 * sockets here. */
#ifndef DP_PS_DEVREGION_H
#define DP_PS_DEVREGION_H

#include <stdint.h>

#include "proto/devmem.h"
#include "proto/downpour.pb-c.h"
#include "server/core/shard.h"

#define DP_PS_DEVREGION_RING 4 /* versions in the ring: pins of 2 workers leave one to write */

typedef struct dp_ps_devr dp_ps_devr_t;

/* The region for shard s on ops: a ring of the shard's range, n_workers
 * slots (at most DP_DEVREGION_MAX_WORKERS). on_device: ops allocate on the
 * shard's device (s->dev), so versions go into the ring from d_w there. */
int dp_ps_devr_new(dp_ps_devr_t **out, dp_shard_t *s, int n_workers, const dp_devmem_ops_t *ops,
                   int on_device, char *err);
/* The provider the region was made on. */
const dp_devmem_ops_t *dp_ps_devr_ops(const dp_ps_devr_t *x);
/* Retires the region, frees what no worker maps. */
void dp_ps_devr_destroy(dp_ps_devr_t **x_p);
/* Worker's offer into o (whose bytes point into x: valid until the next
 * grant); the grant holds until the worker's next HELLO (revoke). */
int dp_ps_devr_grant(dp_ps_devr_t *x, int worker, Downpour__DevRegionOffer *o, char *err);
void dp_ps_devr_revoke(dp_ps_devr_t *x, int worker);
/* The snapshot's version into the ring (unless it is the newest already):
 * 1 it is the newest entry, 0 the ring is busy (every other entry pinned:
 * answer in frames). */
int dp_ps_devr_publish(dp_ps_devr_t *x, const dp_snap_t *snap);
/* Take worker's push from its slot: 0 taken (the gradient in *g, x's copy
 * of the shard's whole range, finite), -1 refused with one line in err
 * (nothing taken: not granted, no completed push, a count jump, not
 * finite). */
int dp_ps_devr_take(dp_ps_devr_t *x, int worker, dp_grad_slice_t *g, char *err);

#endif
