/* sim: `downpour sim`'s command line and output (the loop is sim_run.c). */
#include "deploy/lab/sim.h"
#include "worker/train/progress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/dylu.h"
#include "common/opts.h"
#include "common/util.h"
#include "deploy/launcher/commands.h"
#include "worker/exec/data.h"

static const char s_synopsis[] =
    "usage: downpour sim --workers M --compute DIST [--straggler I:FACTOR] --updates N\n"
    "                    [--mode async|sync|ssp] [--model SPEC] [--json] [...]\n"
    "       downpour sim --workers MIN:MAX --churn leave:S|kill:S --updates N [...]\n"
    "       downpour sim --env cartpole-v1|acrobot-v1 --workers M [--env-steps N] [...]\n"
    "       downpour sim --model 'embed:D ...' --data libsvm:TRAIN[:TEST] [--ps-shards K]\n"
    "                    [--rows-mode M] [--row-optimizer NAME] [--row-lr X] [--row-init X] [...]\n"
    "A simulated cluster in one process: M virtual workers on a simulated clock,\n"
    "real gradients on real data, the parameter server's own update code.\n"
    "DIST: const:MS, exp:MEAN_MS, lognormal:MU:SIGMA (exp(MU + SIGMA z) ms), or\n"
    "trace:DIR, the step times of the downpour local run whose --out is DIR,\n"
    "simulated worker w replaying worker w mod T's of T, wrapping (docs/LAB.md).\n"
    "\n";

static const char s_epilog[] =
    "With --json, stdout is JSON lines (evaluations, diagnostics) and the last line\n"
    "is the result: fresh_fraction, staleness_mean, staleness_max, test_accuracy,\n"
    "updates, ... The lr anneals to zero over the N updates (cosine) unless\n"
    "--lr-schedule is given. The same flags give the same result, bit for bit.\n"
    DP_MODEL_SPEC_HELP;

typedef struct {
    dp_sim_conf_t c;
    const char *out;
    long epochs;
    int backup;
    char outer[24];            /* --outer-optimizer */
    long outer_every;          /* --outer-momentum-every (0: downpour-ps's default) */
    float outer_lr, outer_momentum;
    double slow[DP_SIM_MAX_WORKERS];
    char save[4096], summary[4096];
    dp_ps_config_t ps;         /* a model with embed:D: the servers' row flags, resolved by
                                * downpour-ps's own rule (dp_ps_rows_conf) */
} s_args_t;

static int s_set_compute(void *arg, const char *v, char *err)
{
    return dp_dist_parse(&((s_args_t *)arg)->c.compute, v, err);
}

/* "I:FACTOR", may be given more than once. */
static int s_set_straggler(void *arg, const char *v, char *err)
{
    s_args_t *a = arg;
    const char *colon = strchr(v, ':');
    char index[16];
    long i;
    double f;
    if (!colon || colon - v >= (long)sizeof index) goto bad;
    snprintf(index, sizeof index, "%.*s", (int)(colon - v), v);
    if (dp_opts_parse_long("--straggler", index, 0, DP_SIM_MAX_WORKERS - 1, &i, NULL) != 0 ||
        dp_opts_parse_double("--straggler", colon + 1, 1e-3, 1e6, &f, NULL) != 0)
        goto bad;
    a->slow[i] = f;
    return 0;
bad:
    return dp_err(err, "'%s' is not WORKER:FACTOR (WORKER in [0, %d], FACTOR in [0.001, 1e6]), e.g. 0:4",
                  v, DP_SIM_MAX_WORKERS - 1);
}

static int s_set_workers(void *arg, const char *v, char *err)
{
    dp_lab_conf_t *l = &((s_args_t *)arg)->c.lab;
    return dp_opts_parse_crew("--workers", v, DP_SIM_MAX_WORKERS, &l->min_workers, &l->workers, err);
}

static int s_set_churn(void *arg, const char *v, char *err)
{
    return dp_churn_parse(&((s_args_t *)arg)->c.churn, v, err);
}

static int s_set_mode(void *arg, const char *v, char *err)
{
    return dp_mode_parse(v, &((s_args_t *)arg)->c.lab.mode, err);
}

static int s_set_optimizer(void *arg, const char *v, char *err)
{
    return dp_optim_parse_kind(&((s_args_t *)arg)->c.lab.optim, v, err);
}

static int s_set_schedule(void *arg, const char *v, char *err)
{
    return dp_optim_parse_schedule(&((s_args_t *)arg)->c.lab.optim, v, err);
}

static int s_set_delay_lr(void *arg, const char *v, char *err)
{
    dp_policy_conf_t *p = &((s_args_t *)arg)->c.lab.policy;
    return dp_delay_lr_parse(v, &p->delay_lr, &p->delay_k, err);
}

static int s_set_dc(void *arg, const char *v, char *err)
{
    return dp_optim_parse_dc(&((s_args_t *)arg)->c.lab.optim, v, err);
}

static int s_set_rows_mode(void *arg, const char *v, char *err)
{
    return dp_mode_parse(v, &((s_args_t *)arg)->ps.rows_mode, err);
}

static int s_set_row_optimizer(void *arg, const char *v, char *err)
{
    dp_row_optim_kind_t k;
    if (dp_row_optim_parse_kind(v, &k, err) != 0) return -1;
    dp_row_optim_conf_default(&((s_args_t *)arg)->ps.rows.optim, k); /* --row-lr after parsing */
    return 0;
}

static int s_set_local_steps(void *arg, const char *v, char *err)
{
    dp_lab_conf_t *l = &((s_args_t *)arg)->c.lab;
    return dp_dylu_parse(v, &l->local_steps, &l->dylu, err);
}

static int s_set_compress(void *arg, const char *v, char *err)
{
    return dp_compress_parse(v, &((s_args_t *)arg)->c.lab.train.compress, err);
}

static int s_set_precision(void *arg, const char *v, char *err)
{
    return dp_precision_parse(v, &((s_args_t *)arg)->c.lab.train.precision, err);
}

static int s_set_error_feedback(void *arg, const char *v, char *err)
{
    return dp_compress_ef_parse(v, &((s_args_t *)arg)->c.lab.train.compress.error_feedback, err);
}

/* The actor-critic flags (--env and its segment), after the others. */
static void s_options_rl(dp_opts_t *o, dp_train_conf_t *t)
{
    const dp_opts_flag_t tab[] = {
        DP_FLAG_STR("env", "NAME", &t->a3c.env, 0,
                    "A3C / A2C: M actor-critic workers act in cartpole-v1 or acrobot-v1\n"
                    "instead of training on --data, until --env-steps (as downpour-worker\n"
                    "--help says; the model: --model ending in ac, default\n"
                    "\"" DP_A3C_DEFAULT_SPEC "\"; the lr constant unless --lr-schedule)"),
        DP_FLAG_NUM("envs", DP_OPTS_INT, "K", &t->a3c.envs, 1, DP_A3C_MAX_ENVS, 0,
                    "--env: environments each worker acts in (default 1)"),
        DP_FLAG_NUM("t-max", DP_OPTS_INT, "T", &t->a3c.t_max, 1, DP_A3C_MAX_T, 0,
                    "--env: steps of each environment per push (default 5)"),
        DP_FLAG_NUM("entropy", DP_OPTS_FLOAT, "B", &t->a3c.entropy, 0, 100, 0,
                    "--env: weight of the entropy bonus (default 0.01)"),
        DP_FLAG_NUM("gamma", DP_OPTS_FLOAT, "G", &t->a3c.gamma, 0, 1, 0, "--env: discount (default 0.99)"),
        DP_FLAG_CHOICE("obs-norm", "off|on", &t->a3c.obs_norm, 0,
                       "--env: on: the model's first layer obsnorm (default off)"),
        DP_FLAG_NUM("reward-scale", DP_OPTS_FLOAT, "S", &t->a3c.reward_scale, 1e-6, 1e6, 0,
                    "--env: each reward times S in the returns learned from (default 0.1; 1: off)"),
        DP_FLAG_NUM("clip-norm", DP_OPTS_FLOAT, "N", &t->a3c.clip_norm, 0, 1e9, 0,
                    "--env: clip each gradient to this global L2 norm (default 40; 0: off)"),
        DP_FLAG_NUM("env-steps", DP_OPTS_LONG, "N", &t->a3c.env_steps, 1, 1000000000000L, 0,
                    "--env: the run's budget in environment steps, all workers together\n"
                    "(default 500000)"),
    };
    dp_opts_add(o, tab, (int)(sizeof tab / sizeof tab[0]));
}

/* What a run writes, and where. */
static void s_options_out(dp_opts_t *o, s_args_t *a)
{
    dp_sim_conf_t *c = &a->c;
    dp_train_conf_t *t = &c->lab.train;
    const dp_opts_flag_t tab[] = {
        DP_FLAG_SET("json", &c->json, 1, 0, "JSON lines on stdout, the result last"),
        DP_FLAG_SET("progress", &c->progress, DP_PROGRESS_ON, 0, "the progress line (default: on a terminal)"),
        DP_FLAG_SET("no-progress", &c->progress, DP_PROGRESS_OFF, 0, "no progress line"),
        DP_FLAG_STR("metrics", "FILE", &t->metrics, 0, "JSON lines of evaluations and diagnostics"),
        DP_FLAG_STR("out", "DIR", &a->out, 0, "DIR/summary.json and DIR/model.safetensors"),
        DP_FLAG_STR("record", "FILE", &c->lab.record, 0, "the schedule, for downpour replay"),
    };
    dp_opts_add(o, tab, (int)(sizeof tab / sizeof tab[0]));
}

static void s_options(dp_opts_t *o, s_args_t *a)
{
    dp_sim_conf_t *c = &a->c;
    dp_train_conf_t *t = &c->lab.train;
    const dp_opts_flag_t tab[] = {
        DP_FLAG_CALL("workers", "M|MIN:MAX", s_set_workers, a, 0,
                     "virtual workers (default 4); MIN:MAX: an elastic crew, MIN live at the\n"
                     "start, the batches dealt by shard 0 (each sample of an epoch once)"),
        DP_FLAG_CALL("churn", "leave:S|kill:S", s_set_churn, a, 0,
                     "an elastic crew changes every S simulated seconds on average (seeded):\n"
                     "a join, or a random worker but the chief leaves after its push (leave)\n"
                     "or dies with it (kill, its batch trained again)"),
        DP_FLAG_CALL("compute", "DIST", s_set_compute, a, 0, "compute time per gradient (default exp:100)"),
        DP_FLAG_CALL("straggler", "I:FACTOR", s_set_straggler, a, 0,
                     "worker I's compute times x FACTOR (may repeat)"),
        DP_FLAG_NUM("updates", DP_OPTS_LONG, "N", &c->updates, 1, 1L << 40, 0,
                    "stop at server version N (async: N pushes; sync: N steps)"),
        DP_FLAG_NUM("epochs", DP_OPTS_LONG, "E", &a->epochs, 1, 1 << 20, 0,
                    "instead of --updates: E epochs of data, as downpour local counts them"),
        DP_FLAG_CALL("mode", "sync|async|ssp", s_set_mode, a, 0, "consistency (default async)"),
        DP_FLAG_NUM("replicas-to-aggregate", DP_OPTS_INT, "R", &c->lab.policy.replicas, 1, DP_SIM_MAX_WORKERS, 0,
                    "sync: gradients per step (default: all workers)"),
        DP_FLAG_NUM("backup", DP_OPTS_INT, "B", &a->backup, 0, DP_SIM_MAX_WORKERS, 0,
                    "sync: B backup workers, i.e. R = M - B"),
        DP_FLAG_NUM("staleness", DP_OPTS_INT, "S", &c->lab.policy.staleness, 0, 1000000, 0,
                    "ssp: max pushes a worker may be ahead (default 0)"),
        DP_FLAG_CALL("delay-lr", "RULE", s_set_delay_lr, a, 0,
                     "async/ssp: none (default), inverse, adaptive or threshold[:K]\n"
                     "(as downpour-ps --help says)"),
        DP_FLAG_SET("lr-staleness", &c->lab.policy.delay_lr, DP_DELAY_INVERSE, 0, "the same as --delay-lr inverse"),
        DP_FLAG_CALL("delay-compensation", "DC", s_set_dc, a, 0,
                     "async/ssp: off (default), const:LAMBDA or adaptive:LAMBDA0 (DC-ASGD)"),
        DP_FLAG_CALL("local-steps", "H|auto[:H]", s_set_local_steps, a, 0,
                    "local SGD / DiLoCo: each push is H steps of --optimizer on the\n"
                    "worker's copy (H compute times), the servers step by the outer\n"
                    "optimizer (as downpour-ps --help says; default 1: off); auto\n"
                    "(DyLU): the fastest worker H (default 8), the others in\n"
                    "proportion to their simulated speed"),
        DP_FLAG_BUF("outer-optimizer", "sgd|nesterov|delayed-nesterov", a->outer, 0,
                    "with --local-steps: averaging (lr 1), DiLoCo's nesterov (lr 0.7,\n"
                    "its momentum on every push) or delayed-nesterov (the momentum\n"
                    "once per --outer-momentum-every pushes, default M in async/ssp;\n"
                    "lr 0.5 there)"),
        DP_FLAG_NUM("outer-lr", DP_OPTS_FLOAT, "X", &a->outer_lr, 1e-12, 1e6, 0,
                    "with --local-steps: the outer lr"),
        DP_FLAG_NUM("outer-momentum", DP_OPTS_FLOAT, "X", &a->outer_momentum, 0, 1, 0,
                    "with --local-steps: the outer nesterov's momentum (default 0.9)"),
        DP_FLAG_NUM("outer-momentum-every", DP_OPTS_LONG, "N", &a->outer_every, 1, 1000000, 0,
                    "with delayed-nesterov: pushes per move of the momentum"),
        DP_FLAG_CALL("compress", "none|topk:F|sign", s_set_compress, a, 0,
                     "each worker compresses its pushes (as downpour-worker --help says)"),
        DP_FLAG_CALL("error-feedback", "on|off", s_set_error_feedback, a, 0,
                     "with --compress: each worker keeps what it did not send (default on)"),
        DP_FLAG_NUM("ps-shards", DP_OPTS_INT, "K", &c->lab.shards, 1, 1024, 0,
                    "parameter-server shards, each a slice of the weights and its part\n"
                    "of a model's rows (default 1)"),
        DP_FLAG_CALL("rows-mode", "sync|async|ssp", s_set_rows_mode, a, 0,
                     "a model with embed:D: when its row pushes apply (as downpour-ps\n"
                     "--help says; default --mode's)"),
        DP_FLAG_CALL("row-optimizer", "NAME", s_set_row_optimizer, a, 0,
                     "a model with embed:D: the rows' optimizer (as downpour-ps --help\n"
                     "says; default adagrad)"),
        DP_FLAG_NUM("row-lr", DP_OPTS_FLOAT, "X", &a->ps.row_lr, 1e-12, 1e6, 0,
                    "a model with embed:D: the rows' lr (default: --lr's)"),
        DP_FLAG_NUM("row-init", DP_OPTS_FLOAT, "X", &a->ps.row_init, 0, 1e3, 0,
                    "a model with embed:D: a new row uniform in [-X, X) by --seed and\n"
                    "key; 0: zeros (default 0.01; ftrl: 0)"),
        DP_FLAG_STR("model", "SPEC", &t->model, 0, "network (default the project's)"),
        DP_FLAG_STR("data", "SPEC", &t->data, 0, "dataset (default fashion-mnist)"),
        DP_FLAG_NUM("train-samples", DP_OPTS_INT, "N", &t->train_samples, 0, 1 << 30, 0,
                    "the first N training samples only (as downpour-worker --help says)"),
        DP_FLAG_SET("augment", &t->augment, 1, 0, "random crop + flip (as downpour-worker --help says)"),
        DP_FLAG_STR("normalize", "train|M,../S,..", &t->normalize, 0, "per-channel (x - mean) / std"),
        DP_FLAG_NUM("batch", DP_OPTS_INT, "B", &t->batch, 1, 1 << 16, 0, "per worker (default 64)"),
        DP_FLAG_CALL("optimizer", "NAME", s_set_optimizer, a, 0, "sgd|momentum|nesterov|adam|adagrad|rmsprop (default adam)"),
        DP_FLAG_NUM("lr", DP_OPTS_FLOAT, "X", &c->lab.optim.lr, 1e-12, 1e6, 0, "learning rate (default: the optimizer's)"),
        DP_FLAG_NUM("momentum", DP_OPTS_FLOAT, "X", &c->lab.optim.momentum, 0, 1, 0, "momentum (default 0.9)"),
        DP_FLAG_NUM("rms-alpha", DP_OPTS_FLOAT, "X", &c->lab.optim.alpha, 0, 1, 0,
                    "rmsprop: square average's smoothing (default 0.99)"),
        DP_FLAG_NUM("eps", DP_OPTS_FLOAT, "X", &c->lab.optim.eps, 1e-30, 1e3, 0,
                    "adam, adagrad, rmsprop: added to the root (default 1e-8)"),
        DP_FLAG_NUM("weight-decay", DP_OPTS_FLOAT, "X", &c->lab.optim.weight_decay, 0, 1e3, 0, "L2 weight decay"),
        DP_FLAG_CALL("lr-schedule", "S", s_set_schedule, a, 0, "constant | step:STEPS:GAMMA | cosine:TOTAL"),
        DP_FLAG_SEED("seed", &t->seed, 0, "weights, data order and compute times (default 1)"),
        DP_FLAG_NUM("threads", DP_OPTS_INT, "N", &t->threads, 1, 1024, 0, "CPU kernel threads (default 1)"),
        DP_FLAG_CALL("precision", "fp32|bf16", s_set_precision, a, 0,
                     "the workers' conv and fc arithmetic (as downpour-worker --help\nsays; default fp32)"),
        DP_FLAG_NUM("eval-every", DP_OPTS_LONG, "N", &c->eval_every, 0, 1L << 40, 0,
                    "evaluate every N updates (an \"eval\" line; default 0: at the end)"),
        DP_FLAG_NUM("eval-limit", DP_OPTS_INT, "N", &c->eval_limit, 0, 1 << 30, 0,
                    "test samples per periodic evaluation (default 0: all)"),
        DP_FLAG_NUM("diag-every", DP_OPTS_LONG, "N", &c->diag_every, 0, 1L << 40, 0,
                    "diagnostics every N updates (a \"diag\" line; costs a gradient)"),
    };
    dp_opts_init(o, "downpour sim", s_synopsis, s_epilog);
    dp_opts_add(o, tab, (int)(sizeof tab / sizeof tab[0]));
    s_options_out(o, a);
    s_options_rl(o, t);
}

/* --local-steps H > 1: the flags' optimizer is the workers' inner one, the
 * servers' the outer one, by downpour-ps's own rule. */
static int s_local_steps(s_args_t *a, dp_opts_t *o, char *err)
{
    dp_lab_conf_t *l = &a->c.lab;
    dp_ps_config_t ps;
    dp_ps_config_default(&ps);
    snprintf(ps.outer_optimizer, sizeof ps.outer_optimizer, "%s", a->outer);
    ps.outer_lr = a->outer_lr;
    if (dp_opts_find(o, "outer-momentum")->given) ps.outer_momentum = a->outer_momentum;
    ps.outer_every = a->outer_every;
    ps.mode = l->mode;
    ps.num_workers = l->workers;
    ps.local_steps = l->local_steps;
    ps.optim = l->optim;
    if (dp_ps_resolve_local_steps(&ps, o, err) != 0) return -1;
    l->inner = l->optim;
    l->optim = ps.optim;
    return 0;
}

/* --env: the flags of a classifier's run refused with it, the RL flags
 * without it; the model's default the RL one. */
static int s_env_flags(s_args_t *a, dp_opts_t *o, char *err)
{
    static const char *const classifier[] = {"updates", "epochs", "eval-every", "eval-limit", "diag-every",
                                             "data", "train-samples", "augment", "normalize", "batch",
                                             "local-steps", "churn"};
    static const char *const rl[] = {"envs", "t-max", "entropy", "gamma", "reward-scale", "obs-norm", "clip-norm",
                                     "env-steps"};
    int env = a->c.lab.train.a3c.env != NULL;
    for (size_t i = 0; env && i < sizeof classifier / sizeof classifier[0]; i++)
        if (dp_opts_find(o, classifier[i])->given)
            return dp_err(err, "--%s: not with --env (an actor-critic run has no data set; it "
                          "stops at --env-steps)", classifier[i]);
    for (size_t i = 0; !env && i < sizeof rl / sizeof rl[0]; i++)
        if (dp_opts_find(o, rl[i])->given)
            return dp_err(err, "--%s is an actor-critic flag: give --env NAME with it", rl[i]);
    if (env && !dp_opts_find(o, "model")->given) a->c.lab.train.model = NULL; /* the RL default */
    if (env && a->c.lab.min_workers > 0)
        return dp_err(err, "--workers MIN:MAX: an --env run has a fixed crew (give --workers M)");
    return 0;
}

/* A model with embed:D (dp_lab_is_sparse): a fixed crew, worker i of M
 * training batches i, i + M, ... as the embed kind's cluster loop does, and the
 * row tables' conf from the row flags by downpour-ps's own rule
 * (dp_ps_rows_conf: --row-lr defaults to --lr's, --row-init to the
 * optimizer's start, seeded by --seed). Periodic evaluations and
 * diagnostics are refused: the chief's evaluation pulls rows, which a
 * record holds only at the end (downpour replay skips them there). The
 * row flags without such a model are refused too. */
static int s_sparse_flags(s_args_t *a, dp_opts_t *o, char *err)
{
    static const char *const rows[] = {"rows-mode", "row-optimizer", "row-lr", "row-init"};
    dp_lab_conf_t *l = &a->c.lab;
    if (!dp_lab_is_sparse(l)) {
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            if (dp_opts_find(o, rows[i])->given)
                return dp_err(err, "--%s is a flag of a model with embed:D (its rows on the servers): "
                              "give --model 'embed:D ...' --data libsvm:TRAIN[:TEST]", rows[i]);
        return 0;
    }
    if (l->min_workers > 0 || a->c.churn.kind != DP_CHURN_NONE)
        return dp_err(err, "a model with embed:D trains a fixed crew in the simulator (worker i of M: "
                      "batches i, i + M, ...): not with --workers MIN:MAX or --churn");
    if (a->epochs)
        return dp_err(err, "--epochs with a model with embed:D: give --updates N");
    if (a->c.eval_every > 0 || a->c.diag_every > 0)
        return dp_err(err, "--eval-every / --diag-every: not with a model with embed:D (its evaluation is "
                      "the chief's at the end, whose row pulls a record holds only there)");
    dp_model_t m;
    if (l->train.model && dp_model_parse(&m, l->train.model, 1, 1, 1, err) != 0) return -1;
    if (!l->train.model || m.embed_dim < 1)
        return dp_err(err, "--data %s: libsvm data trains a model whose first layer is embed:D "
                      "(--model 'embed:D ...')", l->train.data ? l->train.data : "");
    a->ps.optim = l->optim;
    a->ps.seed = l->init_seed;
    float init;
    dp_ps_rows_conf(&a->ps, &l->rows, &init);
    l->rows.width = m.embed_dim;
    l->rows_mode = a->ps.rows_mode ? a->ps.rows_mode : l->mode;
    l->has_rows = 1;
    return 0;
}

/* What the flags leave open: R from --backup, N from --epochs, the lr
 * schedule, the output files. */
static int s_resolve(s_args_t *a, dp_opts_t *o, char *err)
{
    dp_sim_conf_t *c = &a->c;
    int M = c->lab.workers;
    for (int w = M; w < DP_SIM_MAX_WORKERS; w++)
        if (a->slow[w] != 1.0) return dp_err(err, "--straggler %d: there are only %d workers", w, M);
    c->lab.init_seed = c->lab.train.seed;
    if (dp_precision_check(c->lab.train.device, c->lab.train.precision, err) != 0) return -1;
    if (s_env_flags(a, o, err) != 0) return -1;
    if (c->lab.shards > 1 && c->diag_every > 0)
        return dp_err(err, "--diag-every measures one shard's whole vector: not with --ps-shards %d",
                      c->lab.shards);
    /* before the crew's checks: a sparse model's own line for --churn */
    if (dp_lab_is_sparse(&c->lab) && (c->lab.min_workers > 0 || c->churn.kind != DP_CHURN_NONE))
        return s_sparse_flags(a, o, err);
    int elastic = c->lab.min_workers > 0;
    if (c->churn.kind != DP_CHURN_NONE && (!elastic || c->lab.min_workers >= M))
        return dp_err(err, "--churn needs an elastic crew with room to change: --workers MIN:MAX, MIN < MAX");
    if (elastic && a->epochs)
        return dp_err(err, "--epochs with --workers MIN:MAX: give --updates (how many updates an epoch "
                           "makes depends on who is live)");
    if (elastic && c->lab.local_steps > 1)
        return dp_err(err, "--local-steps keeps each worker's own data order: not with --workers MIN:MAX");
    if (dp_ps_check_delay_flags(o, c->lab.policy.delay_lr, err) != 0) return -1;
    if (s_local_steps(a, o, err) != 0 || s_sparse_flags(a, o, err) != 0) return -1;
    if (a->backup) {
        if (a->backup >= M) return dp_err(err, "--backup %d: needs fewer than --workers %d", a->backup, M);
        c->lab.policy.replicas = M - a->backup;
    }
    if (c->lab.policy.replicas > M)
        return dp_err(err, "--replicas-to-aggregate %d exceeds --workers %d", c->lab.policy.replicas, M);
    if (a->epochs) {
        if (dp_opts_find(o, "updates")->given) return dp_err(err, "give --updates or --epochs, not both");
        c->updates = 0; /* set once the data is known (s_epochs_updates) */
    } else if (!c->updates && !c->lab.train.a3c.env)
        return dp_err(err, "--updates N (or --epochs E) is required");
    if (a->out) {
        snprintf(a->save, sizeof a->save, "%s/model.safetensors", a->out);
        snprintf(a->summary, sizeof a->summary, "%s/summary.json", a->out);
        c->lab.train.save = a->save;
        c->lab.train.summary = a->summary;
    }
    return 0;
}

/* --epochs: the updates downpour local's servers would count. */
static int s_epochs_updates(s_args_t *a, char *err)
{
    dp_sim_conf_t *c = &a->c;
    dp_dataset_t probe = {0};
    if (dp_lab_check_dense(&c->lab, err) != 0) return -1;
    if (dp_dataset_init(&probe, c->lab.train.data, DP_SPLIT_TRAIN, err) != 0) return -1;
    dp_dataset_limit(&probe, c->lab.train.train_samples);
    long spe = dp_data_steps_per_epoch(probe.n, c->lab.train.batch, c->lab.workers);
    dp_dataset_fini(&probe);
    if (spe < 1) return dp_err(err, "%d workers at batch %d: not one global batch in the data", c->lab.workers, c->lab.train.batch);
    long per_worker = a->epochs * spe;
    long H = c->lab.local_steps > 1 ? c->lab.local_steps : 1;
    per_worker = (per_worker + H - 1) / H; /* local steps: a push per round of H */
    c->updates = (uint64_t)(c->lab.mode == DP_MODE_SYNC ? per_worker : per_worker * c->lab.workers);
    return 0;
}


/* The result: its JSON line (--json) or its sentence on stderr. */
static void s_print(const s_args_t *a, const cJSON *result)
{
    if (a->c.json) {
        char *text = cJSON_PrintUnformatted(result);
        printf("%s\n", text);
        cJSON_free(text);
    } else if (a->c.lab.train.a3c.env) {
        fprintf(stderr, "sim: %s, %s, %d workers, %g env steps, %g episodes in %g simulated s: return of "
                "the last 100 %.1f, greedy test return %.1f; staleness mean %.2f max %g\n",
                a->c.lab.train.a3c.env, dp_mode_name(a->c.lab.mode), a->c.lab.workers,
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "env_steps")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "episodes")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "sim_s")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "return_mean_100")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "test_return")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "staleness_mean")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "staleness_max")));
    } else {
        fprintf(stderr, "sim: %s, %d workers, %g updates in %g simulated s: test accuracy %.4f; "
                "fresh %.3f, staleness mean %.2f max %g\n",
                dp_mode_name(a->c.lab.mode),
                a->c.lab.workers, cJSON_GetNumberValue(cJSON_GetObjectItem(result, "updates")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "sim_s")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "test_accuracy")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "fresh_fraction")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "staleness_mean")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(result, "staleness_max")));
    }
}

int dp_sim_main(int argc, char **argv)
{
    static s_args_t a; /* the straggler table: off the stack */
    memset(&a, 0, sizeof a);
    dp_lab_conf_default(&a.c.lab);
    dp_ps_config_default(&a.ps);
    a.c.lab.workers = 4;
    a.c.progress = DP_PROGRESS_AUTO;
    dp_dist_parse(&a.c.compute, "exp:100", NULL);
    for (int i = 0; i < DP_SIM_MAX_WORKERS; i++) a.slow[i] = 1.0;
    a.c.slow = a.slow;
    dp_opts_t o;
    s_options(&o, &a);
    char err[DP_ERR_LEN] = "";
    cJSON *result = NULL;
    int status = 1;
    dp_opts_result_t rc = dp_opts_parse(&o, argc, argv, err);
    if (rc == DP_OPTS_PARSED) rc = s_resolve(&a, &o, err);
    if (rc != DP_OPTS_PARSED) {
        status = dp_opts_exit_status("downpour sim", rc, err);
        goto out;
    }
    if ((a.epochs && s_epochs_updates(&a, err) != 0) || (a.out && dp_mkdirs(a.out, 0755, err) != 0)) {
        fprintf(stderr, "downpour sim: %s\n", err);
        goto out;
    }
    if (a.c.lab.train.a3c.env) dp_optim_actor_critic_default(&a.c.lab.optim);
    if (!dp_opts_find(&o, "lr-schedule")->given && !a.c.lab.train.a3c.env) {
        a.c.lab.optim.schedule = DP_LR_COSINE;
        a.c.lab.optim.total_steps = (long)a.c.updates;
    }
    if (dp_sim_run(&a.c, &result, err) != 0) {
        fprintf(stderr, "downpour sim: %s\n", err);
        goto out;
    }
    s_print(&a, result);
    status = 0;
out:
    cJSON_Delete(result);
    dp_dist_fini(&a.c.compute); /* a trace's series */
    return status;
}
