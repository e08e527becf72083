/* a3c_train: the actor-critic worker's runs (--env): standalone (one
 * learner, its own optimizer: the baseline) and against the servers (A3C
 * in async, A2C in sync), on the rollouts of worker/exec/a3c.h. */
#include "worker/train/a3c_train.h"

#include <inttypes.h>
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
    double t0;
} s_run_t;

static void s_fini(s_run_t *r)
{
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
    if (dp_a3c_model(&r->model, c->model, r->kind, err) != 0) return -1;
    if (dp_backend_new(&r->be, c->device, err) != 0) return -1;
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
    r->t0 = dp_now();
    return 0;
fail:
    s_fini(r);
    return -1;
}

/* One segment and its gradient, clipped, in h_grads (and with local, in
 * the net's d_grads again for a local optimizer step). Records the
 * episodes that ended. Returns the batch's loss (NAN: diverged). */
static float s_segment(s_run_t *r, int local, char *err)
{
    const dp_a3c_conf_t *ac = &r->c->a3c;
    if (dp_a3c_segment(&r->a, &r->net, err) != 0) return NAN;
    int rows = r->a.K * r->a.T;
    float loss = dp_net_train_step_ac(&r->net, r->a.x, r->a.act, r->a.ret, rows);
    dp_net_get_grads(&r->net, r->h_grads);
    dp_clip_global_norm(r->h_grads, r->model.n_floats, ac->clip_norm);
    if (local) r->be->ops->upload(r->be, r->net.d_grads, r->h_grads, r->model.n_floats * sizeof(float));
    for (int i = 0; i < r->a.n_ended; i++) {
        dp_episodes_add(&r->returns, r->a.ended[i], r->env_steps + (uint64_t)r->a.ended_at[i]);
        dp_tb_scalar(r->tb, "rl/episode_return", (long)(r->env_steps + (uint64_t)r->a.ended_at[i]),
                     (float)r->a.ended[i]);
    }
    r->env_steps += (uint64_t)rows;
    r->segments++;
    return loss;
}

/* A metrics line every segment; the progress line when it is time, with
 * the run's env steps (run_steps: the servers' count, all workers). */
static void s_log(s_run_t *r, float loss, int final, uint64_t run_steps)
{
    cJSON *line = dp_metrics_line(r->metrics);
    if (line) {
        cJSON_AddNumberToObject(line, "step", (double)r->segments);
        cJSON_AddNumberToObject(line, "env_steps", (double)r->env_steps);
        if (run_steps != r->env_steps) cJSON_AddNumberToObject(line, "run_env_steps", (double)run_steps);
        cJSON_AddNumberToObject(line, "episodes", (double)r->returns.episodes);
        cJSON_AddNumberToObject(line, "return_mean_100", dp_metrics_round(dp_episodes_mean(&r->returns), 3));
        cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
        dp_metrics_write(r->metrics, &line);
    }
    double dt = dp_now() - r->t0;
    dp_progress_update(&r->progress, final, "%s  env steps %" PRIu64 "/%ld  episodes %" PRIu64
                       "  return(100) %.1f  %.0f env steps/s",
                       r->kind->name, run_steps, r->c->a3c.env_steps, r->returns.episodes,
                       dp_episodes_mean(&r->returns), r->env_steps / (dt > 0 ? dt : 1e-9));
}

static void s_curve_point(cJSON *curve, uint64_t at, double mean)
{
    cJSON *pt = cJSON_CreateArray();
    cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)at));
    cJSON_AddItemToArray(pt, cJSON_CreateNumber(dp_metrics_round(mean, 4)));
    cJSON_AddItemToArray(curve, pt);
}

cJSON *dp_a3c_curve_json(const uint64_t *at, const double *mean, int n, uint64_t end_at, double end_mean)
{
    cJSON *curve = cJSON_CreateArray();
    for (int k = 0; k < n; k++) s_curve_point(curve, at[k], mean[k]);
    if (n > 0 && end_at > at[n - 1]) s_curve_point(curve, end_at, end_mean);
    return curve;
}

int dp_a3c_summary_write(const dp_train_conf_t *c, const dp_a3c_summary_t *s, char *err)
{
    if (!c->summary) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", s->mode);
    cJSON_AddNumberToObject(o, "workers", s->workers);
    cJSON_AddNumberToObject(o, "ps_shards", s->ps_shards);
    cJSON_AddStringToObject(o, "env", s->kind->name);
    cJSON_AddNumberToObject(o, "env_steps", (double)s->env_steps);
    cJSON_AddNumberToObject(o, "episodes", (double)s->episodes);
    cJSON_AddNumberToObject(o, "return_mean_100", dp_metrics_round(s->return_mean_100, 4));
    if (s->solved_at >= 0) cJSON_AddNumberToObject(o, "solved_at_env_steps", (double)s->solved_at);
    else cJSON_AddNullToObject(o, "solved_at_env_steps");
    cJSON_AddNumberToObject(o, "solved_threshold", s->kind->solved);
    cJSON_AddNumberToObject(o, "test_return", dp_metrics_round(s->test_return, 4));
    cJSON_AddItemToObject(o, "return_curve", dp_a3c_curve_json(s->curve_at, s->curve_mean, s->n_curve,
                                                              s->env_steps, s->return_mean_100));
    cJSON_AddNumberToObject(o, "test_episodes", DP_A3C_TEST_EPISODES);
    cJSON_AddNumberToObject(o, "steps", (double)s->steps);
    cJSON_AddNumberToObject(o, "env_steps_per_s",
                            dp_metrics_round(s->env_steps / (s->train_s > 0 ? s->train_s : 1e-9), 1));
    cJSON_AddNumberToObject(o, "train_s", s->train_s);
    cJSON_AddNumberToObject(o, "wall_s", s->wall_s);
    if (s->ps_shards > 0) cJSON_AddNumberToObject(o, "version", (double)s->version);
    cJSON_AddNumberToObject(o, "updates_applied", (double)s->applied);
    cJSON_AddNumberToObject(o, "updates_dropped", (double)s->dropped);
    cJSON_AddNumberToObject(o, "updates_rejected", (double)s->rejected);
    if (s->ps_shards > 0) cJSON_AddNumberToObject(o, "requests_refused", (double)s->requests_refused);
    cJSON_AddNumberToObject(o, "staleness_mean", s->staleness_mean);
    cJSON_AddNumberToObject(o, "staleness_max", (double)s->staleness_max);
    if (s->staleness_hist)
        cJSON_AddItemToObject(o, "staleness_histogram", dp_staleness_json(s->staleness_hist));
    if (s->membership) dp_summary_membership_json(o, s->membership);
    if (s->optim) {
        cJSON_AddStringToObject(o, "optimizer", dp_optim_kind_name(s->optim->kind));
        cJSON_AddNumberToObject(o, "lr", dp_optim_base_lr(s->optim));
    }
    cJSON_AddNumberToObject(o, "envs", c->a3c.envs);
    cJSON_AddNumberToObject(o, "t_max", c->a3c.t_max);
    cJSON_AddNumberToObject(o, "entropy", dp_metrics_round(c->a3c.entropy, 6));
    cJSON_AddNumberToObject(o, "gamma", dp_metrics_round(c->a3c.gamma, 6));
    cJSON_AddNumberToObject(o, "clip_norm", dp_metrics_round(c->a3c.clip_norm, 6));
    cJSON_AddStringToObject(o, "device", c->device);
    cJSON_AddStringToObject(o, "model", s->model);
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, c->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    int rc = dp_summary_write(c->summary, o, err);
    cJSON_Delete(o);
    return rc;
}

/* The chief's end: test_return, the model file, the summary. */
static int s_finish(s_run_t *r, dp_a3c_summary_t *s, char *err)
{
    dp_progress_done(&r->progress);
    s->kind = r->kind;
    s->model = r->model.spec;
    s->steps = r->segments;
    s->test_return = dp_a3c_test_return(r->kind, &r->net, r->c->seed, r->a.worker, DP_A3C_TEST_EPISODES);
    char solved[48] = "not solved";
    if (s->solved_at >= 0) snprintf(solved, sizeof solved, "solved at env step %" PRId64, s->solved_at);
    dp_log_info("%s: %" PRIu64 " env steps, %" PRIu64 " episodes in %.1f s; return over the last "
                "100 %.1f (%s), greedy test return %.1f", r->kind->name, s->env_steps,
                s->episodes, s->train_s, s->return_mean_100, solved, s->test_return);
    if (r->c->save) {
        dp_net_get_params(&r->net, r->h_params);
        if (dp_checkpoint_save(r->c->save, &r->model, r->h_params, r->segments, (long)s->version,
                               NULL, err) != 0)
            return -1;
    }
    s->wall_s = dp_now() - r->t0;
    return dp_a3c_summary_write(r->c, s, err);
}

int dp_a3c_standalone(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    s_run_t r;
    if (s_init(&r, c, 0, err) != 0) return -1;
    const dp_optim_conf_t *opt = &c->optim;
    dp_model_init_params(&r.model, r.h_params, c->seed);
    dp_net_set_params(&r.net, r.h_params);
    size_t n_state = r.model.n_floats * (size_t)dp_optim_state_per_param(opt->kind);
    float *d_state = n_state ? r.be->ops->alloc(r.be, n_state * sizeof(float)) : NULL;
    dp_log_info("standalone: %s on %s, %d environment(s), %d steps a segment, %ld env steps, %s "
                "lr %g", r.model.spec, r.kind->name, c->a3c.envs, c->a3c.t_max, c->a3c.env_steps,
                dp_optim_kind_name(opt->kind), (double)dp_optim_base_lr(opt));
    int rc = 0;
    while (!(stop && *stop) && r.env_steps < (uint64_t)c->a3c.env_steps) {
        float loss = s_segment(&r, 1, err);
        if (!isfinite(loss)) {
            rc = err[0] ? -1 : dp_err(err, "loss is %f after %" PRIu64 " env steps: training "
                                      "diverged (lower --lr)", loss, r.env_steps);
            break;
        }
        dp_net_optim_step(&r.net, opt, dp_optim_lr_at(opt, r.segments - 1), d_state, r.segments);
        s_log(&r, loss, r.env_steps >= (uint64_t)c->a3c.env_steps, r.env_steps);
    }
    double train_s = dp_now() - r.t0;
    if (d_state) r.be->ops->release(r.be, d_state);
    if (rc == 0 && stop && *stop) {
        dp_progress_done(&r.progress);
        dp_log_info("standalone: stopped by signal %d after %" PRIu64 " env steps", (int)*stop,
                    r.env_steps);
        if (c->save) {
            dp_net_get_params(&r.net, r.h_params);
            rc = dp_checkpoint_save(c->save, &r.model, r.h_params, r.segments, r.segments, NULL, err);
        }
    } else if (rc == 0) {
        dp_a3c_summary_t s = {.mode = "standalone", .workers = 1, .env_steps = r.env_steps,
                         .episodes = r.returns.episodes,
                         .return_mean_100 = dp_episodes_mean(&r.returns),
                         .solved_at = r.returns.solved_at, .train_s = train_s, .optim = opt,
                         .version = (uint64_t)r.segments, .applied = (uint64_t)r.segments,
                         .curve_at = r.returns.curve_at, .curve_mean = r.returns.curve_mean,
                         .n_curve = r.returns.n_curve};
        rc = s_finish(&r, &s, err);
    }
    s_fini(&r);
    return rc;
}

/* The chief's end of a cluster run: every worker finished, the final
 * weights pulled for test_return, the run's episodes from the servers. */
static int s_finish_chief(s_run_t *r, dp_ps_client_t *ps, const dp_ps_info_t *info,
                          double train_s, char *err)
{
    if (dp_ps_client_wait_all_finished(ps, r->c->timeout_s * 10, err) != 0)
        dp_log_warn("not every worker finished: %s", err);
    if (dp_ps_client_pull(ps, r->h_params, err) != 0) return -1;
    dp_net_set_params(&r->net, r->h_params);
    dp_ps_stats_t st;
    if (dp_ps_client_stats(ps, &st, err) != 0) return -1;
    dp_a3c_summary_t s = {.mode = dp_mode_name(info->mode), .workers = info->num_workers,
                     .ps_shards = info->num_shards, .env_steps = st.env_steps,
                     .episodes = st.episodes, .return_mean_100 = st.return_mean_100,
                     .solved_at = st.solved_at_env_steps, .train_s = train_s,
                     .version = st.version, .applied = st.applied, .dropped = st.dropped,
                     .rejected = st.rejected, .staleness_max = st.staleness_max,
                     .staleness_mean = st.staleness_mean, .requests_refused = st.requests_refused,
                     .curve_at = st.curve_at,
                     .curve_mean = st.curve_mean, .n_curve = st.n_curve};
    dp_staleness_t hist; /* the servers' (shard 0's) counts per staleness, as a dense run's */
    dp_staleness_init(&hist);
    for (size_t b = 0; b < st.staleness_bins; b++) dp_staleness_add_n(&hist, b, st.staleness_hist[b]);
    s.staleness_hist = &hist;
    dp_ps_membership_t crew = {0};
    int rc = dp_ps_client_membership(ps, &crew, err);
    if (rc == 0) {
        s.membership = &crew;
        rc = s_finish(r, &s, err);
    }
    dp_ps_membership_fini(&crew);
    dp_staleness_fini(&hist);
    return rc;
}

/* One segment's push: the clipped gradient with the segment's account. */
static int s_push(s_run_t *r, dp_ps_client_t *ps, float loss, uint32_t *ends, uint64_t *run_steps,
                  char *err)
{
    for (int i = 0; i < r->a.n_ended; i++) ends[i] = (uint32_t)r->a.ended_at[i];
    int rows = r->a.K * r->a.T;
    dp_ps_segment_t sg = {.env_steps = (uint64_t)rows, .n = (size_t)r->a.n_ended,
                          .returns = r->a.ended, .ends = ends, .threshold = r->kind->solved};
    dp_ps_push_t p = {.grads = r->h_grads, .loss = loss, .batch = rows,
                      .step = (uint64_t)r->segments, .segment = &sg};
    dp_push_result_t res;
    if (dp_ps_client_push(ps, &p, &res, err) != 0) return -1;
    /* every segment of this worker would be: its flags are not the servers' */
    if (res.account_refused)
        return dp_err(err, "the servers refused the segment's account: %s", res.reason);
    *run_steps = res.env_steps;
    return 0;
}

int dp_a3c_distributed(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    s_run_t r;
    if (s_init(&r, c, c->task_index, err) != 0) return -1;
    dp_ps_client_opts_t opts = {.timeout_s = c->timeout_s,
                                .curve = {c->curve_secret, c->curve_server},
                                .transport = c->transport, .wire = c->wire, .compress = c->compress,
                                .stop = stop, .session = dp_ps_session_new()};
    dp_ps_beat_t *beat = NULL;
    dp_ps_client_t *ps = NULL;
    dp_ps_info_t info;
    uint32_t *ends = dp_malloc((size_t)r.a.K * r.a.T * sizeof(uint32_t));
    int rc = -1;
    if (dp_ps_beat_new(&beat, c->ps ? c->ps : "", c->task_index, opts.session, &opts.curve, err) != 0 ||
        dp_ps_client_new(&ps, c->ps, &r.model, c->task_index, &opts, &info, err) != 0)
        goto done;
    if (c->task_index >= info.num_workers) {
        dp_err(err, "--task-index %d out of range: the servers expect %d workers", c->task_index,
               info.num_workers);
        goto done;
    }
    if (info.local_steps > 1) {
        dp_err(err, "--env: the servers run --local-steps %ld, which an actor-critic worker does "
               "not (it pushes every segment's gradient)", info.local_steps);
        goto done;
    }
    dp_log_info("worker %d/%d: %s mode, %d shard(s), %s in %d environment(s), %d steps a push, "
                "until the run has taken %ld env steps", c->task_index, info.num_workers,
                dp_mode_name(info.mode), info.num_shards, r.model.spec, c->a3c.envs, c->a3c.t_max,
                c->a3c.env_steps);
    /* The budget is the run's: the servers count every push's steps and
     * each ACK says the total, so the workers together stop at it (each
     * takes at most the segment it is in past it). */
    uint64_t run_steps = 0;
    /* Elastic: a signal ends the loop after a whole segment's push, never
     * inside one, and the worker leaves (the dense and sparse rule). */
    if (info.min_workers > 0) dp_ps_client_set_stop(ps, NULL);
    while (!(stop && *stop) && run_steps < (uint64_t)c->a3c.env_steps) {
        dp_train_test_hold(c->task_index, r.segments + 1, stop);
        if (dp_ps_client_pull(ps, r.h_params, err) != 0) goto done;
        dp_net_set_params(&r.net, r.h_params);
        float loss = s_segment(&r, 0, err);
        if (!isfinite(loss)) {
            if (!err[0]) dp_err(err, "loss is %f after %" PRIu64 " env steps: training diverged "
                                "(lower the servers' --lr)", loss, r.env_steps);
            goto done;
        }
        if (s_push(&r, ps, loss, ends, &run_steps, err) != 0) goto done;
        s_log(&r, loss, 0, run_steps);
    }
    double train_s = dp_now() - r.t0;
    dp_progress_done(&r.progress);
    if (stop && *stop && info.min_workers > 0) {
        rc = dp_train_leave(ps, c->task_index, r.segments, (int)*stop, err);
        goto done;
    }
    if (stop && *stop) {
        dp_err(err, "stopped by signal %d after %" PRIu64 " env steps", (int)*stop, r.env_steps);
        goto done;
    }
    dp_log_info("worker %d: %" PRIu64 " of the run's %" PRIu64 " env steps, %" PRIu64
                " episodes of its own (mean of its last 100 %.1f)", c->task_index, r.env_steps,
                run_steps, r.returns.episodes, dp_episodes_mean(&r.returns));
    if (dp_ps_client_finish(ps, err) != 0) goto done;
    if (c->task_index == 0) {
        if (s_finish_chief(&r, ps, &info, train_s, err) != 0) goto done;
        if (dp_ps_client_shutdown_servers(ps, err) != 0) goto done;
    }
    rc = 0;
done:
    free(ends);
    dp_ps_client_destroy(&ps);
    dp_ps_beat_destroy(&beat);
    s_fini(&r);
    return rc;
}
