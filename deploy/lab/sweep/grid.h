/* sweep/grid: what `downpour sweep` runs — a grid of axes (mode, workers,
 * staleness bound, lr, lr policy, delay rule, delay compensation, momentum,
 * optimizer, replicas, straggler,
 * simulated compute time, simulated churn, an actor-critic run's
 * environment and RL flags, seed), each a list of values, read from a small
 * text file and/or flags. A configuration is one value of every axis but the seed;
 * a run is a configuration with a seed.
 *
 * The file, one "key = v1, v2, ..." per line; '#' starts a comment; keys
 * are the axis names and the settings below ('_' and '-' alike):
 *   mode = sync, async, ssp, standalone     workers = 2, 4
 *   staleness = 0, 2                        lr = 0.001, 0.003
 *   lr-policy = fixed, staleness            momentum = 0, 0.9
 *   delay-lr = none, adaptive, threshold:2  delay-compensation = off, adaptive:2
 *   optimizer = adam, rmsprop
 *   replicas = 3                            straggler = none, 3:50
 *   compute = exp:10                        seed = 1, 2, 3
 *   workers = 2:8 (elastic)                 churn = none, kill:2 (sim)
 *   precision = fp32, bf16
 *   env = cartpole-v1, acrobot-v1           envs = 1, 4
 *   t-max = 5, 20                           entropy = 0.01, 0.001
 *   gamma = 0.99                            clip-norm = 0, 40
 *   env-steps = 100000
 *   cluster = local | sim                   args = --epochs 1 --batch 64
 *   eval-every = 50                         eval-limit = 2000
 *   targets = 0.80, 0.85, 0.88
 * A value is checked when it is read: a bad line is refused with
 * "FILE:LINE: ..." and nothing runs. So is a key given twice (under any
 * spelling: lr_policy and lr-policy, seed and seeds) and a value listed
 * twice in one list (the same text or the same number: 0.1 and 0.10).
 * tests/unit/test_sweep_grid.c holds these. */
#ifndef DP_SWEEP_GRID_H
#define DP_SWEEP_GRID_H

#include <stddef.h>

typedef enum {
    DP_SWEEP_MODE = 0,
    DP_SWEEP_WORKERS,
    DP_SWEEP_STALENESS,   /* --staleness (ssp's bound) */
    DP_SWEEP_LR,
    DP_SWEEP_LR_POLICY,   /* fixed | staleness (--lr-staleness) */
    DP_SWEEP_DELAY_LR,    /* --delay-lr: none | inverse | adaptive | threshold[:K] */
    DP_SWEEP_DELAY_COMPENSATION, /* --delay-compensation: off | const:L | adaptive:L0 */
    DP_SWEEP_LOCAL_STEPS, /* --local-steps H or auto[:H] */
    DP_SWEEP_OUTER_OPTIMIZER, /* --outer-optimizer: sgd | nesterov | delayed-nesterov (with --local-steps) */
    DP_SWEEP_MOMENTUM,
    DP_SWEEP_OPTIMIZER,   /* --optimizer: sgd | momentum | nesterov | adam | adagrad | rmsprop */
    DP_SWEEP_REPLICAS,    /* --replicas-to-aggregate: workers - replicas are backups */
    DP_SWEEP_STRAGGLER,   /* none | I:MS[:exp] (local) or I:FACTOR (sim) */
    DP_SWEEP_COMPUTE,     /* sim: const:MS | exp:MEAN_MS | lognormal:MU:SIGMA */
    DP_SWEEP_COMPRESS,    /* the workers' --compress: none | topk:F | sign */
    DP_SWEEP_ERROR_FEEDBACK, /* --error-feedback: on | off */
    DP_SWEEP_MODEL,       /* --model: a spec or a preset (resnet20) */
    DP_SWEEP_PRECISION,   /* the workers' --precision: fp32 | bf16 */
    DP_SWEEP_CHURN,       /* sim: none | leave:S | kill:S (with workers = MIN:MAX) */
    DP_SWEEP_ENV,         /* --env: an actor-critic run (cartpole-v1 | acrobot-v1) */
    DP_SWEEP_ENVS,        /* --envs K */
    DP_SWEEP_T_MAX,       /* --t-max T */
    DP_SWEEP_ENTROPY,     /* --entropy */
    DP_SWEEP_GAMMA,       /* --gamma */
    DP_SWEEP_REWARD_SCALE, /* --reward-scale */
    DP_SWEEP_OBS_NORM,    /* --obs-norm: off | on */
    DP_SWEEP_CLIP_NORM,   /* --clip-norm (0: off) */
    DP_SWEEP_ENV_STEPS,   /* --env-steps: the run's budget */
    DP_SWEEP_SEED,
    DP_SWEEP_N_AXES
} dp_sweep_axis_t;

#define DP_SWEEP_VALUES 32  /* values per axis */
#define DP_SWEEP_TARGETS 8  /* accuracy targets */

typedef struct {
    char *value[DP_SWEEP_N_AXES][DP_SWEEP_VALUES]; /* owned; NULL past n */
    int n[DP_SWEEP_N_AXES];   /* 0: the axis is not set (the binaries' default) */
    char cluster[8];          /* "local" (real processes) or "sim" */
    char *args;               /* extra flags for every run, or NULL; owned */
    long eval_every;          /* the chief's test evaluation every N steps (the curves) */
    int eval_limit;           /* test samples per periodic evaluation (0: all) */
    double target[DP_SWEEP_TARGETS]; /* accuracies whose time and updates are reported */
    int n_target;
} dp_sweep_grid_t;

/* Defaults: cluster local, mode async, seed 1, eval every 50 steps on 2000
 * test samples, targets 0.80 0.85 0.88. */
void dp_sweep_grid_init(dp_sweep_grid_t *g);
void dp_sweep_grid_fini(dp_sweep_grid_t *g);

/* One setting: key (an axis or a setting name) and its comma list, replacing
 * what the key held. -1 with one line in err (unknown key, bad value). */
int dp_sweep_grid_set(dp_sweep_grid_t *g, const char *key, const char *list, char *err);
/* A grid file; errors name FILE:LINE. */
int dp_sweep_grid_load(dp_sweep_grid_t *g, const char *path, char *err);

/* Axis name as in the file ("lr-policy"). */
const char *dp_sweep_axis_name(int axis);
/* The value of axis in a pick, or NULL when the axis is not set. */
const char *dp_sweep_grid_value(const dp_sweep_grid_t *g, const int *pick, int axis);

/* Configurations (seed excluded): pick[] of config index i (mixed radix,
 * the mode varying slowest); 0 when the configuration is a duplicate that
 * is skipped (standalone takes only the first value of the server's axes). */
long dp_sweep_grid_configs(const dp_sweep_grid_t *g);
int dp_sweep_grid_pick(const dp_sweep_grid_t *g, long config, int *pick);
/* Seeds: 1 when the axis is not set. */
int dp_sweep_grid_seeds(const dp_sweep_grid_t *g);

/* "mode=async workers=4 lr=0.001": the axes with more than one value (all
 * set axes when none varies), seed excluded. */
void dp_sweep_grid_label(const dp_sweep_grid_t *g, const int *pick, char *out, size_t n);

#endif
