/* driver: a run's lifecycle, once for every kind (driver.h). */
#include "worker/train/driver.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "worker/exec/sparse_data.h"

/* --env: an actor-critic; --data libsvm: a model with an embedding (its
 * open says so when the model has none); else a dense model. */
static const dp_train_kind_ops_t *s_kind(const dp_train_conf_t *c)
{
    if (c->a3c.env) return &dp_train_rl;
    if (dp_sparse_data_is(c->data)) return &dp_train_embed;
    return &dp_train_dense;
}

void dp_train_log_eval(dp_train_drv_t *d, long step, const dp_train_eval_t *e)
{
    dp_outputs_log_eval(d->metrics, d->tb, step, e->accuracy, e->loss, e->auc);
}

/* --eval-every N on the chief: the test set every N of its steps, so a run
 * leaves an accuracy curve; the last step is scored by the run's end. The
 * other workers never evaluate: it would only slow them. */
static int s_maybe_eval(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    if (!d->ops->evaluate || c->task_index != 0 || c->eval_every <= 0 ||
        d->done % c->eval_every != 0 || d->done >= d->total)
        return 0;
    dp_train_eval_t e;
    if (d->ops->evaluate(d, c->eval_limit, &e, err) != 0) return -1;
    dp_train_log_eval(d, d->done, &e);
    return 0;
}

/* What a push's result adds: its staleness, a change of the crew's size,
 * a rejection's reason. */
static void s_push_done(dp_train_drv_t *d, const dp_train_step_t *st)
{
    const dp_push_result_t *r = st->push;
    if (d->info.mode != DP_MODE_SYNC)
        dp_tb_scalar(d->tb, "train/staleness", st->step, (float)r->staleness_mean);
    if (r->workers_live > 0 && r->workers_live != d->workers_live) { /* the crew changed */
        if (d->workers_live > 0 && d->c->task_index == 0)
            dp_log_info("chief: %d workers live at step %ld (were %d)", r->workers_live, st->step,
                        d->workers_live);
        dp_tb_scalar(d->tb, "workers", st->step, (float)r->workers_live);
        d->workers_live = r->workers_live;
    }
    if (r->rejected && r->reason[0]) dp_log_warn("step %ld: update rejected: %s", st->step, r->reason);
}

int dp_train_done(dp_train_drv_t *d, const dp_train_step_t *st, char *err)
{
    const char *hint = d->standalone ? d->ops->diverged : d->ops->diverged_cluster;
    if (hint && !isfinite(st->loss))
        return dp_err(err, "loss is %f at step %ld: training diverged (%s)", st->loss, st->step, hint);
    d->done = st->step + 1;
    d->samples += st->samples;
    if (isfinite(st->loss))
        d->loss_avg = d->done == d->first + 1 ? st->loss : 0.98 * d->loss_avg + 0.02 * st->loss;
    if (st->push) d->stale_sum += st->push->staleness_mean;
    /* a push's whole step on this worker, from the last one's record to
     * this one's: its pull, compute (an injected delay too), push, and the
     * last record's own time; what `downpour sim --compute trace:DIR` replays */
    double now = dp_now(), before = d->t_step > 0 ? d->t_step : d->t0, step_ms = (now - before) * 1e3;
    d->t_step = now;
    cJSON *line = dp_metrics_line(d->metrics);
    if (line) {
        d->ops->metrics(d, st, line);
        if (st->push) { /* and when, on the machine's monotonic clock (every process's) */
            cJSON_AddNumberToObject(line, "step_ms", dp_metrics_round(step_ms, 6));
            cJSON_AddNumberToObject(line, "clock_s", round(now * 1e6) / 1e6); /* to the µs */
            /* its parts: from the last record to its pull's return (the pull's
             * round trip), from its push's start to this record (the push's) */
            if (st->pulled_at > 0 && st->pushed_at >= st->pulled_at && now >= st->pushed_at) {
                double pull_ms = fmax(0, (st->pulled_at - before) * 1e3);
                cJSON_AddNumberToObject(line, "pull_ms", dp_metrics_round(pull_ms, 6));
                cJSON_AddNumberToObject(line, "push_ms", dp_metrics_round((now - st->pushed_at) * 1e3, 6));
            }
        }
        dp_metrics_write(d->metrics, &line);
    }
    if (st->step % 10 == 0) dp_tb_scalar(d->tb, "train/loss", st->step, st->loss); /* small files */
    if (st->push) s_push_done(d, st);
    if (s_maybe_eval(d, err) != 0) return -1;
    if (dp_progress_due(d->progress, st->last)) { /* worded only when shown */
        char text[256];
        d->ops->progress(d, st, text, sizeof text);
        dp_progress_update(d->progress, st->last, "%s", text);
    }
    return 0;
}

/* The client's options and the heartbeats, before anything slow (data,
 * device), so that a starting worker is never taken for a dead one. The
 * signal's flag ends the HELLO wait too. */
static int s_beat(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    d->opts = (dp_ps_client_opts_t){.timeout_s = c->timeout_s,
                                    .curve = {c->curve_secret, c->curve_server},
                                    .transport = c->transport, .wire = c->wire,
                                    .compress = c->compress, .stop = d->stop,
                                    .session = dp_ps_session_new()};
    return dp_ps_beat_new(&d->beat, c->ps, c->task_index, d->opts.session, &d->opts.curve, err);
}

/* HELLO with the kind's model and deal plan; this task in the crew. A GPU
 * worker (--device cuda:K) offers CUDA IPC for the device region of a
 * shard on this host (kernels/backend.h's dp_devmem_for_device); a CPU
 * worker offers none, and a module that refuses leaves the host path with
 * a line. */
static int s_connect(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    char why[DP_ERR_LEN];
    d->opts.devmem = dp_devmem_for_device(c->device ? c->device : "cpu", why);
    if (!d->opts.devmem && why[0]) dp_log_info("no device region: %s", why);
    if (dp_ps_client_new(&d->ps, c->ps, d->model, c->task_index, &d->opts, &d->info, err) != 0)
        return -1;
    if (c->task_index >= d->info.num_workers)
        return dp_err(err, "--task-index %d out of range: the servers expect %d workers",
                      c->task_index, d->info.num_workers);
    d->elastic = d->info.min_workers > 0;
    return 0;
}

/* The one signal rule: standalone saves and returns 0 (the caller exits
 * 128 + signal); an elastic crew's worker, its last step whole (its pull
 * and push were not interrupted, so every shard has its gradient or none
 * has), tells the servers it leaves (BARRIER{leave}) and returns
 * DP_TRAIN_LEFT (exit 0); any other worker fails. */
static int s_stopped(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    int sig = (int)*d->stop;
    if (d->standalone) {
        if (d->ops->save(d, err) != 0) return -1;
        dp_log_info("standalone: stopped by signal %d at step %ld; %s%s", sig, d->done,
                    c->save ? "model saved to " : "nothing saved (no --save)", c->save ? c->save : "");
        return 0;
    }
    if (!d->elastic) return dp_err(err, "interrupted at step %ld", d->done);
    if (dp_ps_client_leave(d->ps, err) != 0) return -1;
    dp_log_info("worker %d: left after step %ld on signal %d; the servers go on without it%s",
                c->task_index, d->done, sig,
                c->task_index == 0 ? " (a chief that comes back takes its role again)" : "");
    return DP_TRAIN_LEFT;
}

/* Standalone's end: the kind's finish, then the summary. */
static int s_end_standalone(dp_train_drv_t *d, double train_s, char *err)
{
    dp_run_summary_t r = {
        .mode = "standalone", .workers = 1, .ps_shards = 0, .staleness = -1, .steps = d->done,
        .train_loss = d->loss_avg, .train_s = train_s, .t_start = d->t_open,
        .images_per_s_per_worker = d->samples / (train_s > 0 ? train_s : 1e-9),
        .applied = (uint64_t)d->done,
    };
    if (d->ops->finish(d, &r, err) != 0) return -1;
    return dp_train_summary_write(d->c, &r, err);
}

/* The chief's end of a cluster run, the crew finished: the servers' part
 * of the summary, the kind's finish, the summary, the servers shut down. */
static int s_end_chief(dp_train_drv_t *d, const dp_ps_stats_t *st, double train_s, double crew_s,
                       char *err)
{
    const dp_ps_info_t *info = &d->info;
    dp_staleness_t hist; /* the servers' (shard 0's) counts per staleness */
    dp_staleness_init(&hist);
    for (size_t b = 0; b < st->staleness_bins; b++) dp_staleness_add_n(&hist, b, st->staleness_hist[b]);
    dp_ps_membership_t crew = {0};
    int rc = dp_ps_client_membership(d->ps, &crew, err);
    if (rc == 0) {
        dp_log_info("chief: %zu join(s) and leave(s) over the run, %d to %d workers live", crew.n,
                    crew.live_min, crew.live_max);
        dp_run_summary_t r = {
            .mode = dp_mode_name(info->mode), .workers = info->num_workers,
            .ps_shards = info->num_shards, .replicas = info->replicas,
            .staleness = info->mode == DP_MODE_SSP ? info->staleness : -1, .steps = d->done,
            .images_per_s_per_worker = d->samples / (train_s > 0 ? train_s : 1e-9),
            .train_s = train_s, .t_start = d->t_open,
            .crew_samples = dp_crew_samples(&crew, d->samples, info->num_workers), .crew_s = crew_s,
            .version = st->version, .applied = st->applied, .dropped = st->dropped,
            .rejected = st->rejected, .requests_refused = st->requests_refused,
            .staleness_mean = st->staleness_mean, .staleness_max = st->staleness_max,
            .staleness_hist = &hist, .membership = &crew, .min_workers = info->min_workers, .stats = st,
        };
        rc = d->ops->finish(d, &r, err);
        /* the client's counts after the finish's pulls (the final weights, rows) */
        r.updates_lost = dp_ps_client_updates_lost(d->ps);
        r.bytes_pushed = dp_ps_client_bytes_pushed(d->ps);
        r.bytes_pulled = dp_ps_client_bytes_pulled(d->ps);
        if (rc == 0) rc = dp_train_summary_write(d->c, &r, err);
        if (rc == 0) rc = dp_ps_client_shutdown_servers(d->ps, err);
    }
    dp_ps_membership_fini(&crew);
    dp_staleness_fini(&hist);
    return rc;
}

/* A cluster run's end: FINISH; the chief waits for every worker (the
 * crew trained until its last one ended) and reads the servers' STATS. */
static int s_end_cluster(dp_train_drv_t *d, double train_s, char *err)
{
    if (dp_ps_client_finish(d->ps, err) != 0) return -1;
    if (d->c->task_index != 0) return 0;
    double waited = dp_now();
    if (dp_ps_client_wait_all_finished(d->ps, d->c->timeout_s * 10, err) != 0)
        dp_log_warn("not every worker finished: %s", err);
    double crew_s = train_s + (dp_now() - waited);
    dp_ps_stats_t st;
    if (dp_ps_client_stats(d->ps, &st, err) != 0) return -1;
    return s_end_chief(d, &st, train_s, crew_s, err);
}

int dp_train_run(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    dp_train_drv_t d = {.c = c, .ops = s_kind(c), .stop = stop, .standalone = c->ps == NULL,
                        .t_open = dp_now()};
    int rc = -1;
    if ((!d.standalone && s_beat(&d, err) != 0) || d.ops->open(&d, err) != 0 ||
        (!d.standalone && s_connect(&d, err) != 0) || d.ops->plan(&d, err) != 0)
        goto done;
    /* Elastic: a signal ends the loop at a step's end, never inside one */
    if (d.elastic) dp_ps_client_set_stop(d.ps, NULL);
    d.t0 = dp_now();
    d.done = d.first;
    int looped = d.ops->loop(&d, err);
    double train_s = dp_now() - d.t0;
    if (d.progress) dp_progress_done(d.progress);
    if (looped != 0) goto done;
    rc = dp_train_stopped(&d) ? s_stopped(&d, err)
         : d.standalone       ? s_end_standalone(&d, train_s, err)
                              : s_end_cluster(&d, train_s, err);
done:
    dp_ps_client_destroy(&d.ps);
    d.ops->close(&d);
    dp_ps_beat_destroy(&d.beat);
    return rc;
}
