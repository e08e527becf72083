/* train: the session shared by both modes, and the standalone trainer. */
#include "worker/train/train.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "worker/exec/data.h"
#include "worker/client/ps_client.h"

void dp_train_conf_default(dp_train_conf_t *c)
{
    memset(c, 0, sizeof *c);
    c->device = "cpu";
    c->data = "fashion-mnist";
    c->model = DP_MODEL_DEFAULT_SPEC;
    c->batch = 64;
    c->epochs = 1;
    dp_optim_conf_default(&c->optim);
    c->local_steps = 1;
    c->compress.error_feedback = 1;
    c->seed = 1;
    c->progress = DP_PROGRESS_AUTO;
    c->task_index = 0;
    c->timeout_s = 60;
    c->overlap = -1;
    c->stream_push = -1;
    c->stream_pull = -1;
    dp_a3c_conf_default(&c->a3c);
    c->row_optim = DP_ROW_ADAGRAD;
    c->row_init = -1; /* the default: worker/train/embed_train.h */
}

/* --normalize on both splits: the training set's figures or the given ones. */
static int s_normalize(dp_session_t *s, const char *how, char *err)
{
    float mean[DP_DATASET_MAX_C], std[DP_DATASET_MAX_C];
    if (s->train.c > DP_DATASET_MAX_C)
        return dp_err(err, "--normalize: %s has %d channels, at most %d are normalised", s->train.name,
                      s->train.c, DP_DATASET_MAX_C);
    if (strcmp(how, "train") == 0) dp_dataset_channel_stats(&s->train, mean, std);
    else if (dp_dataset_parse_normalize(how, s->train.c, mean, std, err) != 0) return -1;
    if (dp_dataset_set_normalize(&s->train, mean, std, err) != 0) return -1;
    return dp_dataset_set_normalize(&s->test, mean, std, err);
}

int dp_session_init(dp_session_t *s, const dp_train_conf_t *c, char *err)
{
    memset(s, 0, sizeof *s);
    s->conf = *c;
    s->t_start = dp_now();
    if (c->batch < 1) return dp_err(err, "--batch must be at least 1 (got %d)", c->batch);
    if (c->threads > 0) dp_cpu_set_threads(c->threads);
    if (dp_dataset_init(&s->train, c->data, DP_SPLIT_TRAIN, err) != 0) goto fail;
    dp_dataset_limit(&s->train, c->train_samples); /* before --normalize train's statistics */
    if (dp_dataset_init(&s->test, c->data, DP_SPLIT_TEST, err) != 0) goto fail;
    if (c->normalize && s_normalize(s, c->normalize, err) != 0) goto fail;
    if (dp_model_parse(&s->model, c->model, s->train.c, s->train.h, s->train.w, err) != 0) goto fail;
    if (s->model.embed_dim > 0) {
        dp_err(err, "model spec '%s' starts with an embedding: it trains on sparse data (--data "
               "libsvm:TRAIN[:TEST]), not on %s", s->model.spec, s->train.name);
        goto fail;
    }
    if (s->model.classes != s->train.classes) {
        dp_err(err, "model spec ends with fc:%d but %s has %d classes", s->model.classes,
               s->train.name, s->train.classes);
        goto fail;
    }
    if (dp_backend_new(&s->be, c->device, err) != 0) goto fail;
    if (dp_net_init(&s->net, &s->model, s->be, c->batch, err) != 0) goto fail;
    /* dropout's mask: by seed, step and the sample's place in the global
     * batch (worker r's slice starts at r * batch), so that sync with R
     * workers draws the masks of standalone at R * batch */
    s->net.seed = c->seed;
    s->net.sample0 = (unsigned long long)c->task_index * (unsigned long long)c->batch;
    if (c->bn_ghost_batch > 0) {
        if (c->ps || c->batch % c->bn_ghost_batch != 0) {
            dp_err(err, "--bn-ghost-batch %d: standalone only, and --batch (%d) a multiple of it",
                   c->bn_ghost_batch, c->batch);
            goto fail;
        }
        s->net.ghost = c->bn_ghost_batch;
    }
    size_t bytes = s->model.n_floats * sizeof(float);
    s->h_params = s->be->ops->host_alloc(s->be, bytes);
    s->h_grads = s->be->ops->host_alloc(s->be, bytes);
    s->eval_x = s->be->ops->host_alloc(s->be, (size_t)c->batch * dp_dataset_sample_size(&s->test) * sizeof(float));
    s->eval_y = s->be->ops->host_alloc(s->be, (size_t)c->batch * sizeof(int));
    if (dp_session_init_outputs(s, err) != 0) goto fail;
    return 0;
fail:
    dp_session_fini(s);
    return -1;
}

int dp_session_init_outputs(dp_session_t *s, char *err)
{
    const dp_train_conf_t *c = &s->conf;
    if (dp_metrics_new(&s->metrics, c->metrics, err) != 0) return -1;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "worker-%d", c->task_index);
    if (dp_tb_new(&s->tb, c->tensorboard, suffix, err) != 0) return -1;
    dp_progress_init(&s->progress, c->progress);
    return 0;
}

void dp_session_fini(dp_session_t *s)
{
    dp_metrics_destroy(&s->metrics);
    dp_tb_destroy(&s->tb);
    if (s->be) {
        dp_net_fini(&s->net);
        s->be->ops->host_release(s->be, s->h_params);
        s->be->ops->host_release(s->be, s->h_grads);
        s->be->ops->host_release(s->be, s->eval_x);
        s->be->ops->host_release(s->be, s->eval_y);
        dp_backend_destroy(&s->be);
    }
    dp_dataset_fini(&s->train);
    dp_dataset_fini(&s->test);
}

void dp_session_evaluate(dp_session_t *s, int limit, double *accuracy, double *loss)
{
    dp_net_evaluate_dataset(&s->net, &s->test, limit, s->eval_x, s->eval_y, accuracy, loss);
}

long dp_session_total_steps(const dp_session_t *s, int world)
{
    if (s->conf.steps > 0) return s->conf.steps;
    return s->conf.epochs * dp_data_steps_per_epoch(s->train.n, s->conf.batch, world);
}

int dp_session_save(dp_session_t *s, long step, long version, char *err)
{
    if (!s->conf.save) return 0;
    dp_net_get_params(&s->net, s->h_params);
    /* the normalisation the weights were trained under: downpour eval
     * applies it to the test set */
    char norm[DP_DATASET_NORM_LEN];
    dp_dataset_normalize_text(&s->test, norm, sizeof norm);
    const char *kv[] = {"normalize", norm, NULL};
    return dp_checkpoint_save(s->conf.save, &s->model, s->h_params, step, version, norm[0] ? kv : NULL,
                              err);
}

void dp_summary_outer_json(cJSON *o, const dp_optim_conf_t *outer)
{
    cJSON_AddStringToObject(o, "outer_optimizer", dp_optim_kind_name(outer->kind));
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

int dp_session_summary(dp_session_t *s, const dp_run_summary_t *r, char *err)
{
    if (!s->conf.summary) return 0;
    /* In the order a reader scans it: the run's shape, its result, its
     * speed, the servers' counters, then what it ran on. */
    int cluster = r->ps_shards > 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mode", r->mode);
    cJSON_AddNumberToObject(o, "workers", r->workers);
    if (r->min_workers > 0) cJSON_AddNumberToObject(o, "min_workers", r->min_workers);
    cJSON_AddNumberToObject(o, "ps_shards", r->ps_shards);
    if (cluster) cJSON_AddNumberToObject(o, "replicas_to_aggregate", r->replicas);
    if (cluster) cJSON_AddNumberToObject(o, "local_steps", (double)s->conf.local_steps);
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
    cJSON_AddNumberToObject(o, "train_s", r->train_s);
    if (r->crew_s > 0) cJSON_AddNumberToObject(o, "crew_train_s", r->crew_s);
    cJSON_AddNumberToObject(o, "wall_s", dp_now() - s->t_start);
    if (cluster) cJSON_AddNumberToObject(o, "version", (double)r->version);
    cJSON_AddNumberToObject(o, "updates_applied", (double)r->applied);
    cJSON_AddNumberToObject(o, "updates_dropped", (double)r->dropped);
    if (cluster) cJSON_AddNumberToObject(o, "updates_lost", (double)r->updates_lost);
    cJSON_AddNumberToObject(o, "updates_rejected", (double)r->rejected);
    if (cluster) cJSON_AddNumberToObject(o, "requests_refused", (double)r->requests_refused);
    cJSON_AddNumberToObject(o, "staleness_mean", r->staleness_mean);
    cJSON_AddNumberToObject(o, "staleness_max", (double)r->staleness_max);
    if (r->staleness_hist) {
        cJSON_AddItemToObject(o, "staleness_histogram", dp_staleness_json(r->staleness_hist));
        cJSON_AddNumberToObject(o, "staleness_geometric_p",
                                dp_metrics_round(dp_staleness_geometric_p(r->staleness_hist), 6));
    }
    if (r->membership) dp_summary_membership_json(o, r->membership);
    if (r->sparse) s_summary_sparse(o, r->sparse);
    if (r->optim) {
        cJSON_AddStringToObject(o, "optimizer", dp_optim_kind_name(r->optim->kind));
        cJSON_AddNumberToObject(o, "lr", dp_optim_base_lr(r->optim));
    }
    if (r->outer) dp_summary_outer_json(o, r->outer);
    if (r->delay_lr) cJSON_AddStringToObject(o, "delay_lr", r->delay_lr);
    if (r->delay_compensation) cJSON_AddStringToObject(o, "delay_compensation", r->delay_compensation);
    if (cluster) {
        /* the workers' --compress; bytes_pushed: the chief's pushes, each
         * counted once (a repeat after a lost reply is not), the gradient's
         * bytes only (dp_compress_bytes: not the envelope or the framing);
         * bytes_pulled: the tensor bytes the chief's pulls received */
        char name[48];
        dp_compress_name(&s->conf.compress, name, sizeof name);
        cJSON_AddStringToObject(o, "compress", name);
        cJSON_AddStringToObject(o, "error_feedback", s->conf.compress.error_feedback ? "on" : "off");
        cJSON_AddNumberToObject(o, "bytes_pushed", (double)r->bytes_pushed);
        cJSON_AddNumberToObject(o, "bytes_pulled", (double)r->bytes_pulled);
    }
    cJSON_AddStringToObject(o, "device", s->conf.device);
    cJSON_AddStringToObject(o, "data", s->train.name);
    if (s->conf.train_samples > 0) cJSON_AddNumberToObject(o, "train_samples", s->train.n);
    cJSON_AddStringToObject(o, "model", s->model.spec);
    cJSON_AddNumberToObject(o, "batch", s->conf.batch);
    /* The seed is a uint64: written as its exact integer text (a double
     * would round seeds above 2^53; JSON numbers have no such limit). */
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, s->conf.seed);
    cJSON_AddRawToObject(o, "seed", seed);
    int rc = dp_summary_write(s->conf.summary, o, err);
    cJSON_Delete(o);
    return rc;
}

void dp_session_log_start(dp_session_t *s, int worker, long total_steps, long steps_per_epoch)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (!line) return;
    cJSON_AddStringToObject(line, "event", "start");
    cJSON_AddNumberToObject(line, "worker", worker);
    if (total_steps > 0) cJSON_AddNumberToObject(line, "total_steps", total_steps);
    else cJSON_AddNumberToObject(line, "epochs", -total_steps); /* dealt: no steps of its own */
    cJSON_AddNumberToObject(line, "steps_per_epoch", steps_per_epoch);
    cJSON_AddNumberToObject(line, "batch", s->conf.batch);
    dp_metrics_write(s->metrics, &line);
}

void dp_session_log_step(dp_session_t *s, long step, float loss)
{
    if (step % 10 == 0) dp_tb_scalar(s->tb, "train/loss", step, loss);
}

void dp_session_log_eval(dp_session_t *s, long step, double accuracy, double loss)
{
    dp_session_log_eval_auc(s, step, accuracy, loss, NAN);
}

void dp_session_log_eval_auc(dp_session_t *s, long step, double accuracy, double loss, double auc)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (line) {
        cJSON_AddStringToObject(line, "event", "eval");
        cJSON_AddNumberToObject(line, "step", step);
        cJSON_AddNumberToObject(line, "test_accuracy", dp_metrics_round(accuracy, 5));
        cJSON_AddNumberToObject(line, "test_loss", dp_metrics_round(loss, 5));
        if (!isnan(auc)) cJSON_AddNumberToObject(line, "test_auc", dp_metrics_round(auc, 6));
        dp_metrics_write(s->metrics, &line);
    }
    dp_tb_scalar(s->tb, "test/accuracy", step, (float)accuracy);
    dp_tb_scalar(s->tb, "test/loss", step, (float)loss);
    if (!isnan(auc)) dp_tb_scalar(s->tb, "test/auc", step, (float)auc);
}

/* The standalone trainer's line per step. */
static void s_metrics_step(dp_session_t *s, long step, long spe, float loss, float lr)
{
    cJSON *line = dp_metrics_line(s->metrics);
    if (!line) return;
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "epoch", step / spe);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
    cJSON_AddNumberToObject(line, "lr", dp_metrics_round(lr, 6));
    dp_metrics_write(s->metrics, &line);
}

/* Evaluate and record the result. */
static void s_eval_and_log(dp_session_t *s, long step, int limit, double *acc, double *loss)
{
    dp_session_evaluate(s, limit, acc, loss);
    dp_session_log_eval(s, step, *acc, *loss);
}

/* The standalone training loop: steps until the batcher ends, the loss
 * diverges (-1 with err) or *stop is set; returns the steps done. */
static long s_standalone_loop(dp_session_t *s, dp_batcher_t *bt, const dp_optim_conf_t *opt,
                              float *d_state, long total, volatile sig_atomic_t *stop,
                              double *loss_avg, char *err)
{
    const dp_train_conf_t *c = &s->conf;
    long spe = dp_data_steps_per_epoch(s->train.n, c->batch, 1);
    double t0 = dp_now(), acc = 0, test_loss = 0;
    dp_batch_t batch;
    long step, done = 0;
    while (!(stop && *stop) && (step = dp_batcher_next(bt, &batch)) >= 0) {
        s->net.step = (unsigned long long)step; /* dropout's mask */
        float loss = dp_net_train_step_device(&s->net, batch.d_x, batch.d_y, c->batch, NULL);
        if (!isfinite(loss))
            return dp_err(err, "loss is %f at step %ld: training diverged (lower --lr)", loss, step);
        float lr = dp_optim_lr_at(opt, step);
        dp_net_optim_step(&s->net, opt, lr, d_state, step + 1);
        done = step + 1;
        *loss_avg = done == 1 ? loss : 0.98 * *loss_avg + 0.02 * loss;
        s_metrics_step(s, step, spe, loss, lr);
        dp_session_log_step(s, step, loss);
        double dt = dp_now() - t0;
        dp_progress_update(&s->progress, done == total, "epoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f",
                           step / spe + 1, (total + spe - 1) / spe, done, total,
                           done * c->batch / (dt > 0 ? dt : 1e-9), *loss_avg);
        if (c->eval_every > 0 && done % c->eval_every == 0 && done < total)
            s_eval_and_log(s, done, c->eval_limit, &acc, &test_loss);
    }
    return done;
}

/* Stopped by a signal: the model at the step reached goes to --save (if
 * given); no evaluation, no summary (the run did not finish). */
static int s_standalone_stopped(dp_session_t *s, long done, int sig, char *err)
{
    if (dp_session_save(s, done, done, err) != 0) return -1;
    dp_log_info("standalone: stopped by signal %d at step %ld; %s%s", sig, done,
                s->conf.save ? "model saved to " : "nothing saved (no --save)",
                s->conf.save ? s->conf.save : "");
    return 0;
}

int dp_train_standalone(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    dp_session_t s;
    if (dp_session_init(&s, c, err) != 0) return -1;
    dp_optim_conf_t optim = c->optim;
    const dp_optim_conf_t *opt = &optim;
    dp_model_init_params(&s.model, s.h_params, c->seed);
    dp_net_set_params(&s.net, s.h_params);
    /* The optimizer steps where the parameters live (be->optim_step: the
     * parameter server's dp_optim_step, or its CUDA twin), its state too. */
    size_t n_state = s.model.n_floats * (size_t)dp_optim_state_per_param(opt->kind);
    float *d_state = n_state ? s.be->ops->alloc(s.be, n_state * sizeof(float)) : NULL;

    long total = dp_session_total_steps(&s, 1);
    long spe = dp_data_steps_per_epoch(s.train.n, c->batch, 1);
    if (!c->schedule_given) {
        /* Anneal over the run, as `downpour local` does for the servers. */
        optim.schedule = DP_LR_COSINE;
        optim.total_steps = total;
    }
    dp_batcher_t bt;
    if (dp_batcher_init_at(&bt, &s.train, s.be, c->batch, 0, 1, c->seed, 0, total, c->augment, err) != 0) {
        if (d_state) s.be->ops->release(s.be, d_state);
        dp_session_fini(&s);
        return -1;
    }
    dp_log_info("standalone: %s on %s, %d train / %d test samples, batch %d, %ld steps (%ld per epoch)",
                s.model.spec, c->device, s.train.n, s.test.n, c->batch, total, spe);
    dp_session_log_start(&s, 0, total, spe);
    double t0 = dp_now(), loss_avg = 0, acc = 0, test_loss = 0;
    long done = s_standalone_loop(&s, &bt, opt, d_state, total, stop, &loss_avg, err);
    double train_s = dp_now() - t0;
    dp_progress_done(&s.progress);
    dp_batcher_fini(&bt);
    if (d_state) s.be->ops->release(s.be, d_state);
    int rc = done < 0 ? -1 : 0;
    if (rc == 0 && stop && *stop) {
        rc = s_standalone_stopped(&s, done, (int)*stop, err);
        dp_session_fini(&s);
        return rc;
    }
    if (rc == 0) {
        s_eval_and_log(&s, done, 0, &acc, &test_loss);
        double ips = done * c->batch / (train_s > 0 ? train_s : 1e-9);
        dp_log_info("standalone: %ld steps in %.1f s (%.0f images/s); test accuracy %.4f, loss %.4f",
                    done, train_s, ips, acc, test_loss);
        rc = dp_session_save(&s, done, done, err);
        dp_run_summary_t r = {
            .mode = "standalone", .workers = 1, .ps_shards = 0, .staleness = -1,
            .steps = done, .epochs = (double)done / spe,
            .test_accuracy = acc, .test_loss = test_loss, .train_loss = loss_avg,
            .images_per_s_per_worker = ips, .train_s = train_s,
            .applied = (uint64_t)done, .optim = opt,
        };
        if (rc == 0) rc = dp_session_summary(&s, &r, err);
    }
    dp_session_fini(&s);
    return rc;
}
