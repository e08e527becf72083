/* a3c_train: what downpour-worker runs with --env (worker/exec/a3c.h): A3C's
 * learner standalone (one worker, its own --optimizer: the baseline) or
 * against the servers (async is A3C, sync A2C, ssp and the delay rules as
 * for any push). Both stop after --env-steps environment steps; the chief
 * (standalone: the one worker) then runs its greedy policy over 100 fresh
 * episodes (test_return), saves --save and writes --summary. */
#ifndef DP_A3C_TRAIN_H
#define DP_A3C_TRAIN_H

#include <signal.h>

#include "worker/train/train.h"

/* What summary.json says of an actor-critic run (the names fixed by the
 * RL tools that read it: env, env_steps, episodes, return_mean_100,
 * solved_at_env_steps, test_return), the worker's and the lab's alike
 * (deploy/lab/engine.c: a simulated or replayed run's chief). */
typedef struct {
    const char *mode;
    int workers, ps_shards;
    const dp_env_kind_t *kind;
    const char *model;         /* the spec as parsed */
    long steps;                /* the chief's segments */
    uint64_t env_steps, episodes;
    double return_mean_100, test_return;
    int64_t solved_at;
    double train_s, wall_s;
    const dp_optim_conf_t *optim; /* standalone's or the lab's servers'; NULL in a cluster
                                   * (downpour local adds it) */
    uint64_t version, applied, dropped, rejected, staleness_max;
    uint64_t requests_refused; /* the servers' other refusals (not pushes) */
    double staleness_mean;
    const dp_staleness_t *staleness_hist; /* the servers' counts per staleness, or NULL (standalone) */
    const struct dp_ps_membership *membership; /* distributed: the joins and leaves, or NULL */
    const uint64_t *curve_at;  /* the run's return curve (common/episodes.h): n_curve points */
    const double *curve_mean;
    int n_curve;
} dp_a3c_summary_t;

#define DP_A3C_TEST_EPISODES 100 /* test_return: the greedy policy over this many */

/* summary.json's "return_curve": [[env step, mean return of the last 100],
 * ...], the n points of the run's account then its end (end_at, end_mean). */
cJSON *dp_a3c_curve_json(const uint64_t *at, const double *mean, int n, uint64_t end_at, double end_mean);

/* c->summary (if set) from s and c's RL flags. */
int dp_a3c_summary_write(const dp_train_conf_t *c, const dp_a3c_summary_t *s, char *err);

/* 0 when done (or stopped by *stop: the model saved, no summary), -1 with err. */
int dp_a3c_standalone(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err);
int dp_a3c_distributed(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err);

#endif
