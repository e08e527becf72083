/* embed_train: a model with an embedding trained on libsvm data (see
 * embed_train.h): the session's dense net behind the embedding stage, the
 * rows in a table of this process (standalone) or on the servers. */
#include "worker/train/embed_train.h"

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
                      "'embed:2 softmax', logistic regression); '%s' has none", m->spec);
    if (m->classes != 2)
        return dp_err(err, "model spec '%s' ends in %d classes but libsvm labels are 0 and 1: end "
                      "it in 2 (fc:2 softmax, or embed:2 softmax)", m->spec, m->classes);
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
        dp_backend_new(&s->be, c->device, err) != 0 || dp_net_init(&s->net, &s->model, s->be, B, err) != 0)
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

static void s_metrics_step(s_run_t *r, long step, float loss, float lr)
{
    cJSON *line = dp_metrics_line(r->s.metrics);
    if (!line) return;
    dp_rows_stats_t st;
    dp_rows_stats(r->rows, &st);
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "epoch", step / r->data.steps_per_epoch);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
    cJSON_AddNumberToObject(line, "lr", dp_metrics_round(lr, 6));
    cJSON_AddNumberToObject(line, "rows", (double)st.rows);
    dp_metrics_write(r->s.metrics, &line);
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

/* The training loop: steps until total, a failure (-1 with err: a bad
 * read, a diverged loss) or *stop; the steps done. */
static long s_loop(s_run_t *r, const dp_optim_conf_t *opt, long total, volatile sig_atomic_t *stop,
                   double *loss_avg, char *err)
{
    const dp_train_conf_t *c = &r->s.conf;
    long spe = r->data.steps_per_epoch, done = 0;
    double t0 = dp_now(), samples = 0;
    while (!(stop && *stop) && done < total) {
        long step = done, k = dp_sparse_data_next(&r->data, err);
        if (k < 0) return -1;
        float loss = 0;
        if (s_step(r, opt, step, &loss, err) != 0) return -1;
        if (!isfinite(loss))
            return dp_err(err, "loss is %f at step %ld: training diverged (lower --lr or --row-lr)",
                          loss, step);
        done = step + 1;
        samples += (double)k;
        *loss_avg = done == 1 ? loss : 0.98 * *loss_avg + 0.02 * loss;
        s_metrics_step(r, step, loss, dp_optim_lr_at(opt, step));
        dp_session_log_step(&r->s, step, loss);
        dp_rows_stats_t st;
        dp_rows_stats(r->rows, &st);
        double dt = dp_now() - t0;
        dp_progress_update(&r->s.progress, done == total,
                           "epoch %ld/%ld  step %ld/%ld  %.0f samples/s  loss %.4f  rows %" PRIu64,
                           step / spe + 1, (total + spe - 1) / spe, done, total,
                           samples / (dt > 0 ? dt : 1e-9), *loss_avg, st.rows);
        if (c->eval_every > 0 && done % c->eval_every == 0 && done < total) {
            double acc, test_loss, auc;
            if (s_evaluate(r, &acc, &test_loss, &auc, err) != 0) return -1;
            dp_session_log_eval_auc(&r->s, done, acc, test_loss, auc);
        }
    }
    return done;
}

/* The end of a whole run: evaluation, --save, summary.json. */
static int s_finish(s_run_t *r, const dp_optim_conf_t *opt, long done, double train_s,
                    double loss_avg, char *err)
{
    const dp_train_conf_t *c = &r->s.conf;
    double acc, test_loss, auc;
    if (s_evaluate(r, &acc, &test_loss, &auc, err) != 0) return -1;
    dp_session_log_eval_auc(&r->s, done, acc, test_loss, auc);
    dp_rows_stats_t st;
    dp_rows_stats(r->rows, &st);
    double sps = (double)done * c->batch / (train_s > 0 ? train_s : 1e-9);
    dp_log_info("standalone: %ld steps in %.1f s; %" PRIu64 " rows; test accuracy %.4f, loss "
                "%.4f, AUC %.4f", done, train_s, st.rows, acc, test_loss, auc);
    if (s_save(r, done, err) != 0) return -1;
    uint64_t rows = st.rows;
    dp_sparse_summary_t sp = {
        .test_auc = auc, .rows = &rows, .tables = 1, .rows_digest = dp_rows_digest(r->rows),
        .row_optim = &r->row_optim, .row_init = r->row_init,
    };
    dp_run_summary_t sum = {
        .mode = "standalone", .workers = 1, .ps_shards = 0, .staleness = -1,
        .steps = done, .epochs = (double)done / r->data.steps_per_epoch,
        .test_accuracy = acc, .test_loss = test_loss, .train_loss = loss_avg,
        .images_per_s_per_worker = sps, .train_s = train_s,
        .applied = (uint64_t)done, .optim = opt, .sparse = &sp,
    };
    return dp_session_summary(&r->s, &sum, err);
}

int dp_embed_standalone(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    s_run_t r;
    if (s_init(&r, c, 1, err) != 0) {
        s_fini(&r);
        return -1;
    }
    dp_session_t *s = &r.s;
    dp_model_init_params(&s->model, s->h_params, c->seed);
    dp_net_set_params(&s->net, s->h_params);
    long spe = r.data.steps_per_epoch;
    long total = c->steps > 0 ? c->steps : c->epochs * spe;
    dp_optim_conf_t optim = c->optim;
    if (!c->schedule_given) { /* anneal the dense layers over the run, as standalone does */
        optim.schedule = DP_LR_COSINE;
        optim.total_steps = total;
    }
    dp_log_info("standalone: %s on %s, %" PRIu64 " train / %" PRIu64 " test samples, batch %d, "
                "%ld steps (%ld per epoch); rows: %s, lr %g", s->model.spec, c->device,
                r.data.train_samples, r.data.test_samples, c->batch, total, spe,
                dp_row_optim_kind_name(r.row_optim.kind), (double)r.row_optim.lr);
    dp_session_log_start(s, 0, total, spe);
    double t0 = dp_now(), loss_avg = 0;
    long done = s_loop(&r, &optim, total, stop, &loss_avg, err);
    double train_s = dp_now() - t0;
    dp_progress_done(&s->progress);
    int rc = done < 0 ? -1 : 0;
    if (rc == 0 && stop && *stop) {
        rc = s_save(&r, done, err);
        if (rc == 0)
            dp_log_info("standalone: stopped by signal %d at step %ld; %s%s", (int)*stop, done,
                        c->save ? "dense layers saved to " : "nothing saved (no --save)",
                        c->save ? c->save : "");
    } else if (rc == 0) {
        rc = s_finish(&r, &optim, done, train_s, loss_avg, err);
    }
    s_fini(&r);
    return rc;
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

int dp_embed_eval_file(const char *path, const char *test, int batch, int threads,
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

static int s_check_cluster(const dp_train_conf_t *c, const dp_ps_info_t *info, char *err)
{
    if (c->task_index >= info->num_workers)
        return dp_err(err, "--task-index %d out of range: the servers expect %d workers",
                      c->task_index, info->num_workers);
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

/* The line per push; batch: the training file's batch g it trained (the
 * epoch's g mod steps_per_epoch). */
static void s_metrics_push(s_run_t *r, long step, long g, float loss, size_t keys,
                           const dp_push_result_t *res)
{
    cJSON *line = dp_metrics_line(r->s.metrics);
    if (!line) return;
    cJSON_AddNumberToObject(line, "step", step);
    cJSON_AddNumberToObject(line, "epoch", g / r->data.steps_per_epoch);
    cJSON_AddNumberToObject(line, "batch", g);
    cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
    cJSON_AddNumberToObject(line, "version", (double)dp_ps_client_version(r->ps));
    cJSON_AddNumberToObject(line, "staleness", dp_metrics_round(res->staleness_mean, 3));
    cJSON_AddBoolToObject(line, "applied", res->applied > 0);
    cJSON_AddNumberToObject(line, "keys", (double)keys);
    cJSON_AddNumberToObject(line, "bytes_pushed", (double)dp_ps_client_bytes_pushed(r->ps));
    cJSON_AddNumberToObject(line, "bytes_pulled", (double)dp_ps_client_bytes_pulled(r->ps));
    if (res->workers_live > 0) cJSON_AddNumberToObject(line, "workers", res->workers_live);
    dp_metrics_write(r->s.metrics, &line);
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

/* The chief's end: every worker finished, the servers' weights and rows
 * evaluated on the test file, the table's rows per shard from STATS. */
static int s_finish_chief(s_run_t *r, const dp_ps_info_t *info, long done, double epochs,
                          double train_s, double samples, char *err)
{
    dp_session_t *s = &r->s;
    double waited = dp_now();
    if (dp_ps_client_wait_all_finished(r->ps, s->conf.timeout_s * 10, err) != 0)
        dp_log_warn("not every worker finished: %s", err);
    double crew_s = train_s + (dp_now() - waited); /* the crew trained until its last one ended */
    if (dp_ps_client_pull(r->ps, s->h_params, err) != 0) return -1;
    dp_net_set_params(&s->net, s->h_params);
    double acc, test_loss, auc;
    if (s_evaluate(r, &acc, &test_loss, &auc, err) != 0) return -1;
    dp_session_log_eval_auc(s, done, acc, test_loss, auc);
    dp_ps_stats_t st;
    if (dp_ps_client_stats(r->ps, &st, err) != 0) return -1;
    uint64_t held = 0;
    for (int k = 0; k < st.rows_shards; k++) held += st.rows[k];
    dp_log_info("chief: test accuracy %.4f, loss %.4f, AUC %.4f; %" PRIu64 " rows on %d shard(s), "
                "%" PRIu64 " evicted; row pushes %" PRIu64 " (%" PRIu64 " rejected)", acc, test_loss,
                auc, held, st.rows_shards, st.rows_evicted, st.row_pushes, st.row_pushes_rejected);
    if (s_save_cluster(r, done, st.version, held, err) != 0) return -1;
    dp_ps_membership_t crew = {0}; /* joins and leaves: an elastic crew's story */
    if (dp_ps_client_membership(r->ps, &crew, err) != 0) return -1;
    dp_sparse_summary_t sp = {.test_auc = auc, .rows = st.rows, .tables = st.rows_shards};
    dp_run_summary_t sum = {
        .mode = dp_mode_name(info->mode), .workers = info->num_workers,
        .ps_shards = info->num_shards, .replicas = info->replicas,
        .staleness = info->mode == DP_MODE_SSP ? info->staleness : -1,
        .steps = done, .epochs = epochs, .test_accuracy = acc,
        .test_loss = test_loss, .images_per_s_per_worker = samples / (train_s > 0 ? train_s : 1e-9),
        .train_s = train_s, .crew_samples = dp_crew_samples(&crew, samples, info->num_workers),
        .crew_s = crew_s, .version = st.version, .applied = st.applied, .dropped = st.dropped,
        .rejected = st.rejected, .requests_refused = st.requests_refused,
        .staleness_mean = st.staleness_mean,
        .staleness_max = st.staleness_max, .updates_lost = dp_ps_client_updates_lost(r->ps),
        .bytes_pushed = dp_ps_client_bytes_pushed(r->ps),
        .bytes_pulled = dp_ps_client_bytes_pulled(r->ps), .sparse = &sp,
        .membership = &crew, .min_workers = info->min_workers,
    };
    int rc = dp_session_summary(s, &sum, err);
    dp_ps_membership_fini(&crew);
    return rc;
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
 * more (an elastic one: total is LONG_MAX); a signal ends a fixed crew's
 * run as an error, an elastic crew's after the whole step in flight (the
 * caller then leaves). The steps done, or -1 with err. */
static long s_loop_cluster(s_run_t *r, const dp_ps_info_t *info, long first, long total,
                           volatile sig_atomic_t *stop, double *samples, char *err)
{
    dp_session_t *s = &r->s;
    int task = s->conf.task_index, elastic = info->min_workers > 0;
    long spe = r->data.steps_per_epoch, done = first;
    double t0 = dp_now(), loss_avg = 0, stale_sum = 0;
    while (done < total) {
        if (stop && *stop) {
            if (elastic) break;
            return dp_err(err, "interrupted at step %ld", done);
        }
        long step = done, g = 0;
        if (elastic) dp_ps_client_deal_step(r->ps, (uint64_t)step + 1);
        if (s_pull_dense(r, err) != 0) return -1;
        long k = s_batch_of(r, info, step, &g, err);
        if (k < 0) return -1;
        if (k == 0) break; /* dealt out */
        float loss = 0;
        size_t keys = 0;
        dp_push_result_t res;
        if (s_step_cluster(r, step, (int)k, &loss, &keys, &res, err) != 0) return -1;
        if (!isfinite(loss))
            return dp_err(err, "loss is %f at step %ld: training diverged (lower --lr or --row-lr)",
                          loss, step);
        if (res.rejected && res.reason[0]) dp_log_warn("step %ld: update rejected: %s", step, res.reason);
        done = step + 1;
        *samples += (double)k;
        loss_avg = done == first + 1 ? loss : 0.98 * loss_avg + 0.02 * loss;
        stale_sum += res.staleness_mean;
        s_metrics_push(r, step, g, loss, keys, &res);
        dp_session_log_step(s, step, loss);
        if (info->mode != DP_MODE_SYNC) dp_tb_scalar(s->tb, "train/staleness", step, (float)res.staleness_mean);
        double dt = dp_now() - t0;
        char of[32] = "";
        if (!elastic) snprintf(of, sizeof of, "/%ld", total);
        dp_progress_update(&s->progress, done == total,
                           "worker %d  epoch %ld  step %ld%s  %.0f samples/s  loss %.4f  keys %zu  "
                           "staleness %.2f", task, g / spe + 1, done, of,
                           *samples / (dt > 0 ? dt : 1e-9), loss_avg, keys, stale_sum / (done - first));
    }
    return done;
}

int dp_embed_distributed(const dp_train_conf_t *c, volatile sig_atomic_t *stop, char *err)
{
    if (s_check_cluster_conf(c, err) != 0) return -1;
    dp_ps_client_opts_t opts = {.timeout_s = c->timeout_s,
                                .curve = {c->curve_secret, c->curve_server},
                                .transport = c->transport, .wire = c->wire, .compress = c->compress,
                                .stop = stop, .session = dp_ps_session_new()};
    dp_ps_beat_t *beat = NULL;
    if (dp_ps_beat_new(&beat, c->ps ? c->ps : "", c->task_index, opts.session, &opts.curve, err) != 0)
        return -1;
    s_run_t r;
    dp_ps_info_t info;
    int rc = -1;
    if (s_init(&r, c, 0, err) != 0) goto done;
    /* What shard 0 of an elastic crew deals from (a fixed crew's ignore
     * it): the file's batches, as "samples" of spe x batch, so that its
     * per_epoch (samples / batch) is this file's count of batches, a short
     * last one or ones cut at the features' bound included. */
    long spe = r.data.steps_per_epoch;
    opts.deal = (dp_ps_deal_plan_t){.samples = (uint64_t)spe * (uint64_t)c->batch,
                                    .batch = (uint32_t)c->batch,
                                    .epochs = c->steps > 0 ? 0 : (uint64_t)c->epochs,
                                    .steps = c->steps > 0 ? (uint64_t)c->steps : 0};
    if (dp_ps_client_new(&r.ps, c->ps, &r.s.model, c->task_index, &opts, &info, err) != 0 ||
        s_check_cluster(c, &info, err) != 0)
        goto done;
    dp_session_t *s = &r.s;
    int elastic = info.min_workers > 0;
    long total = elastic ? LONG_MAX : s_cluster_steps(c, spe, info.num_workers);
    /* a restarted worker takes up after its last step every shard applied */
    uint64_t held = dp_ps_client_resume_step(r.ps);
    long first = held < (uint64_t)total ? (long)held : total;
    if (first > 0)
        dp_log_info("worker %d: rejoining: the servers hold its steps 1..%ld; resuming at step %ld "
                    "of %ld", c->task_index, first, first + 1, total);
    /* the epochs shard 0 deals: the plan's, or --steps a worker x MAX */
    long epochs = c->steps <= 0 ? c->epochs : (c->steps * info.num_workers + spe - 1) / spe;
    char plan[96];
    if (elastic) snprintf(plan, sizeof plan, "the batches shard 0 deals for %ld epoch(s)", epochs);
    else snprintf(plan, sizeof plan, "%ld steps (batches %d, %d + %d, ...)", total, c->task_index,
                  c->task_index, info.num_workers);
    dp_log_info("worker %d/%d: %s mode, %d shard(s), %s on %" PRIu64 " train samples, batch %d, %s",
                c->task_index, info.num_workers, dp_mode_name(info.mode), info.num_shards,
                s->model.spec, r.data.train_samples, c->batch, plan);
    dp_session_log_start(s, c->task_index, elastic ? -epochs : total, spe);
    /* Elastic: a signal ends the loop at a step's end, never inside one */
    if (elastic) dp_ps_client_set_stop(r.ps, NULL);
    double t0 = dp_now(), samples = 0;
    long done = s_loop_cluster(&r, &info, first, total, stop, &samples, err);
    double train_s = dp_now() - t0;
    dp_progress_done(&s->progress);
    if (done >= 0 && elastic && stop && *stop) {
        rc = dp_train_leave(r.ps, c->task_index, done, (int)*stop, err);
        goto done;
    }
    if (done < 0 || dp_ps_client_finish(r.ps, err) != 0) goto done;
    if (c->task_index == 0) {
        if (s_finish_chief(&r, &info, done, elastic ? (double)epochs : (double)done * info.num_workers / spe,
                           train_s, samples, err) != 0 ||
            dp_ps_client_shutdown_servers(r.ps, err) != 0)
            goto done;
    }
    rc = 0;
done:
    dp_ps_client_destroy(&r.ps);
    s_fini(&r);
    dp_ps_beat_destroy(&beat);
    return rc;
}
