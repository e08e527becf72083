/* push_apply: see push_apply.h. */
#include "server/core/push_apply.h"

void dp_push_apply(const dp_push_apply_t *a, int worker, uint64_t version, const dp_grad_slice_t *g,
                   int n, bool early, dp_push_outcome_t *o)
{
    dp_policy_push(a->policy, worker, version, g, n, early, o);
    if (!a->rows) return;
    /* sync rows: this worker's rows go with the step */
    if (o->status == DP_PUSH_APPLIED) dp_ps_rows_dense_taken(a->rows, worker, version);
    if (o->stepped) dp_ps_rows_stepped(a->rows, a->policy->shard->version);
}

void dp_push_apply_record(const dp_push_apply_t *a, int worker, uint64_t step, uint64_t version,
                          const dp_push_outcome_t *o, uint64_t after, const dp_deal_batch_t *carried)
{
    dp_record_push(a->rec, a->shard, worker, step, version, o, after, a->members, carried);
}
