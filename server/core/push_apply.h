/* push_apply: what a push does once it is admitted, in one place for
 * downpour-ps (server/loop/ps.c) and the lab's engine (deploy/lab/engine.c),
 * so the simulator and the replay run the daemon's rules, not a copy of
 * them: the mode's policy takes the gradient (applied, held for a sync
 * step, or dropped), a sparse model's row table learns of the dense step
 * (its rows' version rules), and the record gets the push's line. What
 * comes before (the wire's checks, the step rule, the RL account) and what
 * the daemon does around it (the dealer, the reply) stay the caller's.
 * No sockets here. */
#ifndef DP_PUSH_APPLY_H
#define DP_PUSH_APPLY_H

#include <stdbool.h>
#include <stdint.h>

#include "server/core/policy.h"
#include "server/core/ps_rows.h"
#include "server/core/record.h"

/* One shard's parts that an admitted push touches. */
typedef struct {
    dp_policy_t *policy;
    dp_ps_rows_t *rows;         /* the shard's row table, or NULL (no embed:D) */
    dp_record_t *rec;           /* --record, or NULL */
    const dp_members_t *members; /* the member table the record writes beside the push */
    int shard;                  /* the shard's index, as the record names it */
} dp_push_apply_t;

/* The policy's decision on worker's gradient g (n slices) computed on
 * version (early: its step was made as its parts came) into *o; the row
 * table told of an applied push and of a step. */
void dp_push_apply(const dp_push_apply_t *a, int worker, uint64_t version, const dp_grad_slice_t *g,
                   int n, bool early, dp_push_outcome_t *o);

/* The record's line for that push (step: the worker's, 1-based), the
 * shard's version after it, the dealt batch it carried (NULL: none). */
void dp_push_apply_record(const dp_push_apply_t *a, int worker, uint64_t step, uint64_t version,
                          const dp_push_outcome_t *o, uint64_t after, const dp_deal_batch_t *carried);

#endif
