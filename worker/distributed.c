/* distributed: the worker's loop against parameter servers — pull, compute,
 * push — and, on the chief (task 0), the end of the run: wait for every
 * worker, evaluate the final weights, save them, write the summary, stop
 * the servers. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "common/util.h"
#include "worker/data.h"
#include "worker/ps_beat.h"
#include "worker/ps_client.h"
#include "worker/train.h"

static const char *s_mode_name(dp_mode_t m)
{
    switch (m) {
    case DP_MODE_SYNC: return "sync";
    case DP_MODE_ASYNC: return "async";
    case DP_MODE_SSP: return "ssp";
    }
    return "?";
}

/* Sleep for the injected delay: fixed, or exponential with that mean (the
 * heavy tail of real stragglers). */
static void s_inject_delay(const dp_train_conf_t *c, dp_rng_t *rng)
{
    if (c->delay_ms <= 0) return;
    double ms = c->delay_ms;
    if (c->delay_exp) ms = -c->delay_ms * log(1.0 - dp_rng_uniform(rng));
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    nanosleep(&ts, NULL);
}

/* The line per push: what was computed on which version, what the shards
 * made of it, and the updates lost so far to shard restarts. */
static void s_metrics_push(dp_session_t *s, long step, long spe, float loss, uint64_t version,
                           const dp_push_result_t *r, int applied, uint64_t lost)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (!line) return;
    cJSON_AddNumberToObject(line, "worker", s->conf.task_index);
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "epoch", step / spe);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
    cJSON_AddNumberToObject(line, "version", (double)version);
    cJSON_AddNumberToObject(line, "version_after", (double)r->version);
    cJSON_AddNumberToObject(line, "staleness", dp_metrics_round(r->staleness_mean, 4));
    cJSON_AddNumberToObject(line, "staleness_max", (double)r->staleness_max);
    cJSON_AddStringToObject(line, "status", applied ? "applied" : r->rejected ? "rejected" : "dropped");
    cJSON_AddNumberToObject(line, "updates_lost", (double)lost);
    dp_metrics_write(s->metrics, &line);
}

/* The worker's last line: its own staleness histogram. */
static void s_metrics_staleness(dp_session_t *s, const dp_staleness_t *h)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (!line) return;
    cJSON_AddStringToObject(line, "event", "staleness");
    cJSON_AddNumberToObject(line, "worker", s->conf.task_index);
    cJSON_AddItemToObject(line, "staleness_histogram", dp_staleness_json(h));
    cJSON_AddNumberToObject(line, "staleness_geometric_p", dp_metrics_round(dp_staleness_geometric_p(h), 6));
    dp_metrics_write(s->metrics, &line);
}

/* --eval-every N on the chief: the test accuracy of the weights it pulled
 * for this step (the push line's "version"), every N of its steps, so a
 * run leaves an accuracy curve; the last step is scored by the end of the
 * run. The other workers never evaluate: it would only slow them. */
static void s_maybe_eval(dp_session_t *s, long done, long total)
{
    const dp_train_conf_t *c = &s->conf;
    if (c->task_index != 0 || c->eval_every <= 0 || done % c->eval_every != 0 || done >= total)
        return;
    double acc = 0, loss = 0;
    dp_session_evaluate(s, c->eval_limit, &acc, &loss);
    dp_session_log_eval(s, done, acc, loss);
}

/* The chief's end of the run. */
static int s_finish_chief(dp_session_t *s, dp_ps_client_t *ps, const dp_ps_info_t *info,
                          long steps, double train_s, double images, char *err)
{
    if (dp_ps_client_wait_all_finished(ps, s->conf.timeout_s * 10, err) != 0)
        dp_log_warn("not every worker finished: %s", err);
    if (dp_ps_client_pull(ps, s->h_params, err) != 0) return -1;
    dp_net_set_params(&s->net, s->h_params);
    double acc = 0, loss = 0;
    dp_session_evaluate(s, 0, &acc, &loss);
    dp_session_log_eval(s, steps, acc, loss);
    dp_ps_stats_t st;
    if (dp_ps_client_stats(ps, &st, err) != 0) return -1;
    dp_log_info("chief: test accuracy %.4f, loss %.4f; server applied %llu, dropped %llu, rejected %llu, staleness mean %.2f max %llu",
                acc, loss, (unsigned long long)st.applied, (unsigned long long)st.dropped,
                (unsigned long long)st.rejected, st.staleness_mean,
                (unsigned long long)st.staleness_max);
    if (dp_session_save(s, steps, (long)st.version, err) != 0) return -1;
    dp_staleness_t hist; /* the servers' (shard 0's) counts per staleness */
    dp_staleness_init(&hist);
    for (size_t b = 0; b < st.staleness_bins; b++) dp_staleness_add_n(&hist, b, st.staleness_hist[b]);
    long spe = dp_data_steps_per_epoch(s->train.n, s->conf.batch, info->num_workers);
    /* The chief's own throughput; the summary multiplies it by the workers
     * for the cluster's rate. */
    dp_run_summary_t r = {
        .mode = s_mode_name(info->mode), .workers = info->num_workers,
        .ps_shards = info->num_shards, .replicas = info->replicas,
        .staleness = info->mode == DP_MODE_SSP ? info->staleness : -1,
        .steps = steps, .epochs = (double)steps / spe, .test_accuracy = acc, .test_loss = loss,
        .images_per_s_per_worker = images / (train_s > 0 ? train_s : 1e-9), .train_s = train_s,
        .version = st.version, .applied = st.applied, .dropped = st.dropped,
        .rejected = st.rejected, .staleness_mean = st.staleness_mean,
        .staleness_max = st.staleness_max, .updates_lost = dp_ps_client_updates_lost(ps),
        .staleness_hist = &hist,
    };
    int rc = dp_session_summary(s, &r, err);
    dp_staleness_fini(&hist);
    return rc;
}

/* Where this worker starts: after the last step every shard applied from
 * it (a restarted worker; 0 for a new one). The data order is a function of
 * the step, so it takes up exactly where it stopped. In sync mode the loop
 * pulls before it pushes, so a rejoining worker computes on the current
 * version. */
static long s_first_step(dp_ps_client_t *ps, int task, long total)
{
    uint64_t held = dp_ps_client_resume_step(ps);
    long first = held < (uint64_t)total ? (long)held : total;
    if (first > 0)
        dp_log_info("worker %d: rejoining: the servers hold its steps 1..%ld; resuming at step %ld of %ld",
                    task, first, first + 1, total);
    return first;
}

int dp_train_distributed(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    /* Beats before anything slow (data, device), so a starting worker is
     * never taken for a dead one. */
    dp_ps_beat_t *beat = NULL;
    dp_ps_curve_t curve = {c->curve_secret, c->curve_server};
    if (dp_ps_beat_new(&beat, c->ps ? c->ps : "", c->task_index, c->curve_secret ? &curve : NULL,
                       err) != 0)
        return -1;
    dp_session_t s;
    if (dp_session_init(&s, c, err) != 0) {
        dp_ps_beat_destroy(&beat);
        return -1;
    }
    dp_ps_client_t *ps = NULL;
    dp_ps_info_t info;
    dp_batcher_t bt = {0};
    dp_staleness_t my_hist; /* this worker's applied pushes (the largest over shards) */
    dp_staleness_init(&my_hist);
    int rc = -1;
    dp_ps_client_default_stop_flag(stop); /* a signal ends the HELLO wait too */
    if (dp_ps_client_new_curve(&ps, c->ps, &s.model, c->task_index, c->timeout_s,
                               c->curve_secret ? &curve : NULL, &info, err) != 0)
        goto done;
    if (stop) dp_ps_client_set_stop_flag(ps, stop);
    if (c->task_index >= info.num_workers) {
        dp_err(err, "--task-index %d out of range: the servers expect %d workers", c->task_index,
               info.num_workers);
        goto done;
    }
    long total = dp_session_total_steps(&s, info.num_workers);
    long spe = dp_data_steps_per_epoch(s.train.n, c->batch, info.num_workers);
    long first = s_first_step(ps, c->task_index, total);
    if (dp_batcher_init_at(&bt, &s.train, s.be, c->batch, c->task_index, info.num_workers, c->seed,
                           first, total, err) != 0)
        goto done;
    dp_log_info("worker %d/%d: %s mode, %d shard(s), batch %d, %ld steps on %s", c->task_index,
                info.num_workers, s_mode_name(info.mode), info.num_shards, c->batch, total,
                c->device);
    dp_session_log_start(&s, c->task_index, total, spe);
    dp_rng_t delay_rng;
    dp_rng_seed(&delay_rng, c->seed * 7919 + (unsigned long long)c->task_index);
    double t0 = dp_now(), loss_avg = 0, stale_sum = 0;
    long done = first, applied = 0, dropped = 0, rejected = 0;
    dp_batch_t batch;
    long step;
    while ((step = dp_batcher_next(&bt, &batch)) >= 0) {
        if (stop && *stop) {
            dp_err(err, "interrupted at step %ld", step);
            goto done;
        }
        if (dp_ps_client_pull(ps, s.h_params, err) != 0) goto done;
        uint64_t version = dp_ps_client_version(ps);
        dp_net_set_params(&s.net, s.h_params);
        /* the gradient lands in the push buffer as the backward pass goes */
        float loss = dp_net_train_step_device(&s.net, batch.d_x, batch.d_y, c->batch, s.h_grads);
        s_inject_delay(c, &delay_rng);
        dp_push_result_t r;
        if (dp_ps_client_push_step(ps, (uint64_t)step + 1, s.h_grads, loss, c->batch, &r, err) != 0)
            goto done;
        int status_applied = r.applied == info.num_shards;
        applied += status_applied;
        if (status_applied) dp_staleness_add(&my_hist, r.staleness_max);
        dropped += r.dropped > 0;
        rejected += r.rejected > 0;
        stale_sum += r.staleness_mean;
        done = step + 1;
        if (isfinite(loss)) loss_avg = done == first + 1 ? loss : 0.98 * loss_avg + 0.02 * loss;
        s_metrics_push(&s, step, spe, loss, version, &r, status_applied,
                       dp_ps_client_updates_lost(ps));
        dp_session_log_step(&s, step, loss);
        if (info.mode != DP_MODE_SYNC) dp_tb_scalar(s.tb, "train/staleness", step, (float)r.staleness_mean);
        if (r.rejected && r.reason[0]) dp_log_warn("step %ld: update rejected: %s", step, r.reason);
        s_maybe_eval(&s, done, total);
        double dt = dp_now() - t0;
        dp_progress_update(&s.progress, done == total,
                           "worker %d  epoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f  staleness %.2f",
                           c->task_index, step / spe + 1, (total + spe - 1) / spe, done, total,
                           (done - first) * c->batch / (dt > 0 ? dt : 1e-9), loss_avg,
                           stale_sum / (done - first));
    }
    dp_progress_done(&s.progress);
    s_metrics_staleness(&s, &my_hist);
    double train_s = dp_now() - t0;
    dp_log_info("worker %d: %ld steps in %.1f s (%.0f images/s): %ld applied, %ld dropped, %ld rejected",
                c->task_index, done - first, train_s,
                (done - first) * c->batch / (train_s > 0 ? train_s : 1e-9), applied, dropped, rejected);
    if (dp_ps_client_finish(ps, err) != 0) goto done;
    if (c->task_index == 0) {
        if (s_finish_chief(&s, ps, &info, done, train_s, (double)(done - first) * c->batch, err) != 0)
            goto done;
        if (dp_ps_client_shutdown_servers(ps, err) != 0) goto done;
    }
    rc = 0;
done:
    dp_staleness_fini(&my_hist);
    dp_batcher_fini(&bt);
    dp_ps_client_destroy(&ps);
    dp_session_fini(&s);
    dp_ps_beat_destroy(&beat);
    return rc;
}
