/* episodes: a reinforcement-learning run's account of its episodes — how
 * many ended, the mean return of the last DP_EPISODES_WINDOW, and the
 * environment step at which that mean first reached the environment's
 * "solved" threshold. A standalone actor-critic run keeps one
 * (worker/train/a3c_train.c); in a cluster every shard keeps the run's, from the
 * episodes each push reports (server/loop/ps.c), and STATS gives it to the
 * chief, so summary.json's return_mean_100 and solved_at_env_steps are the
 * whole run's, every worker's episodes in the order their pushes came. */
#ifndef DP_EPISODES_H
#define DP_EPISODES_H

#include <stdint.h>

#define DP_EPISODES_WINDOW 100 /* the "last 100 episodes" */
#define DP_EPISODES_CURVE 64   /* points of the return curve kept */
#define DP_EPISODES_STRIDE0 1024 /* the curve's first spacing, in env steps */

typedef struct {
    uint64_t episodes;
    uint64_t env_steps;        /* the run's environment steps so far */
    double window[DP_EPISODES_WINDOW]; /* ring: episode e at e % DP_EPISODES_WINDOW */
    double threshold;          /* the mean of the window that solves the environment; NAN: unknown */
    int64_t solved_at;         /* the env step the window's mean first reached threshold, with a
                                * full window; -1: not yet */
    /* The return curve: the window's mean as the first episode to end in
     * each stretch of `stride` env steps left it, at most DP_EPISODES_CURVE
     * points; when full, every other point goes and the stride doubles, so
     * a run of any length keeps 32 to 64 points spread over all of it. */
    uint64_t curve_at[DP_EPISODES_CURVE]; /* the env step of each point */
    double curve_mean[DP_EPISODES_CURVE];
    int n_curve;
    uint64_t stride;           /* env steps a point stands for (0: DP_EPISODES_STRIDE0) */
} dp_episodes_t;

void dp_episodes_init(dp_episodes_t *e, double threshold);
/* An episode of return ret ended at env step `at` (the run's count). */
void dp_episodes_add(dp_episodes_t *e, double ret, uint64_t at);
/* The mean of the last min(100, episodes) returns; 0 before any. */
double dp_episodes_mean(const dp_episodes_t *e);

#endif
