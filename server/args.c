/* args: downpour-ps's command line (and TF_CONFIG) into a dp_ps_config_t.
 *
 * One option table (common/opts.h): "--flag VALUE" or "--flag=VALUE". Cluster
 * flags in TensorFlow's style (--job-name ps --task-index I --ps-hosts ... /
 * TF_CONFIG) give the bind endpoint, the shard I/K (K = number of ps hosts)
 * and, with --worker-hosts, the worker count; explicit --bind / --shard /
 * --workers win. Every error is one line naming the flag. The entries
 * marked DP_OPTS_PASS are the ones `downpour local` passes on to its shards. */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cluster.h"
#include "common/dylu.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/optim_dev.h"
#include "server/args.h"
#include "server/core/account.h"
#include "server/core/policy.h"

void dp_ps_config_default(dp_ps_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->bind, sizeof c->bind, "tcp://*:5555");
    c->shard_index = 0;
    c->shard_count = 1;
    c->num_workers = 1;
    c->mode = DP_MODE_SYNC;
    c->replicas = 0;
    c->staleness = 0;
    snprintf(c->model_spec, sizeof c->model_spec, "%s", DP_MODEL_DEFAULT_SPEC);
    c->in_c = 1;
    c->in_h = c->in_w = 28;
    c->seed = 1;
    c->local_steps = 1;
    c->outer_momentum = 0.9f;
    dp_optim_conf_default(&c->optim);
    c->checkpoint_every = 0;
    c->metrics_every = 5.0;
    c->heartbeat_timeout = 5.0; /* workers beat every second (worker/client/ps_beat.h) */
    c->early_step = 1;
    dp_rows_conf_default(&c->rows, 1, DP_ROW_ADAGRAD); /* its width: the model's, at setup */
    c->row_init = -1;
    c->envs = 1; /* the workers' defaults (worker/exec/a3c.h) */
    c->t_max = 5;
}

void dp_ps_config_run_id(const dp_ps_config_t *c, char *out, size_t n)
{
    const dp_optim_conf_t *o = &c->optim;
    char text[1024];
    int len = snprintf(text, sizeof text,
                       "%s|%dx%dx%d|%d|%d|%d|%d|%d|%" PRIu64 "|%d|%.9g|%.9g|%.9g|%.9g|%.9g|%.9g|%d|%ld|"
                       "%.9g|%ld|%d/%d|%.9g",
                       c->init_path[0] ? c->init_path : c->model_spec, c->in_c, c->in_h, c->in_w,
                       (int)c->mode, c->num_workers, c->replicas, c->staleness,
                       c->delay_lr == DP_DELAY_INVERSE, c->seed, (int)o->kind,
                       dp_optim_base_lr(o), o->momentum, o->beta1, o->beta2, o->eps,
                       o->weight_decay, (int)o->schedule, o->step_size, o->gamma, o->total_steps,
                       c->shard_index, c->shard_count, o->alpha);
    if (c->replicas_frac > 0 && len > 0 && (size_t)len < sizeof text)
        len += snprintf(text + len, sizeof text - (size_t)len, "|F%.9g", (double)c->replicas_frac);
    /* Only when set, so the runs before these rules keep their ids. */
    if (len >= 0 && len < (int)sizeof text && (c->delay_lr > DP_DELAY_INVERSE || o->dc != DP_DC_OFF)) {
        char rule[48], dc[48];
        dp_delay_lr_name(c->delay_lr, c->delay_k, rule, sizeof rule);
        dp_optim_dc_name(o, dc, sizeof dc);
        len += snprintf(text + len, sizeof text - (size_t)len, "|%s|%s", rule, dc);
    }
    if (c->local_steps > 1 && len >= 0 && len < (int)sizeof text)
        len += snprintf(text + len, sizeof text - (size_t)len, "|H%ld", c->local_steps);
    if (c->local_auto && len >= 0 && len < (int)sizeof text)
        len += snprintf(text + len, sizeof text - (size_t)len, "|auto");
    if (o->period > 1 && len >= 0 && len < (int)sizeof text) /* delayed-nesterov */
        len += snprintf(text + len, sizeof text - (size_t)len, "|N%ld", o->period);
    if (len < 0 || len >= (int)sizeof text) len = (int)sizeof text - 1;
    snprintf(out, n, "cfg-%016" PRIx64, dp_fnv1a(DP_FNV_SEED, text, (size_t)len));
}

int dp_ps_config_model(const dp_ps_config_t *c, dp_model_t *m, float **values, char *err)
{
    if (values) *values = NULL;
    if (c->init_path[0])
        return dp_safetensors_read_table(c->init_path, c->state_tensors, m, values, err);
    return dp_model_parse(m, c->model_spec, c->in_c, c->in_h, c->in_w, err);
}

int dp_ps_config_threads_on(const dp_ps_config_t *c, long cores)
{
    if (c->threads > 0) return c->threads;
    dp_model_t m;
    char err[DP_ERR_LEN];
    size_t n = 0;
    if (dp_ps_config_model(c, &m, NULL, err) == 0)
        n = m.n_floats / (size_t)(c->shard_count > 0 ? c->shard_count : 1);
    if (n < ((size_t)256 << 10) || cores < 2) return 1;
    return cores < DP_PS_MAX_AUTO_THREADS ? (int)cores : DP_PS_MAX_AUTO_THREADS;
}

int dp_ps_config_threads(const dp_ps_config_t *c)
{
    /* the cores this process may run on (taskset, cgroups' cpusets) */
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : sysconf(_SC_NPROCESSORS_ONLN);
    return dp_ps_config_threads_on(c, cores);
}

static const char s_synopsis[] =
    "usage: downpour-ps [flags]\n"
    "  The parameter-server shard: holds a range of the model's parameters and the\n"
    "  optimizer state, answers workers' pulls and applies their gradients.\n"
    "\n";

static const char s_epilog[] = "Stops on SIGINT/SIGTERM or a SHUTDOWN message (final checkpoint first).\n";

static int s_set_shard(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    long ik[2];
    if (dp_opts_parse_tuple("--shard", v, '/', 2, 0, 1 << 20, "I/K", ik, NULL) != 0 || ik[0] >= ik[1])
        return dp_err(err, "'%s' is not I/K with 0 <= I < K, e.g. 0/2", v);
    c->shard_index = (int)ik[0];
    c->shard_count = (int)ik[1];
    return 0;
}

static int s_set_input(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    long chw[3];
    if (dp_opts_parse_tuple("--input", v, 'x', 3, 1, 1 << 16, "CxHxW", chw, NULL) != 0)
        return dp_err(err, "'%s' is not CxHxW with each in [1, 65536], e.g. 1x28x28", v);
    c->in_c = (int)chw[0];
    c->in_h = (int)chw[1];
    c->in_w = (int)chw[2];
    return 0;
}

static int s_set_mode(void *arg, const char *v, char *err)
{
    return dp_mode_parse(v, &((dp_ps_config_t *)arg)->mode, err);
}

static int s_set_rows_mode(void *arg, const char *v, char *err)
{
    return dp_mode_parse(v, &((dp_ps_config_t *)arg)->rows_mode, err);
}

static int s_set_row_optimizer(void *arg, const char *v, char *err)
{
    dp_row_optim_kind_t k;
    if (dp_row_optim_parse_kind(v, &k, err) != 0) return -1;
    dp_row_optim_conf_default(&((dp_ps_config_t *)arg)->rows.optim, k); /* --row-lr after parsing */
    return 0;
}

/* A count of at most hi into *out (the flag's name comes first in err). */
static int s_count(const char *v, uint64_t hi, uint64_t *out, char *err)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!v[0] || *end || errno || v[0] == '-' || x > hi)
        return dp_err(err, "'%s': a whole number from 0 to %llu", v, (unsigned long long)hi);
    *out = x;
    return 0;
}

static int s_set_row_admit(void *arg, const char *v, char *err)
{
    uint64_t x;
    if (s_count(v, DP_ROWS_MAX_ADMIT, &x, err) != 0) return -1;
    ((dp_ps_config_t *)arg)->rows.admit_after = (uint32_t)x;
    return 0;
}

static int s_set_row_evict(void *arg, const char *v, char *err)
{
    return s_count(v, UINT64_MAX >> 1, &((dp_ps_config_t *)arg)->rows.evict_after, err);
}

static int s_set_row_max(void *arg, const char *v, char *err)
{
    return s_count(v, DP_ROWS_MAX_ROWS, &((dp_ps_config_t *)arg)->rows.max_rows, err);
}

static int s_set_optimizer(void *arg, const char *v, char *err)
{
    return dp_optim_parse_kind(&((dp_ps_config_t *)arg)->optim, v, err);
}

static int s_set_schedule(void *arg, const char *v, char *err)
{
    return dp_optim_parse_schedule(&((dp_ps_config_t *)arg)->optim, v, err);
}

static int s_set_local_steps(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    return dp_dylu_parse(v, &c->local_steps, &c->local_auto, err);
}

static int s_set_workers(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    return dp_opts_parse_crew("--workers", v, 100000, &c->min_workers, &c->num_workers, err);
}

static int s_set_replicas(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    return dp_policy_replicas_parse("--replicas-to-aggregate", v, &c->replicas, &c->replicas_frac, err);
}

static int s_set_delay_lr(void *arg, const char *v, char *err)
{
    dp_ps_config_t *c = arg;
    return dp_delay_lr_parse(v, &c->delay_lr, &c->delay_k, err);
}

static int s_set_dc(void *arg, const char *v, char *err)
{
    return dp_optim_parse_dc(&((dp_ps_config_t *)arg)->optim, v, err);
}

/* The table in --help order; each value lands at an offset into its
 * struct (dp_opts_add_at): the cluster's flags into dp_cluster_t, the
 * others into dp_ps_config_t (a CALL's argument: the config itself). */
#define S_AT(field) offsetof(dp_ps_config_t, field)
#define S_CL(field) offsetof(dp_cluster_t, field)
#define S_BUF(n, m, field, pass_, h)                                                       \
    {{.name = (n), .kind = DP_OPTS_BUF, .size = sizeof(((dp_ps_config_t *)0)->field),       \
      .meta = (m), .pass = (pass_), .help = (h)},                                            \
     S_AT(field)}

static const dp_opts_entry_t s_config_head[] = {
    S_BUF("bind", "tcp://*:PORT", bind, 0, "endpoint to bind (default tcp://*:5555)"),
};

static const dp_opts_entry_t s_cluster[] = {
    {DP_FLAG_STR("job-name", "ps", NULL, 0,
                    "TensorFlow-style cluster (or the TF_CONFIG variable): binds this\n"
                    "task's port, shard I of K ps hosts"), S_CL(flag_job_name)},
    {DP_FLAG_NUM("task-index", DP_OPTS_INT, "I", NULL, 0, 1 << 20, 0,
                    "this task's index in the ps hosts"), S_CL(flag_task_index)},
    {DP_FLAG_STR("ps-hosts", "H:P,...", NULL, 0, "the ps job's tasks"), S_CL(flag_ps_hosts)},
    {DP_FLAG_STR("worker-hosts", "H:P,...", NULL, 0,
                    "the worker job's tasks (their number is --workers)"), S_CL(flag_worker_hosts)},
};

static const dp_opts_entry_t s_config[] = {
    {DP_FLAG_CALL("shard", "I/K", s_set_shard, NULL, 0,
                     "this shard's index and the shard count (default 0/1)"), 0},
    {DP_FLAG_CALL("workers", "N|MIN:MAX", s_set_workers, NULL, 0,
                     "workers expected (default 1, or the worker hosts); MIN:MAX:\n"
                     "elastic, task indexes below MAX join and leave at any time,\n"
                     "sync steps while at least MIN are live"), 0},
    {DP_FLAG_CALL("mode", "sync|async|ssp", s_set_mode, NULL, DP_OPTS_PASS, "consistency (default sync)"), 0},
    {DP_FLAG_CALL("replicas-to-aggregate", "R|F", s_set_replicas, NULL, DP_OPTS_PASS,
                     "sync: gradients per step, a count R or a fraction F in (0, 1)\n"
                     "of the live workers (default: all workers)"), 0},
    {DP_FLAG_NUM("staleness", DP_OPTS_INT, "S", NULL, 0, 1000000, DP_OPTS_PASS,
                    "ssp: max pushes a worker may be ahead (default 0)"), S_AT(staleness)},
    {DP_FLAG_CALL("delay-lr", "RULE", s_set_delay_lr, NULL, DP_OPTS_PASS,
                     "async/ssp: the lr of a gradient of delay tau: none (default),\n"
                     "inverse (lr / tau), adaptive (lr x min(1, workers / tau)),\n"
                     "threshold[:K] (skip it when tau > K x the mean delay; K 2)"), 0},
    {DP_FLAG_SET("lr-staleness", NULL, DP_DELAY_INVERSE, DP_OPTS_PASS, "the same as --delay-lr inverse"), S_AT(delay_lr)},
    {DP_FLAG_CALL("delay-compensation", "DC", s_set_dc, NULL, DP_OPTS_PASS,
                     "async/ssp: DC-ASGD, g + lambda g*g*(w - w_pulled) before the\n"
                     "optimizer: off (default), const:LAMBDA, adaptive:LAMBDA0\n"
                     "(lambda0 / sqrt(mean g*g)); keeps n floats per worker"), 0},
    {DP_FLAG_CHOICE("early-step", "off|on", NULL, DP_OPTS_PASS,
                       "step a push in parts as its parts come, under the worker's\n"
                       "backward (the same bits as a whole step; it needs a core the\n"
                       "workers leave free: downpour local turns it off when the\n"
                       "workers' threads take every core; default on)"), S_AT(early_step)},
    {DP_FLAG_CALL("rows-mode", "sync|async|ssp", s_set_rows_mode, NULL, DP_OPTS_PASS,
                     "a model with embed:D: when its row pushes apply (default\n"
                     "--mode's; sync needs --mode sync; --mode sync --rows-mode async:\n"
                     "the rows at once, the dense layers by step)"), 0},
    {DP_FLAG_CALL("row-optimizer", "NAME", s_set_row_optimizer, NULL, DP_OPTS_PASS,
                     "the rows' optimizer: sgd, adagrad (default), adam, ftrl, sparse_adam;\n"
                     "each row steps only when a push carries it (adam: by its own step\n"
                     "count; sparse_adam: torch.optim.SparseAdam's, by the table's pushes)"), 0},
    {DP_FLAG_NUM("row-lr", DP_OPTS_FLOAT, "X", NULL, 1e-12, 1e6, DP_OPTS_PASS,
                    "the rows' lr (ftrl: alpha; default: --lr's)"), S_AT(row_lr)},
    {DP_FLAG_NUM("row-init", DP_OPTS_FLOAT, "X", NULL, 0, 1e3, DP_OPTS_PASS,
                    "a new row starts uniform in [-X, X) by --seed and key; 0: zeros\n"
                    "(default 0.01; ftrl: 0, the only start it allows)"), S_AT(row_init)},
    {DP_FLAG_NUM("row-l1", DP_OPTS_FLOAT, "X", NULL, 0, 1e6, DP_OPTS_PASS,
                    "ftrl: the L1 strength (default 0)"), S_AT(rows.optim.l1)},
    {DP_FLAG_NUM("row-l2", DP_OPTS_FLOAT, "X", NULL, 0, 1e6, DP_OPTS_PASS,
                    "ftrl: the L2 strength (default 0)"), S_AT(rows.optim.l2)},
    {DP_FLAG_CALL("row-admit", "K", s_set_row_admit, NULL, DP_OPTS_PASS,
                     "a key gets a row at its K-th push (reads as zeros before;\n"
                     "default 1: the first)"), 0},
    {DP_FLAG_CALL("row-evict", "T", s_set_row_evict, NULL, DP_OPTS_PASS,
                     "rows no push touched for T versions are dropped (default 0: never)"), 0},
    {DP_FLAG_CALL("row-max", "N", s_set_row_max, NULL, DP_OPTS_PASS,
                     "rows a shard holds at most (default 2^31); a new key's gradient\n"
                     "beyond them is dropped and counted"), 0},
    S_BUF("model", "SPEC", model_spec, DP_OPTS_PASS, "network (default \"" DP_MODEL_DEFAULT_SPEC "\")"),
    {DP_FLAG_CALL("input", "CxHxW", s_set_input, NULL, 0, "input shape (default 1x28x28)"), 0},
    S_BUF("env", "NAME", env, 0,
                    "an actor-critic run's environment (cartpole-v1, acrobot-v1): a\n"
                    "push's episode returns and the solved threshold are its; without\n"
                    "it a push carrying env steps is refused (downpour local --env gives it)"),
    {DP_FLAG_NUM("envs", DP_OPTS_INT, "K", NULL, 1, DP_A3C_MAX_ENVS, 0,
                    "with --env: the workers' --envs (default 1)"), S_AT(envs)},
    {DP_FLAG_CHOICE("obs-norm", "off|on", NULL, 0,
                    "with --env: the workers' --obs-norm (obsnorm first in the model; default off)"),
     S_AT(obs_norm)},
    {DP_FLAG_NUM("t-max", DP_OPTS_INT, "T", NULL, 1, DP_A3C_MAX_T, 0,
                    "with --env: the workers' --t-max (default 5); a push's segment\n"
                    "has at most --envs x --t-max env steps"), S_AT(t_max)},
    S_BUF("init", "FILE", init_path, 0,
                    "instead of --model: any model, as the tensors of a safetensors\n"
                    "file (names, shapes, float32 initial values; e.g. written by\n"
                    "downpour.torch.save_init); those its metadata '" DP_ST_STATE_KEY "'\n"
                    "names are state (batch norm's statistics), not gradients"),
    S_BUF("state-tensors", "NAME,...", state_tensors, 0,
                    "with --init: more tensors that are state, not gradients"),
    {DP_FLAG_SEED("seed", NULL, DP_OPTS_PASS, "initialisation seed (default 1)"), S_AT(seed)},
    {DP_FLAG_CALL("optimizer", "NAME", s_set_optimizer, NULL, DP_OPTS_PASS,
                     "sgd|momentum|nesterov|adam|adagrad|rmsprop (default adam)"), 0},
    {DP_FLAG_NUM("lr", DP_OPTS_FLOAT, "X", NULL, 1e-12, 1e6, DP_OPTS_PASS,
                    "learning rate (default: adam 0.0015, adagrad and rmsprop 0.01, others 0.05)"), S_AT(optim.lr)},
    {DP_FLAG_NUM("momentum", DP_OPTS_FLOAT, "X", NULL, 0, 1, DP_OPTS_PASS, "momentum (default 0.9)"), S_AT(optim.momentum)},
    {DP_FLAG_NUM("rms-alpha", DP_OPTS_FLOAT, "X", NULL, 0, 1, DP_OPTS_PASS,
                    "rmsprop: square average's smoothing (default 0.99)"), S_AT(optim.alpha)},
    {DP_FLAG_NUM("eps", DP_OPTS_FLOAT, "X", NULL, 1e-30, 1e3, DP_OPTS_PASS,
                    "adam, adagrad, rmsprop: added to the root of the square\n"
                    "average (default 1e-8; A3C's shared RMSProp: 0.1)"), S_AT(optim.eps)},
    {DP_FLAG_NUM("weight-decay", DP_OPTS_FLOAT, "X", NULL, 0, 1e3, DP_OPTS_PASS,
                    "L2 weight decay (default 0)"), S_AT(optim.weight_decay)},
    {DP_FLAG_CALL("lr-schedule", "S", s_set_schedule, NULL, DP_OPTS_PASS,
                     "constant | step:STEPS:GAMMA | cosine:TOTAL (by version)"), 0},
    {DP_FLAG_CALL("local-steps", "H|auto[:H]", s_set_local_steps, NULL, DP_OPTS_PASS,
                    "workers take H steps of their own optimizer (--optimizer) and\n"
                    "push the pseudo-gradient (the weights pulled minus those reached);\n"
                    "this server then steps by the outer optimizer (default 1: off).\n"
                    "auto (DyLU): the fastest worker H (default 8), each other one\n"
                    "H x its speed / the fastest's, by the step times the crew\n"
                    "reports with its pushes"), 0},
    S_BUF("outer-optimizer", "sgd|nesterov|delayed-nesterov", outer_optimizer, DP_OPTS_PASS,
                    "with --local-steps: sgd (averaging, lr 1), nesterov (DiLoCo:\n"
                    "lr 0.7, momentum 0.9, the momentum on every push) or\n"
                    "delayed-nesterov (the momentum once per --outer-momentum-every\n"
                    "pushes, between them the plain step; async's fix of Liu et al.\n"
                    "2024) (default sgd)"),
    {DP_FLAG_NUM("outer-lr", DP_OPTS_FLOAT, "X", NULL, 1e-12, 1e6, DP_OPTS_PASS,
                    "with --local-steps: the outer lr (default: sgd 1, nesterov 0.7,\n"
                    "delayed-nesterov 0.5 where its momentum waits)"), S_AT(outer_lr)},
    {DP_FLAG_NUM("outer-momentum", DP_OPTS_FLOAT, "X", NULL, 0, 1, DP_OPTS_PASS,
                    "with --local-steps and nesterov: the outer momentum (default 0.9)"), S_AT(outer_momentum)},
    {DP_FLAG_NUM("outer-momentum-every", DP_OPTS_LONG, "N", NULL, 1, 1000000, DP_OPTS_PASS,
                    "with delayed-nesterov: steps per move of the momentum\n"
                    "(default: --workers in async and ssp, 1 in sync)"), S_AT(outer_every)},
    S_BUF("checkpoint-dir", "DIR", checkpoint_dir, DP_OPTS_PASS,
                    "DIR/ps-shard-I-of-K.safetensors: restored at start,\n"
                    "written every --checkpoint-every versions and at exit"),
    S_BUF("run-id", "ID", run_id, DP_OPTS_PASS,
                    "this run's name in its checkpoints (default: a hash of the\n"
                    "flags that define the run; downpour local: a new one per launch);\n"
                    "another run's checkpoint is refused"),
    {DP_FLAG_SET("resume", NULL, 1, DP_OPTS_PASS,
                    "continue the run in --checkpoint-dir (another or a finished\n"
                    "one), its version and lr schedule where they stopped"), S_AT(resume)},
    {DP_FLAG_NUM("startup-timeout", DP_OPTS_DOUBLE, "SECONDS", NULL, 0, 1e7, DP_OPTS_PASS,
                    "fail naming the workers that did not say HELLO by then\n"
                    "(default 0: wait forever)"), S_AT(startup_timeout)},
    /* not passed on by `downpour local`: there --threads is the
         * workers' and --ps-threads the shards' */
    {DP_FLAG_NUM("threads", DP_OPTS_INT, "N", NULL, 1, 256, 0,
                    "threads of the optimizer sweep over the shard (default:\n"
                    "one per core, at most 4; 1 for a small shard)"), S_AT(threads)},
    S_BUF("device", "cpu|cuda:N|cpu:staged", device, 0,
                    "where the shard's weights and optimizer state are kept and\n"
                    "stepped: cpu (default) or cuda:N, one fused step per push on\n"
                    "GPU N (a CUDA build); cpu:staged:\n"
                    "the CPU's step behind a device's protocol (tests; cpu's bits)"),
    {DP_FLAG_CHOICE("device-region", "off|on", NULL, DP_OPTS_PASS,
                    "with --device cuda:N: offer the GPU workers on this host the\n"
                    "weights and their gradient slots in the shard's GPU memory by\n"
                    "CUDA IPC (default off: not yet run on a device, and a worker\n"
                    "holding the mapping can write the weights it reads)"), S_AT(device_region)},
    {DP_FLAG_NUM("checkpoint-every", DP_OPTS_LONG, "N", NULL, 0, 1L << 40, DP_OPTS_PASS,
                    "versions between checkpoints (default 0: at exit only)"), S_AT(checkpoint_every)},
    S_BUF("metrics", "FILE", metrics_path, 0, "JSON lines of counters (appended)"),
    S_BUF("record", "FILE", record, 0,
                    "write the schedule (which worker's step, computed on which\n"
                    "version, applied in which order) for downpour replay"),
    {DP_FLAG_NUM("metrics-every", DP_OPTS_DOUBLE, "SECONDS", NULL, 0.01, 1e6, 0,
                    "between metrics lines (default 5)"), S_AT(metrics_every)},
    {DP_FLAG_NUM("heartbeat-timeout", DP_OPTS_DOUBLE, "SECONDS", NULL, 0, 1e7, DP_OPTS_PASS,
                    "silence before a worker stops counting (default 5, 0 = never)"), S_AT(heartbeat_timeout)},
    S_BUF("ready-file", "FILE", ready_file, 0,
                    "write the bound endpoint to FILE once listening"),
    S_BUF("curve-secret", "FILE", curve_secret, 0,
                    "CURVE: this server's secret key (downpour keygen FILE);\n"
                    "encrypts the traffic and admits only --curve-allow keys"),
    S_BUF("curve-allow", "DIR|FILE,...", curve_allow, 0,
                    "CURVE: the workers' public keys allowed in (DIR/*.pub or a list);\n"
                    "a file named worker-I.pub or chief-0.pub is that worker only (I + 1\n"
                    "with a chief-0.pub), the list must name the chief (worker 0), and\n"
                    "a key under another name may take only an id none of those owns,\n"
                    "never 0"),
};

#define S_ADD(o, base, table) dp_opts_add_at(o, base, table, (int)(sizeof table / sizeof table[0]))

void dp_ps_options(dp_opts_t *o, dp_ps_config_t *c, dp_cluster_t *cl)
{
    dp_opts_init(o, "downpour-ps", s_synopsis, s_epilog);
    S_ADD(o, c, s_config_head);
    S_ADD(o, cl, s_cluster);
    S_ADD(o, c, s_config);
}

int dp_ps_check_delay_flags(dp_opts_t *o, int delay_lr, char *err)
{
    if (dp_opts_find(o, "lr-staleness")->given && dp_opts_find(o, "delay-lr")->given &&
        delay_lr != DP_DELAY_INVERSE)
        return dp_err(err, "--lr-staleness is --delay-lr inverse: give one rule, not both");
    return 0;
}

/* The cluster spec (flags or TF_CONFIG) decides what explicit flags left
 * open: the bind endpoint, the shard, the worker count. */
static int s_apply_cluster(dp_ps_config_t *c, dp_cluster_t *cl, dp_opts_t *o, char *err)
{
    const char *tf = getenv("TF_CONFIG");
    if (!tf || !tf[0]) tf = NULL;
    if (!(cl->flag_job_name || cl->flag_ps_hosts || cl->flag_worker_hosts ||
          cl->flag_task_index >= 0 || tf))
        return 0;
    if (dp_cluster_resolve(cl, tf, err) != 0) return -1;
    if (cl->job_name[0] && strcmp(cl->job_name, "ps") != 0)
        return dp_err(err, "--job-name %s: downpour-ps runs ps tasks (use downpour-worker for workers)",
                      cl->job_name);
    if (cl->job_name[0]) {
        if (!dp_opts_find(o, "bind")->given &&
            dp_cluster_bind_endpoint(cl, c->bind, sizeof c->bind, err) != 0)
            return -1;
        if (!dp_opts_find(o, "shard")->given) {
            c->shard_index = cl->task_index;
            c->shard_count = cl->n_ps;
        }
    }
    if (!dp_opts_find(o, "workers")->given && cl->n_workers > 0) c->num_workers = cl->n_workers;
    dp_cluster_log(cl);
    return 0;
}

int dp_ps_outer_optim(const dp_ps_config_t *c, dp_optim_conf_t *out, char *err)
{
    /* delayed-nesterov, async and ssp: the momentum moves once per round
     * of the crew's pushes (kernels/optim.h), not once per push */
    long every = c->outer_every > 0 ? c->outer_every : c->mode == DP_MODE_SYNC ? 1 : c->num_workers;
    return dp_optim_outer(c->outer_optimizer, c->outer_lr, c->outer_momentum, every, out, err);
}

int dp_ps_resolve_local_steps(dp_ps_config_t *c, dp_opts_t *o, char *err)
{
    int every_given = dp_opts_find(o, "outer-momentum-every")->given != NULL;
    int outer_given = c->outer_optimizer[0] || dp_opts_find(o, "outer-lr")->given ||
                      dp_opts_find(o, "outer-momentum")->given || every_given;
    dp_optim_conf_t outer;
    if (c->local_steps <= 1) {
        /* a line, not a refusal: a sweep crosses the outer optimizer with H = 1 */
        if (dp_optim_outer(c->outer_optimizer, 0, 0.9f, 1, &outer, err) != 0) return -1;
        if (outer_given)
            dp_log_info("--outer-optimizer, --outer-lr, --outer-momentum and --outer-momentum-every "
                        "have no effect without --local-steps H (H > 1)");
        return 0;
    }
    if (every_given && strcmp(c->outer_optimizer, DP_OPTIM_DELAYED_NESTEROV) != 0)
        return dp_err(err, "--outer-momentum-every is the period of --outer-optimizer "
                           "delayed-nesterov (not of %s)", c->outer_optimizer[0] ? c->outer_optimizer : "sgd");
    if (dp_ps_outer_optim(c, &outer, err) != 0) return -1;
    if (c->optim.schedule != DP_LR_CONSTANT)
        dp_log_info("--local-steps %ld: --lr-schedule is the workers' (inner) schedule; the "
                    "outer lr stays %g", c->local_steps, (double)outer.lr);
    c->optim = outer;
    return 0;
}

/* --init replaces --model and --input. */
static int s_check_init(const dp_ps_config_t *c, dp_opts_t *o, char *err)
{
    if (!c->init_path[0]) {
        if (c->state_tensors[0])
            return dp_err(err, "--state-tensors names tensors of an --init file: give --init too");
        return 0;
    }
    if (dp_opts_find(o, "model")->given || dp_opts_find(o, "input")->given)
        return dp_err(err, "--init %s gives the model: drop --model and --input", c->init_path);
    return 0;
}

/* A given --model parsed on --input's shape (an embed:D model's is its
 * own), so that a malformed one is a bad command line (status 2), as
 * downpour local's is, not a shard that starts and fails. */
static int s_check_model(const dp_ps_config_t *c, dp_opts_t *o, char *err)
{
    if (c->init_path[0] || !dp_opts_find(o, "model")->given) return 0;
    dp_model_t *m = dp_malloc(sizeof *m);
    int rc = dp_ps_config_model(c, m, NULL, err);
    free(m);
    return rc;
}

/* --env NAME known, --envs and --t-max only with it (they bound its
 * segments); with --env, the model is the environment's as a worker's
 * --env makes it: --model (default DP_MODEL_AC_DEFAULT_SPEC) with a bare
 * "ac" written out as ac:A, and the input the observation (OBSx1x1)
 * unless --input says otherwise. */
static int s_check_env(dp_ps_config_t *c, dp_opts_t *o, char *err)
{
    if (!c->env[0] && (dp_opts_find(o, "envs")->given || dp_opts_find(o, "t-max")->given ||
                       dp_opts_find(o, "obs-norm")->given))
        return dp_err(err, "--envs, --t-max and --obs-norm are an actor-critic run's: give --env NAME too");
    dp_account_bounds_t b;
    if (dp_account_bounds(&b, c->env, c->envs, c->t_max, err) != 0) return -1;
    if (c->env[0]) dp_optim_actor_critic_default(&c->optim);
    if (!c->env[0] || c->init_path[0]) return 0;
    char spec[DP_MODEL_SPEC_LEN];
    const char *given = dp_opts_find(o, "model")->given ? c->model_spec : DP_MODEL_AC_DEFAULT_SPEC;
    if (dp_model_spec_env(given, b.env->n_actions, c->obs_norm, spec, sizeof spec, err) != 0) return -1;
    snprintf(c->model_spec, sizeof c->model_spec, "%s", spec);
    if (!dp_opts_find(o, "input")->given) {
        c->in_c = b.env->obs_dim;
        c->in_h = c->in_w = 1;
    }
    return 0;
}

/* --device's spelling (the device itself is dp_ps_device_check's, after
 * parsing: `downpour local` checks flags where the device may not be). */
static int s_check_device(const dp_ps_config_t *c, char *err)
{
    long k = 0;
    if (!c->device[0] || strcmp(c->device, "cpu") == 0 || strcmp(c->device, "cpu:staged") == 0)
        return 0;
    if (strncmp(c->device, "cuda:", 5) == 0 &&
        dp_opts_parse_long("--device", c->device + 5, 0, 1024, &k, NULL) == 0)
        return 0;
    return dp_err(err, "--device %s: expected cpu, cpu:staged or cuda:N with N a device number",
                  c->device);
}

int dp_ps_device_check(const dp_ps_config_t *c, int *usage, char *err)
{
    dp_optim_dev_t *dev = NULL;
    *usage = 1;
    if (!c->device[0] || strcmp(c->device, "cpu") == 0) return 0;
    if (dp_optim_dev_new(&dev, c->device, usage, err) != 0) return -1;
    dp_optim_dev_destroy(&dev); /* the loop opens it again for the shard */
    return 0;
}

dp_opts_result_t dp_ps_parse_args(dp_ps_config_t *c, int argc, char **argv, char *err)
{
    dp_opts_t o;
    dp_cluster_t *cl = dp_malloc(sizeof *cl); /* 128 KiB of host names: not on the stack */
    dp_cluster_init(cl);
    dp_ps_options(&o, c, cl);
    dp_opts_result_t rc = dp_opts_parse(&o, argc, argv, err);
    if (rc == DP_OPTS_PARSED) rc = s_apply_cluster(c, cl, &o, err);
    if (rc == DP_OPTS_PARSED && !c->curve_secret[0] != !c->curve_allow[0])
        rc = dp_err(err, "--curve-secret and --curve-allow go together: give both (this server's "
                         "secret key and the public keys allowed in) or neither");
    if (rc == DP_OPTS_PARSED) rc = s_check_device(c, err);
    if (rc == DP_OPTS_PARSED) rc = s_check_init(c, &o, err);
    if (rc == DP_OPTS_PARSED) rc = s_check_env(c, &o, err);
    if (rc == DP_OPTS_PARSED) rc = s_check_model(c, &o, err);
    if (rc == DP_OPTS_PARSED) rc = dp_ps_resolve_local_steps(c, &o, err);
    if (rc == DP_OPTS_PARSED) rc = dp_ps_check_delay_flags(&o, c->delay_lr, err);
    if (rc == DP_OPTS_PARSED && cl->n_workers > 0 && c->min_workers > 0 && cl->n_workers != c->num_workers)
        rc = dp_err(err, "--workers %d:%d names %d task indexes, the cluster's worker hosts %d: "
                    "give MAX as many hosts", c->min_workers, c->num_workers, c->num_workers,
                    cl->n_workers);
    if (rc == DP_OPTS_PARSED && c->replicas > c->num_workers)
        rc = dp_err(err, "--replicas-to-aggregate %d exceeds --workers %d", c->replicas,
                    c->num_workers);
    free(cl);
    return rc;
}
