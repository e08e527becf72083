/* policy_fixture.h: a shard, its members and a policy over them, driven by
 * calls without sockets, for the tests of a policy's rules (test_policy)
 * and of the early step under one (test_shard_early).
 *
 *   policy_fx_t f;
 *   CHECK_EQ(policy_fx_init(&f, &dp_policy_sync, &optim, 2, &pc), 0);
 *   ... f.g[w] is worker w's gradient, f.shard the one shard ...
 *   policy_fx_fini(&f);
 */
#ifndef DP_TESTS_POLICY_FIXTURE_H
#define DP_TESTS_POLICY_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "common/util.h"
#include "server/core/policy.h"
#include "server/core/shard.h"
#include "server/core/shard_dc.h"
#include "server/crew/members.h"

#define POLICY_FX_SPEC "conv3x3:2 relu maxpool2 fc:4 softmax"
#define POLICY_FX_MAX_WORKERS 3

typedef struct {
    dp_model_t model;
    dp_shard_t shard;
    dp_members_t members;
    dp_policy_t *policy;
    float *g[POLICY_FX_MAX_WORKERS]; /* one gradient per worker, a fixed pattern */
} policy_fx_t;

/* The model POLICY_FX_SPEC on 1x8x8 in one shard (seed 7) optimized by o,
 * with its compensation's slots; workers (at most POLICY_FX_MAX_WORKERS),
 * all joined; the policy ops under pc. 0, or -1 after one line on stderr. */
static inline int policy_fx_init(policy_fx_t *f, const dp_policy_ops_t *ops,
                                 const dp_optim_conf_t *o, int workers, const dp_policy_conf_t *pc)
{
    char err[DP_ERR_LEN] = "";
    memset(f, 0, sizeof *f);
    if (workers > POLICY_FX_MAX_WORKERS) {
        fprintf(stderr, "  policy_fx_init: %d workers, at most %d\n", workers,
                POLICY_FX_MAX_WORKERS);
        return -1;
    }
    if (dp_model_parse(&f->model, POLICY_FX_SPEC, 1, 8, 8, err) != 0 ||
        dp_shard_init(&f->shard, &f->model, 0, 1, 7, o, err) != 0)
        goto fail;
    dp_members_init(&f->members, workers, 0, 0, 0.0);
    for (int i = 0; i < workers; i++) dp_members_join(&f->members, i);
    dp_shard_dc_init(&f->shard, workers);
    if (dp_policy_new(&f->policy, ops, pc, &f->shard, &f->members, err) != 0) goto fail;
    for (int k = 0; k < POLICY_FX_MAX_WORKERS; k++) {
        f->g[k] = dp_malloc(f->shard.n * sizeof(float));
        for (size_t i = 0; i < f->shard.n; i++) f->g[k][i] = (float)((i * 7 + k * 3) % 11) - 5.0f;
    }
    return 0;
fail:
    fprintf(stderr, "  %s\n", err);
    return -1;
}

/* Everything policy_fx_init made; safe after a failed init. */
static inline void policy_fx_fini(policy_fx_t *f)
{
    dp_policy_destroy(&f->policy);
    dp_members_fini(&f->members);
    dp_shard_fini(&f->shard);
    for (int k = 0; k < POLICY_FX_MAX_WORKERS; k++) free(f->g[k]);
}

#endif
