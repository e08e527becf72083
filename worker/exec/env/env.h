/* env: the environments an actor-critic worker acts in (--env), each a
 * pure step function: the next state, reward and termination are a
 * function of the state and the action alone, and an episode's first
 * state a function of (seed, worker, episode), so that a run is repeated
 * bit for bit from its seeds and its schedule (replay, the simulator).
 *
 * Every environment follows the Gymnasium definition it is named after
 * (dynamics, action set, reward, termination, the 500-step truncation of
 * its registration); the equations are public, the code is ours, and the
 * state is kept in double precision as there (the observation a network
 * sees is float).
 *
 * Adding one: a file worker/exec/env/NAME.c with a dp_env_kind_t (its sizes,
 * threshold, rewards' range, reset, step, observe) and a line in env.c's table; its tests
 * in tests/unit/test_env.c, against trajectories of an independent
 * reference (tests/env_reference.py). */
#ifndef DP_ENV_H
#define DP_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"

#define DP_ENV_MAX_STATE 8   /* doubles of state, any environment */
#define DP_ENV_MAX_OBS 8     /* floats of observation */
/* An actor-critic worker's segment (worker/exec/a3c.h): at most this many
 * environments (--envs) for this many steps each (--t-max); here so that
 * the servers, which bound a segment by them, need not know the worker. */
#define DP_A3C_MAX_ENVS 1024
#define DP_A3C_MAX_T 10000

typedef struct {
    const char *name;        /* as --env takes it: "cartpole-v1" */
    int state_dim, obs_dim;
    int n_actions;           /* actions 0 .. n_actions - 1 */
    int max_steps;           /* truncation: an episode ends after this many steps */
    double solved;           /* the mean return of 100 episodes that solves it */
    double reward_lo, reward_hi; /* every step's reward lies in [lo, hi] */
    /* An episode's first state from r (uniform draws only). */
    void (*reset)(double *state, dp_rng_t *r);
    /* state x action -> next, reward, terminated (1: a terminal state). */
    void (*step)(const double *state, int action, double *next, double *reward, int *terminated);
    void (*observe)(const double *state, float *obs);
} dp_env_kind_t;

extern const dp_env_kind_t dp_env_cartpole_v1, dp_env_acrobot_v1;

/* The environment named, or NULL (err says which names there are). */
const dp_env_kind_t *dp_env_find(const char *name, char *err);
/* "cartpole-v1, acrobot-v1". */
void dp_env_names(char *out, size_t n);

/* One running episode. */
typedef struct {
    const dp_env_kind_t *kind;
    double state[DP_ENV_MAX_STATE];
    int steps;               /* taken in this episode */
    int terminated;          /* the last step reached a terminal state */
    int truncated;           /* the last step was the max_steps-th */
    double ret;              /* the episode's return so far */
} dp_env_t;

/* Episode `episode` of worker `worker` under seed: its first state. */
void dp_env_reset(dp_env_t *e, const dp_env_kind_t *k, uint64_t seed, int worker, uint64_t episode);
/* One step: the reward into *reward, 1 into *done when the episode ended
 * (terminated or truncated). -1 with one line in err for an action out of
 * range or a step after the episode ended (nothing changes). */
int dp_env_step(dp_env_t *e, int action, double *reward, int *done, char *err);
void dp_env_observe(const dp_env_t *e, float *obs);

/* The range of an episode's return: 1 .. max_steps steps, each rewarded
 * within [reward_lo, reward_hi] (cartpole-v1 [1, 500], acrobot-v1
 * [-500, 0]). What the servers hold a push's episode returns to. */
void dp_env_return_range(const dp_env_kind_t *k, double *lo, double *hi);

/* Uniform in [lo, hi) from 53 random bits: how every reset draws. */
double dp_env_uniform(dp_rng_t *r, double lo, double hi);

#endif
