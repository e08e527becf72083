/* embed_train: a model with an embedding trained on libsvm data (see
 * embed_train.h): the session's dense net behind the embedding stage, the
 * rows in a table of this process (standalone) or on the servers. */
#include "worker/train/embed_train.h"
#include "worker/train/driver.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auc.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/embed.h"
#include "kernels/ops.h"
#include "server/core/rows.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"
#include "worker/exec/sparse_data.h"

_Static_assert(DP_MODEL_MAX_EMBED == DP_ROWS_MAX_WIDTH && DP_MODEL_MAX_EMBED == DP_EMBED_MAX_DIM,
               "every embed:D has a table and a stage of its width");

/* A run: the dense half is a session without image data (its model, its
 * backend and net, its outputs); the sparse half is the rest. */
typedef struct {
    dp_session_t s;
    dp_sparse_data_t data;
    dp_embed_t stage;
    dp_rows_t *rows;               /* standalone: the table; NULL in a cluster */
    dp_ps_client_t *ps;            /* a cluster: the servers, which hold the table */
    dp_row_optim_conf_t row_optim; /* the table's optimizer, lr resolved */
    float row_init;                /* the table's initial bound, resolved */
    float *x, *dx;                 /* the net's input and its gradient: [B * D] */
    int *y;                        /* [B] */
    float *row_w, *row_g;          /* a batch's rows and their gradients: [batch nnz * D] */
    float *scores, *labels;        /* the test file's: probability of class 1, label */
    float *d_state;                /* the dense optimizer's state (on the backend) */
    dp_optim_conf_t optim;         /* standalone: the dense layers', annealed over the run */
    long spe;                      /* the training file's batches */
    long epochs;                   /* a cluster: the epochs shard 0 deals */
    long g;                        /* a cluster: the step's batch of the training file */
    size_t keys;                   /* its distinct keys */
    uint64_t rows_held;            /* the summary's rows (standalone's one table) */
    dp_sparse_summary_t sparse;    /* the summary's sub-object */
} s_run_t;

static void s_fini(s_run_t *r)
{
    if (r->d_state) r->s.be->ops->release(r->s.be, r->d_state);
    dp_session_fini(&r->s);
    dp_sparse_data_close(&r->data);
    dp_embed_fini(&r->stage);
    dp_rows_destroy(&r->rows);
    free(r->x), free(r->dx), free(r->y), free(r->row_w), free(r->row_g);
    free(r->scores), free(r->labels);
}

/* The flags an image run takes that mean nothing here, the model, the
 * device: one line each. */
static int s_check_conf(const dp_train_conf_t *c, const dp_model_t *m, char *err)
{
    if (c->train_samples > 0 || c->augment || c->normalize)
        return dp_err(err, "--train-samples, --augment and --normalize are for image data, not "
                      "--data libsvm: (cut the file with head -n N to train on fewer samples)");
    if (strncmp(c->device, "cuda", 4) == 0)
        return dp_err(err, "--device %s: a model with an embedding trains on the CPU only for now "
                      "(--device cpu)", c->device);
    if (m->embed_dim == 0)
        return dp_err(err, "--data libsvm: needs a model that starts with embed:D (e.g. --model "
                      "'embed:1 sigmoid', logistic regression); '%s' has none", m->spec);
    if (m->classes != 2)
        return dp_err(err, "model spec '%s' ends in %d classes but libsvm labels are 0 and 1: end "
                      "it in 2 (fc:1 sigmoid or fc:2 softmax, or embed:1 sigmoid)", m->spec,
                      m->classes);
    return 0;
}

/* The table: width D, the row optimizer of --row-optimizer and --row-lr
 * (default: the dense layers' lr), rows from --row-init. */
static int s_table(s_run_t *r, const dp_train_conf_t *c, int D, size_t max_keys, char *err)
{
    dp_row_optim_conf_default(&r->row_optim, c->row_optim);
    r->row_optim.lr = c->row_lr > 0 ? c->row_lr : dp_optim_base_lr(&c->optim);
    r->row_init = c->row_init >= 0 ? c->row_init : dp_rows_init_default(c->row_optim);
    dp_rows_conf_t rc;
    dp_rows_conf_default(&rc, D, c->row_optim);
    rc.optim = r->row_optim;
    rc.max_keys = (uint32_t)max_keys;
    if (r->row_init > 0) {
        rc.init = DP_ROWS_INIT_UNIFORM;
        rc.init_scale = r->row_init;
        rc.seed = c->seed;
    }
    char why[DP_ERR_LEN];
    if ((r->rows = dp_rows_new(&rc, why))) return 0;
    return dp_err(err, "--row-optimizer %s, --row-lr %g, --row-init %g: %s",
                  dp_row_optim_kind_name(c->row_optim), (double)r->row_optim.lr,
                  (double)r->row_init, why);
}

/* local_table: standalone's rows in this process (a cluster's are the
 * servers'). */
static int s_init(s_run_t *r, const dp_train_conf_t *c, int local_table, char *err)
{
    memset(r, 0, sizeof *r);
    dp_session_t *s = &r->s;
    s->conf = *c;
    s->t_start = dp_now();
    snprintf(s->train.name, sizeof s->train.name, "libsvm");
    if (c->threads > 0) dp_cpu_set_threads(c->threads);
    /* the input shape is the embedding's, whatever is given */
    if (dp_model_parse(&s->model, c->model, 1, 1, 1, err) != 0 ||
        s_check_conf(c, &s->model, err) != 0 ||
        dp_sparse_data_open(&r->data, c->data, c->batch, err) != 0)
        return -1;
    int D = s->model.embed_dim, B = c->batch;
    size_t nnz = dp_sparse_batch_nnz(B);
    if ((local_table && s_table(r, c, D, nnz, err) != 0) || dp_embed_init(&r->stage, D, nnz, err) != 0 ||
        dp_backend_new_in(&s->be, c->device, c->precision, err) != 0 || dp_net_init(&s->net, &s->model, s->be, B, err) != 0)
        return -1;
    s->net.seed = c->seed; /* dropout's mask */
    size_t bytes = s->model.n_floats * sizeof(float);
    s->h_params = s->be->ops->host_alloc(s->be, bytes);
    s->h_grads = s->be->ops->host_alloc(s->be, bytes);
    r->x = dp_malloc((size_t)B * D * sizeof(float));
    r->dx = dp_malloc((size_t)B * D * sizeof(float));
    r->y = dp_malloc((size_t)B * sizeof(int));
    r->row_w = dp_malloc(nnz * D * sizeof(float));
    r->row_g = dp_malloc(nnz * D * sizeof(float));
    r->scores = dp_malloc((r->data.test_samples + 1) * sizeof(float));
    r->labels = dp_malloc((r->data.test_samples + 1) * sizeof(float));
    size_t n_state = s->model.n_floats * (size_t)dp_optim_state_per_param(c->optim.kind);
    if (n_state) r->d_state = s->be->ops->alloc(s->be, n_state * sizeof(float));
    return dp_session_init_outputs(s, err);
}

/* The batch in data.batch through the stage's forward into x (and its
 * labels into y), its rows from e's source: the distinct keys' count, or
 * -1 with err. */
static long s_embed_batch(const dp_embed_eval_t *e, char *err)
{
    const dp_libsvm_batch_t *b = e->data->batch;
    size_t U = dp_embed_plan(e->stage, b);
    if (e->rows(e->arg, e->stage->keys, U, e->stage->dim, e->row_w, err) != 0) return -1;
    dp_embed_forward(e->stage, e->x, b, e->row_w);
    for (size_t i = 0; i < b->n; i++) e->y[i] = (int)b->labels[i];
    return (long)U;
}

/* A run's rows: the servers' or the table of this process. */
static int s_rows_of(void *arg, const uint64_t *keys, size_t n, int d, float *rows, char *err)
{
    s_run_t *r = arg;
    if (r->ps) return dp_ps_client_rows_pull(r->ps, keys, n, d, rows, NULL, err);
    return dp_rows_pull(r->rows, keys, n, d, rows, err) < 0 ? -1 : 0;
}

static dp_embed_eval_t s_eval_of(s_run_t *r)
{
    return (dp_embed_eval_t){.net = &r->s.net, .data = &r->data, .stage = &r->stage, .rows = s_rows_of,
                             .arg = r, .x = r->x, .row_w = r->row_w, .scores = r->scores,
                             .labels = r->labels, .y = r->y};
}

static long s_embed(s_run_t *r, char *err)
{
    dp_embed_eval_t e = s_eval_of(r);
    return s_embed_batch(&e, err);
}

/* One training step on data.batch, its loss into *loss; -1 with err on a
 * failure of the table. */
static int s_step(s_run_t *r, const dp_optim_conf_t *opt, long step, float *loss, char *err)
{
    dp_session_t *s = &r->s;
    int n = (int)r->data.batch->n;
    long U = s_embed(r, err);
    if (U < 0) return -1;
    s->net.step = (unsigned long long)step; /* dropout's mask */
    *loss = dp_net_train_step(&s->net, r->x, r->y, n);
    dp_net_get_input_grad(&s->net, r->dx, n);
    dp_embed_backward(&r->stage, r->row_g, r->data.batch, r->dx);
    if (dp_rows_push(r->rows, (uint64_t)step + 1, r->stage.keys, (size_t)U, r->stage.dim, r->row_g,
                     err) < 0)
        return -1;
    dp_net_optim_step(&s->net, opt, dp_optim_lr_at(opt, step), r->d_state, step + 1);
    return 0;
}

int dp_embed_evaluate(const dp_embed_eval_t *e, double *acc, double *loss, double *auc, char *err)
{
    dp_sparse_data_t *d = e->data;
    *acc = *loss = *auc = NAN;
    if (!d->test) return 0;
    if (dp_sparse_data_rewind_test(d, err) != 0) return -1;
    size_t n = 0;
    long k, correct = 0;
    double loss_sum = 0;
    while ((k = dp_sparse_data_next_test(d, err)) > 0) {
        if (s_embed_batch(e, err) < 0) return -1;
        int ok = 0;
        loss_sum += (double)dp_net_evaluate(e->net, e->x, e->y, (int)k, &ok) * k;
        correct += ok;
        for (long i = 0; i < k && n + (size_t)i < d->test_samples; i++) {
            e->scores[n + i] = e->net->h_probs[2 * i + 1];
            e->labels[n + i] = d->batch->labels[i];
        }
        n += (size_t)k;
    }
    if (k < 0) return -1;
    if (n != d->test_samples)
        return dp_err(err, "%s: %zu samples now, %" PRIu64 " when opened (did the file change?)",
                      d->test_path, n, d->test_samples);
    *acc = (double)correct / (double)n;
    *loss = loss_sum / (double)n;
    char why[DP_ERR_LEN];
    if (dp_auc(e->scores, e->labels, n, auc, why) != 0) {
        dp_log_warn("%s: no test AUC: %s", d->test_path, why);
        *auc = NAN;
    }
    return 0;
}

static int s_evaluate(s_run_t *r, double *acc, double *loss, double *auc, char *err)
{
    dp_embed_eval_t e = s_eval_of(r);
    return dp_embed_evaluate(&e, acc, loss, auc, err);
}

/* A step's metrics line: standalone's, or a cluster's push (batch: the
 * training file's batch g it trained, the epoch's g mod steps_per_epoch). */
static void s_embed_metrics(dp_train_drv_t *d, const dp_train_step_t *st, cJSON *line)
{
    s_run_t *r = d->run;
    if (d->standalone) {
        dp_rows_stats_t rs;
        dp_rows_stats(r->rows, &rs);
        cJSON_AddNumberToObject(line, "step", st->step);
        cJSON_AddNumberToObject(line, "epoch", st->step / r->spe);
        cJSON_AddNumberToObject(line, "loss", dp_metrics_round(st->loss, 6));
        cJSON_AddNumberToObject(line, "lr", dp_metrics_round(dp_optim_lr_at(&r->optim, st->step), 6));
        cJSON_AddNumberToObject(line, "rows", (double)rs.rows);
        return;
    }
    const dp_push_result_t *res = st->push;
    cJSON_AddNumberToObject(line, "step", st->step);
    cJSON_AddNumberToObject(line, "epoch", r->g / r->spe);
    cJSON_AddNumberToObject(line, "batch", r->g);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(st->loss, 6));
    cJSON_AddNumberToObject(line, "version", (double)dp_ps_client_version(r->ps));
    cJSON_AddNumberToObject(line, "staleness", dp_metrics_round(res->staleness_mean, 3));
    cJSON_AddBoolToObject(line, "applied", res->applied > 0);
    cJSON_AddNumberToObject(line, "keys", (double)r->keys);
    cJSON_AddNumberToObject(line, "bytes_pushed", (double)dp_ps_client_bytes_pushed(r->ps));
    cJSON_AddNumberToObject(line, "bytes_pulled", (double)dp_ps_client_bytes_pulled(r->ps));
    if (res->workers_live > 0) cJSON_AddNumberToObject(line, "workers", res->workers_live);
}

static void s_embed_progress(dp_train_drv_t *d, const dp_train_step_t *st, char *line, size_t n)
{
    s_run_t *r = d->run;
    long spe = r->spe, total = d->total;
    double dt = dp_now() - d->t0;
    double rate = d->samples / (dt > 0 ? dt : 1e-9);
    if (d->standalone) {
        dp_rows_stats_t rs;
        dp_rows_stats(r->rows, &rs);
        snprintf(line, n, "epoch %ld/%ld  step %ld/%ld  %.0f samples/s  loss %.4f  rows %" PRIu64,
                 st->step / spe + 1, (total + spe - 1) / spe, d->done, total, rate, d->loss_avg, rs.rows);
        return;
    }
    char of[32] = "";
    if (!d->elastic) snprintf(of, sizeof of, "/%ld", total);
    snprintf(line, n, "worker %d  epoch %ld  step %ld%s  %.0f samples/s  loss %.4f  keys %zu  "
             "staleness %.2f", d->c->task_index, r->g / spe + 1, d->done, of, rate, d->loss_avg,
             r->keys, d->stale_sum / (d->done - d->first));
}

/* Every row of t in key order, pulled a page of max_keys at a time, from
 * k[0] and w[0] on; n returned. */
static size_t s_table_rows_into(const dp_rows_t *t, size_t n, uint64_t *k, float *w)
{
    int D = dp_rows_width(t);
    size_t got = 0, page = DP_ROWS_DEFAULT_KEYS;
    uint64_t from = 0;
    char err[DP_ERR_LEN];
    while (got < n) {
        size_t m = dp_rows_keys_from(t, from, n - got < page ? n - got : page, k + got);
        /* keys it holds, at most max_keys, its width: the pull cannot fail */
        if (m == 0 || dp_rows_pull(t, k + got, m, D, w + got * (size_t)D, err) < 0) break;
        got += m;
        if (k[got - 1] == UINT64_MAX) break;
        from = k[got - 1] + 1;
    }
    return got;
}

static int s_cmp_at(const void *a, const void *b, void *keys)
{
    uint64_t x = ((const uint64_t *)keys)[*(const size_t *)a], y = ((const uint64_t *)keys)[*(const size_t *)b];
    return (x > y) - (x < y);
}

size_t dp_embed_rows_of(dp_rows_t *const *tables, int k, uint64_t **keys, float **rows)
{
    size_t n = 0;
    for (int i = 0; i < k; i++) {
        dp_rows_stats_t st;
        dp_rows_stats(tables[i], &st);
        n += (size_t)st.rows;
    }
    int D = k > 0 ? dp_rows_width(tables[0]) : 1;
    uint64_t *kk = dp_malloc((n ? n : 1) * sizeof *kk);
    float *ww = dp_malloc((n ? n : 1) * (size_t)D * sizeof *ww);
    size_t got = 0;
    for (int i = 0; i < k; i++) {
        dp_rows_stats_t st;
        dp_rows_stats(tables[i], &st);
        got += s_table_rows_into(tables[i], (size_t)st.rows, kk + got, ww + got * (size_t)D);
    }
    if (k > 1) { /* each table's keys ascend and no key is in two: one sort of the whole */
        size_t *at = dp_malloc((got ? got : 1) * sizeof *at);
        for (size_t i = 0; i < got; i++) at[i] = i;
        qsort_r(at, got, sizeof *at, s_cmp_at, kk);
        uint64_t *k2 = dp_malloc((got ? got : 1) * sizeof *k2);
        float *w2 = dp_malloc((got ? got : 1) * (size_t)D * sizeof *w2);
        for (size_t i = 0; i < got; i++) {
            k2[i] = kk[at[i]];
            memcpy(w2 + i * (size_t)D, ww + at[i] * (size_t)D, (size_t)D * sizeof *w2);
        }
        free(at), free(kk), free(ww);
        kk = k2, ww = w2;
    }
    *keys = kk, *rows = ww;
    return got;
}

int dp_embed_save_file(const char *path, const dp_model_t *m, const float *params, long step,
                       long version, const uint64_t *keys, const float *rows, size_t n, float init,
                       uint64_t seed, int batch, const char *digest, char *err)
{
    char nrows[24], sinit[32], sseed[24], sbatch[16];
    snprintf(nrows, sizeof nrows, "%zu", n);
    snprintf(sinit, sizeof sinit, "%.9g", (double)init);
    snprintf(sseed, sizeof sseed, "%" PRIu64, seed);
    snprintf(sbatch, sizeof sbatch, "%d", batch);
    const char *kv[] = {"embed_rows", nrows, DP_ST_ROWS_INIT, sinit, DP_ST_ROWS_SEED, sseed,
                        "batch", sbatch, digest ? "embed_rows_digest" : NULL, digest, NULL};
    return dp_checkpoint_save_rows(path, m, params, step, version, keys, rows, n, kv, err);
}

/* --save: the dense layers and the table's rows (dp_embed_save_file), with
 * the table's digest. */
static int s_save(s_run_t *r, long step, char *err)
{
    dp_session_t *s = &r->s;
    if (!s->conf.save) return 0;
    dp_net_get_params(&s->net, s->h_params);
    uint64_t *keys;
    float *w;
    size_t n = dp_embed_rows_of(&r->rows, 1, &keys, &w);
    char digest[20];
    snprintf(digest, sizeof digest, "%016" PRIx64, dp_rows_digest(r->rows));
    int rc = dp_embed_save_file(s->conf.save, &s->model, s->h_params, step, step, keys, w, n,
                                r->row_init, s->conf.seed, s->conf.batch, digest, err);
    free(keys);
    free(w);
    return rc;
}

/* Standalone: steps until total, a failure (a bad read, a diverged loss)
 * or a signal. */
static int s_loop(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    while (!dp_train_stopped(d) && d->done < d->total) {
        long step = d->done, k = dp_sparse_data_next(&r->data, err);
        if (k < 0) return -1;
        float loss = 0;
        if (s_step(r, &r->optim, step, &loss, err) != 0) return -1;
        dp_train_step_t st = {.step = step, .loss = loss, .samples = (double)k,
                              .last = step + 1 == d->total};
        if (dp_train_done(d, &st, err) != 0) return -1;
    }
    return 0;
}

/* The end of a whole standalone run: evaluation, --save, the summary's
 * fields. */
static int s_finish(dp_train_drv_t *d, dp_run_summary_t *sum, char *err)
{
    s_run_t *r = d->run;
    const dp_train_conf_t *c = &r->s.conf;
    dp_train_eval_t e;
    if (s_evaluate(r, &e.accuracy, &e.loss, &e.auc, err) != 0) return -1;
    dp_train_log_eval(d, d->done, &e);
    dp_rows_stats_t st;
    dp_rows_stats(r->rows, &st);
    dp_log_info("standalone: %ld steps in %.1f s; %" PRIu64 " rows; test accuracy %.4f, loss "
                "%.4f, AUC %.4f", d->done, sum->train_s, st.rows, e.accuracy, e.loss, e.auc);
    if (s_save(r, d->done, err) != 0) return -1;
    r->rows_held = st.rows;
    r->sparse = (dp_sparse_summary_t){
        .test_auc = e.auc, .rows = &r->rows_held, .tables = 1, .rows_digest = dp_rows_digest(r->rows),
        .row_optim = &r->row_optim, .row_init = r->row_init,
    };
    sum->epochs = (double)d->done / r->spe;
    sum->test_accuracy = e.accuracy;
    sum->test_loss = e.loss;
    /* the batches' samples as given, a short last one counted whole */
    sum->images_per_s_per_worker = (double)d->done * c->batch / (sum->train_s > 0 ? sum->train_s : 1e-9);
    sum->optim = &r->optim;
    sum->sparse = &r->sparse;
    return 0;
}

/* ---- a model file scored: downpour eval ---------------------------------- */

/* Metadata key of path as a number in [lo, hi] into *v; absent: *v kept.
 * -1 with err for a bad file or value. */
static int s_meta_num(const char *path, const char *key, double lo, double hi, double *v, char *err)
{
    char *s = dp_safetensors_read_meta(path, key, err);
    if (!s) return err[0] ? -1 : 0;
    char *end = NULL;
    double x = strtod(s, &end);
    int bad = end == s || *end || !(x >= lo && x <= hi);
    if (bad) dp_err(err, "%s: metadata '%s' is '%.32s', not a number in [%g, %g]", path, key, s, lo, hi);
    else *v = x;
    free(s);
    return bad ? -1 : 0;
}

int dp_embed_eval_file(const char *path, const char *test, int batch, int threads, dp_precision_t precision,
                       dp_embed_scores_t *out, char *err)
{
    s_run_t r;
    memset(&r, 0, sizeof r);
    uint64_t *keys = NULL;
    float *w = NULL;
    char *spec = NULL, *data = NULL;
    int rc = -1;
    double init = -1, b = 256;
    unsigned long long seed = 1;
    if (!(spec = dp_safetensors_read_meta(path, "spec", err))) {
        if (!err[0]) dp_err(err, "%s: no model spec in the metadata (not a Downpour model file?)", path);
        goto done;
    }
    if (s_meta_num(path, DP_ST_ROWS_INIT, 0, 1e30, &init, err) != 0 ||
        s_meta_num(path, "batch", 1, 1 << 16, &b, err) != 0)
        goto done;
    char *sv = dp_safetensors_read_meta(path, DP_ST_ROWS_SEED, err); /* any 64-bit seed */
    if (!sv && err[0]) goto done;
    if (sv) {
        char *end = NULL;
        errno = 0;
        seed = strtoull(sv, &end, 10);
        int bad = end == sv || *end || errno || sv[0] == '-';
        if (bad) dp_err(err, "%s: metadata '%s' is '%.32s', not a 64-bit seed", path, DP_ST_ROWS_SEED, sv);
        free(sv);
        if (bad) goto done;
    }
    dp_train_conf_t c;
    dp_train_conf_default(&c);
    /* the test file as both halves of the spec: nothing is trained */
    size_t len = strlen(test) * 2 + 16;
    data = dp_malloc(len);
    snprintf(data, len, "libsvm:%s:%s", test, test);
    c.model = spec, c.data = data, c.threads = threads, c.progress = DP_PROGRESS_OFF;
    c.precision = precision;
    c.batch = batch > 0 ? batch : (int)b;
    c.seed = (uint64_t)seed;
    c.row_init = init >= 0 ? (float)init : 0; /* a file without it: absent keys read zeros */
    if (s_init(&r, &c, 1, err) != 0) goto done;
    size_t n = 0;
    if (dp_checkpoint_load(path, &r.s.model, r.s.h_params, NULL, NULL, err) != 0 ||
        dp_safetensors_read_rows(path, r.s.model.embed_dim, &keys, &w, &n, err) != 0)
        goto done;
    char why[DP_ERR_LEN];
    if (dp_rows_put(r.rows, keys, n, r.s.model.embed_dim, w, why) != 0) {
        dp_err(err, "%s: its rows: %s", path, why);
        goto done;
    }
    dp_net_set_params(&r.s.net, r.s.h_params);
    if (s_evaluate(&r, &out->accuracy, &out->loss, &out->auc, err) != 0) goto done;
    out->samples = r.data.test_samples;
    out->rows = n;
    out->batch = c.batch;
    rc = 0;
done:
    s_fini(&r);
    free(keys);
    free(w);
    free(spec);
    free(data);
    return rc;
}

/* ---- in a cluster: the table on the servers ------------------------------
 * Worker i of N trains the training file's batches i, i + N, i + 2N, ...
 * (one sequence over the epochs, so each epoch's every batch is trained
 * once by the crew); a step pulls the dense weights, then the rows of its
 * batch's keys, computes, and pushes the rows' gradients, then the dense
 * gradient (in sync the rows wait in the shard for the dense step that
 * takes this worker's gradient, so they go first). */

/* What a cluster takes that this worker does not do yet, and the flags that
 * are the servers' there: one line each. */
static int s_check_cluster_conf(const dp_train_conf_t *c, char *err)
{
    if (c->row_lr > 0 || c->row_init >= 0 || c->row_optim != DP_ROW_ADAGRAD)
        return dp_err(err, "--row-optimizer, --row-lr and --row-init are the servers' in a cluster "
                      "(give them to downpour-ps; downpour local passes them on)");
    if (c->local_steps > 1)
        return dp_err(err, "--local-steps with --data libsvm: the rows are pushed every step, so "
                      "a model with an embedding trains without local steps");
    return 0;
}

static int s_check_cluster(const dp_ps_info_t *info, char *err)
{
    if (info->local_steps > 1)
        return dp_err(err, "the servers run --local-steps %ld, which a model with an embedding "
                      "does not (its rows are pushed every step)", info->local_steps);
    return 0;
}

/* The dense weights from the servers into the net (an elastic crew's pull
 * also brings shard 0's deal: dp_ps_client_dealt). 0, or -1 with err. */
static int s_pull_dense(s_run_t *r, char *err)
{
    dp_session_t *s = &r->s;
    if (s->be->host_memory ? dp_ps_client_pull(r->ps, s->net.d_params, err)
                           : dp_ps_client_pull(r->ps, s->h_params, err))
        return -1;
    if (!s->be->host_memory) dp_net_set_params(&s->net, s->h_params);
    return 0;
}

/* One step on data.batch (n samples), the dense weights pulled: the rows
 * pulled, the push's result into *res, the loss into *loss, the batch's
 * distinct keys into *keys. 0, or -1 with err. */
static int s_step_cluster(s_run_t *r, long step, int n, float *loss, size_t *keys,
                          dp_push_result_t *res, char *err)
{
    dp_session_t *s = &r->s;
    long U = s_embed(r, err);
    if (U < 0) return -1;
    *keys = (size_t)U;
    s->net.step = (unsigned long long)step; /* dropout's mask */
    *loss = dp_net_train_step(&s->net, r->x, r->y, n);
    dp_net_get_input_grad(&s->net, r->dx, n);
    dp_embed_backward(&r->stage, r->row_g, r->data.batch, r->dx);
    dp_push_result_t rows_res;
    if (dp_ps_client_rows_push(r->ps, r->stage.keys, (size_t)U, r->stage.dim, r->row_g,
                               (uint64_t)step + 1, &rows_res, err) != 0)
        return -1;
    if (rows_res.rejected && rows_res.reason[0])
        dp_log_warn("step %ld: row push rejected: %s", step, rows_res.reason);
    const float *grads = s->be->host_memory ? s->net.d_grads : s->h_grads;
    if (!s->be->host_memory) dp_net_get_grads(&s->net, s->h_grads);
    dp_ps_push_t p = {.grads = grads, .loss = *loss, .batch = n, .step = (uint64_t)step + 1};
    return dp_ps_client_push(r->ps, &p, res, err);
}

/* The chief's --save: the dense layers it evaluated and every shard's rows
 * (read page by page and merged by key: dp_ps_client_rows_all), with a
 * standalone file's metadata (what a key without a row reads as: the
 * servers' init and seed, which their scan replies say; the batch the test
 * file was scored in), so downpour eval scores it as the chief did. held:
 * the rows STATS counted, which a table no worker pushes to any more
 * still holds. */
static int s_save_cluster(s_run_t *r, long done, uint64_t version, uint64_t held, char *err)
{
    dp_session_t *s = &r->s;
    if (!s->conf.save) return 0;
    dp_ps_table_t t;
    if (dp_ps_client_rows_all(r->ps, s->model.embed_dim, 0, &t, err) != 0) return -1;
    if (t.n != held)
        dp_log_warn("--save: %zu rows read from the servers, %" PRIu64 " counted by their STATS "
                    "(was a worker still pushing?)", t.n, held);
    dp_log_info("chief: --save %s: the dense layers and %zu rows (%" PRIu64 " pages)",
                s->conf.save, t.n, t.pages);
    int rc = dp_embed_save_file(s->conf.save, &s->model, s->h_params, done, (long)version, t.keys,
                                t.rows, t.n, t.init, t.seed, s->conf.batch, NULL, err);
    dp_ps_table_free(&t);
    return rc;
}

/* The chief's end, the crew finished (sum has the servers' part): their
 * weights and rows evaluated on the test file, the table's rows per shard
 * from STATS, --save. */
static int s_finish_chief(dp_train_drv_t *d, dp_run_summary_t *sum, char *err)
{
    s_run_t *r = d->run;
    dp_session_t *s = &r->s;
    const dp_ps_stats_t *st = sum->stats;
    if (dp_ps_client_pull(r->ps, s->h_params, err) != 0) return -1;
    dp_net_set_params(&s->net, s->h_params);
    dp_train_eval_t e;
    if (s_evaluate(r, &e.accuracy, &e.loss, &e.auc, err) != 0) return -1;
    dp_train_log_eval(d, d->done, &e);
    uint64_t held = 0;
    for (int k = 0; k < st->rows_shards; k++) held += st->rows[k];
    dp_log_info("chief: test accuracy %.4f, loss %.4f, AUC %.4f; %" PRIu64 " rows on %d shard(s), "
                "%" PRIu64 " evicted; row pushes %" PRIu64 " (%" PRIu64 " rejected)", e.accuracy,
                e.loss, e.auc, held, st->rows_shards, st->rows_evicted, st->row_pushes,
                st->row_pushes_rejected);
    if (s_save_cluster(r, d->done, st->version, held, err) != 0) return -1;
    r->sparse = (dp_sparse_summary_t){.test_auc = e.auc, .rows = st->rows, .tables = st->rows_shards};
    sum->epochs = d->elastic ? (double)r->epochs : (double)d->done * d->info.num_workers / r->spe;
    sum->test_accuracy = e.accuracy;
    sum->test_loss = e.loss;
    sum->staleness_hist = NULL; /* a sparse run's summary has none */
    sum->sparse = &r->sparse;
    return 0;
}

/* This worker's steps: --steps, or its share of --epochs' batches (batch
 * g is worker g mod N's). */
static long s_cluster_steps(const dp_train_conf_t *c, long spe, int N)
{
    if (c->steps > 0) return c->steps;
    long all = c->epochs * spe;
    return all > c->task_index ? (all - c->task_index + N - 1) / N : 0;
}

/* The next batch of step into data.batch, after its dense pull (which,
 * in an elastic crew, brought shard 0's deal): its samples, 0 at the end
 * (the crew's batches are done), or -1 with err; *g the training file's
 * batch it is (epoch * steps_per_epoch + index). A fixed crew's worker i of
 * N takes batch step * N + i. */
static long s_batch_of(s_run_t *r, const dp_ps_info_t *info, long step, long *g, char *err)
{
    if (info->min_workers > 0) {
        dp_ps_dealt_t d;
        if (dp_ps_client_dealt(r->ps, &d) != 0) return dp_err(err, "shard 0 dealt no batch with the weights");
        if (d.end) return 0;
        *g = (long)(d.epoch * (uint64_t)r->data.steps_per_epoch + d.index);
    } else {
        *g = step * info->num_workers + r->s.conf.task_index;
    }
    if (dp_sparse_data_seek(&r->data, *g, err) != 0) return -1;
    long k = dp_sparse_data_next(&r->data, err);
    return k == 0 ? dp_err(err, "%s: no batch %ld (did the file change?)", r->data.train_path, *g) : k;
}

/* Steps from first until total (a fixed crew) or until shard 0 deals no
 * more (an elastic one: total is LONG_MAX), or a signal (after the whole
 * step in flight). */
static int s_loop_cluster(dp_train_drv_t *d, char *err)
{
    s_run_t *r = d->run;
    while (d->done < d->total && !dp_train_stopped(d)) {
        long step = d->done;
        if (d->elastic) dp_ps_client_deal_step(r->ps, (uint64_t)step + 1);
        if (s_pull_dense(r, err) != 0) return -1;
        long k = s_batch_of(r, &d->info, step, &r->g, err);
        if (k < 0) return -1;
        if (k == 0) break; /* dealt out */
        dp_train_test_hold(d->c->task_index, step, d->stop);
        float loss = 0;
        dp_push_result_t res;
        if (s_step_cluster(r, step, (int)k, &loss, &r->keys, &res, err) != 0) return -1;
        dp_train_step_t st = {.step = step, .loss = loss, .samples = (double)k, .push = &res,
                              .last = step + 1 == d->total};
        if (dp_train_done(d, &st, err) != 0) return -1;
    }
    return 0;
}

/* ---- the embed kind (worker/train/driver.h) ------------------------------ */

static int s_embed_open(dp_train_drv_t *d, char *err)
{
    const dp_train_conf_t *c = d->c;
    if (!d->standalone && s_check_cluster_conf(c, err) != 0) return -1;
    s_run_t *r = d->run = dp_malloc(sizeof *r);
    if (s_init(r, c, d->standalone, err) != 0) return -1;
    dp_session_t *s = &r->s;
    d->model = &s->model;
    d->metrics = s->metrics;
    d->tb = s->tb;
    d->progress = &s->progress;
    r->spe = r->data.steps_per_epoch;
    if (d->standalone) {
        dp_model_init_params(&s->model, s->h_params, c->seed);
        dp_net_set_params(&s->net, s->h_params);
        return 0;
    }
    /* What shard 0 of an elastic crew deals from (a fixed crew's ignore
     * it): the file's batches, as "samples" of spe x batch, so that its
     * per_epoch (samples / batch) is this file's count of batches, a short
     * last one or ones cut at the features' bound included. */
    d->opts.deal = (dp_ps_deal_plan_t){.samples = (uint64_t)r->spe * (uint64_t)c->batch,
                                       .batch = (uint32_t)c->batch,
                                       .epochs = c->steps > 0 ? 0 : (uint64_t)c->epochs,
                                       .steps = c->steps > 0 ? (uint64_t)c->steps : 0};
    r->ps = d->ps; /* set again once connected (s_embed_plan) */
    return 0;
}

static int s_embed_plan_standalone(dp_train_drv_t *d)
{
    s_run_t *r = d->run;
    const dp_train_conf_t *c = d->c;
    long spe = r->spe, total = d->total = c->steps > 0 ? c->steps : c->epochs * spe;
    r->optim = c->optim;
    if (!c->schedule_given) { /* anneal the dense layers over the run, as standalone does */
        r->optim.schedule = DP_LR_COSINE;
        r->optim.total_steps = total;
    }
    dp_log_info("standalone: %s on %s in %s, %" PRIu64 " train / %" PRIu64 " test samples, batch %d, "
                "%ld steps (%ld per epoch); rows: %s, lr %g", r->s.model.spec, c->device, r->s.be->precision,
                r->data.train_samples, r->data.test_samples, c->batch, total, spe,
                dp_row_optim_kind_name(r->row_optim.kind), (double)r->row_optim.lr);
    dp_session_log_start(&r->s, 0, total, spe);
    return 0;
}

static int s_embed_plan(dp_train_drv_t *d, char *err)
{
    if (d->standalone) return s_embed_plan_standalone(d);
    s_run_t *r = d->run;
    const dp_train_conf_t *c = d->c;
    const dp_ps_info_t *info = &d->info;
    r->ps = d->ps;
    if (s_check_cluster(info, err) != 0) return -1;
    long spe = r->spe;
    d->total = d->elastic ? LONG_MAX : s_cluster_steps(c, spe, info->num_workers);
    /* a restarted worker takes up after its last step every shard applied */
    uint64_t held = dp_ps_client_resume_step(r->ps);
    d->first = held < (uint64_t)d->total ? (long)held : d->total;
    if (d->first > 0)
        dp_log_info("worker %d: rejoining: the servers hold its steps 1..%ld; resuming at step %ld "
                    "of %ld", c->task_index, d->first, d->first + 1, d->total);
    /* the epochs shard 0 deals: the plan's, or --steps a worker x MAX */
    r->epochs = c->steps <= 0 ? c->epochs : (c->steps * info->num_workers + spe - 1) / spe;
    char plan[96];
    if (d->elastic) snprintf(plan, sizeof plan, "the batches shard 0 deals for %ld epoch(s)", r->epochs);
    else snprintf(plan, sizeof plan, "%ld steps (batches %d, %d + %d, ...)", d->total, c->task_index,
                  c->task_index, info->num_workers);
    dp_log_info("worker %d/%d: %s mode, %d shard(s), %s in %s on %" PRIu64 " train samples, batch %d, %s",
                c->task_index, info->num_workers, dp_mode_name(info->mode), info->num_shards,
                r->s.model.spec, r->s.be->precision, r->data.train_samples, c->batch, plan);
    dp_session_log_start(&r->s, c->task_index, d->elastic ? -r->epochs : d->total, spe);
    return 0;
}

static int s_embed_loop(dp_train_drv_t *d, char *err)
{
    return d->standalone ? s_loop(d, err) : s_loop_cluster(d, err);
}

static int s_embed_evaluate(dp_train_drv_t *d, int limit, dp_train_eval_t *e, char *err)
{
    (void)limit; /* the test file whole: its AUC is of all of it */
    return s_evaluate(d->run, &e->accuracy, &e->loss, &e->auc, err);
}

static int s_embed_save(dp_train_drv_t *d, char *err)
{
    return s_save(d->run, d->done, err);
}

static int s_embed_finish(dp_train_drv_t *d, dp_run_summary_t *sum, char *err)
{
    s_run_t *r = d->run;
    sum->data = r->s.train.name;
    sum->model = r->s.model.spec;
    return d->standalone ? s_finish(d, sum, err) : s_finish_chief(d, sum, err);
}

static void s_embed_close(dp_train_drv_t *d)
{
    s_run_t *r = d->run;
    if (!r) return;
    r->ps = NULL; /* the driver's */
    s_fini(r);
    free(r);
    d->run = NULL;
}

const dp_train_kind_ops_t dp_train_embed = {
    .name = "embed",
    .diverged = "lower --lr or --row-lr",
    .diverged_cluster = "lower --lr or --row-lr",
    .open = s_embed_open,
    .plan = s_embed_plan,
    .loop = s_embed_loop,
    .metrics = s_embed_metrics,
    .progress = s_embed_progress,
    .evaluate = s_embed_evaluate,
    .save = s_embed_save,
    .finish = s_embed_finish,
    .close = s_embed_close,
};
