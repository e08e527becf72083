/* a3c_train: the rl kind (worker/train/driver.h), the actor-critic
 * worker's runs (--env): standalone (one learner, its own optimizer: the
 * baseline) and against the servers (A3C in async, A2C in sync), on the
 * rollouts of worker/exec/a3c.h. */
#include "worker/train/a3c_train.h"
#include "worker/train/driver.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/episodes.h"
#include "common/metrics.h"
#include "common/safetensors.h"
#include "common/staleness.h"
#include "common/tbevents.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "worker/exec/a3c.h"
#include "worker/train/progress.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"

/* What a run of either kind holds. */
typedef struct {
    const dp_train_conf_t *c;
    const dp_env_kind_t *kind;
    dp_model_t model;
    dp_backend_t *be;
    dp_net_t net;
    int net_ok;
    dp_a3c_t a;
    int a_ok;
    float *h_params, *h_grads;
    dp_episodes_t returns;     /* this worker's episodes (standalone: the run's) */
    uint64_t env_steps;        /* this worker's */
    long segments;             /* this worker's pushes (or optimizer steps) */
    dp_metrics_t *metrics;
    dp_tb_t *tb;
    dp_progress_t progress;
    float *d_state;            /* standalone: the optimizer's state (on the backend) */
    uint32_t *ends;            /* a cluster: a segment's episodes' ends, for its push */
    uint64_t run_steps;        /* the run's env steps (a cluster: the servers' count, all workers) */
    dp_rl_summary_t sum;       /* the summary's sub-object */
} s_run_t;

static void s_fini(s_run_t *r)
{
    free(r->ends);
    if (r->d_state) r->be->ops->release(r->be, r->d_state);
    if (r->a_ok) dp_a3c_fini(&r->a);
    dp_metrics_destroy(&r->metrics);
    dp_tb_destroy(&r->tb);
    if (r->be) {
        if (r->net_ok) dp_net_fini(&r->net);
        r->be->ops->host_release(r->be, r->h_params);
        r->be->ops->host_release(r->be, r->h_grads);
        dp_backend_destroy(&r->be);
    }
}

static int s_init(s_run_t *r, const dp_train_conf_t *c, int worker, char *err)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    if (c->threads > 0) dp_cpu_set_threads(c->threads);
    if (!(r->kind = dp_env_find(c->a3c.env, err))) return -1;
    if (dp_a3c_model(&r->model, c->model, r->kind, c->a3c.obs_norm, err) != 0) return -1;
    if (dp_backend_new_in(&r->be, c->device, c->precision, err) != 0) return -1;
    int rows = c->a3c.envs * c->a3c.t_max;
    if (dp_a3c_init(&r->a, r->kind, &c->a3c, c->seed, worker, err) != 0) goto fail;
    r->a_ok = 1;
    if (dp_net_init(&r->net, &r->model, r->be, rows, err) != 0) goto fail;
    r->net_ok = 1;
    r->net.ac_entropy = c->a3c.entropy;
    size_t bytes = r->model.n_floats * sizeof(float);
    r->h_params = r->be->ops->host_alloc(r->be, bytes);
    r->h_grads = r->be->ops->host_alloc(r->be, bytes);
    dp_episodes_init(&r->returns, r->kind->solved);
    if (dp_metrics_new(&r->metrics, c->metrics, err) != 0) goto fail;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "worker-%d", worker);
    if (dp_tb_new(&r->tb, c->tensorboard, suffix, err) != 0) goto fail;
    dp_progress_init(&r->progress, c->progress);
    return 0;
fail:
    s_fini(r);
    return -1;
}

/* One segment and its gradient, clipped, in h_grads (and with local, in
 * the net's d_grads again for a local optimizer step). Records the
 * episodes that ended. Its loss into *loss (NAN: diverged); -1 with err
 * when the environment failed. */
static int s_segment(s_run_t *r, int local, float *loss, char *err)
{
    const dp_a3c_conf_t *ac = &r->c->a3c;
    if (dp_a3c_segment(&r->a, &r->net, err) != 0) return -1;
    int rows = r->a.K * r->a.T;
    *loss = dp_net_train_step_ac(&r->net, r->a.x, r->a.act, r->a.ret, rows);
    dp_net_get_grads(&r->net, r->h_grads);
    dp_a3c_clip(&r->model, r->h_grads, ac->clip_norm);
    if (local) r->be->ops->upload(r->be, r->net.d_grads, r->h_grads, r->model.n_floats * sizeof(float));
    for (int i = 0; i < r->a.n_ended; i++) {
        dp_episodes_add(&r->returns, r->a.ended[i], r->env_steps + (uint64_t)r->a.ended_at[i]);
        dp_tb_scalar(r->tb, "rl/episode_return", (long)(r->env_steps + (uint64_t)r->a.ended_at[i]),
                     (float)r->a.ended[i]);
    }
    r->env_steps += (uint64_t)rows;
    r->segments++;
    return 0;
}

/* A segment's metrics line. */
static void s_rl_metrics(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line)
{
    s_run_t *r = d->run;
    cJSON_AddNumberToObject(line, "step", (double)r->segments);
    cJSON_AddNumberToObject(line, "env_steps", (double)r->env_steps);
    if (r->run_steps != r->env_steps) cJSON_AddNumberToObject(line, "run_env_steps", (double)r->run_steps);
    cJSON_AddNumberToObject(line, "episodes", (double)r->returns.episodes);
    cJSON_AddNumberToObject(line, "return_mean_100", dp_metrics_round(dp_episodes_mean(&r->returns), 3));
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(st->loss, 6));
}

/* The progress line, with the run's env steps (a cluster: all workers'). */
static void s_rl_progress(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n)
{
    (void)st;
    s_run_t *r = d->run;
    double dt = dp_now() - d->t0;
    snprintf(line, n, "%s  env steps %" PRIu64 "/%ld  episodes %" PRIu64 "  return(100) %.1f  %.0f env steps/s",
             r->kind->name, r->run_steps, r->c->a3c.env_steps, r->returns.episodes,
             dp_episodes_mean(&r->returns), r->env_steps / (dt > 0 ? dt : 1e-9));
}

/* One segment's push: the clipped gradient with the segment's account. */
static int s_push(s_run_t *r, dp_ps_client_t *ps, float loss, dp_push_result_t *res, char *err)
{
    for (int i = 0; i < r->a.n_ended; i++) r->ends[i] = (uint32_t)r->a.ended_at[i];
    int rows = r->a.K * r->a.T;
    dp_ps_segment_t sg = {.env_steps = (uint64_t)rows, .n = (size_t)r->a.n_ended,
                          .returns = r->a.ended, .ends = r->ends, .threshold = r->kind->solved};
    dp_ps_push_t p = {.grads = r->h_grads, .loss = loss, .batch = rows,
                      .step = (uint64_t)r->segments, .segment = &sg};
    if (dp_ps_client_push(ps, &p, res, err) != 0) return -1;
    /* every segment of this worker would be: its flags are not the servers' */
    if (res->account_refused)
        return dp_err(err, "the servers refused the segment's account: %s", res->reason);
    r->run_steps = res->env_steps;
    return 0;
}

/* Standalone: segments and the optimizer's steps until --env-steps. */
static int s_loop_standalone(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    const dp_optim_conf_t *opt = &d->c->optim;
    uint64_t budget = (uint64_t)d->c->a3c.env_steps;
    while (!dp_train_stopped(d) && r->env_steps < budget) {
        float loss;
        if (s_segment(r, 1, &loss, err) != 0) return -1;
        dp_net_optim_step(&r->net, opt, dp_optim_lr_at(opt, r->segments - 1), r->d_state, r->segments);
        r->run_steps = r->env_steps;
        dp_train_step_t st = {.step = r->segments - 1, .loss = loss, .samples = r->a.K * r->a.T,
                              .last = r->env_steps >= budget};
        if (dp_train_done(d, &st, err) != 0) return -1;
    }
    return 0;
}

/* A cluster: pull, a segment, its push, until the run (the servers count
 * every push's steps and each ACK says the total, so the workers together
 * stop at the budget, each taking at most the segment it is in past it). A
 * loss not finite is not pushed. */
static int s_loop_cluster(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    const dp_train_conf_t *c = d->c;
    while (!dp_train_stopped(d) && r->run_steps < (uint64_t)c->a3c.env_steps) {
        dp_train_test_hold(c->task_index, r->segments + 1, d->stop);
        if (dp_ps_client_pull(d->ps, r->h_params, err) != 0) return -1;
        double t1 = dp_now();
        dp_net_set_params(&r->net, r->h_params);
        float loss;
        if (s_segment(r, 0, &loss, err) != 0) return -1;
        if (!isfinite(loss))
            return dp_err(err, "loss is %f at step %ld: training diverged (lower the servers' --lr)",
                          loss, r->segments - 1);
        dp_push_result_t res;
        double t2 = dp_now();
        if (s_push(r, d->ps, loss, &res, err) != 0) return -1;
        dp_train_step_t st = {.step = r->segments - 1, .loss = loss, .samples = r->a.K * r->a.T,
                              .push = &res, .pulled_at = t1, .pushed_at = t2};
        if (dp_train_done(d, &st, err) != 0) return -1;
    }
    if (!dp_train_stopped(d))
        dp_log_info("worker %d: %" PRIu64 " of the run's %" PRIu64 " env steps, %" PRIu64
                    " episodes of its own (mean of its last 100 %.1f)", c->task_index, r->env_steps,
                    r->run_steps, r->returns.episodes, dp_episodes_mean(&r->returns));
    return 0;
}

static int s_rl_loop(dp_train_drv_t *d, char *err)
{
    return d->standalone ? s_loop_standalone(d, err) : s_loop_cluster(d, err);
}

static int s_rl_open(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    s_run_t *r = d->run = dp_malloc(sizeof *r);
    if (s_init(r, c, d->standalone ? 0 : c->task_index, err) != 0) {
        free(r);
        d->run = NULL;
        return -1;
    }
    d->model = &r->model;
    d->metrics = r->metrics;
    d->tb = r->tb;
    d->progress = &r->progress;
    d->total = LONG_MAX; /* the run ends by its env steps */
    if (!d->standalone) {
        r->ends = dp_malloc((size_t)r->a.K * r->a.T * sizeof(uint32_t));
        return 0;
    }
    dp_model_init_params(&r->model, r->h_params, c->seed);
    dp_net_set_params(&r->net, r->h_params);
    size_t n_state = r->model.n_floats * (size_t)dp_optim_state_per_param(c->optim.kind);
    if (n_state) r->d_state = r->be->ops->alloc(r->be, n_state * sizeof(float));
    return 0;
}

static int s_rl_plan(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    const dp_train_conf_t *c = d->c;
    if (d->standalone) {
        dp_log_info("standalone: %s on %s in %s, %d environment(s), %d steps a segment, %ld env steps, %s "
                    "lr %g", r->model.spec, r->kind->name, r->be->precision, c->a3c.envs, c->a3c.t_max, c->a3c.env_steps,
                    dp_optim_kind_name(c->optim.kind), (double)dp_optim_base_lr(&c->optim));
        return 0;
    }
    const dp_ps_info_t *info = &d->info;
    if (info->local_steps > 1)
        return dp_err(err, "--env: the servers run --local-steps %ld, which an actor-critic worker "
                      "does not (it pushes every segment's gradient)", info->local_steps);
    dp_log_info("worker %d/%d: %s mode, %d shard(s), %s in %s in %d environment(s), %d steps a push, "
                "until the run has taken %ld env steps", c->task_index, info->num_workers,
                dp_mode_name(info->mode), info->num_shards, r->model.spec, r->be->precision, c->a3c.envs,
                c->a3c.t_max, c->a3c.env_steps);
    return 0;
}

static int s_rl_save(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    if (!d->c->save) return 0;
    dp_net_get_params(&r->net, r->h_params);
    return dp_checkpoint_save(d->c->save, &r->model, r->h_params, r->segments, r->segments, NULL, err);
}

/* The end of a whole run (standalone, or the chief with the servers' STATS
 * in sum): the final weights' greedy test_return, the model file, the
 * summary's fields. */
static int s_rl_finish(dp_train_drv_t *d, dp_run_summary_t *sum, char *err)
{
    s_run_t *r = d->run;
    const dp_ps_stats_t *st = sum->stats;
    dp_rl_summary_t *rl = &r->sum;
    *rl = (dp_rl_summary_t){.kind = r->kind, .env_steps = r->env_steps, .episodes = r->returns.episodes,
                            .return_mean_100 = dp_episodes_mean(&r->returns),
                            .solved_at = r->returns.solved_at, .curve_at = r->returns.curve_at,
                            .curve_mean = r->returns.curve_mean, .n_curve = r->returns.n_curve};
    if (st) { /* the run's episodes, all workers': the servers' account */
        if (dp_ps_client_pull(d->ps, r->h_params, err) != 0) return -1;
        dp_net_set_params(&r->net, r->h_params);
        *rl = (dp_rl_summary_t){.kind = r->kind, .env_steps = st->env_steps, .episodes = st->episodes,
                                .return_mean_100 = st->return_mean_100,
                                .solved_at = st->solved_at_env_steps, .curve_at = st->curve_at,
                                .curve_mean = st->curve_mean, .n_curve = st->n_curve};
    } else {
        sum->version = (uint64_t)r->segments;
        sum->optim = &d->c->optim;
    }
    rl->test_return = dp_a3c_test_return(r->kind, &r->net, r->c->seed, r->a.worker, DP_A3C_TEST_EPISODES);
    char solved[48] = "not solved";
    if (rl->solved_at >= 0) snprintf(solved, sizeof solved, "solved at env step %" PRId64, rl->solved_at);
    dp_log_info("%s: %" PRIu64 " env steps, %" PRIu64 " episodes in %.1f s; return over the last "
                "100 %.1f (%s), greedy test return %.1f", r->kind->name, rl->env_steps,
                rl->episodes, sum->train_s, rl->return_mean_100, solved, rl->test_return);
    if (d->c->save) {
        dp_net_get_params(&r->net, r->h_params);
        if (dp_checkpoint_save(d->c->save, &r->model, r->h_params, r->segments, (long)sum->version,
                               NULL, err) != 0)
            return -1;
    }
    sum->model = r->model.spec;
    sum->rl = rl;
    return 0;
}

static void s_rl_close(dp_train_drv_t *d)
{
    if (!d->run) return;
    s_fini(d->run);
    free(d->run);
    d->run = NULL;
}

const dp_train_kind_ops_t dp_train_rl = {
    .name = "rl",
    .diverged = "lower --lr",
    .diverged_cluster = NULL, /* its loop says it before the push */
    .open = s_rl_open,
    .plan = s_rl_plan,
    .loop = s_rl_loop,
    .metrics = s_rl_metrics,
    .progress = s_rl_progress,
    .evaluate = NULL, /* test_return at the end only */
    .save = s_rl_save,
    .finish = s_rl_finish,
    .close = s_rl_close,
};
