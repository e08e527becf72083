/* lab/rl: the actor-critic side of the lab engine (--env, deploy/lab/engine.h)
 * — each virtual worker's rollouts as the worker daemon makes them
 * (worker/exec/a3c.h: its own environments, episode numbers and action stream,
 * from (seed, worker) alone) and the run's account of env steps and
 * episodes as shard 0 keeps it (common/episodes.h).
 *
 * A worker's environments move only by its own segments, so its segment n
 * is a function of its seed and the weights of its segments 0 .. n: given
 * the weights each segment was computed on, which the simulator's clock or
 * a record's schedule fixes, every rollout is recomputed exactly. A
 * worker's segments must therefore be computed in their order (0, 1, ...),
 * each once; the engine asserts that and a replay checks the record for it
 * before it starts.
 *
 * The run's account takes each segment when shard 0 takes its push, in the
 * order shard 0 took them, as server/loop/ps.c counts Push.env_steps and the
 * episodes that ended (so return_mean_100 and solved_at_env_steps are the
 * servers' figures, not the order the segments were computed in). */
#ifndef DP_LAB_RL_H
#define DP_LAB_RL_H

#include <stdint.h>

#include "common/episodes.h"
#include "worker/exec/a3c.h"
#include "worker/train/train.h"

/* What one segment reports with its push (Push.env_steps, episode_returns,
 * episode_ends). */
typedef struct {
    uint64_t env_steps;        /* K T */
    int n;                     /* episodes that ended in it */
    double *ret;               /* [K T]: their returns, in the order they ended */
    int *at;                   /* [K T]: the env step into the segment each ended at (1 .. K T) */
} dp_lab_seg_t;

typedef struct {
    const dp_env_kind_t *kind;
    int workers;
    int rows;                  /* K T: a segment's rows */
    dp_a3c_t *a;               /* [workers]: each worker's environments and action stream */
    long *next;                /* [workers]: each worker's next segment, 0-based */
    dp_lab_seg_t *seg;         /* [workers]: each worker's last segment's account */
    dp_episodes_t run;         /* the run's account (shard 0's) */
    double test_return;        /* the chief's greedy return at the end (dp_lab_finish) */
} dp_lab_rl_t;

/* The session of an actor-critic lab: the model for c->a3c.env (c->model,
 * NULL: the default spec), the backend, a net of K T rows with the
 * entropy weight, host buffers and metrics; no data. */
int dp_lab_rl_session(dp_session_t *s, const dp_train_conf_t *c, char *err);

/* Every worker's environments under c->seed, all made now (none later). */
int dp_lab_rl_init(dp_lab_rl_t *r, const dp_train_conf_t *c, int workers, char *err);
void dp_lab_rl_fini(dp_lab_rl_t *r);

/* Worker's segment number step (0-based; it must be the worker's next) on
 * params, as the worker daemon computes it (dp_a3c_segment, the
 * actor-critic gradient, clipped to c->a3c.clip_norm) into grad; the
 * segment's account in r->seg[worker]. Returns the batch's loss (NAN: a
 * diverged run, or an environment refusing a step). */
float dp_lab_rl_gradient(dp_lab_rl_t *r, dp_session_t *s, const dp_a3c_conf_t *c,
                         const float *params, int worker, long step, float *grad);

/* A segment's account copied (dst's arrays hold rows). */
void dp_lab_seg_alloc(dp_lab_seg_t *g, int rows);
void dp_lab_seg_copy(dp_lab_seg_t *dst, const dp_lab_seg_t *src);
void dp_lab_seg_free(dp_lab_seg_t *g);
/* The sum of its returns, in order (the record's "er"). */
double dp_lab_seg_returns(const dp_lab_seg_t *g);

/* Shard 0 took the push of segment g: the run's account takes it. */
void dp_lab_rl_count(dp_lab_rl_t *r, const dp_lab_seg_t *g);

/* The account's and the RL flags' fields, as summary.json names them, into
 * o (the simulator's result, the replay's report). */
void dp_lab_rl_json(const dp_lab_rl_t *r, const dp_a3c_conf_t *c, cJSON *o);

/* The RL flags of an actor-critic run (env, envs, t_max, entropy, gamma,
 * clip_norm, env_steps) into a record header h: the lab's, and `downpour
 * local --record` adds them to the shards' (engine.c reads them back). */
void dp_lab_rl_header(cJSON *h, const dp_a3c_conf_t *a);

#endif
