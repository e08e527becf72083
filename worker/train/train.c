/* train: the session shared by both modes, and the dense kind's table
 * (worker/train/driver.h) with its standalone part. */
#include "worker/train/train.h"
#include "worker/train/driver.h"

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
    if (dp_backend_new_in(&s->be, c->device, c->precision, err) != 0) goto fail;
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

void dp_session_log_eval(dp_session_t *s, long step, double accuracy, double loss)
{
    dp_session_log_eval_auc(s, step, accuracy, loss, NAN);
}

void dp_session_log_eval_auc(dp_session_t *s, long step, double accuracy, double loss, double auc)
{
    dp_outputs_log_eval(s->metrics, s->tb, step, accuracy, loss, auc);
}

void dp_outputs_log_eval(dp_metrics_t *m, dp_tb_t *tb, long step, double accuracy, double loss,
                         double auc)
{
    cJSON *line = dp_metrics_line(m);
    if (line) {
        cJSON_AddStringToObject(line, "event", "eval");
        cJSON_AddNumberToObject(line, "step", step);
        cJSON_AddNumberToObject(line, "test_accuracy", dp_metrics_round(accuracy, 5));
        cJSON_AddNumberToObject(line, "test_loss", dp_metrics_round(loss, 5));
        if (!isnan(auc)) cJSON_AddNumberToObject(line, "test_auc", dp_metrics_round(auc, 6));
        dp_metrics_write(m, &line);
    }
    dp_tb_scalar(tb, "test/accuracy", step, (float)accuracy);
    dp_tb_scalar(tb, "test/loss", step, (float)loss);
    if (!isnan(auc)) dp_tb_scalar(tb, "test/auc", step, (float)auc);
}

/* ---- the dense kind (worker/train/driver.h): standalone here, a
 * cluster's loop in distributed.c ----------------------------------------- */

static int s_dense_open(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    dp_dense_run_t *r = dp_calloc(1, sizeof *r);
    d->run = r;
    if (dp_session_init(&r->s, c, err) != 0) {
        free(r);
        d->run = NULL;
        return -1;
    }
    dp_session_t *s = &r->s;
    d->model = &s->model;
    d->metrics = s->metrics;
    d->tb = s->tb;
    d->progress = &s->progress;
    if (!d->standalone) {
        /* what shard 0 of an elastic crew deals from (a fixed crew's ignore
         * it); local steps take H batches a pull and keep the order of their own */
        if (c->local_steps <= 1)
            d->opts.deal = (dp_ps_deal_plan_t){.samples = (uint64_t)s->train.n, .batch = (uint32_t)c->batch,
                                               .epochs = c->steps > 0 ? 0 : (uint64_t)c->epochs,
                                               .steps = c->steps > 0 ? (uint64_t)c->steps : 0};
        return 0;
    }
    r->optim = c->optim;
    dp_model_init_params(&s->model, s->h_params, c->seed);
    dp_net_set_params(&s->net, s->h_params);
    /* The optimizer steps where the parameters live (be->optim_step: the
     * parameter server's dp_optim_step, or its CUDA twin), its state too. */
    size_t n_state = s->model.n_floats * (size_t)dp_optim_state_per_param(r->optim.kind);
    if (n_state) r->d_state = s->be->ops->alloc(s->be, n_state * sizeof(float));
    return 0;
}

static int s_dense_plan(dp_train_drv_t *d, char *err)
{
    if (!d->standalone) return dp_dense_cluster_plan(d, err);
    const dp_train_conf_t *c = d->c;
    dp_dense_run_t *r = d->run;
    dp_session_t *s = &r->s;
    d->total = dp_session_total_steps(s, 1);
    r->spe = dp_data_steps_per_epoch(s->train.n, c->batch, 1);
    if (!c->schedule_given) {
        /* Anneal over the run, as `downpour local` does for the servers. */
        r->optim.schedule = DP_LR_COSINE;
        r->optim.total_steps = d->total;
    }
    if (dp_batcher_init_at(&r->bt, &s->train, s->be, c->batch, 0, 1, c->seed, 0, d->total, c->augment,
                           err) != 0)
        return -1;
    dp_log_info("standalone: %s on %s in %s, %d train / %d test samples, batch %d, %ld steps (%ld per epoch)",
                s->model.spec, c->device, s->be->precision, s->train.n, s->test.n, c->batch, d->total, r->spe);
    dp_session_log_start(s, 0, d->total, r->spe);
    return 0;
}

/* Standalone: steps until the batcher ends, the loss diverges or a signal. */
static int s_dense_loop(dp_train_drv_t *d, char *err)
{
    if (!d->standalone) return dp_dense_cluster_loop(d, err);
    dp_dense_run_t *r = d->run;
    dp_session_t *s = &r->s;
    dp_batch_t batch;
    long step;
    while (!dp_train_stopped(d) && (step = dp_batcher_next(&r->bt, &batch)) >= 0) {
        s->net.step = (unsigned long long)step; /* dropout's mask */
        float loss = dp_net_train_step_device(&s->net, batch.d_x, batch.d_y, s->conf.batch, NULL);
        r->lr = dp_optim_lr_at(&r->optim, step);
        dp_net_optim_step(&s->net, &r->optim, r->lr, r->d_state, step + 1);
        dp_train_step_t st = {.step = step, .loss = loss, .samples = s->conf.batch,
                              .last = step + 1 == d->total};
        if (dp_train_done(d, &st, err) != 0) return -1;
    }
    return 0;
}

static void s_dense_metrics(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line)
{
    if (!d->standalone) {
        dp_dense_cluster_metrics(d, st, line);
        return;
    }
    dp_dense_run_t *r = d->run;
    cJSON_AddNumberToObject(line, "step", st->step);
    cJSON_AddNumberToObject(line, "epoch", st->step / r->spe);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(st->loss, 6));
    cJSON_AddNumberToObject(line, "lr", dp_metrics_round(r->lr, 6));
}

static void s_dense_progress(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n)
{
    if (!d->standalone) {
        dp_dense_cluster_progress(d, st, line, n);
        return;
    }
    dp_dense_run_t *r = d->run;
    long spe = r->spe, total = d->total;
    double dt = dp_now() - d->t0;
    snprintf(line, n, "epoch %ld/%ld  step %ld/%ld  %.0f img/s  loss %.4f", st->step / spe + 1,
             (total + spe - 1) / spe, d->done, total, d->done * r->s.conf.batch / (dt > 0 ? dt : 1e-9),
             d->loss_avg);
}

static int s_dense_evaluate(dp_train_drv_t *d, int limit, dp_train_eval_t *e, char *err)
{
    (void)err;
    dp_dense_run_t *r = d->run;
    dp_session_evaluate(&r->s, limit, &e->accuracy, &e->loss);
    e->auc = NAN;
    return 0;
}

static int s_dense_save(dp_train_drv_t *d, char *err)
{
    dp_dense_run_t *r = d->run;
    return dp_session_save(&r->s, d->done, d->done, err);
}

/* The end of a whole run: the test set, --save, the summary's fields. */
static int s_dense_finish(dp_train_drv_t *d, dp_run_summary_t *sum, char *err)
{
    dp_dense_run_t *r = d->run;
    dp_session_t *s = &r->s;
    sum->data = s->train.name;
    sum->model = s->model.spec;
    sum->train_n = s->train.n;
    if (!d->standalone) return dp_dense_cluster_finish(d, sum, err);
    dp_train_eval_t e;
    s_dense_evaluate(d, 0, &e, err);
    dp_train_log_eval(d, d->done, &e);
    dp_log_info("standalone: %ld steps in %.1f s (%.0f images/s); test accuracy %.4f, loss %.4f",
                d->done, sum->train_s, sum->images_per_s_per_worker, e.accuracy, e.loss);
    if (dp_session_save(s, d->done, d->done, err) != 0) return -1;
    sum->epochs = (double)d->done / r->spe;
    sum->test_accuracy = e.accuracy;
    sum->test_loss = e.loss;
    sum->optim = &r->optim;
    return 0;
}

static void s_dense_close(dp_train_drv_t *d)
{
    dp_dense_run_t *r = d->run;
    if (!r) return;
    dp_dense_cluster_close(d);
    dp_batcher_fini(&r->bt);
    if (r->d_state) r->s.be->ops->release(r->s.be, r->d_state);
    dp_session_fini(&r->s);
    free(r);
    d->run = NULL;
}

const dp_train_kind_ops_t dp_train_dense = {
    .name = "dense",
    .diverged = "lower --lr",
    .diverged_cluster = NULL, /* a worker's loss is reported as it is: the servers' --lr */
    .open = s_dense_open,
    .plan = s_dense_plan,
    .loop = s_dense_loop,
    .metrics = s_dense_metrics,
    .progress = s_dense_progress,
    .evaluate = s_dense_evaluate,
    .save = s_dense_save,
    .finish = s_dense_finish,
    .close = s_dense_close,
};
