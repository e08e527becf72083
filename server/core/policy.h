/* policy: a shard's consistency policy — sync (with backup workers), async
 * or ssp — behind one small interface that knows nothing of sockets. The
 * caller (the event loop, server/loop/ps.c, or a simulator driving the same code
 * without a network) passes plain data: worker ids, versions, clocks and
 * gradients as slices; the policy changes the shard (server/core/shard.h) and
 * returns its decision; replies, identities and held pulls stay with the
 * caller.
 *
 * The policies:
 *   sync   gradients of the current version are summed; once min(R, workers
 *          that are live or already contributed) are in, one step with their
 *          mean (R a count, or ceil(F x those workers) for a fraction F).
 *          Older versions are dropped as late (backup workers), a second
 *          gradient of a worker for one version as a duplicate. A pull waits
 *          for the version after the one the worker pushed on. An elastic
 *          crew (--workers MIN:MAX) steps only while at least MIN workers
 *          are live, until the first of them is done with its steps (the
 *          run's end: the rest finish on what is left); below MIN the step
 *          waits, with one line.
 *   async  every gradient is applied on arrival, its lr by the delay rule
 *          (below); pulls are answered at once.
 *   ssp    async, but a pull from a worker more than S pushes ahead of the
 *          slowest live worker waits, so with N workers a gradient is at
 *          most (N - 1)(2S + 1) versions stale (test_local_cluster).
 *
 * The delay rules (--delay-lr; async and ssp: a gradient of delay tau =
 * the shard's version - the version it was computed on, M workers):
 *   none       lr
 *   inverse    lr / tau when tau > 1 (Zhang et al. 2016; --lr-staleness)
 *   adaptive   lr x min(1, M / tau), lr at tau 0 (Mishchenko et al. 2022)
 *   threshold  skip (drop, with the reason) a gradient with tau > K x
 *              max(1, mean tau of the pushes judged before it, applied
 *              or skipped); the first is always applied (after Koloskova
 *              et al. 2022, who drop gradients of delay over a threshold
 *              tied to the average delay; K = 2 by default). The mean is
 *              this policy's, in apply order: replays decide the same.
 * and the delay compensation (--delay-compensation, server/core/shard_dc.h),
 * a transform of the gradient before the optimizer step. Sync applies
 * only gradients of the current version (every delay 0): both are turned
 * off there, with a line (dp_policy_for_mode).
 *
 * Contract, in call order:
 *  1. dp_policy_new(ops, conf, shard, members): shard and members outlive the
 *     policy. conf is checked (R in 1..members->n).
 *  2. Any number of, in any order:
 *     - dp_policy_push(worker, version, g, n, early): only for a worker id
 *       in [0, members->n) that joined, with g valid (slices tiling the
 *       shard's range, every float finite). Decides: reject (computed on a
 *       version the shard has not reached), drop as late or duplicate,
 *       accumulate, apply now. May change the shard's parameters,
 *       optimizer state, version, acc and counters, and the policy's
 *       per-worker clocks; nothing else. out->stepped says whether the
 *       version moved. early: the push is the one the early step in
 *       progress is for (dp_shard_early_of, server/core/shard_early.h), which
 *       the policy then commits in place of its own step where that step
 *       is the one made early (dp_shard_early_commit); every other step of
 *       the shard drops it first (dp_shard_early_overtaken).
 *     - dp_policy_pull_ready(worker, min_version): may this pull be answered
 *       now? Changes nothing. A pull that is not ready is held by the caller.
 *     - dp_policy_members_changed(): after the caller changed the member
 *       table (a worker joined or came back, finished, or went silent). Sync
 *       stops waiting for a worker that is gone or finished and counts one
 *       that came back; it may step on what it has. Returns 1 when the
 *       version moved. Changes what push may change.
 *  3. After a push that was APPLIED and after every members_changed (the
 *     calls that can make a held pull ready) the caller asks pull_ready again
 *     for every held pull, in arrival order, and answers those now ready;
 *     after a call that moved the version it first writes a checkpoint if
 *     one is due.
 *  4. dp_policy_destroy. */
#ifndef DP_POLICY_H
#define DP_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/staleness.h"
#include "common/util.h"
#include "proto/wire.h"
#include "server/core/shard.h"
#include "server/crew/members.h"

/* The decision on one push; the values are the wire's AckStatus ones. */
typedef enum {
    DP_PUSH_APPLIED = 1,   /* applied (async, ssp) or accumulated (sync) */
    DP_PUSH_DROPPED = 2,   /* valid but not used: late or duplicate (sync) */
    DP_PUSH_REJECTED = 3,  /* computed on a version this shard has not reached */
    DP_PUSH_RECEIVED = 4,  /* a part of a push in parts, the rest awaited (server/core/shard_parts.h);
                            * never a policy's decision */
} dp_push_status_t;

typedef struct {
    dp_push_status_t status;
    uint64_t staleness;    /* versions between the one computed on and the shard's */
    int stepped;           /* the shard's version moved */
    char reason[DP_ERR_LEN]; /* why dropped or rejected; "" when applied */
    /* What the step did, for the lab (record files, the simulator): the lr
     * applied (after any staleness scaling; 0 when nothing stepped) and,
     * when the policy measures (dp_policy_measure), the L2 norms of the
     * gradient (sync: of the mean that stepped) and of the update w_new -
     * w_old over this shard's range; -1 when not measured. */
    float lr;
    double grad_norm, update_norm;
    int compensated;       /* delay compensation: 1 done, 0 fell back (no weights of
                              that version kept), -1 off or nothing applied */
} dp_push_outcome_t;

/* --delay-lr's rules (above); the values are fixed: 1 is --lr-staleness. */
typedef enum {
    DP_DELAY_NONE = 0,
    DP_DELAY_INVERSE = 1,
    DP_DELAY_ADAPTIVE = 2,
    DP_DELAY_THRESHOLD = 3,
} dp_delay_lr_t;
#define DP_DELAY_K_DEFAULT 2.0f

typedef struct {
    int replicas;          /* sync: R gradients per step, 1..workers */
    int staleness;         /* ssp: S, pushes a worker may be ahead */
    int delay_lr;          /* dp_delay_lr_t: async / ssp: the lr of a delayed gradient */
    float delay_k;         /* DP_DELAY_THRESHOLD: K (0: DP_DELAY_K_DEFAULT) */
    float replicas_frac;   /* sync: F in (0, 1]: ceil(F x the live workers) per step; 0: R */
} dp_policy_conf_t;

/* --replicas-to-aggregate: a count ("3": *r, *frac 0) or a fraction of the
 * live workers ("0.75", with a point: *frac in (0, 1], *r 0). */
int dp_policy_replicas_parse(const char *flag, const char *text, int *r, float *frac, char *err);

/* "none", "inverse", "adaptive", "threshold" or "threshold:K" (K a number
 * in [1, 1e6]) into *kind and *k. */
int dp_delay_lr_parse(const char *text, int *kind, float *k, char *err);
/* The rule as that text ("threshold:2"; K by dp_optim_float_text). */
void dp_delay_lr_name(int kind, float k, char *out, size_t n);
/* Sync: the delay rule and compensation have nothing to act on; a rule
 * other than none and a compensation other than off are turned off in pc
 * and o, each with one line naming who (the shard, the simulator). */
void dp_policy_for_mode(dp_mode_t mode, dp_policy_conf_t *pc, dp_optim_conf_t *o, const char *who);

typedef struct dp_policy dp_policy_t;
struct dp_shard_early;

/* One policy's behaviour; see the contract above for each call. */
typedef struct {
    void (*push)(dp_policy_t *p, int worker, uint64_t version, const dp_grad_slice_t *g, int n,
                 bool early, dp_push_outcome_t *out);
    int (*pull_ready)(const dp_policy_t *p, int worker, uint64_t min_version);
    int (*members_changed)(dp_policy_t *p);
    int (*early)(const dp_policy_t *p, int worker, uint64_t version, float *lr, int *count);
} dp_policy_ops_t;

extern const dp_policy_ops_t dp_policy_sync, dp_policy_async, dp_policy_ssp;

/* Fields the ops read and write; callers use the functions below. */
struct dp_policy {
    const dp_policy_ops_t *ops;
    dp_policy_conf_t conf;
    dp_shard_t *shard;
    const dp_members_t *members;
    uint64_t *clock;       /* per worker: gradients used (applied or accumulated) */
    uint64_t *contributed; /* sync, per worker: version + 1 it last contributed to, 0 = none */
    dp_staleness_t staleness; /* every used gradient's staleness (sync: 0 each) */
    float *before;         /* measuring: the range before a step (dp_policy_measure), else NULL */
    uint64_t delay_sum, delay_count; /* threshold: the delays of the pushes judged */
    unsigned char *was_live; /* ssp, per worker: live at the last members_changed */
    int below_min;         /* sync: said that the step waits for MIN live workers */
    struct dp_shard_early *early; /* the early step it commits or drops (dp_policy_early_steps),
                                     or NULL: none */
};

int dp_policy_new(dp_policy_t **out, const dp_policy_ops_t *ops, const dp_policy_conf_t *conf,
                  dp_shard_t *shard, const dp_members_t *members, char *err);
void dp_policy_destroy(dp_policy_t **p_p);

void dp_policy_push(dp_policy_t *p, int worker, uint64_t version, const dp_grad_slice_t *g, int n,
                    bool early, dp_push_outcome_t *out);
int dp_policy_pull_ready(const dp_policy_t *p, int worker, uint64_t min_version);
int dp_policy_members_changed(dp_policy_t *p);

/* Measure every step from now on (the norms of dp_push_outcome_t): one
 * more pass over the range and n floats of memory, so only the lab and
 * --record turn it on. */
void dp_policy_measure(dp_policy_t *p);
/* The early steps (server/core/shard_early.h) the policy commits or drops from
 * now on; NULL (the default): none, every push stepped whole. */
void dp_policy_early_steps(dp_policy_t *p, struct dp_shard_early *e);
/* For the ops: one step of the shard by g at lr (dp_shard_step; the early
 * step's commit when early and that is the step made early), measured into
 * out when measuring; and the same for sync's mean of acc (out NULL: not
 * measured). */
void dp_policy_step(dp_policy_t *p, const dp_grad_slice_t *g, int n, float lr, bool early,
                    dp_push_outcome_t *out);
void dp_policy_step_mean(dp_policy_t *p, bool early, dp_push_outcome_t *out);
/* How a push of worker computed on version would be stepped if it were
 * whole now, for an early step (server/core/shard_early.h): 0 with *lr and
 * *count (dp_shard_early_commit's) when that is known before it is whole: async
 * and ssp without delay compensation (count 0: by the gradient, at the
 * delay rule's lr for the present staleness); sync when it would complete
 * the step (of the current version, not a duplicate, the gradient that
 * makes the step's count: count = acc_count + 1). -1 otherwise (sync's
 * earlier pushes, compensation's transform, a version the shard has not
 * reached). Changes nothing: the commit checks it against what the policy
 * does once the push is whole (a threshold skip, a version moved, a
 * worker that joined in between only drop the early step). */
int dp_policy_early(const dp_policy_t *p, int worker, uint64_t version, float *lr, int *count);
/* For async / ssp: should a gradient of delay tau be skipped (threshold)?
 * 1 with why (n bytes); judges it either way (the running mean). */
int dp_policy_delay_skip(dp_policy_t *p, uint64_t tau, char *why, size_t n);
/* lr by the delay rule for a gradient of delay tau. */
float dp_policy_delay_lr(const dp_policy_t *p, uint64_t tau, float lr);

#endif
