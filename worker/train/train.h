/* train: what a training run is made of, for every kind the driver runs
 * (worker/train/driver.h) and for the lab's runs (deploy/lab): the
 * flags (dp_train_conf_t), summary.json (dp_run_summary_t and its one
 * writer, summary.c), and the session of an image model.
 *
 * dp_session_t holds what a dense run shares between its modes: the data,
 * the model, the backend and executor, host buffers for pulled parameters
 * and pushed gradients, metrics, the progress line; dp_session_evaluate,
 * _save and _summary are the chief's end-of-run duties in both modes. */
#ifndef DP_TRAIN_H
#define DP_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/dataset.h"
#include "common/metrics.h"
#include "common/model.h"
#include "common/staleness.h"
#include "common/tbevents.h"
#include "kernels/backend.h"
#include "kernels/optim.h"
#include "kernels/row_optim.h"
#include "proto/compress.h"
#include "worker/exec/a3c.h"
#include "worker/exec/net.h"
#include "worker/train/progress.h"
#include "worker/client/ps_client.h"

typedef struct {
    const char *device;        /* "cpu", "cuda:K" */
    dp_precision_t precision;  /* --precision: the conv and fc layers' arithmetic (fp32);
                                * the backend's (dp_backend_new_in), never the servers' */
    const char *data;          /* dataset spec (common/dataset.h) */
    int train_samples;         /* the first N training samples only (0: all; dp_dataset_limit) */
    const char *model;         /* model spec (common/model.h) */
    int batch;                 /* per worker */
    int epochs;                /* used when steps == 0 */
    long steps;                /* this worker's steps; 0: epochs over its share */
    dp_optim_conf_t optim;     /* standalone, and the inner optimizer of local steps: the
                                * optimizer and the lr schedule */
    long local_steps;          /* distributed: a push of the pseudo-gradient every H steps
                                * of the worker's own optimizer (worker/train/distributed.c); 1: off */
    int local_auto;            /* --local-steps auto (DyLU): local_steps is the fastest worker's H,
                                * this worker's rounds by its speed (common/dylu.h) */
    int schedule_given;        /* --lr-schedule given; else standalone anneals (cosine) over its run */
    uint64_t seed;             /* weights (standalone) and data order; the servers' type */
    int threads;               /* CPU kernel threads, 0 = all cores */
    int bn_ghost_batch;        /* standalone: batch norm statistics per ghost batch of this
                                * many samples (0: the whole batch); what sync with R
                                * workers at batch b equals at --batch R*b (ARCHITECTURE.md) */
    int augment;               /* random crop (zero padding 4) + horizontal flip (worker/exec/data.h) */
    const char *normalize;     /* per-channel (x - mean) / std: "train" (the training set's
                                * figures) or "M0,.../S0,..."; NULL: none */
    const char *save;          /* model.safetensors (standalone / chief) */
    const char *summary;       /* summary.json (standalone / chief) */
    const char *metrics;       /* JSON lines, one per step */
    const char *tensorboard;   /* TensorBoard log dir (event files), or NULL */
    dp_progress_mode_t progress; /* the progress line */
    long eval_every;           /* chief: evaluate the test set every N steps (0: at the end) */
    int eval_limit;            /* test samples per periodic evaluation (0: all) */
    /* distributed */
    const char *ps;            /* "tcp://h:p,..." */
    int task_index;            /* this worker; 0 is the chief */
    double delay_ms;           /* injected delay before each push (mean) */
    int delay_exp;             /* delay drawn from an exponential with that mean */
    double timeout_s;          /* connect / reply timeout */
    const char *curve_secret;  /* CURVE: this worker's secret key file, or NULL */
    const char *curve_server;  /* CURVE: the servers' public key file(s), or NULL */
    dp_ps_transport_t transport; /* --transport: how tensors travel to the servers */
    dp_ps_wire_t wire;         /* --wire: their precision in ZeroMQ frames */
    dp_compress_conf_t compress; /* --compress, --error-feedback: how pushes are compressed
                                  * (ps_client; the lab engine the same way) */
    int overlap;               /* pull and push on a thread while computing: 1 on, 0 off,
                                * -1 by mode (on in async; off in ssp, off always in sync) */
    int stream_push;           /* --stream-push: the gradient leaves in parts as the backward
                                * produces it (plain loop only): 1 on, 0 off, -1 the
                                * default (on for a CPU worker, off on a device) */
    int stream_pull;           /* --stream-pull: the weights arrive in parts as the forward
                                * needs them (the same cases): 1 on, 0 off, -1 the default */
    dp_a3c_conf_t a3c;         /* --env and the RL flags: an actor-critic run (a3c.env set) */
    /* a model with an embedding (embed:D) on --data libsvm: (worker/train/embed_train.h) */
    dp_row_optim_kind_t row_optim; /* --row-optimizer: the rows' optimizer (adagrad) */
    float row_lr;              /* --row-lr; 0: the dense layers' lr (dp_optim_base_lr) */
    float row_init;            /* --row-init: rows start uniform in [-X, X) by (seed, key), 0
                                * zeros; < 0: the default (dp_rows_init_default) */
} dp_train_conf_t;

void dp_train_conf_default(dp_train_conf_t *c);

typedef struct {
    dp_train_conf_t conf;
    dp_dataset_t train, test;
    dp_model_t model;
    dp_backend_t *be;
    dp_net_t net;
    float *h_params;           /* host copy of the parameters (pinned on GPU) */
    float *h_grads;            /* host copy of the gradients (pinned on GPU) */
    float *eval_x;             /* one evaluation batch */
    int *eval_y;
    dp_metrics_t *metrics;
    dp_tb_t *tb;               /* TensorBoard writer; does nothing without --tensorboard */
    dp_progress_t progress;
    double t_start;            /* dp_now() at open */
} dp_session_t;

/* Load data and model, open the backend, allocate everything. */
int dp_session_init(dp_session_t *s, const dp_train_conf_t *c, char *err);
/* The outputs of a session (metrics, TensorBoard, the progress line) from
 * s->conf: dp_session_init's last part, for a run that fills the rest of
 * its session itself (worker/train/embed_train.c). */
int dp_session_init_outputs(dp_session_t *s, char *err);
void dp_session_fini(dp_session_t *s);

/* Accuracy and mean loss of the net's current parameters on the first
 * limit test samples (0: all). */
void dp_session_evaluate(dp_session_t *s, int limit, double *accuracy, double *loss);

/* Steps this worker runs: conf.steps, or epochs over its share of the data. */
long dp_session_total_steps(const dp_session_t *s, int world);

/* Write conf.save (if set) from the net's parameters. */
int dp_session_save(dp_session_t *s, long step, long version, char *err);

/* What a run of a model with an embedding adds to summary.json. */
typedef struct {
    double test_auc;           /* on the test file (two classes); NAN: none */
    const uint64_t *rows;      /* rows held, one number per table (standalone: its one; a
                                * cluster: one per shard) */
    int tables;
    /* standalone: the table's digest and optimizer; a cluster's are the
     * servers' (row_optim NULL: these three and row_init not written) */
    uint64_t rows_digest;      /* dp_rows_digest of the table (server/core/rows.h) */
    const dp_row_optim_conf_t *row_optim; /* the rows' optimizer */
    double row_init;           /* the rows' initial bound (0: zeros) */
} dp_sparse_summary_t;

/* What summary.json says of an actor-critic run (the names fixed by the
 * RL tools that read it: env, env_steps, episodes, return_mean_100,
 * solved_at_env_steps, test_return), the worker's and the lab's alike
 * (deploy/lab/engine.c: a simulated or replayed run's chief); its flags
 * (envs, t_max, ...) are the conf's a3c. */
typedef struct {
    const dp_env_kind_t *kind;
    uint64_t env_steps, episodes;
    double return_mean_100, test_return;
    int64_t solved_at;         /* -1: not solved */
    const uint64_t *curve_at;  /* the run's return curve (common/episodes.h): n_curve points */
    const double *curve_mean;
    int n_curve;
} dp_rl_summary_t;

/* What a run reports in summary.json, any kind, standalone or distributed. */
typedef struct {
    const char *mode;          /* "standalone", "sync", "async", "ssp" */
    int workers;
    int ps_shards;             /* 0: standalone */
    int replicas;              /* distributed: replicas_to_aggregate */
    int staleness;             /* ssp: the staleness bound; -1 otherwise */
    long steps;                /* this worker's (the chief's) steps */
    double epochs;             /* steps over the steps per epoch */
    double test_accuracy, test_loss;
    double train_loss;         /* standalone: the smoothed training loss */
    double images_per_s_per_worker; /* this worker's (the chief's) */
    double crew_samples;       /* distributed: the samples the crew trained (dp_crew_samples) */
    double crew_s;             /* distributed: the seconds it took (the chief's loop and its wait
                                * for the last worker); images_per_s is crew_samples / crew_s
                                * (0: this x workers, standalone and the lab) */
    double train_s;            /* the training loop's seconds */
    uint64_t version;          /* distributed: the servers' version */
    uint64_t applied, dropped, rejected;
    uint64_t requests_refused; /* distributed: requests the servers refused (not pushes), all shards */
    double staleness_mean;
    uint64_t staleness_max;
    uint64_t updates_lost;     /* distributed: updates the shards lost by restarting (the chief's view) */
    const dp_optim_conf_t *optim; /* the optimizer: standalone's, or the lab's servers'; NULL
                                   * in a real cluster (downpour local adds the servers') */
    const dp_staleness_t *staleness_hist; /* counts per staleness value, or NULL */
    const char *delay_lr;      /* the servers' --delay-lr and --delay-compensation as text */
    const char *delay_compensation; /* (the lab's); NULL: not written */
    const dp_optim_conf_t *outer; /* local steps: the servers' outer optimizer (optim is then
                                   * the workers' inner one); NULL: none */
    uint64_t bytes_pushed;     /* distributed: this worker's pushes' bytes (dp_push_result_t.bytes) */
    uint64_t bytes_pulled;     /* distributed: its pulls' tensor bytes (dp_ps_client_bytes_pulled) */
    const struct dp_ps_membership *membership; /* distributed: shard 0's joins and leaves and
                                                * live range (worker/client/ps_client.h); NULL: none */
    int min_workers;           /* distributed: an elastic crew's MIN (workers is MAX); 0: fixed */
    const dp_sparse_summary_t *sparse; /* a model with an embedding: its rows and test AUC;
                                        * NULL: none */
    const dp_rl_summary_t *rl; /* an actor-critic: its episodes and test return, written in
                                * their own order (the RL tools'); NULL: none */
    const char *data;          /* the training data's name, the model's spec, the samples */
    const char *model;         /* trained (written when --train-samples cut them) */
    int train_n;
    double t_start;            /* dp_now() when the run began: wall_s */
    const dp_ps_stats_t *stats; /* a cluster's chief: the servers' STATS, for the kind's
                                 * finish (worker/train/driver.h); not written */
} dp_run_summary_t;

/* The outer optimizer's fields (outer_optimizer, outer_lr, and for
 * nesterov outer_momentum and, delayed, outer_momentum_every) into o: for
 * dp_session_summary, the simulator's result and `downpour local`, which
 * adds the servers' to the chief's summary. */
void dp_summary_outer_json(cJSON *o, const dp_optim_conf_t *outer);
/* The samples a crew trained, for the summary's images_per_s: an elastic
 * crew's, from shard 0's deal (every epoch's trained samples); a fixed
 * crew's, each of the workers as many as the chief (own_samples): the same
 * plan each. */
double dp_crew_samples(const dp_ps_membership_t *m, double own_samples, int workers);

/* "epoch_samples" (one object per dealt epoch: epoch, trained, repeated,
 * retrained_after_death, batches), as summary.json has it; the simulator's
 * result too. */
void dp_summary_epoch_samples_json(cJSON *o, const struct dp_ps_membership *m);
/* summary.json's "membership" (the joins and leaves, as the servers'
 * metrics lines give them), "live_min", "live_max", and an elastic crew's
 * epoch samples: every kind's distributed summary. */
void dp_summary_membership_json(cJSON *o, const struct dp_ps_membership *m);
/* Write c->summary (if set) from r and c: the one place where
 * summary.json's fields are named (worker/train/summary.c), every kind's. */
int dp_train_summary_write(const dp_train_conf_t *c, const dp_run_summary_t *r, char *err);
/* The same for a session's run: r's data, model and start from s. */
int dp_session_summary(dp_session_t *s, const dp_run_summary_t *r, char *err);
/* summary.json's "return_curve": [[env step, mean return of the last 100],
 * ...], the n points of the run's account then its end (end_at, end_mean). */
cJSON *dp_a3c_curve_json(const uint64_t *at, const double *mean, int n, uint64_t end_at, double end_mean);

/* A run's first metrics line: the steps it will run, for `downpour local`'s
 * progress line; total_steps -E (an elastic crew's worker, whose batches
 * shard 0 deals until they are done): "epochs": E instead. */
void dp_session_log_start(dp_session_t *s, int worker, long total_steps, long steps_per_epoch);

/* An evaluation's record: a metrics line and TensorBoard scalars. */
void dp_session_log_eval(dp_session_t *s, long step, double accuracy, double loss);
/* The same with the test AUC (a two-class sparse model's), NAN: none. */
void dp_session_log_eval_auc(dp_session_t *s, long step, double accuracy, double loss, double auc);
/* The same into given outputs (a run without a session: worker/train/driver.c). */
void dp_outputs_log_eval(dp_metrics_t *m, dp_tb_t *tb, long step, double accuracy, double loss,
                         double auc);

#endif
