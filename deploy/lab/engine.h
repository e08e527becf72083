/* lab/engine: the engine `downpour sim` and `downpour replay` share — a cluster in
 * one process: K parameter-server shards (server/core/shard.h) behind the very
 * policies the daemons run (server/core/policy.h: the same push, pull_ready and
 * members_changed code, no copy), M virtual workers whose gradients are
 * real (worker/exec/net.h on the training set, each worker's batches exactly
 * those the worker daemon would take: worker/exec/data.h's global-batch order),
 * and the end of a run as the chief does it (worker/train/train.h: evaluate,
 * model.safetensors, summary.json).
 *
 * Who calls what: the simulator pulls (dp_lab_params), computes
 * (dp_lab_gradient) and pushes (dp_lab_push) in the order its simulated
 * clock gives; replay does the same in the order a record file gives.
 * Both may record (server/core/record.h) what the policies decided.
 *
 * A sparse lab (a model with embed:D, deploy/lab/sparse.h): the shards
 * also hold row tables behind their row rules; a worker's step pulls its
 * batch's rows from each (dp_lab_rows_pull), computes
 * (dp_lab_sparse_gradient) and pushes the rows' gradients
 * (dp_lab_rows_push) before its dense push; dp_lab_push runs the dense
 * step's row hooks as downpour-ps does. Replay in a record's order, sim
 * at each worker's simulated pull and push (deploy/lab/sim_run.c).
 *
 * An actor-critic lab (conf.train.a3c.env set, deploy/lab/rl.h) has no
 * data: a worker's gradient is its next segment of rollouts on the weights
 * given, its push carries the segment's account (dp_lab_push_rl), and the
 * chief's end is the worker's (test_return, summary.json's RL fields).
 *
 * Determinism: on the CPU backend a gradient is a function of (params,
 * batch, kernel threads); the engine sets the threads from its conf (1 by
 * default) and OpenBLAS always runs single-threaded (kernels/cpu/threads.c). */
#ifndef DP_LAB_H
#define DP_LAB_H

#include <stdint.h>

#include "common/staleness.h"
#include "deploy/lab/rl.h"
#include "deploy/lab/sparse.h"
#include "proto/wire.h"
#include "server/core/policy.h"
#include "server/core/record.h"
#include "server/core/shard.h"
#include "server/crew/members.h"
#include "worker/train/train.h"

typedef struct {
    dp_train_conf_t train;     /* data, model, batch, data seed, threads, save / summary / metrics */
    uint64_t init_seed;        /* the servers' --seed (initial weights) */
    int workers, shards;
    int min_workers;           /* an elastic crew's MIN (a replayed record's), 0: fixed */
    dp_mode_t mode;
    dp_policy_conf_t policy;   /* R, S, the delay rule */
    dp_optim_conf_t optim;     /* the servers' optimizer and lr schedule (the outer one with
                                * local steps) */
    long local_steps;          /* H > 1: a worker's push is the pseudo-gradient of H steps of
                                * its own optimizer `inner` (--local-steps) */
    int dylu;                  /* --local-steps auto (DyLU, common/dylu.h): local_steps is the
                                * fastest worker's H, each round's its own (dp_lab_round) */
    dp_optim_conf_t inner;     /* the workers' optimizer under local steps */
    int measure;               /* norms of every step (dp_policy_measure) */
    const char *record;        /* write the schedule here, or NULL */
    int has_rows;              /* a model with embed:D: the shards' row tables are known, */
    dp_rows_conf_t rows;       /* ... of this conf (a record's header "rows"), */
    dp_mode_t rows_mode;       /* ... their pushes applied as this mode says (server/core/ps_rows.h) */
} dp_lab_conf_t;

typedef struct {
    dp_lab_conf_t conf;
    dp_session_t s;            /* data, model, backend, executor, metrics */
    dp_shard_t *shard;         /* [shards] */
    dp_members_t *members;     /* [shards], every worker joined */
    dp_policy_t **policy;      /* [shards] */
    int *idx;                  /* one batch: sample indices, pixels, labels */
    float *x;
    int *y;
    float *aug_tmp;            /* one sample, for --augment's crop */
    dp_record_t *rec;
    dp_staleness_t *per_worker; /* [workers]: staleness of each worker's used gradients */
    uint64_t pushes;           /* pushes handed to the policies (all shards) */
    float **inner_state;       /* [workers]: local steps' optimizer state, made at first use */
    float *w_local;            /* local steps: the weights a round reaches */
    long *round_h;             /* [workers] DyLU: the H of each worker's next round (dp_lab_round), */
    long *round_n;             /* ... the data steps of its round computed last (H, or fewer at
                                * conf.train.steps), */
    long *next_data;           /* ... and its next round's first data step */
    dp_compressor_t **z;       /* [workers * shards] --compress: each worker's compressor (and
                                * error feedback) per shard slice, made on its first push;
                                * NULL without compression */
    uint64_t bytes_chief;      /* worker 0's pushes' bytes (summary.json bytes_pushed) */
    dp_lab_rl_t *rl;           /* --env: the workers' rollouts and the run's account; NULL for
                                * a classifier */
    dp_lab_sparse_t *sp;       /* a model with embed:D (deploy/lab/sparse.h); NULL: dense */
    double test_auc;           /* dp_lab_finish's, of a sparse model (NAN: none) */
} dp_lab_t;

/* The defaults a cluster launched by `downpour local` would have: async,
 * 1 shard, Adam at its default lr, seeds 1, 1 thread. */
void dp_lab_conf_default(dp_lab_conf_t *c);
/* A lab conf as a record header (JSON object), and back. */
cJSON *dp_lab_conf_header(const dp_lab_conf_t *c);
int dp_lab_conf_from_header(dp_lab_conf_t *c, const cJSON *h, char *err);

/* 1 when c is a sparse run (its model starts with embed:D, or its data
 * is libsvm:, which only such a model trains), else 0: the model parsed,
 * not its text. */
int dp_lab_is_sparse(const dp_lab_conf_t *c);
/* -1 with one line in err for a sparse run (dp_lab_is_sparse) whose row
 * tables' conf is not known (c->has_rows: a record's header gives it, or
 * downpour sim's row flags, resolved by downpour-ps's rule).
 * dp_lab_init checks it first. */
int dp_lab_check_dense(const dp_lab_conf_t *c, char *err);
int dp_lab_init(dp_lab_t *L, const dp_lab_conf_t *c, char *err);
void dp_lab_fini(dp_lab_t *L);

/* Shard k's slice of the parameter vector is written into params (the full
 * vector, n_floats); all shards with k < 0. */
void dp_lab_params(const dp_lab_t *L, int k, float *params);
/* worker was sent every shard's current weights (after dp_lab_params, as
 * a shard answering its pull): the weights delay compensation keeps. */
void dp_lab_pulled(dp_lab_t *L, int worker);
/* The gradient worker computes at its 0-based data step from params, into
 * grad (n_floats), as the worker daemon would. Returns the batch's loss.
 * With local steps, step is the worker's 0-based round and grad the
 * round's pseudo-gradient (the worker daemon's s_loop_local: H steps of
 * conf.inner over data steps round*H ..., capped at conf.train.steps when
 * that is set, state carried from round to round per worker); the mean
 * loss of its steps is returned. A worker's rounds must come in order.
 * dealt (not with local steps; NULL: none): the batch shard 0 of an
 * elastic crew dealt the push (worker/exec/data.h), trained instead of the
 * batch of (worker, step); its index is below the data's batches an epoch. */
float dp_lab_gradient(dp_lab_t *L, const float *params, int worker, long step,
                      const dp_deal_batch_t *dealt, float *grad);
/* A sparse model's step (L->sp, deploy/lab/sparse.h), as the worker
 * daemon takes it (worker/train/embed_train.c):
 * dp_lab_batch_load: worker's batch at its 0-based data step into j (its
 * distinct keys planned; rows and gradients to come): 0, or -1 with err.
 * dp_lab_rows_pull: shard k answers worker's pull of j's keys of shard k,
 * as the daemon's ROWS_PULL (dp_ps_rows_pull: the table as it stands
 * now), into their places in j->rows; the keys of shard k, or -1 with err.
 * dp_lab_sparse_gradient: the dense gradient worker computes on params and
 * j's rows at its data step, into grad, and the rows' gradients into
 * j->grads; the batch's loss.
 * dp_lab_rows_push: shard k takes worker's ROWS_PUSH of j's gradients of
 * shard k (Push.step step, pulled at version pulled_at), as the daemon
 * does (dp_ps_rows_push at the shard's version): o the outcome, *norm the
 * L2 norm of the rows pushed (dp_record_rows_norm: the record's "gn"), the
 * keys of shard k returned (*repeat: 1 when the shard took it as a repeat). */
int dp_lab_batch_load(dp_lab_t *L, int worker, long step, dp_lab_batch_t *j, char *err);
long dp_lab_rows_pull(dp_lab_t *L, int k, int worker, dp_lab_batch_t *j, char *err);
float dp_lab_sparse_gradient(dp_lab_t *L, const float *params, int worker, long step, dp_lab_batch_t *j,
                             float *grad);
size_t dp_lab_rows_push(dp_lab_t *L, int k, int worker, uint64_t step, uint64_t pulled_at,
                        const dp_lab_batch_t *j, dp_push_outcome_t *o, double *norm, int *repeat);
/* A sparse lab's own part (deploy/lab/sparse.c): init (from L->conf: the
 * session without image data, each worker's reader, the stage, a row
 * table per shard; the shards themselves are dp_lab_init's), fini (safe
 * on a part made half), and the chief's test figures (accuracy, loss,
 * AUC) on the shards' current weights and rows. */
int dp_lab_sparse_init(dp_lab_t *L, char *err);
void dp_lab_sparse_fini(dp_lab_t *L);
int dp_lab_sparse_evaluate(dp_lab_t *L, double *acc, double *loss, double *auc, char *err);

/* Data steps worker's push number `step` (0-based) stands for: 1, or with
 * local steps the round's H (fewer in a last round cut at conf.train.steps;
 * with DyLU the H of worker's round computed last). */
long dp_lab_push_steps(const dp_lab_t *L, int worker, long step);
/* DyLU (conf.dylu): worker's next round takes h data steps (1..H; the
 * simulator's rule, or a replayed record's "h"). A round not told takes H.
 * Its pushes are recorded with it ("h"), so a replay repeats it. */
void dp_lab_round(dp_lab_t *L, int worker, long h);
/* Shard k gets grad's slice from worker's data step, computed on version:
 * the policy decides (o); counted per worker and recorded, with the batch
 * shard 0 dealt it (dealt; NULL: the batch of its (worker, step)). */
void dp_lab_push(dp_lab_t *L, int k, int worker, long step, uint64_t version, const float *grad,
                 const dp_deal_batch_t *dealt, dp_push_outcome_t *o);
/* An actor-critic push (L->rl): dp_lab_push carrying the segment's account
 * g, which the record writes with the push and, on shard 0, the run's
 * account takes (as every shard counts Push.env_steps and the episodes). */
void dp_lab_push_rl(dp_lab_t *L, int k, int worker, long step, uint64_t version, const float *grad,
                    const dp_lab_seg_t *g, dp_push_outcome_t *o);
/* The member state of shard k from a record ("LFG..."), and with call the
 * policy's members_changed. Returns 1 when the version moved. */
int dp_lab_members(dp_lab_t *L, int k, const char *state, int call);

/* A change of the crew at every shard, as the daemons' loops see it: a
 * worker joins (its HELLO), leaves (its SIGTERM, after its last push),
 * finishes (no data left) or dies (the heartbeat timeout); recorded, and
 * the policies told. Returns 1 when shard 0's version moved (a sync step
 * no longer waiting for it). */
typedef enum { DP_LAB_JOIN, DP_LAB_LEAVE, DP_LAB_FINISH, DP_LAB_DIE } dp_lab_crew_t;
int dp_lab_crew(dp_lab_t *L, int worker, dp_lab_crew_t what);

/* Every shard's counters and staleness summed (the chief's STATS view:
 * applied etc. from shard 0, staleness merged over shards). */
void dp_lab_counts(const dp_lab_t *L, dp_shard_counts_t *c, dp_staleness_t *all);

/* The chief's end: evaluate the current weights (an actor-critic run: the
 * greedy test return, in rl->test_return, and the worker's summary.json), save conf.train.save,
 * write conf.train.summary with the run's figures (and crew: the
 * membership and dealt epochs of an elastic run, or NULL); close the
 * record. accuracy / loss out (may be NULL). */
int dp_lab_finish(dp_lab_t *L, long chief_steps, double train_s, const struct dp_ps_membership *crew,
                  double *accuracy, double *loss, char *err);

#endif
