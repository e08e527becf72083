/* driver: one training run of any kind, standalone or against the
 * servers. downpour-worker's one entry point (dp_train_run) picks the kind
 * (--env: rl; a model with an embedding on --data libsvm: embed; else
 * dense) and the mode (--ps or the cluster flags: distributed; else
 * standalone), and owns the lifecycle once for all of them:
 *
 *   open        the kind's (data, model, backend, net, outputs)
 *   connect     beats first, then HELLO with the kind's model and deal plan,
 *               the task's range; an elastic crew's signal ends steps whole
 *   plan        the kind's (its steps, its first step, its start line)
 *   loop        the kind's; before each step it asks dp_train_stopped
 *               whether to end, and hands each result to dp_train_done,
 *               which keeps the loss average, writes the metrics line (the
 *               kind adds its fields), TensorBoard, the periodic
 *               evaluation and the progress line (the kind words it)
 *   signal      one rule: standalone saves (the kind's save) and returns 0;
 *               an elastic crew's worker leaves after its whole step
 *               (DP_TRAIN_LEFT); any other worker fails ("interrupted")
 *   end         standalone: the kind's finish, the one summary writer; a
 *               cluster: FINISH, then the chief waits for the crew, reads
 *               the servers' STATS and membership, the kind's finish
 *               (evaluate, save, its summary sub-object), the one summary
 *               writer, and shuts the servers down
 *
 * A kind is a const table of its operations (dp_train_kind_ops_t), in the
 * manner of the backends' (kernels/backend.h): dp_train_dense (train.c,
 * distributed.c), dp_train_embed (embed_train.c), dp_train_rl
 * (a3c_train.c). What differs between kinds is theirs; what a run is, is
 * the driver's. */
#ifndef DP_TRAIN_DRIVER_H
#define DP_TRAIN_DRIVER_H

#include <signal.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"
#include "worker/exec/data.h"
#include "worker/train/train.h"

typedef struct dp_train_drv dp_train_drv_t;

/* One step as its kind hands it to the driver (dp_train_done). */
typedef struct {
    long step;                 /* its index from 0; the driver's done becomes step + 1 */
    float loss;
    double samples;            /* what it trained: samples, or an actor-critic's env steps */
    const dp_push_result_t *push; /* a cluster's: its push's result; NULL standalone */
    double pulled_at, pushed_at; /* a cluster's: dp_now() at its pull's return and its push's
                                * start; 0: not measured (the overlapped loop's, the embed
                                * kind's) */
    int last;                  /* the run's last step: the progress line is written now */
} dp_train_step_t;

/* An evaluation of the test set (auc NAN: none). */
typedef struct {
    double accuracy, loss, auc;
} dp_train_eval_t;

typedef struct dp_train_kind_ops {
    const char *name;          /* "dense", "embed", "rl" */
    /* the words after "training diverged" for a step whose loss is not
     * finite, standalone and in a cluster; NULL: not checked */
    const char *diverged, *diverged_cluster;
    /* Data, model, backend, net and outputs (d->run, d->model, d->metrics,
     * d->tb, d->progress, and a cluster's deal plan in d->opts.deal). */
    int (*open)(dp_train_drv_t *d, char *err);
    /* After connecting (a cluster) or at once (standalone): the kind's own
     * checks of the servers' info, d->first and d->total, its start line. */
    int (*plan)(dp_train_drv_t *d, char *err);
    /* The steps: dp_train_stopped before each, dp_train_done after each. 0 at
     * the end or on a signal (dp_train_stopped tells), -1 with err. */
    int (*loop)(dp_train_drv_t *d, char *err);
    /* A step's metrics line: the kind's fields into line. */
    void (*metrics)(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line);
    /* A step's progress line, worded into line. */
    void (*progress)(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n);
    /* The test set (its first limit samples, 0: all, where the kind can
     * cut it) on the weights the net holds; NULL: no periodic one. */
    int (*evaluate)(dp_train_drv_t *d, int limit, dp_train_eval_t *e, char *err);
    /* Standalone stopped by a signal: --save (if given) at the step reached. */
    int (*save)(dp_train_drv_t *d, char *err);
    /* The end of a whole run (standalone, or a cluster's chief with r's
     * servers' part filled): evaluate, log, --save, and the kind's part of
     * r (data, model, its result; its sub-object, which lives in d->run
     * until the summary is written). */
    int (*finish)(dp_train_drv_t *d, dp_run_summary_t *r, char *err);
    void (*close)(dp_train_drv_t *d);
} dp_train_kind_ops_t;

extern const dp_train_kind_ops_t dp_train_dense, dp_train_embed, dp_train_rl;

/* A run as the driver holds it; the kind's own state is d->run. */
struct dp_train_drv {
    const dp_train_conf_t *c;
    const dp_train_kind_ops_t *ops;
    void *run;                 /* the kind's (its open allocates, its close frees) */
    volatile sig_atomic_t *stop;
    int standalone;            /* no servers (c->ps NULL) */
    const dp_model_t *model;   /* the kind's, for HELLO */
    dp_metrics_t *metrics;     /* the kind's outputs */
    dp_tb_t *tb;
    dp_progress_t *progress;
    /* a cluster */
    dp_ps_client_opts_t opts;
    dp_ps_beat_t *beat;
    dp_ps_client_t *ps;
    dp_ps_info_t info;
    int elastic;               /* --workers MIN:MAX on the servers */
    /* the steps */
    long first, total, done;   /* where it starts (a rejoin), ends (LONG_MAX: dealt), got to */
    double t_open, t0;         /* dp_now() at open and at the loop's start */
    double t_step;             /* dp_now() at the last step's record (0: none yet) */
    double loss_avg;           /* the smoothed training loss */
    double samples;            /* trained since first */
    double stale_sum;          /* a cluster: its pushes' mean staleness, summed */
    int workers_live;          /* the crew's size at the last push, 0: not yet */
};

/* downpour-worker's run: 0 when done (standalone stopped by a signal: the
 * model saved, no summary; the caller exits 128 + signal), DP_TRAIN_LEFT
 * when an elastic crew's worker left on a signal (the caller exits 0),
 * -1 with err. stop may be NULL. */
int dp_train_run(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err);
#define DP_TRAIN_LEFT 1

/* Whether a signal asked the run to end (the loop ends after its step). */
static inline int dp_train_stopped(const dp_train_drv_t *d)
{
    return d->stop && *d->stop;
}

/* A step done: the loss average, the metrics line, TensorBoard, the
 * periodic evaluation (the chief's), the progress line. 0, or -1 with err
 * (a loss not finite, where the kind checks it; a failed evaluation). */
int dp_train_done(dp_train_drv_t *d, const dp_train_step_t *st, char *err);

/* An evaluation's record: a metrics line and TensorBoard scalars. */
void dp_train_log_eval(dp_train_drv_t *d, long step, const dp_train_eval_t *e);

/* Test hook (DP_TEST_HOLD_DIR=DIR): worker task holds before its step
 * `step` while DIR/hold-TASK-STEP exists, its pid in DIR/held-TASK-STEP,
 * until the file goes or *stop is set (worker/train/distributed.c says more). */
void dp_train_test_hold(int task, long step, volatile sig_atomic_t *stop);

/* The dense kind's run (train.c standalone, distributed.c in a cluster). */
struct dp_dense_cluster;
typedef struct {
    dp_session_t s;
    dp_optim_conf_t optim;     /* standalone: --optimizer, annealed over the run by default */
    float *d_state;            /* standalone: the optimizer's state (on the backend) */
    dp_batcher_t bt;
    long spe;                  /* steps per epoch (this worker's share in a cluster) */
    float lr;                  /* standalone: the last step's */
    struct dp_dense_cluster *cl; /* a cluster's loop state (distributed.c) */
} dp_dense_run_t;

/* The dense kind in a cluster (distributed.c). */
int dp_dense_cluster_plan(dp_train_drv_t *d, char *err);
int dp_dense_cluster_loop(dp_train_drv_t *d, char *err);
void dp_dense_cluster_metrics(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line);
void dp_dense_cluster_progress(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n);
int dp_dense_cluster_finish(dp_train_drv_t *d, dp_run_summary_t *r, char *err);
void dp_dense_cluster_close(dp_train_drv_t *d);

#endif
