/* args: downpour-ps's command line (and TF_CONFIG) into a dp_ps_config_t —
 * one option table (common/opts.h), which `downpour local` also reads to
 * check and pass on the flags marked DP_OPTS_PASS — and what the config
 * implies (the model served, the outer optimizer, the rows' conf, the run
 * id, the sweep's threads). Wire-free: server/core/ reads the config too
 * (server/core/record.h writes it into a record); the shard that runs it is
 * server/loop/ps.h. */
#ifndef DP_PS_ARGS_H
#define DP_PS_ARGS_H

#include <signal.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/model.h"
#include "common/opts.h"
#include "kernels/optim.h"
#include "proto/wire.h"
#include "server/core/rows.h"

#define DP_PS_PATH_LEN 512

typedef struct {
    char bind[256];             /* e.g. "tcp://0.0.0.0:5555"; port "*" picks a free one */
    int shard_index;            /* i of K */
    int shard_count;            /* K */
    int num_workers;            /* N workers expected (elastic: MAX, worker ids 0 .. MAX - 1) */
    int min_workers;            /* --workers MIN:MAX: MIN; 0: a fixed crew of num_workers */
    dp_mode_t mode;
    int replicas;               /* R for sync; 0 = num_workers */
    float replicas_frac;        /* --replicas-to-aggregate F in (0, 1): R = ceil(F x live); 0: R */
    int staleness;              /* S for ssp */
    int delay_lr;               /* --delay-lr, dp_delay_lr_t (server/core/policy.h); 1 = --lr-staleness */
    float delay_k;              /* --delay-lr threshold:K */
    char model_spec[DP_MODEL_SPEC_LEN];
    int in_c, in_h, in_w;
    char env[32];               /* --env NAME: an actor-critic run's environment, which bounds
                                 * a push's account (server/core/account.h); "": none told */
    int obs_norm;               /* --obs-norm off|on: with --env, obsnorm first in the model */
    int envs, t_max;            /* --envs, --t-max: a segment's env steps at most envs x t_max */
    char init_path[DP_PS_PATH_LEN];      /* --init FILE: the tensor table and its initial
                                          * values from a safetensors file ("": the spec's) */
    char state_tensors[4096];            /* --state-tensors: more state tensors of init_path */
    uint64_t seed;              /* dp_model_init_params seed */
    dp_optim_conf_t optim;
    long local_steps;           /* --local-steps H: workers push a pseudo-gradient every H steps
                                 * and optim is the outer optimizer (dp_ps_parse_args); 1: off */
    int local_auto;             /* --local-steps auto[:H] (DyLU): H is the fastest worker's, each
                                 * worker's rounds by its speed (common/dylu.h) */
    char outer_optimizer[24];   /* --outer-optimizer sgd|nesterov|delayed-nesterov ("" = sgd) */
    long outer_every;           /* --outer-momentum-every N: delayed-nesterov's period (0: the
                                 * crew's size in async and ssp, 1 in sync) */
    float outer_lr;             /* --outer-lr (0: sgd 1, nesterov 0.7, delayed 0.5) */
    float outer_momentum;       /* --outer-momentum (default 0.9) */
    char checkpoint_dir[DP_PS_PATH_LEN]; /* "" = no checkpoints */
    long checkpoint_every;      /* versions between checkpoints; 0 = only at shutdown */
    char metrics_path[DP_PS_PATH_LEN];   /* "" = no metrics */
    double metrics_every;       /* seconds between metrics lines */
    double heartbeat_timeout;   /* seconds of silence before a worker is gone; 0 = never */
    char ready_file[DP_PS_PATH_LEN];     /* "" or a file that gets the bound endpoint */
    char curve_secret[DP_PS_PATH_LEN];   /* "" or this server's CURVE secret key file */
    char curve_allow[4096];              /* with curve_secret: a directory of *.pub or a comma list */
    char run_id[80];            /* --run-id; "" = dp_ps_config_run_id's fingerprint */
    int resume;                 /* --resume: continue the checkpoint's run, whatever its id */
    double startup_timeout;     /* seconds for every worker to say HELLO; 0 = wait forever */
    char record[DP_PS_PATH_LEN];         /* "" or --record FILE: the schedule (server/core/record.h) */
    int threads;                /* optimizer sweep threads; 0 = dp_ps_config_threads decides */
    char device[32];            /* --device cpu|cuda:N|cpu:staged: where the shard's weights and
                                 * optimizer state live and are stepped ("" or "cpu": host
                                 * memory; cpu:staged: kernels/optim_dev.h's stand-in);
                                 * checked by dp_ps_device_check */
    int device_region;          /* --device-region off|on (0, 1): with --device cuda:N, GPU
                                 * workers on this host offered the device region by CUDA IPC */
    int early_step;             /* --early-step off|on (0, 1): a push in parts stepped as its parts
                                 * come (server/core/shard.h, dp_shard_early_t); default on */
    dp_rows_conf_t rows;        /* a model with embed:D: its row table (--row-optimizer,
                                 * --row-admit, --row-evict, --row-max; its width is D) */
    dp_mode_t rows_mode;        /* --rows-mode: when row pushes apply (server/core/ps_rows.h); 0: --mode */
    float row_lr;               /* --row-lr: rows.optim.lr when set (0: --lr's base, as a worker's
                                 * own table takes it) */
    float row_init;             /* --row-init: new rows uniform in [-X, X) by (seed, key); 0:
                                 * zeros; < 0: dp_rows_init_default */
    /* Called once bound (tests: learn the port of "tcp://127.0.0.1:*"). */
    void (*on_ready)(const char *endpoint, void *arg);
    void *on_ready_arg;
    /* non-zero (SIGHUP's flag, cleared by the loop): read --curve-allow
     * again; NULL: never */
    volatile sig_atomic_t *reload;
} dp_ps_config_t;

/* Defaults: bind all interfaces on port 5555, shard 0/1, 1 worker, sync, R = all, S = 0, default
 * model on 1x28x28, seed 1, the optimizer defaults of kernels/optim.h (Adam at
 * dp_optim_base_lr's 0.0015), metrics every 5 s, heartbeat timeout 5 s. */
void dp_ps_config_default(dp_ps_config_t *c);

/* Parse downpour-ps's flags (and TF_CONFIG through common/cluster.h) into c.
 * BAD with one line in err naming the flag. */
dp_opts_result_t dp_ps_parse_args(dp_ps_config_t *c, int argc, char **argv, char *err);
/* downpour-ps's option table, writing into c and cl's flag fields; `downpour
 * local` reads it to check and pass on the flags marked DP_OPTS_PASS. */
void dp_ps_options(dp_opts_t *o, dp_ps_config_t *c, dp_cluster_t *cl);

/* The model c serves into m: the spec's, or with --init the file's tensor
 * table (common/safetensors.h), whose initial values then go to *values
 * when values is not NULL (the caller frees; NULL for a spec: the seed
 * draws them). */
int dp_ps_config_model(const dp_ps_config_t *c, dp_model_t *m, float **values, char *err);

/* The outer optimizer of --local-steps: --outer-optimizer, --outer-lr,
 * --outer-momentum (dp_optim_outer). nesterov's momentum moves on every
 * step in every mode; delayed-nesterov's once per --outer-momentum-every
 * N steps (Liu et al. 2024's DN), N by default --workers in async and ssp
 * (a round of the crew's pushes) and 1 in sync (a sync step already
 * holds the crew's pushes: then the plain rule). */
int dp_ps_outer_optim(const dp_ps_config_t *c, dp_optim_conf_t *out, char *err);

/* The row table's conf as the shards run it: c->rows with --row-lr (else
 * --lr's base) and --row-init (else dp_rows_init_default) resolved; the
 * initial bound into *init (0: zeros). */
void dp_ps_rows_conf(const dp_ps_config_t *c, dp_rows_conf_t *out, float *init);
/* The bytes of a ROWS_PUSH of the most keys a request may carry, for rows
 * of width d (its keys and rows; no envelope): part of the largest
 * message a shard takes. */
size_t dp_ps_rows_max_bytes(const dp_ps_config_t *c, int d);
/* --local-steps and the outer flags, once parsed into c by o's table (the
 * daemon's, or the simulator's, which names them alike): with H > 1,
 * c->optim becomes the outer optimizer, at a constant lr (the inner one is
 * the workers'); with H <= 1 an outer flag is a line, not a refusal (a
 * sweep crosses it with H = 1), its name still checked. */
int dp_ps_resolve_local_steps(dp_ps_config_t *c, dp_opts_t *o, char *err);

/* --lr-staleness with a --delay-lr other than inverse: -1 with err (the
 * alias and another rule contradict each other). o parsed already. */
int dp_ps_check_delay_flags(dp_opts_t *o, int delay_lr, char *err);

/* The run id a config implies when --run-id is not given: "cfg-" and 16
 * hex digits of a hash of the flags that define the run (model, input,
 * mode, workers, R, S, seed, optimizer, lr, schedule, shard I/K, and the
 * delay rule and compensation when not none / off), so the
 * same flags restarted name the same run and other flags another one. */
void dp_ps_config_run_id(const dp_ps_config_t *c, char *out, size_t n);

/* --device before anything starts: "" or "cpu" pass (0); "cuda:N" opens
 * the device (kernels/optim_dev.h, through the CUDA module, which only a
 * device loads) and closes it again: 0 when it opened. -1 with one line
 * in err and *usage 1 (a build without CUDA: exit 2) or 0 (the module or
 * the device missing on this machine: exit 1). */
int dp_ps_device_check(const dp_ps_config_t *c, int *usage, char *err);

/* The optimizer sweep's threads: --threads, or when 0 one per core it may
 * run on (its affinity) up to DP_PS_MAX_AUTO_THREADS (more buys nothing:
 * the sweep is bound by memory bandwidth), and 1 for a shard under 256 K
 * floats (threads cost more than they save). */
#define DP_PS_MAX_AUTO_THREADS 4
int dp_ps_config_threads(const dp_ps_config_t *c);
/* The same rule for a shard given `cores` of its own: `downpour local`
 * starts K shards on one host and gives each its share. */
int dp_ps_config_threads_on(const dp_ps_config_t *c, long cores);

#endif
