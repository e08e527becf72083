/* ps_admin: downpour-ps's account of itself (server/loop/ps_loop.h) —
 * checkpoints (when --checkpoint-every says so, the first at a fresh
 * start, the last at SHUTDOWN or the stop; a restore at start), the
 * metrics lines, the STATS reply, SHUTDOWN. */
#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/metrics.h"
#include "common/util.h"
#include "server/core/shard_dc.h"
#include "server/loop/ps_loop.h"

/* Write the shard unless there is no --checkpoint-dir or this version is on
 * disk as finished or not. finished: the run ended (the chief's SHUTDOWN),
 * so the same flags do not silently restart it. */
int dp_ps_checkpoint(dp_ps_loop_t *ps, int finished, char *err)
{
    if (!ps->cfg->checkpoint_dir[0]) return 0;
    if (ps->ckpt_version == ps->shard.version && ps->run.finished == finished) return 0;
    ps->run.finished = finished;
    if (dp_shard_checkpoint_write(&ps->shard, ps->ckpt_path, &ps->run, err) != 0) {
        /* Loud, every time: a restart would go back to what the file holds. */
        ps->ckpt_failures++;
        char held[96] = "holds no checkpoint yet";
        if (ps->ckpt_version != UINT64_MAX)
            snprintf(held, sizeof held, "holds version %" PRIu64 ", which a restart goes back to",
                     ps->ckpt_version);
        dp_log_error("shard %d: checkpoint of version %" PRIu64 " FAILED (%" PRIu64 " failure%s "
                     "so far; %s %s): %s", ps->cfg->shard_index, ps->shard.version,
                     ps->ckpt_failures, ps->ckpt_failures > 1 ? "s" : "", ps->ckpt_path, held, err);
        return -1;
    }
    ps->ckpt_version = ps->shard.version;
    dp_log_debug("shard %d: checkpoint at version %" PRIu64 " in %s", ps->cfg->shard_index,
                 ps->shard.version, ps->ckpt_path);
    return 0;
}

/* The version moved: checkpoint when --checkpoint-every says so. */
void dp_ps_version_moved(dp_ps_loop_t *ps)
{
    long every = ps->cfg->checkpoint_every;
    char err[DP_ERR_LEN];
    if (every > 0 && ps->shard.version % (uint64_t)every == 0)
        dp_ps_checkpoint(ps, 0, err); /* a failure is logged and counted there */
}

/* The run's checkpoint restored, if the directory holds one this run may
 * take (server/core/shard_checkpoint.h says which). */
int dp_ps_restore(dp_ps_loop_t *ps, char *err)
{
    const dp_ps_config_t *cfg = ps->cfg;
    if (cfg->run_id[0]) snprintf(ps->run.id, sizeof ps->run.id, "%s", cfg->run_id);
    else dp_ps_config_run_id(cfg, ps->run.id, sizeof ps->run.id);
    ps->run.resume = cfg->resume;
    ps->run.deal = ps->dealing ? &ps->deal : NULL; /* shard 0's batches go with its weights */
    ps->run.rows = ps->rows.table ? &ps->rows : NULL; /* and a row table's rows */
    if (!cfg->checkpoint_dir[0]) return 0;
    char mk[DP_ERR_LEN];
    if (dp_mkdirs(cfg->checkpoint_dir, 0755, mk) != 0)
        return dp_err(err, "--checkpoint-dir %s: %s", cfg->checkpoint_dir, mk);
    dp_shard_checkpoint_path(ps->ckpt_path, sizeof ps->ckpt_path, cfg->checkpoint_dir,
                             cfg->shard_index, cfg->shard_count);
    /* What a kill between a checkpoint's write and its rename left. */
    int stale = dp_atomic_remove_stale(ps->ckpt_path, err);
    if (stale < 0) return -1;
    if (stale > 0)
        dp_log_info("shard %d: removed %d temporary file%s an interrupted checkpoint left in %s",
                    cfg->shard_index, stale, stale > 1 ? "s" : "", cfg->checkpoint_dir);
    dp_ckpt_restore_t r = dp_shard_checkpoint_restore(&ps->shard, ps->ckpt_path, &ps->run, err);
    if (r == DP_CKPT_BAD) return -1;
    if (r == DP_CKPT_NONE && cfg->resume)
        return dp_err(err, "--resume: %s has no checkpoint of shard %d/%d to continue",
                      cfg->checkpoint_dir, cfg->shard_index, cfg->shard_count);
    if (r == DP_CKPT_RESTORED) {
        ps->ckpt_version = ps->shard.version;
        dp_log_info("shard %d: restored version %" PRIu64 " of run %s from %s", cfg->shard_index,
                    ps->shard.version, ps->run.id, ps->ckpt_path);
        if (ps->dealing && dp_deal_planned(&ps->deal))
            dp_log_info("shard %d: restored the deal: %" PRIu64 " of %" PRIu64 " batches dealt, %zu "
                        "back in the pool (those in flight at the checkpoint among them)",
                        cfg->shard_index, ps->deal.next, ps->deal.total, ps->deal.n_pool);
        return 0;
    }
    /* A fresh start writes its version 0 at once: from then on the
     * directory holds a checkpoint of this run, so a restart that finds
     * none is a start no earlier start preceded (or a file an operator
     * removed), never a run silently begun again; and a directory that
     * cannot be written fails the start, not the run hours later. */
    char e2[DP_ERR_LEN];
    if (dp_ps_checkpoint(ps, 0, e2) != 0)
        return dp_err(err, "--checkpoint-dir %s: cannot write the first checkpoint (%s)",
                      cfg->checkpoint_dir, e2);
    return 0;
}

void dp_ps_metrics_line(dp_ps_loop_t *ps)
{
    cJSON *line = dp_metrics_line(ps->metrics);
    if (!line) return;
    const dp_shard_counts_t *c = &ps->shard.counts;
    double mean = c->applied ? (double)c->staleness_sum / (double)c->applied : 0.0;
    cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
    cJSON_AddNumberToObject(line, "version", (double)ps->shard.version);
    cJSON_AddNumberToObject(line, "applied", (double)c->applied);
    cJSON_AddNumberToObject(line, "dropped", (double)c->dropped);
    cJSON_AddNumberToObject(line, "rejected", (double)c->rejected);
    cJSON_AddNumberToObject(line, "requests_refused", (double)c->requests_refused);
    cJSON_AddNumberToObject(line, "staleness_mean", dp_metrics_round(mean, 4));
    cJSON_AddNumberToObject(line, "staleness_max", (double)c->staleness_max);
    cJSON_AddNumberToObject(line, "net_errors", (double)ps->net_errors);
    cJSON_AddNumberToObject(line, "repeats", (double)c->repeats);
    cJSON_AddNumberToObject(line, "steps_early", (double)c->steps_early);
    cJSON_AddNumberToObject(line, "early_dropped", (double)c->early_dropped);
    cJSON_AddNumberToObject(line, "auth_refused", (double)ps->auth.refused);
    cJSON_AddNumberToObject(line, "curve_refused", ps->zap ? (double)dp_zap_refused(ps->zap) : 0.0);
    cJSON_AddNumberToObject(line, "snapshots", dp_snap_alive());
    cJSON_AddNumberToObject(line, "held_pulls", ps->n_pending);
    cJSON_AddNumberToObject(line, "checkpoint_failures", (double)ps->ckpt_failures);
    cJSON_AddNumberToObject(line, "workers", ps->membership.live);
    if (ps->shard.dc) {
        cJSON_AddNumberToObject(line, "dc_compensated", (double)ps->shard.dc->compensated);
        cJSON_AddNumberToObject(line, "dc_fallback", (double)ps->shard.dc->fallback);
    }
    if (ps->rows.table) { /* a row table: what STATS says of it */
        dp_ps_rows_stats_t rs;
        dp_ps_rows_stats(&ps->rows, &rs);
        cJSON_AddNumberToObject(line, "rows", (double)rs.rows);
        cJSON_AddNumberToObject(line, "rows_evicted", (double)rs.evicted);
        cJSON_AddNumberToObject(line, "rows_bytes", (double)rs.bytes);
        cJSON_AddNumberToObject(line, "row_pushes", (double)rs.pushes);
        cJSON_AddNumberToObject(line, "row_pushes_rejected", (double)rs.rejected);
    }
    dp_metrics_write(ps->metrics, &line);
}

void dp_ps_metrics_members(dp_ps_loop_t *ps, int news)
{
    const dp_membership_t *h = &ps->membership;
    for (size_t k = h->n_ev - (size_t)news; k < h->n_ev; k++) {
        cJSON *line = dp_metrics_line(ps->metrics);
        if (!line) return;
        const dp_member_event_t *e = dp_membership_at(h, k);
        cJSON_AddStringToObject(line, "event", dp_member_joins(e->why) ? "join" : "leave");
        cJSON_AddNumberToObject(line, "task", e->task);
        cJSON_AddNumberToObject(line, "version", (double)e->version);
        cJSON_AddNumberToObject(line, "live", e->live);
        cJSON_AddStringToObject(line, "why", dp_member_why_name(e->why));
        cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
        dp_metrics_write(ps->metrics, &line);
    }
}

/* The first line of each start: a metrics file is appended to, so this
 * marks where a run (or a restart of it) begins. */
void dp_ps_metrics_start(dp_ps_loop_t *ps)
{
    cJSON *line = dp_metrics_line(ps->metrics);
    if (!line) return;
    cJSON_AddStringToObject(line, "event", "start");
    cJSON_AddNumberToObject(line, "shard", ps->cfg->shard_index);
    cJSON_AddStringToObject(line, "run_id", ps->run.id);
    cJSON_AddNumberToObject(line, "version", (double)ps->shard.version);
    dp_metrics_write(ps->metrics, &line);
}

void dp_ps_on_stats(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    const dp_shard_counts_t *c = &ps->shard.counts;
    Downpour__Envelope rep;
    dp_ps_env(ps, &rep, DOWNPOUR__MSG_TYPE__STATS, env->request_id, env->worker_id);
    Downpour__Stats s = DOWNPOUR__STATS__INIT;
    s.applied = c->applied;
    s.dropped = c->dropped;
    s.rejected = c->rejected;
    s.requests_refused = c->requests_refused;
    s.version = ps->shard.version;
    s.staleness_sum = c->staleness_sum;
    s.staleness_max = c->staleness_max;
    s.staleness_mean = c->applied ? (double)c->staleness_sum / (double)c->applied : 0.0;
    s.malformed = c->malformed;
    s.steps_early = c->steps_early;
    dp_members_counts(&ps->members, &s.workers_joined, &s.workers_finished, &s.workers_gone);
    s.num_workers = ps->members.n;
    s.workers_live = ps->membership.live;
    s.live_min = ps->membership.live_min > 0 ? ps->membership.live_min : 0;
    s.live_max = ps->membership.live_max > 0 ? ps->membership.live_max : 0;
    const dp_membership_t *h = &ps->membership;
    Downpour__MemberEvent *ev = dp_calloc(h->n_ev ? h->n_ev : 1, sizeof *ev);
    Downpour__MemberEvent **evp = dp_calloc(h->n_ev ? h->n_ev : 1, sizeof *evp);
    for (size_t k = 0; k < h->n_ev; k++) {
        const dp_member_event_t *e = dp_membership_at(h, k);
        downpour__member_event__init(&ev[k]);
        ev[k].join = dp_member_joins(e->why);
        ev[k].task = e->task;
        ev[k].version = e->version;
        ev[k].live = e->live;
        ev[k].why = (char *)dp_member_why_name(e->why);
        evp[k] = &ev[k];
    }
    s.n_membership = h->n_ev;
    s.membership = evp;
    uint64_t hist[DP_STATS_HIST_BINS];
    s.n_staleness_hist = dp_staleness_fold(&ps->policy->staleness, hist, DP_STATS_HIST_BINS);
    s.staleness_hist = hist;
    /* the dealt epochs, the last DP_PS_STATS_EPOCHS of them */
    size_t n_ep = ps->dealing ? dp_deal_epochs(&ps->deal, NULL, 0) : 0;
    size_t skip = n_ep > DP_PS_STATS_EPOCHS ? n_ep - DP_PS_STATS_EPOCHS : 0;
    dp_deal_epoch_t *de = dp_calloc(n_ep ? n_ep : 1, sizeof *de);
    Downpour__EpochSamples *es = dp_calloc(n_ep ? n_ep : 1, sizeof *es);
    Downpour__EpochSamples **esp = dp_calloc(n_ep ? n_ep : 1, sizeof *esp);
    dp_deal_epochs(&ps->deal, de, n_ep);
    for (size_t k = skip; k < n_ep; k++) {
        Downpour__EpochSamples *o = &es[k - skip];
        downpour__epoch_samples__init(o);
        o->epoch = de[k].epoch;
        o->trained = de[k].trained;
        o->repeated = de[k].repeated;
        o->retrained_after_death = de[k].retrained_after_death;
        o->batches = de[k].batches;
        esp[k - skip] = o;
    }
    s.n_epoch_samples = n_ep - skip;
    s.epoch_samples = esp;
    s.deal_foreign = ps->deal.foreign;
    s.env_steps = ps->episodes.env_steps;
    s.episodes = ps->episodes.episodes;
    s.return_mean_100 = dp_episodes_mean(&ps->episodes);
    s.solved = ps->episodes.solved_at >= 0;
    s.solved_at_env_steps = s.solved ? (uint64_t)ps->episodes.solved_at : 0;
    s.n_return_curve_at = s.n_return_curve_mean = (size_t)ps->episodes.n_curve;
    s.return_curve_at = ps->episodes.curve_at;
    s.return_curve_mean = ps->episodes.curve_mean;
    dp_ps_rows_stats_t rs;
    dp_ps_rows_stats(&ps->rows, &rs);
    s.rows = rs.rows;
    s.rows_created = rs.created;
    s.rows_evicted = rs.evicted;
    s.row_pushes = rs.pushes;
    s.row_pushes_rejected = rs.rejected;
    s.row_staleness_sum = rs.staleness_sum;
    s.row_staleness_max = rs.staleness_max;
    s.rows_bytes = rs.bytes;
    rep.stats = &s;
    dp_ps_send(ps, id, &rep, NULL, 0);
    free(esp);
    free(es);
    free(de);
    free(evp);
    free(ev);
}

void dp_ps_on_shutdown(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    char err[DP_ERR_LEN];
    dp_log_info("shard %d: SHUTDOWN from worker %d", ps->cfg->shard_index, env->worker_id);
    /* The final checkpoint is on disk before the requester hears back. */
    dp_ps_checkpoint(ps, 1, err); /* a failure is logged and counted there */
    dp_ps_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__SHUTDOWN);
    ps->quit = 1;
}

void dp_ps_on_heartbeat(dp_ps_loop_t *ps, zmq_msg_t *id, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int n_frames)
{
    (void)frames, (void)n_frames;
    dp_ps_reply_bare(ps, id, env, DOWNPOUR__MSG_TYPE__HEARTBEAT);
}
