/* a3c: the actor-critic worker's rollouts (--env) — A3C's (Mnih et al.
 * 2016) n-step actor-critic, as one worker computes it between a pull and
 * a push, in the standalone trainer and against the servers alike.
 *
 * A worker acts in K environments (--envs) for T steps (--t-max) on the
 * weights it pulled: each step it observes all K, runs the network's policy
 * on them as one batch (dp_net_act), draws each action from its policy, and
 * steps each environment; an episode that ends starts the next at once
 * (episode numbers count the worker's episodes in the order they start,
 * environment 0 first, so each first state is the function of (seed,
 * worker, episode) worker/exec/env/env.h promises). Then each environment's T
 * rewards become n-step returns (dp_ac_returns: 0 after a terminal state,
 * the critic's value of the state a time limit cut, the critic's value of
 * the state the segment stopped in otherwise), and the segment is one
 * batch of K * T rows, environment k's steps at rows k T .. k T + T - 1,
 * for dp_net_train_step_ac.
 *
 * Actions are drawn from a stream of the worker's own (seed, worker), one
 * draw per action in the order they are taken: given the weights of each
 * segment, a worker's rollouts are a pure function of its seeds, which is
 * what a replay and the simulator repeat.
 *
 * The episodes that end are listed with the segment (ended, ended_at), for
 * the run's account of them (common/episodes.h). */
#ifndef DP_A3C_H
#define DP_A3C_H

#include <stdint.h>

#include "common/rng.h"
#include "worker/exec/env/env.h"
#include "worker/exec/net.h"

/* --reward-scale's default. A critic whose targets are returns of -100
 * (acrobot-v1: -1 a step, gamma 0.99) or +100 (cartpole-v1) learns them
 * slowly from a start near 0, and its error dominates the clipped
 * gradient: at scale 1 acrobot-v1 never learned (the last 100 episodes at
 * -498, 500 k env steps, standalone), at 0.1 it was solved near 30 k env
 * steps (docs/LAB.md, "Defaults", has the runs). A constant, not a running
 * statistic: every worker scales alike with nothing to share, and a replay
 * repeats it. */
#define DP_A3C_REWARD_SCALE 0.1f

/* The RL flags, in dp_train_conf_t (the defaults: dp_a3c_conf_default). */
typedef struct {
    const char *env;           /* --env NAME; NULL: a supervised run */
    int envs;                  /* --envs K (1) */
    int t_max;                 /* --t-max T (5) */
    float entropy;             /* --entropy beta (0.01) */
    float gamma;               /* --gamma (0.99) */
    int obs_norm;              /* --obs-norm off|on: obsnorm first in the model (off) */
    float reward_scale;        /* --reward-scale S: each reward times S in the returns the
                                * worker learns from (DP_A3C_REWARD_SCALE); an episode's
                                * return, in the account and the summaries, stays unscaled */
    float clip_norm;           /* --clip-norm: global-norm clipping of each gradient (40; 0 off) */
    long env_steps;            /* --env-steps N: the run's budget, all workers together (500000) */
} dp_a3c_conf_t;

void dp_a3c_conf_default(dp_a3c_conf_t *c);

/* One worker's environments and the segment buffers. */
typedef struct {
    const dp_env_kind_t *kind;
    int K, T, obs;             /* environments, steps a segment, floats an observation */
    float gamma, reward_scale;
    uint64_t seed;
    int worker;
    dp_env_t *env;             /* [K] */
    uint64_t next_episode;     /* the worker's next episode number */
    dp_rng_t actions;          /* the action draws' stream */
    /* the last segment, K * T rows: */
    float *x;                  /* observations [K T obs] */
    int *act;                  /* actions [K T] */
    float *ret;                /* n-step returns [K T] */
    float *reward, *cut;       /* [K T]: rewards; the critic's value where a time limit cut */
    unsigned char *end;        /* [K T]: DP_AC_GOES_ON / TERMINATED / TRUNCATED */
    float *probs, *value, *obs_now; /* one step's [K A], [K], [K obs] */
    /* what the last segment's episodes returned, in the order they ended,
     * and the env steps into the segment at which each ended (1 .. K T) */
    double *ended;             /* [K T] at most */
    int *ended_at;
    int n_ended;
} dp_a3c_t;

/* K environments of kind for worker under seed, T steps a segment. */
int dp_a3c_init(dp_a3c_t *a, const dp_env_kind_t *kind, const dp_a3c_conf_t *c, uint64_t seed,
                int worker, char *err);
void dp_a3c_fini(dp_a3c_t *a);

/* g clipped to the global L2 norm max_norm over m's trained tensors (the
 * state's values in g kept as they are), as dp_clip_global_norm clips a
 * model without state, bit for bit; the norm before. */
double dp_a3c_clip(const dp_model_t *m, float *g, double max_norm);

/* One segment on the weights in net (an actor-critic model of the
 * environment's observation and actions): fills x, act, ret (and ended).
 * -1 with err only on a bug (an environment refusing a step). */
int dp_a3c_segment(dp_a3c_t *a, dp_net_t *net, char *err);

/* The greedy policy's mean return over n fresh episodes (numbered from
 * 2^62 for worker, so they are none of training's): test_return. */
double dp_a3c_test_return(const dp_env_kind_t *kind, dp_net_t *net, uint64_t seed, int worker,
                          int n);

/* The model text for an environment: spec (NULL: the default
 * "fc:64 tanh fc:64 tanh ac") with its ac made ac:A and, with obs_norm,
 * obsnorm first (dp_model_spec_env), parsed for the observation; refused
 * with one line for a model with batch norm, whose statistics rollouts do
 * not keep. */
#define DP_A3C_DEFAULT_SPEC DP_MODEL_AC_DEFAULT_SPEC
int dp_a3c_model(dp_model_t *m, const char *spec, const dp_env_kind_t *kind, int obs_norm, char *err);

#endif
