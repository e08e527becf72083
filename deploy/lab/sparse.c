/* lab/sparse: a sparse model's row tables, batches and compute in the lab
 * (see sparse.h), over the daemons' own code: server/core/ps_rows.h's rules,
 * worker/exec/sparse_data.h's batches, kernels/embed.h's stage and
 * worker/train/embed_train.h's evaluation. */
#include "deploy/lab/engine.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/ops.h"
#include "server/core/record.h"
#include "worker/train/embed_train.h"

void dp_lab_batch_free(dp_lab_batch_t *j)
{
    dp_libsvm_batch_destroy(&j->batch);
    free(j->keys), free(j->rows), free(j->grads);
    memset(j, 0, sizeof *j);
}

/* A copy of b, sized to what it holds. */
static dp_libsvm_batch_t *s_batch_copy(const dp_libsvm_batch_t *b)
{
    size_t nnz = b->offsets[b->n];
    dp_libsvm_batch_t *c = dp_libsvm_batch_new(b->n ? b->n : 1, nnz ? nnz : 1);
    c->n = b->n;
    memcpy(c->labels, b->labels, b->n * sizeof *c->labels);
    memcpy(c->offsets, b->offsets, (b->n + 1) * sizeof *c->offsets);
    memcpy(c->keys, b->keys, nnz * sizeof *c->keys);
    memcpy(c->values, b->values, nnz * sizeof *c->values);
    memcpy(c->lines, b->lines, b->n * sizeof *c->lines);
    return c;
}

int dp_lab_batch_load(dp_lab_t *L, int worker, long step, dp_lab_batch_t *j, char *err)
{
    dp_lab_sparse_t *sp = L->sp;
    dp_sparse_data_t *d = &sp->data[worker % sp->readers];
    /* the embed kind's cluster order: worker i of N trains batches i, i + N, ... */
    if (step < 0 || step > (LONG_MAX - worker) / L->conf.workers)
        return dp_err(err, "worker %d's step %ld: past the batches a run can count", worker, step);
    long g = step * L->conf.workers + worker;
    if (dp_sparse_data_seek(d, g, err) != 0 || dp_sparse_data_next(d, err) < 0) return -1;
    dp_lab_batch_free(j);
    j->batch = s_batch_copy(d->batch);
    j->n_keys = dp_embed_plan(&sp->stage, j->batch);
    size_t U = j->n_keys ? j->n_keys : 1, D = (size_t)sp->dim;
    j->keys = dp_malloc(U * sizeof *j->keys);
    memcpy(j->keys, sp->stage.keys, j->n_keys * sizeof *j->keys);
    j->rows = dp_calloc(U * D, sizeof *j->rows);
    j->grads = dp_calloc(U * D, sizeof *j->grads);
    return 0;
}

/* Shard k's part of keys[0..n) into sp->part_keys, in their order (the
 * client's stable grouping, worker/client/ps_rows.c), their places in part_pos:
 * the part's count. */
static size_t s_part(dp_lab_sparse_t *sp, int k, int shards, const uint64_t *keys, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (dp_rows_shard_of(keys[i], (uint32_t)shards) == (uint32_t)k) {
            sp->part_keys[m] = keys[i];
            sp->part_pos[m++] = i;
        }
    return m;
}

/* Shard k answers worker's pull of keys[0..n): its part's rows into their
 * places in rows (n x D). The part's count, or -1 with err. */
static long s_pull(dp_lab_t *L, int k, int worker, const uint64_t *keys, size_t n, float *rows, char *err)
{
    dp_lab_sparse_t *sp = L->sp;
    size_t m = s_part(sp, k, L->conf.shards, keys, n), D = (size_t)sp->dim;
    if (dp_ps_rows_pull(&sp->rows[k], worker, sp->part_keys, m, sp->part_rows, err) < 0) return -1;
    for (size_t i = 0; i < m; i++)
        memcpy(rows + sp->part_pos[i] * D, sp->part_rows + i * D, D * sizeof *rows);
    dp_record_rows_pull(L->rec, k, worker, L->shard[k].version, (uint64_t)m);
    return (long)m;
}

long dp_lab_rows_pull(dp_lab_t *L, int k, int worker, dp_lab_batch_t *j, char *err)
{
    return s_pull(L, k, worker, j->keys, j->n_keys, j->rows, err);
}

float dp_lab_sparse_gradient(dp_lab_t *L, const float *params, int worker, long step, dp_lab_batch_t *j,
                             float *grad)
{
    (void)worker; /* the embed worker's dropout mask starts at sample 0 whoever it is */
    dp_lab_sparse_t *sp = L->sp;
    dp_net_t *net = &L->s.net;
    const dp_libsvm_batch_t *b = j->batch;
    int n = (int)b->n;
    dp_embed_plan(&sp->stage, b); /* the same keys as at load: the plan is a function of the batch */
    dp_embed_forward(&sp->stage, sp->x, b, j->rows);
    for (int i = 0; i < n; i++) sp->y[i] = (int)b->labels[i];
    dp_net_set_params(net, params);
    net->step = (unsigned long long)step;
    float loss = dp_net_train_step(net, sp->x, sp->y, n);
    dp_net_get_input_grad(net, sp->dx, n);
    dp_embed_backward(&sp->stage, j->grads, b, sp->dx);
    dp_net_get_grads(net, grad);
    return loss;
}

size_t dp_lab_rows_push(dp_lab_t *L, int k, int worker, uint64_t step, uint64_t pulled_at,
                        const dp_lab_batch_t *j, dp_push_outcome_t *o, double *norm, int *repeat)
{
    dp_lab_sparse_t *sp = L->sp;
    size_t m = s_part(sp, k, L->conf.shards, j->keys, j->n_keys), D = (size_t)sp->dim;
    for (size_t i = 0; i < m; i++) /* each shard's rows together, as the client sends them */
        memcpy(sp->part_rows + i * D, j->grads + sp->part_pos[i] * D, D * sizeof *sp->part_rows);
    *norm = dp_record_rows_norm(sp->part_rows, m * D);
    *repeat = dp_ps_rows_push(&sp->rows[k], worker, step, pulled_at, L->shard[k].version, sp->dim,
                              sp->part_keys, m, sp->part_rows, o);
    if (!*repeat)
        dp_record_rows_push(L->rec, k, worker, step, pulled_at, o, m,
                            o->status == DP_PUSH_REJECTED ? NULL : sp->part_rows, sp->dim);
    return m;
}

int dp_lab_sparse_init(dp_lab_t *L, char *err)
{
    const dp_lab_conf_t *c = &L->conf;
    dp_session_t *s = &L->s;
    s->conf = c->train;
    s->t_start = dp_now();
    snprintf(s->train.name, sizeof s->train.name, "libsvm");
    if (c->train.threads > 0) dp_cpu_set_threads(c->train.threads);
    /* as the worker parses it (worker/train/embed_train.c): the input is the embedding's */
    if (dp_model_parse(&s->model, c->train.model, 1, 1, 1, err) != 0) return -1;
    int D = s->model.embed_dim, B = c->train.batch, W = c->workers;
    if (D != c->rows.width)
        return dp_err(err, "model '%s' embeds in %d floats but the row tables' rows are %d wide",
                      s->model.spec, D, c->rows.width);
    if (s->model.classes != 2)
        return dp_err(err, "model '%s' ends in %d classes; a sparse model's libsvm labels are 0 and 1",
                      s->model.spec, s->model.classes);
    if (c->local_steps > 1 || c->min_workers > 0 || c->train.compress.kind != DP_COMPRESS_NONE)
        return dp_err(err, "a model with embed:D trains a fixed crew, every step pushed, uncompressed "
                      "(not --local-steps, --workers MIN:MAX or --compress)");
    /* the header is untrusted: every shard keeps a worker's pulled keys
     * and its push (dp_ps_rows_init), so their product is bounded first */
    if ((double)W * c->shards > (double)(1 << 20))
        return dp_err(err, "a model with embed:D: %d workers x %d shards are more row tables' worker "
                      "slots than %d in one process", W, c->shards, 1 << 20);
    dp_lab_sparse_t *sp = L->sp = dp_calloc(1, sizeof *L->sp);
    sp->dim = D;
    sp->max_nnz = dp_sparse_batch_nnz(B);
    sp->readers = W < DP_LAB_SPARSE_READERS ? W : DP_LAB_SPARSE_READERS;
    sp->data = dp_calloc((size_t)sp->readers, sizeof *sp->data);
    for (int i = 0; i < sp->readers; i++)
        if (dp_sparse_data_open(&sp->data[i], c->train.data, B, err) != 0) return -1;
    if (dp_embed_init(&sp->stage, D, sp->max_nnz, err) != 0 ||
        dp_backend_new_in(&s->be, c->train.device, c->train.precision, err) != 0 ||
        dp_net_init(&s->net, &s->model, s->be, B, err) != 0)
        return -1;
    s->net.seed = c->train.seed; /* dropout's mask, as the worker's */
    size_t bytes = s->model.n_floats * sizeof(float), nnz = sp->max_nnz;
    s->h_params = s->be->ops->host_alloc(s->be, bytes);
    s->h_grads = s->be->ops->host_alloc(s->be, bytes);
    sp->x = dp_malloc((size_t)B * (size_t)D * sizeof *sp->x);
    sp->dx = dp_malloc((size_t)B * (size_t)D * sizeof *sp->dx);
    sp->y = dp_malloc((size_t)B * sizeof *sp->y);
    sp->part_keys = dp_malloc(nnz * sizeof *sp->part_keys);
    sp->part_pos = dp_malloc(nnz * sizeof *sp->part_pos);
    sp->part_rows = dp_malloc(nnz * (size_t)D * sizeof *sp->part_rows);
    sp->row_w = dp_malloc(nnz * (size_t)D * sizeof *sp->row_w);
    sp->scores = dp_malloc((sp->data[0].test_samples + 1) * sizeof *sp->scores);
    sp->labels = dp_malloc((sp->data[0].test_samples + 1) * sizeof *sp->labels);
    sp->rows = dp_calloc((size_t)c->shards, sizeof *sp->rows);
    for (int k = 0; k < c->shards; k++) /* as each downpour-ps sets up its table (server/loop/ps.c) */
        if (dp_ps_rows_init(&sp->rows[k], D, &c->rows, c->rows_mode, c->mode, (uint32_t)k,
                            (uint32_t)c->shards, W, err) != 0)
            return -1;
    return dp_session_init_outputs(s, err);
}

void dp_lab_sparse_fini(dp_lab_t *L)
{
    dp_lab_sparse_t *sp = L->sp;
    if (!sp) return;
    for (int i = 0; sp->data && i < sp->readers; i++) dp_sparse_data_close(&sp->data[i]);
    for (int k = 0; sp->rows && k < L->conf.shards; k++) dp_ps_rows_fini(&sp->rows[k]);
    dp_embed_fini(&sp->stage);
    free(sp->data), free(sp->rows), free(sp->x), free(sp->dx), free(sp->y);
    free(sp->part_keys), free(sp->part_pos), free(sp->part_rows), free(sp->row_w);
    free(sp->scores), free(sp->labels);
    free(sp);
    L->sp = NULL;
}

/* The evaluation's rows: every shard's part, pulled as the chief's
 * ROWS_PULLs are (worker 0, the tables as they end). */
static int s_eval_rows(void *arg, const uint64_t *keys, size_t n, int d, float *rows, char *err)
{
    (void)d; /* the stage's: sp->dim */
    dp_lab_t *L = arg;
    for (int k = 0; k < L->conf.shards; k++)
        if (s_pull(L, k, 0, keys, n, rows, err) < 0) return -1;
    return 0;
}

int dp_lab_sparse_evaluate(dp_lab_t *L, double *acc, double *loss, double *auc, char *err)
{
    dp_lab_sparse_t *sp = L->sp;
    float *params = L->s.h_params;
    dp_lab_params(L, -1, params);
    dp_net_set_params(&L->s.net, params);
    /* the chief's reader: its test file (every worker's is the same file) */
    dp_embed_eval_t e = {.net = &L->s.net, .data = &sp->data[0], .stage = &sp->stage, .rows = s_eval_rows,
                         .arg = L, .x = sp->x, .row_w = sp->row_w, .scores = sp->scores,
                         .labels = sp->labels, .y = sp->y};
    return dp_embed_evaluate(&e, acc, loss, auc, err);
}
