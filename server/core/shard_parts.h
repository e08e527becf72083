/* shard_parts: a push in parts (Push.parts K > 1) assembled per worker —
 * the worker streams its gradient as backward produces it, and the shard
 * copies and checks each part on arrival (under the worker's backward)
 * instead of the whole slice once the push is in.
 *
 * The rule (ARCHITECTURE.md, "A push in parts"): a step is applied only
 * when all its parts are in and checked. Each part is checked as it comes:
 * one run of floats inside the shard's range, overlapping no part already
 * in, the same K and version as the step's first part, a part index not
 * seen, every float finite (bfloat16 widened first). A bad part discards
 * the whole assembly (nothing was applied) and makes the step rejected:
 * its later parts are refused too, with the reason of the first. A part
 * of a newer step discards an unfinished older one (the worker gave it
 * up); a part of an older step than the one assembling is refused. When
 * the K-th part is in, the parts tile the range exactly (no overlap, the
 * floats add up to n) and the buffer is handed back as one float32 slice
 * of the whole range, which the shard's usual path takes as it would a
 * whole push (step, repeat, policy, record, replies).
 *
 * Memory: per worker at most one assembly, whose buffer of the shard's n
 * floats is allocated at that worker's first part and kept (steady state
 * allocates nothing); so at most n_workers * n floats more than the shard
 * itself holds (docs/SECURITY.md, "Limits"). Without a part from a worker
 * nothing is allocated for it. Main thread only. */
#ifndef DP_SHARD_PARTS_H
#define DP_SHARD_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "proto/wire.h"
#include "server/core/shard.h"

/* One worker's assembly. */
typedef struct {
    int active;            /* a push is being assembled */
    uint64_t step;         /* its Push.step, version and parts (K) */
    uint64_t version;
    uint32_t parts;
    uint32_t got;          /* parts in */
    uint64_t have;         /* bit k: part k is in (K <= 64) */
    uint64_t filled;       /* floats in */
    uint64_t lo[DP_WIRE_MAX_PUSH_PARTS], hi[DP_WIRE_MAX_PUSH_PARTS]; /* the runs in, [lo, hi) of
                            * the flat vector, in arrival order (got of them) */
    float *buf;            /* n floats (the shard's range), allocated at the first part */
    uint64_t rejected_step; /* a step refused at a part (0: none): its later parts are too */
    char why[DP_ERR_LEN];  /* the reason, for them */
} dp_parts_worker_t;

typedef struct {
    size_t lo, hi, n;      /* the shard's range */
    int n_workers;
    dp_parts_worker_t *w;  /* [n_workers] */
} dp_shard_parts_t;

/* What became of a part. */
typedef enum {
    DP_PARTS_RECEIVED,     /* taken; the push awaits more parts */
    DP_PARTS_COMPLETE,     /* the last part: *out is the assembled gradient */
    DP_PARTS_REJECTED,     /* refused (why): nothing of the step will be applied */
} dp_parts_result_t;

void dp_shard_parts_init(dp_shard_parts_t *p, size_t lo, size_t hi, int n_workers);
void dp_shard_parts_fini(dp_shard_parts_t *p);

/* A part (env a checked PUSH with parts > 1 of worker wid, whose step is
 * plausible and not applied yet; frames its tensors, or with env->shm shm
 * the worker's gradient segment, the shard's n floats, where they lie:
 * NULL when it has none, which refuses the part). On COMPLETE, *out is
 * one float32 slice of the whole range (the worker's buffer, valid until
 * its next part). why (DP_ERR_LEN) says what was wrong on REJECTED and is
 * "part k of K" on RECEIVED. */
dp_parts_result_t dp_shard_parts_add(dp_shard_parts_t *p, int wid, const Downpour__Envelope *env,
                                     const dp_wire_frame_t *frames, int n_frames,
                                     const float *shm, dp_grad_slice_t *out, char *why);

/* A whole push (parts 0 or 1) of worker wid for step: an unfinished
 * assembly of an older step is given up; one of the same step makes that
 * step rejected (its K changed to 1): -1 with why; else 0. */
int dp_shard_parts_whole(dp_shard_parts_t *p, int wid, uint64_t step, char *why);

/* The worker said HELLO again (it rejoins and repeats its push whole, all
 * its parts): whatever it had half sent is discarded. */
void dp_shard_parts_drop(dp_shard_parts_t *p, int wid);

#endif
