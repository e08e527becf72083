/* ps_shm: a shard's shared memory for co-located workers (proto/shm.h) —
 * the parameter segment whose slots become the shard's live buffers (a step
 * writes the next version straight into a free slot: a pull through shared
 * memory costs the server nothing), and one gradient segment per worker
 * that asked for it. The slots can be the master copy because the segment
 * is sealed against every write but this process's own mapping
 * (proto/shm.h): workers, or any process of the user, only read it.
 *
 * Invariants: made at the first Hello.shm the shard grants, then the
 * shard's buffers are slots (the heap is only a fallback when every other
 * slot is held by a ZeroMQ reply in flight: those versions go out as
 * frames); a slot's seq is odd exactly while a step writes it; a gradient is
 * copied out of its segment and checked finite before anything uses it. No
 * sockets here. */
#ifndef DP_PS_SHM_H
#define DP_PS_SHM_H

#include <stdint.h>

#include "proto/downpour.pb-c.h"
#include "server/core/shard.h"

typedef struct dp_ps_shm dp_ps_shm_t;

/* The parameter segment for shard s (its index names it), the current
 * parameters copied into slot 0, which becomes the live buffer; room for
 * n_workers gradient segments. */
int dp_ps_shm_new(dp_ps_shm_t **out, dp_shard_t *s, int n_workers, char *err);
/* Unlinks and unmaps everything; the shard goes back to heap buffers (the
 * live one copied out). Call once ZeroMQ holds no buffer (after the
 * context ended). Safe twice and on NULL. */
void dp_ps_shm_destroy(dp_ps_shm_t **x_p);

/* Worker w's gradient segment (made on first use) and the parameter
 * segment's name. The names stay valid while x lives. A grant holds for
 * the HELLO that got it: */
int dp_ps_shm_grant(dp_ps_shm_t *x, int worker, const char **params_name, const char **grad_name,
                    char *err);
/* worker w said HELLO again (without shared memory, or from a peer not on
 * this host): its pushes may no longer name its segment, which stays for a
 * later grant. Safe on NULL. */
void dp_ps_shm_revoke(dp_ps_shm_t *x, int worker);

/* The live version's slot and seq, 1; 0 when the live buffer is not a slot
 * (then the reply goes as a frame). */
int dp_ps_shm_params(dp_ps_shm_t *x, uint32_t *slot, uint64_t *seq);

/* A PUSH whose descriptors (already checked to tile the shard's range) are
 * in worker w's gradient segment: copied into the shard's scratch and
 * checked finite there, one slice returned in g. -1 with err: no segment
 * granted to w ("malformed"), or a non-finite value (a rejection,
 * *rejected = 1). */
int dp_ps_shm_gradient(dp_ps_shm_t *x, int worker, const Downpour__Envelope *env,
                       dp_grad_slice_t *g, int *rejected, char *err);

/* Worker w's gradient segment (the shard's n floats), where a part of a
 * push in parts through shared memory lies; NULL when w holds no grant.
 * Safe on NULL. */
const float *dp_ps_shm_grad_floats(dp_ps_shm_t *x, int worker);

#endif
