/* summary: summary.json, the one writer of every kind's (train.h). */
#include <inttypes.h>
#include <stdio.h>

#include "common/util.h"
#include "worker/train/a3c_train.h"
#include "worker/train/train.h"

void dp_summary_outer_json(cJSON *o, const dp_optim_conf_t *outer)
{
    cJSON_AddStringToObject(o, "outer_optimizer", dp_optim_outer_name(outer));
    cJSON_AddNumberToObject(o, "outer_lr", dp_metrics_round(dp_optim_base_lr(outer), 6));
    if (outer->kind == DP_OPT_NESTEROV)
        cJSON_AddNumberToObject(o, "outer_momentum", dp_metrics_round(outer->momentum, 6));
    if (outer->period > 1) /* delayed Nesterov: pushes per move of the momentum */
        cJSON_AddNumberToObject(o, "outer_momentum_every", (double)outer->period);
}

/* "membership" (the joins and leaves, as the servers' metrics lines give
 * them), "live_min", "live_max": names other tools read. */
void dp_summary_membership_json(cJSON *o, const dp_ps_membership_t *m)
{
    cJSON *list = cJSON_AddArrayToObject(o, "membership");
    for (size_t k = 0; k < m->n; k++) {
        const dp_ps_member_event_t *e = &m->ev[k];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "event", e->join ? "join" : "leave");
        cJSON_AddNumberToObject(j, "task", e->task);
        cJSON_AddNumberToObject(j, "version", (double)e->version);
        cJSON_AddNumberToObject(j, "live", e->live);
        cJSON_AddStringToObject(j, "why", e->why);
        cJSON_AddItemToArray(list, j);
    }
    cJSON_AddNumberToObject(o, "live_min", m->live_min);
    cJSON_AddNumberToObject(o, "live_max", m->live_max);
    if (m->n_epochs == 0) return; /* a fixed crew: each worker's own order */
    dp_summary_epoch_samples_json(o, m);
    cJSON_AddNumberToObject(o, "pushes_of_no_dealt_batch", (double)m->deal_foreign);
}

/* A model with an embedding's rows: "rows" (one number per table), their
 * digest (equal runs, equal tables) and optimizer. */
static void s_summary_sparse(cJSON *o, const dp_sparse_summary_t *sp)
{
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int k = 0; k < sp->tables; k++)
        cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)sp->rows[k]));
    if (!sp->row_optim) return; /* a cluster's: the servers' (downpour local adds them) */
    char digest[20];
    snprintf(digest, sizeof digest, "%016" PRIx64, sp->rows_digest);
    cJSON_AddStringToObject(o, "rows_digest", digest);
    cJSON_AddStringToObject(o, "row_optimizer", dp_row_optim_kind_name(sp->row_optim->kind));
    cJSON_AddNumberToObject(o, "row_lr", dp_metrics_round(sp->row_optim->lr, 6));
    cJSON_AddNumberToObject(o, "row_init", dp_metrics_round(sp->row_init, 6));
}

void dp_summary_epoch_samples_json(cJSON *o, const dp_ps_membership_t *m)
{
    cJSON *ep = cJSON_AddArrayToObject(o, "epoch_samples");
    for (size_t k = 0; k < m->n_epochs; k++) {
        const dp_ps_epoch_samples_t *e = &m->epochs[k];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "epoch", (double)e->epoch);
        cJSON_AddNumberToObject(j, "trained", (double)e->trained);
        cJSON_AddNumberToObject(j, "repeated", (double)e->repeated);
        cJSON_AddNumberToObject(j, "retrained_after_death", (double)e->retrained_after_death);
        cJSON_AddNumberToObject(j, "batches", (double)e->batches);
        cJSON_AddItemToArray(ep, j);
    }
}

double dp_crew_samples(const dp_ps_membership_t *m, double own_samples, int workers)
{
    if (!m || m->n_epochs == 0) return own_samples * workers;
    double n = 0;
    for (size_t k = 0; k < m->n_epochs; k++) n += (double)m->epochs[k].trained;
    return n;
}

/* An actor-critic's result, in the order the RL tools' summaries have it. */
static void s_summary_rl(cJSON *o, const dp_run_summary_t *r)
{
    const dp_rl_summary_t *rl = r->rl;
    cJSON_AddStringToObject(o, "env", rl->kind->name);
    cJSON_AddNumberToObject(o, "env_steps", (double)rl->env_steps);
    cJSON_AddNumberToObject(o, "episodes", (double)rl->episodes);
    cJSON_AddNumberToObject(o, "return_mean_100", dp_metrics_round(rl->return_mean_100, 4));
    if (rl->solved_at >= 0) cJSON_AddNumberToObject(o, "solved_at_env_steps", (double)rl->solved_at);
    else cJSON_AddNullToObject(o, "solved_at_env_steps");
    cJSON_AddNumberToObject(o, "solved_threshold", rl->kind->solved);
    cJSON_AddNumberToObject(o, "test_return", dp_metrics_round(rl->test_return, 4));
    cJSON_AddItemToObject(o, "return_curve", dp_a3c_curve_json(rl->curve_at, rl->curve_mean, rl->n_curve,
                                                              rl->env_steps, rl->return_mean_100));
    cJSON_AddNumberToObject(o, "test_episodes", DP_A3C_TEST_EPISODES);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "env_steps_per_s",
                            dp_metrics_round(rl->env_steps / (r->train_s > 0 ? r->train_s : 1e-9), 1));
}

/* A dense or sparse model's result and its speed. */
static void s_summary_result(cJSON *o, const dp_train_conf_t *c, const dp_run_summary_t *r)
{
    int cluster = r->ps_shards > 0;
    if (cluster) cJSON_AddNumberToObject(o, "replicas_to_aggregate", r->replicas);
    if (cluster) cJSON_AddNumberToObject(o, "local_steps", (double)c->local_steps);
    if (cluster && c->local_steps > 1 && c->local_auto) cJSON_AddBoolToObject(o, "local_steps_auto", 1);
    if (r->staleness >= 0) cJSON_AddNumberToObject(o, "staleness", r->staleness);
    cJSON_AddNumberToObject(o, "epochs", r->epochs);
    cJSON_AddNumberToObject(o, "steps", r->steps);
    cJSON_AddNumberToObject(o, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    if (r->sparse) cJSON_AddNumberToObject(o, "test_auc", r->sparse->test_auc);
    if (!cluster) cJSON_AddNumberToObject(o, "train_loss", r->train_loss);
    /* What the crew trained over the time it took, not the chief's rate
     * times the workers: an elastic crew's are not MAX all along. */
    double ips = r->crew_s > 0 && r->crew_samples > 0 ? r->crew_samples / r->crew_s
                                                      : r->images_per_s_per_worker * r->workers;
    cJSON_AddNumberToObject(o, "images_per_s", ips);
    if (cluster) cJSON_AddNumberToObject(o, "images_per_s_per_worker", r->images_per_s_per_worker);
}

/* The servers' counters (standalone: its own steps). */
static void s_summary_counters(cJSON *o, const dp_run_summary_t *r)
{
    int cluster = r->ps_shards > 0;
    if (cluster) cJSON_AddNumberToObject(o, "version", (double)r->version);
    cJSON_AddNumberToObject(o, "updates_applied", (double)r->applied);
    cJSON_AddNumberToObject(o, "updates_dropped", (double)r->dropped);
    if (cluster && !r->rl) cJSON_AddNumberToObject(o, "updates_lost", (double)r->updates_lost);
    cJSON_AddNumberToObject(o, "updates_rejected", (double)r->rejected);
    if (cluster) cJSON_AddNumberToObject(o, "requests_refused", (double)r->requests_refused);
    cJSON_AddNumberToObject(o, "staleness_mean", r->staleness_mean);
    cJSON_AddNumberToObject(o, "staleness_max", (double)r->staleness_max);
    if (r->staleness_hist) {
        cJSON_AddItemToObject(o, "staleness_histogram", dp_staleness_json(r->staleness_hist));
        if (!r->rl)
            cJSON_AddNumberToObject(o, "staleness_geometric_p",
                                    dp_metrics_round(dp_staleness_geometric_p(r->staleness_hist), 6));
    }
    if (r->membership) dp_summary_membership_json(o, r->membership);
}

/* The rules it ran under: the optimizers, the delay rules, compression,
 * an actor-critic's flags. */
static void s_summary_rules(cJSON *o, const dp_train_conf_t *c, const dp_run_summary_t *r)
{
    if (r->optim) {
        cJSON_AddStringToObject(o, "optimizer", dp_optim_kind_name(r->optim->kind));
        cJSON_AddNumberToObject(o, "lr", dp_metrics_round(dp_optim_base_lr(r->optim), 7));
    }
    if (r->outer) dp_summary_outer_json(o, r->outer);
    if (r->delay_lr) cJSON_AddStringToObject(o, "delay_lr", r->delay_lr);
    if (r->delay_compensation) cJSON_AddStringToObject(o, "delay_compensation", r->delay_compensation);
    if (r->ps_shards > 0 && !r->rl) {
        /* the workers' --compress; bytes_pushed: the chief's pushes, each
         * counted once (a repeat after a lost reply is not), the gradient's
         * bytes only (dp_compress_bytes: not the envelope or the framing);
         * bytes_pulled: the tensor bytes the chief's pulls received */
        char name[48];
        dp_compress_name(&c->compress, name, sizeof name);
        cJSON_AddStringToObject(o, "compress", name);
        cJSON_AddStringToObject(o, "error_feedback", c->compress.error_feedback ? "on" : "off");
        cJSON_AddNumberToObject(o, "bytes_pushed", (double)r->bytes_pushed);
        cJSON_AddNumberToObject(o, "bytes_pulled", (double)r->bytes_pulled);
    }
    if (r->rl) {
        cJSON_AddNumberToObject(o, "envs", c->a3c.envs);
        cJSON_AddNumberToObject(o, "t_max", c->a3c.t_max);
        cJSON_AddNumberToObject(o, "entropy", dp_metrics_round(c->a3c.entropy, 6));
        cJSON_AddNumberToObject(o, "gamma", dp_metrics_round(c->a3c.gamma, 6));
        cJSON_AddNumberToObject(o, "reward_scale", dp_metrics_round(c->a3c.reward_scale, 6));
        cJSON_AddNumberToObject(o, "clip_norm", dp_metrics_round(c->a3c.clip_norm, 6));
    }
}

int dp_train_summary_write(const dp_train_conf_t *c, const dp_run_summary_t *r, char *err)
{
    if (!c->summary) return 0;
    /* In the order a reader scans it: the run's shape, its result, its
     * speed, the servers' counters, then what it ran on. */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", r->mode);
    cJSON_AddNumberToObject(o, "workers", r->workers);
    if (r->min_workers > 0 && !r->rl) cJSON_AddNumberToObject(o, "min_workers", r->min_workers);
    cJSON_AddNumberToObject(o, "ps_shards", r->ps_shards);
    if (r->rl) s_summary_rl(o, r);
    else s_summary_result(o, c, r);
    cJSON_AddNumberToObject(o, "train_s", r->train_s);
    if (r->crew_s > 0 && !r->rl) cJSON_AddNumberToObject(o, "crew_train_s", r->crew_s);
    cJSON_AddNumberToObject(o, "wall_s", dp_now() - r->t_start);
    s_summary_counters(o, r);
    if (r->sparse) s_summary_sparse(o, r->sparse);
    s_summary_rules(o, c, r);
    cJSON_AddStringToObject(o, "device", c->device);
    cJSON_AddStringToObject(o, "precision", dp_precision_name(c->precision));
    if (!r->rl) cJSON_AddStringToObject(o, "data", r->data);
    if (!r->rl && c->train_samples > 0) cJSON_AddNumberToObject(o, "train_samples", r->train_n);
    cJSON_AddStringToObject(o, "model", r->model);
    if (!r->rl) cJSON_AddNumberToObject(o, "batch", c->batch);
    /* The seed is a uint64: written as its exact integer text (a double
     * would round seeds above 2^53; JSON numbers have no such limit). */
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, c->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    int rc = dp_summary_write(c->summary, o, err);
    cJSON_Delete(o);
    return rc;
}

int dp_session_summary(dp_session_t *s, const dp_run_summary_t *r, char *err)
{
    dp_run_summary_t with = *r;
    with.data = s->train.name;
    with.model = s->model.spec;
    with.train_n = s->train.n;
    with.t_start = s->t_start;
    return dp_train_summary_write(&s->conf, &with, err);
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
