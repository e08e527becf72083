/* shard_early: the early step — a push in parts stepped part by part as
 * its parts arrive, under the worker's backward, instead of all at once
 * when the push is whole (docs/STREAMS.md, "The early step").
 *
 * Invariants:
 *  - At most one early step at a time, for one worker's push (owner,
 *    step): the first whose assembly (server/core/shard_parts.h) qualifies when
 *    none is in progress and the policy can say how the push would be
 *    stepped if it were whole now (dp_policy_early: async and ssp by the
 *    gradient itself, at the delay rule's lr; sync for the push that
 *    completes the step, by the mean of acc and it; never with delay
 *    compensation). In async none begins while another worker's push is
 *    being assembled too (it would likely step the shard first).
 *  - Each checked part is stepped from the live weights into a buffer of
 *    its own and a copy of the optimizer state (dp_shard_step_ahead): the
 *    live weights, state and acc, which pulls, checkpoints and every other
 *    push read, stay as they are until the commit.
 *  - The commit is the policy's explicit call (dp_shard_early_commit) when
 *    it steps the push the early step is for (dp_shard_early_of says
 *    which): it takes place only if the policy steps that push from the
 *    version the early step stepped from, at its lr, averaging its count,
 *    every float stepped; the buffer and state then become the live ones
 *    (dp_shard_adopt), with the bits a whole step has (the same float
 *    operations per element). Otherwise the push is stepped whole.
 *  - Everything else drops it (its work wasted, counted in early_dropped):
 *    the shard stepped by anything else first (dp_shard_early_overtaken,
 *    the policy's, before that step), a bad part, the push refused or not
 *    stepped as planned, the worker moving on to a newer step or saying
 *    HELLO again. A restore replaces the shard only at start (server/loop/ps.c),
 *    before any early step: there is nothing of one to drop then.
 *
 * Memory: one buffer of the shard's n floats (the shard's to give:
 * dp_shard_take_buffer; a dropped step's goes back as the spare, which the
 * next step takes first) and n * state_per floats of optimizer state,
 * allocated at the first early step and kept. On a device shard
 * (dp_shard_set_device) the next version and its state are stepped on
 * the device, in n + n * state_per floats of it allocated at the first
 * early step and kept (a drop leaves them for the next one, as the host's
 * state is kept; the commit swaps them with the live ones, nothing copied
 * there), and the host buffer only receives the new version at the
 * commit. Main thread only. */
#ifndef DP_SHARD_EARLY_H
#define DP_SHARD_EARLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/core/policy.h"
#include "server/core/shard.h"
#include "server/core/shard_parts.h"

typedef struct dp_shard_early {
    dp_shard_t *shard;
    const dp_shard_parts_t *parts; /* the assemblies it steps from (their buffers) */
    const dp_policy_t *policy; /* how a push would be stepped (dp_policy_early) */
    bool enabled;          /* --early-step */
    bool active;           /* an early step is in progress; the fields below are its */
    int owner;             /* the worker whose push it steps */
    uint64_t step;         /* that push's Push.step */
    uint64_t version;      /* the live version it steps from */
    const float *g;        /* the gradient of the shard's range it steps by (the owner's assembly) */
    float lr;
    int count;             /* sync: the gradients the step averages, acc's and g; 0: async */
    size_t done;           /* floats stepped */
    dp_snap_t *buf;        /* the next version (our reference); on a device shard the host
                              buffer it is copied off into at the commit */
    float *state;          /* n * state_per floats: its optimizer state (from the first early
                              step; the device's on a device shard) */
    float *d_w;            /* a device shard's: n floats of the device, the next version
                              (from the first early step), else NULL */
} dp_shard_early_t;

/* What became of a push's early step at an event. */
typedef enum {
    DP_EARLY_NONE,         /* nothing: the push has none (and got none) */
    DP_EARLY_BEGUN,        /* begun for the push, the parts in so far stepped */
    DP_EARLY_STEPPED,      /* the part just in stepped into it */
    DP_EARLY_COMMITTED,    /* it is the shard's next version */
    DP_EARLY_DROPPED,      /* given up */
} dp_early_result_t;

/* For the shard, whose pushes in parts assemble in parts, stepped as
 * policy would step them; enabled false: no early step ever begins. */
void dp_shard_early_init(dp_shard_early_t *e, dp_shard_t *shard, const dp_shard_parts_t *parts,
                         const dp_policy_t *policy, bool enabled);
/* Drops one in progress and frees the state: before the buffer could be a
 * shared-memory slot unmapped (dp_ps_shm_destroy). Safe on a zeroed one. */
void dp_shard_early_fini(dp_shard_early_t *e);

/* Is an early step of worker wid's push step in progress? */
bool dp_shard_early_of(const dp_shard_early_t *e, int wid, uint64_t step);

/* Events, each for a push of worker wid for step that passed the step
 * checks (dp_shard_step_check) and is not a repeat: */
/* A part taken by dp_shard_parts_add with result res: an early step of an
 * older step of wid dropped (the worker gave that push up); then, on
 * REJECTED this push's dropped; else the part stepped into this push's,
 * or this push's begun. */
dp_early_result_t dp_shard_early_part(dp_shard_early_t *e, int wid, uint64_t step,
                                      dp_parts_result_t res);
/* A whole push: an early step of an older step of wid dropped. */
dp_early_result_t dp_shard_early_whole(dp_shard_early_t *e, int wid, uint64_t step);
/* The policy had the push (and committed its early step or not): one it
 * did not commit dropped (what it returns); then an assembly that now
 * qualifies begins (sync: one the step made the completing one; async: one
 * the step overtook). */
dp_early_result_t dp_shard_early_pushed(dp_shard_early_t *e, int wid, uint64_t step);
/* Worker wid said HELLO (it repeats its pushes whole): its early step
 * dropped. */
dp_early_result_t dp_shard_early_hello(dp_shard_early_t *e, int wid);

/* For the policy (e may be NULL: no early steps): */
/* It steps the push the early step in progress is for, from the current
 * version at lr, by the mean of count gradients (acc's and the push's;
 * 0: by the push's gradient alone): COMMITTED when that is the step made
 * early, every float of it stepped; NONE otherwise (the caller steps the
 * push whole, overtaking it). */
dp_early_result_t dp_shard_early_commit(dp_shard_early_t *e, float lr, int count);
/* The shard is about to be stepped otherwise: the early step, from this
 * version, can never commit: dropped (its buffer the spare the step then
 * takes). */
dp_early_result_t dp_shard_early_overtaken(dp_shard_early_t *e);

#endif
