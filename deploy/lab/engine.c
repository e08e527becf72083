/* lab/engine: a cluster in one process over the daemons' own update code (see
 * engine.h). */
#include "deploy/lab/engine.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dataset.h"
#include "common/metrics.h"
#include "common/opts.h"
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/ops.h"
#include "server/core/push_apply.h"
#include "server/core/shard_dc.h"
#include "worker/exec/data.h"
#include "worker/exec/sparse_data.h"
#include "worker/train/a3c_train.h"
#include "worker/train/embed_train.h"

void dp_lab_conf_default(dp_lab_conf_t *c)
{
    memset(c, 0, sizeof *c);
    dp_train_conf_default(&c->train);
    c->train.threads = 1;
    c->train.progress = DP_PROGRESS_OFF;
    c->init_seed = 1;
    c->workers = 1;
    c->shards = 1;
    c->mode = DP_MODE_ASYNC;
    dp_optim_conf_default(&c->optim);
    c->local_steps = 1;
    dp_optim_conf_default(&c->inner);
}

cJSON *dp_lab_conf_header(const dp_lab_conf_t *c)
{
    cJSON *h = cJSON_CreateObject();
    char seed[24];
    cJSON_AddStringToObject(h, "model", c->train.model);
    cJSON_AddStringToObject(h, "data", c->train.data);
    cJSON_AddNumberToObject(h, "batch", c->train.batch);
    if (c->train.train_samples > 0) cJSON_AddNumberToObject(h, "train_samples", c->train.train_samples);
    if (c->train.augment) cJSON_AddBoolToObject(h, "augment", 1);
    if (c->train.normalize) cJSON_AddStringToObject(h, "normalize", c->train.normalize);
    snprintf(seed, sizeof seed, "%" PRIu64, c->train.seed);
    cJSON_AddStringToObject(h, "data_seed", seed); /* uint64: exact as text */
    snprintf(seed, sizeof seed, "%" PRIu64, c->init_seed);
    cJSON_AddStringToObject(h, "seed", seed);
    cJSON_AddNumberToObject(h, "threads", c->train.threads);
    /* the workers' arithmetic; absent: fp32 (a record from before --precision) */
    if (c->train.precision != DP_PRECISION_FP32)
        cJSON_AddStringToObject(h, "precision", dp_precision_name(c->train.precision));
    cJSON_AddNumberToObject(h, "workers", c->workers);
    cJSON_AddNumberToObject(h, "shards", c->shards);
    cJSON_AddStringToObject(h, "mode", dp_mode_name(c->mode));
    cJSON_AddNumberToObject(h, "replicas", c->policy.replicas);
    dp_record_crew_json(h, c->min_workers, c->policy.replicas_frac);
    cJSON_AddNumberToObject(h, "staleness", c->policy.staleness);
    dp_record_delay_json(h, c->policy.delay_lr, c->policy.delay_k);
    cJSON_AddItemToObject(h, "optim", dp_record_optim_json(&c->optim));
    if (c->local_steps > 1) {
        cJSON_AddNumberToObject(h, "local_steps", (double)c->local_steps);
        if (c->dylu) cJSON_AddBoolToObject(h, "local_steps_auto", 1); /* each push's "h" */
        cJSON_AddItemToObject(h, "inner", dp_record_optim_json(&c->inner));
        if (c->train.steps > 0) cJSON_AddNumberToObject(h, "steps", (double)c->train.steps);
    }
    char compress[48];
    dp_compress_name(&c->train.compress, compress, sizeof compress);
    cJSON_AddStringToObject(h, "compress", compress);
    cJSON_AddStringToObject(h, "error_feedback", c->train.compress.error_feedback ? "on" : "off");
    if (c->train.a3c.env) dp_lab_rl_header(h, &c->train.a3c);
    if (c->has_rows) cJSON_AddItemToObject(h, "rows", dp_record_rows_json(&c->rows, c->rows_mode));
    return h;
}

static int s_seed(const cJSON *h, const char *key, uint64_t *out, char *err)
{
    const char *t = dp_record_str(h, key);
    if (!t) return 0; /* absent: keep the default */
    return dp_opts_parse_u64(key, t, out, err);
}

/* h's number at key, when present, into *out: a whole number in [lo, hi]. */
static int s_int_field(const cJSON *h, const char *key, int lo, int hi, int *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return dp_err(err, "record header: '%s' is not a whole number in %d..%d", key, lo, hi);
    *out = (int)d;
    return 0;
}

/* h's fraction at key, when present: a number in (0, 1]. */
static int s_frac_field(const cJSON *h, const char *key, float *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d > 0 && d <= 1)) return dp_err(err, "record header: '%s' is not a number in (0, 1]", key);
    *out = (float)d;
    return 0;
}

/* h's number at key, when present, into *out: a number in [lo, hi]. */
static int s_num_field(const cJSON *h, const char *key, double lo, double hi, float *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi)) return dp_err(err, "record header: '%s' is not a number in [%g, %g]", key, lo, hi);
    *out = (float)d;
    return 0;
}

/* An actor-critic run's RL flags (absent "env": a classifier's record). */
static int s_a3c_from_header(dp_a3c_conf_t *a, const cJSON *h, char *err)
{
    const cJSON *env = cJSON_GetObjectItemCaseSensitive(h, "env");
    if (!env) return 0;
    if (!cJSON_IsString(env)) return dp_err(err, "record header: 'env' is not a string");
    a->env = env->valuestring;
    double steps = dp_record_num(h, "env_steps", (double)a->env_steps);
    if (!(steps >= 1 && steps <= 1e12) || steps != floor(steps))
        return dp_err(err, "record header: 'env_steps' is not a whole number in 1..1e12");
    a->env_steps = (long)steps;
    a->reward_scale = 1; /* a record made before --reward-scale: rewards as they came */
    if (s_int_field(h, "envs", 1, DP_A3C_MAX_ENVS, &a->envs, err) != 0 ||
        s_int_field(h, "t_max", 1, DP_A3C_MAX_T, &a->t_max, err) != 0 ||
        s_num_field(h, "entropy", 0, 100, &a->entropy, err) != 0 ||
        s_num_field(h, "gamma", 0, 1, &a->gamma, err) != 0 ||
        s_num_field(h, "reward_scale", 1e-6, 1e6, &a->reward_scale, err) != 0 ||
        s_num_field(h, "clip_norm", 0, 1e9, &a->clip_norm, err) != 0)
        return -1;
    return 0;
}

int dp_lab_conf_from_header(dp_lab_conf_t *c, const cJSON *h, char *err)
{
    const char *model = dp_record_str(h, "model"), *data = dp_record_str(h, "data");
    const char *mode = dp_record_str(h, "mode");
    if (dp_record_str(h, "init"))
        return dp_err(err, "record header: a run of downpour-ps --init (a tensor table): replay "
                      "recomputes each gradient with Downpour's own network, which a table does "
                      "not have (its schedule is still there to read, one JSON line per push)");
    if (model) c->train.model = model;
    if (data) c->train.data = data;
    /* the workers' data transforms (absent: none), repeated by the replay */
    const cJSON *aug = cJSON_GetObjectItemCaseSensitive(h, "augment");
    if (aug && !cJSON_IsBool(aug)) return dp_err(err, "record header: 'augment' is not true or false");
    c->train.augment = cJSON_IsTrue(aug);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(h, "normalize");
    if (norm && !cJSON_IsString(norm)) return dp_err(err, "record header: 'normalize' is not a string");
    if (norm) c->train.normalize = norm->valuestring;
    /* The header is untrusted: each number is a whole one in its flag's
     * range before it becomes an int (a batch of 2^40 would size every
     * buffer), checked before the cast (a double past INT_MAX is undefined). */
    if (s_int_field(h, "batch", 1, 1 << 16, &c->train.batch, err) != 0 ||
        s_int_field(h, "train_samples", 0, 1 << 30, &c->train.train_samples, err) != 0 ||
        s_int_field(h, "threads", 1, 1024, &c->train.threads, err) != 0 ||
        s_int_field(h, "workers", 1, 100000, &c->workers, err) != 0 ||
        s_int_field(h, "shards", 1, 1024, &c->shards, err) != 0 ||
        s_int_field(h, "replicas", 0, 100000, &c->policy.replicas, err) != 0 ||
        s_int_field(h, "min_workers", 0, 100000, &c->min_workers, err) != 0 ||
        s_frac_field(h, "replicas_frac", &c->policy.replicas_frac, err) != 0 ||
        s_int_field(h, "staleness", 0, 1000000, &c->policy.staleness, err) != 0 ||
        dp_record_delay_parse(h, &c->policy.delay_lr, &c->policy.delay_k, err) != 0)
        return -1;
    if (s_seed(h, "data_seed", &c->train.seed, err) != 0 || s_seed(h, "seed", &c->init_seed, err) != 0)
        return -1;
    if (mode && dp_mode_parse(mode, &c->mode, err) != 0) return -1;
    /* the workers' --precision (absent: a record from before it, fp32) */
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(h, "precision");
    c->train.precision = DP_PRECISION_FP32;
    if (prec && (!cJSON_IsString(prec) || dp_precision_parse(prec->valuestring, &c->train.precision, err) != 0))
        return dp_err(err, "record header: 'precision' is not fp32 or bf16");
    /* the workers' --compress (absent: a record from before it, dense) */
    const char *compress = dp_record_str(h, "compress"), *ef = dp_record_str(h, "error_feedback");
    if ((compress && dp_compress_parse(compress, &c->train.compress, err) != 0) ||
        (ef && dp_compress_ef_parse(ef, &c->train.compress.error_feedback, err) != 0))
        return dp_err(err, "record header: 'compress' is not none, topk:FRACTION or sign, or "
                           "'error_feedback' not on or off");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(h, "optim");
    if (o && dp_record_optim_parse(o, &c->optim, err) != 0) return -1;
    double local = dp_record_num(h, "local_steps", 1), steps = dp_record_num(h, "steps", 0);
    if (!(local >= 1 && local <= 1000000) || local != floor(local) || !(steps >= 0 && steps <= 1e12) ||
        steps != floor(steps))
        return dp_err(err, "record header: local_steps or steps out of range");
    c->local_steps = (long)local;
    c->train.steps = (long)steps;
    const cJSON *dylu = cJSON_GetObjectItemCaseSensitive(h, "local_steps_auto");
    if (dylu && (!cJSON_IsBool(dylu) || c->local_steps < 2))
        return dp_err(err, "record header: 'local_steps_auto' is not true or false with local_steps >= 2");
    c->dylu = cJSON_IsTrue(dylu);
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(h, "inner");
    if (c->local_steps > 1 && (!in || dp_record_optim_parse(in, &c->inner, err) != 0))
        return dp_err(err, "record header: local_steps without a valid inner optimizer");
    if (c->workers < 1 || c->workers > 100000 || c->shards < 1 || c->shards > 1024 ||
        c->train.batch < 1 || c->train.threads < 1)
        return dp_err(err, "record header: workers, shards, batch or threads out of range");
    /* a model with embed:D: the row tables as the shards ran them */
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(h, "rows");
    if (rows) {
        if (dp_record_rows_parse(rows, &c->rows, &c->rows_mode, err) != 0) return -1;
        c->has_rows = 1;
    }
    return s_a3c_from_header(&c->train.a3c, h, err);
}

static const dp_policy_ops_t *s_ops(dp_mode_t m)
{
    return m == DP_MODE_SYNC ? &dp_policy_sync : m == DP_MODE_SSP ? &dp_policy_ssp : &dp_policy_async;
}

/* Shards, member tables (everybody joined, nobody times out) and policies. */
static int s_servers(dp_lab_t *L, char *err)
{
    const dp_lab_conf_t *c = &L->conf;
    L->shard = dp_calloc((size_t)c->shards, sizeof *L->shard);
    L->members = dp_calloc((size_t)c->shards, sizeof *L->members);
    L->policy = dp_calloc((size_t)c->shards, sizeof *L->policy);
    dp_policy_conf_t pc = c->policy;
    dp_optim_conf_t optim = c->optim;
    if (pc.replicas == 0) pc.replicas = c->workers;
    dp_policy_for_mode(c->mode, &pc, &optim, "lab"); /* sync: no delays to act on */
    for (int k = 0; k < c->shards; k++) {
        if (dp_shard_init(&L->shard[k], &L->s.model, k, c->shards, c->init_seed, &optim, err) != 0)
            return -1;
        dp_shard_dc_init(&L->shard[k], c->workers);
        dp_members_init(&L->members[k], c->workers, c->min_workers, k, 0.0);
        L->members[k].quiet = 1;
        /* joined, as their HELLOs would (their live state: the record's or the crew's) */
        for (int w = 0; w < c->workers; w++) L->members[k].w[w].joined = 1;
        if (dp_policy_new(&L->policy[k], s_ops(c->mode), &pc, &L->shard[k], &L->members[k], err) != 0)
            return -1;
        if (c->measure || c->record) dp_policy_measure(L->policy[k]);
    }
    return 0;
}

/* The record, its header from the conf (an actor-critic lab's with the
 * model as parsed: its ac head with the actions written out). */
static int s_record_open(dp_lab_t *L, char *err)
{
    dp_lab_conf_t hc = L->conf;
    if (L->rl) hc.train.model = L->s.model.spec;
    cJSON *h = dp_lab_conf_header(&hc);
    int rc = dp_record_new(&L->rec, L->conf.record, h, err);
    cJSON_Delete(h);
    return rc;
}

/* An actor-critic lab: no data, the workers' environments instead. What
 * the simulator and replay do not do for an RL run is refused here. */
static int s_init_rl(dp_lab_t *L, char *err)
{
    const dp_lab_conf_t *c = &L->conf;
    if (c->local_steps > 1 || c->min_workers > 0)
        return dp_err(err, "--env: an actor-critic run pushes every segment from a fixed crew "
                      "(not with --local-steps or --workers MIN:MAX)");
    /* Every worker's rollout buffers live at once: a bound on them all (a
     * record's header is untrusted; its workers, envs and t_max each pass
     * their own range and still could ask for terabytes together). */
    double rows = (double)c->workers * c->train.a3c.envs * c->train.a3c.t_max;
    if (rows > (double)(1 << 24))
        return dp_err(err, "--env: %d workers x %d environments x %d steps are %.0f rows of rollouts, "
                      "more than %d in one process", c->workers, c->train.a3c.envs, c->train.a3c.t_max,
                      rows, 1 << 24);
    if (dp_lab_rl_session(&L->s, &L->conf.train, err) != 0) return -1;
    L->rl = dp_malloc(sizeof *L->rl);
    if (dp_lab_rl_init(L->rl, &c->train, c->workers, err) != 0) {
        free(L->rl);
        L->rl = NULL;
        return -1;
    }
    L->per_worker = dp_calloc((size_t)c->workers, sizeof *L->per_worker);
    if (c->train.compress.kind != DP_COMPRESS_NONE)
        L->z = dp_calloc((size_t)c->workers * (size_t)c->shards, sizeof *L->z);
    return s_servers(L, err);
}

int dp_lab_is_sparse(const dp_lab_conf_t *c)
{
    if (c->train.data && dp_sparse_data_is(c->train.data)) return 1;
    /* the model as the worker parses it (its input the embedding's); a
     * model that does not parse so is no sparse one: the session says why */
    dp_model_t m;
    char why[DP_ERR_LEN];
    return c->train.model && dp_model_parse(&m, c->train.model, 1, 1, 1, why) == 0 && m.embed_dim > 0;
}

int dp_lab_check_dense(const dp_lab_conf_t *c, char *err)
{
    if (dp_lab_is_sparse(c) && !c->has_rows)
        return dp_err(err, "a model with embed:D (a row table on the servers) needs the row tables' "
                      "conf: a record header's \"rows\" (downpour replay) or the servers' row flags "
                      "(downpour sim: --rows-mode, --row-optimizer, --row-lr, --row-init)");
    return 0;
}

/* A sparse lab (deploy/lab/sparse.h): its session, data and row tables,
 * then the shards as any lab's. */
static int s_init_sparse(dp_lab_t *L, char *err)
{
    if (dp_lab_sparse_init(L, err) != 0 || s_servers(L, err) != 0) return -1;
    L->per_worker = dp_calloc((size_t)L->conf.workers, sizeof *L->per_worker);
    return L->conf.record ? s_record_open(L, err) : 0;
}

int dp_lab_init(dp_lab_t *L, const dp_lab_conf_t *c, char *err)
{
    memset(L, 0, sizeof *L);
    if (dp_lab_check_dense(c, err) != 0) return -1;
    L->conf = *c;
    L->conf.train.local_steps = c->local_steps; /* its summary names them */
    L->test_auc = NAN;
    if (dp_lab_is_sparse(c)) {
        if (s_init_sparse(L, err) != 0) {
            dp_lab_fini(L);
            return -1;
        }
        return 0;
    }
    if (c->train.a3c.env) {
        if (s_init_rl(L, err) != 0 || (c->record && s_record_open(L, err) != 0)) {
            dp_lab_fini(L);
            return -1;
        }
        return 0;
    }
    if (dp_session_init(&L->s, &L->conf.train, err) != 0) return -1;
    if (s_servers(L, err) != 0) goto fail;
    int B = c->train.batch;
    L->idx = dp_malloc((size_t)B * sizeof *L->idx);
    L->x = dp_malloc((size_t)B * dp_dataset_sample_size(&L->s.train) * sizeof *L->x);
    L->y = dp_malloc((size_t)B * sizeof *L->y);
    L->aug_tmp = dp_malloc(dp_dataset_sample_size(&L->s.train) * sizeof *L->aug_tmp);
    L->per_worker = dp_calloc((size_t)c->workers, sizeof *L->per_worker);
    if (c->local_steps > 1) {
        L->inner_state = dp_calloc((size_t)c->workers, sizeof *L->inner_state);
        L->w_local = dp_aligned_alloc((L->s.model.n_floats + 1) * sizeof(float));
        L->round_h = dp_calloc((size_t)c->workers, sizeof *L->round_h);
        L->round_n = dp_calloc((size_t)c->workers, sizeof *L->round_n);
        L->next_data = dp_calloc((size_t)c->workers, sizeof *L->next_data);
    }
    if (c->train.compress.kind != DP_COMPRESS_NONE && dp_model_has_state(&L->s.model)) {
        dp_err(err, "%s", DP_COMPRESS_STATE_REFUSED);
        goto fail;
    }
    if (c->train.compress.kind != DP_COMPRESS_NONE)
        L->z = dp_calloc((size_t)c->workers * (size_t)c->shards, sizeof *L->z);
    if (dp_data_steps_per_epoch(L->s.train.n, B, c->workers) < 1) {
        dp_err(err, "%d workers at batch %d need more than the %d training samples", c->workers, B,
               L->s.train.n);
        goto fail;
    }
    if (c->record) {
        cJSON *h = dp_lab_conf_header(c);
        int rc = dp_record_new(&L->rec, c->record, h, err);
        cJSON_Delete(h);
        if (rc != 0) goto fail;
    }
    return 0;
fail:
    dp_lab_fini(L);
    return -1;
}

void dp_lab_fini(dp_lab_t *L)
{
    dp_record_abandon(&L->rec);
    for (int k = 0; L->shard && k < L->conf.shards; k++) {
        dp_policy_destroy(&L->policy[k]);
        dp_members_fini(&L->members[k]);
        dp_shard_fini(&L->shard[k]);
    }
    for (int w = 0; L->per_worker && w < L->conf.workers; w++) dp_staleness_fini(&L->per_worker[w]);
    free(L->per_worker);
    for (int w = 0; L->inner_state && w < L->conf.workers; w++)
        if (L->inner_state[w]) L->s.be->ops->release(L->s.be, L->inner_state[w]);
    free(L->inner_state);
    free(L->w_local);
    free(L->round_h);
    free(L->round_n);
    free(L->next_data);
    for (size_t i = 0; L->z && i < (size_t)L->conf.workers * (size_t)L->conf.shards; i++)
        if (L->z[i]) {
            dp_compressor_fini(L->z[i]);
            free(L->z[i]);
        }
    free(L->z);
    free(L->shard);
    free(L->members);
    free(L->policy);
    free(L->idx);
    free(L->x);
    free(L->y);
    free(L->aug_tmp);
    if (L->rl) {
        dp_lab_rl_fini(L->rl);
        free(L->rl);
    }
    dp_lab_sparse_fini(L);
    dp_session_fini(&L->s);
    memset(L, 0, sizeof *L);
}

void dp_lab_params(const dp_lab_t *L, int k, float *params)
{
    for (int i = 0; i < L->conf.shards; i++) {
        if (k >= 0 && i != k) continue;
        const dp_shard_t *s = &L->shard[i];
        memcpy(params + s->lo, s->w, s->n * sizeof(float));
    }
}

void dp_lab_pulled(dp_lab_t *L, int worker)
{
    for (int k = 0; k < L->conf.shards; k++) dp_shard_dc_pulled(&L->shard[k], worker);
}

/* One training step of worker at its data step (on the batch dealt, if
 * any) on the net's parameters. */
static float s_train_step(dp_lab_t *L, int worker, long step, const dp_deal_batch_t *dealt)
{
    int B = L->conf.train.batch;
    char err[DP_ERR_LEN];
    if (!dealt)
        dp_data_batch_indices(L->s.train.n, B, worker, L->conf.workers, L->conf.train.seed, step, L->idx);
    else if (dp_data_dealt_indices(L->s.train.n, B, L->conf.train.seed, dealt->epoch, dealt->index,
                                   L->idx, err) != 0)
    {
        dp_log_warn("lab: %s", err); /* a misuse: the caller checks it (engine.h) */
        abort();
    }
    dp_dataset_gather(&L->s.train, L->idx, B, L->x, L->y);
    /* dropout's mask as the worker daemon draws it (worker/train/train.c): by
     * its data step and its slice's place in the global batch */
    L->s.net.step = (unsigned long long)step;
    L->s.net.sample0 = (unsigned long long)worker * (unsigned long long)B;
    if (L->conf.train.augment) /* as the worker's prefetch thread does (worker/exec/data.h) */
        dp_data_augment(&L->s.train, L->x, B, L->conf.train.seed, step,
                        (unsigned long long)worker * (unsigned long long)B, L->aug_tmp);
    return dp_net_train_step(&L->s.net, L->x, L->y, B);
}

/* The data steps of a round from first of h steps: fewer at conf.train.steps. */
static long s_round_steps(const dp_lab_t *L, long first, long h)
{
    long end = first + h;
    if (L->conf.train.steps > 0 && end > L->conf.train.steps) end = L->conf.train.steps;
    return end > first ? end - first : 0;
}

long dp_lab_push_steps(const dp_lab_t *L, int worker, long step)
{
    long H = L->conf.local_steps;
    if (H <= 1) return 1;
    if (L->conf.dylu) return L->round_n[worker];
    return s_round_steps(L, step * H, H);
}

void dp_lab_round(dp_lab_t *L, int worker, long h)
{
    if (L->round_h) L->round_h[worker] = h;
}

/* A round of local steps (dp_lab_gradient): H data steps from round * H,
 * or with DyLU the worker's own h from where its last round ended. */
static float s_local_round(dp_lab_t *L, const float *params, int worker, long round, float *grad)
{
    const dp_lab_conf_t *c = &L->conf;
    size_t n = L->s.model.n_floats;
    size_t n_state = n * (size_t)dp_optim_state_floats(&c->inner);
    if (!L->inner_state[worker])
        L->inner_state[worker] = n_state ? L->s.be->ops->alloc(L->s.be, n_state * sizeof(float)) : NULL;
    long h = c->dylu && L->round_h[worker] > 0 ? L->round_h[worker] : c->local_steps;
    long first = c->dylu ? L->next_data[worker] : round * c->local_steps;
    long end = first + s_round_steps(L, first, h);
    L->round_n[worker] = end - first;
    L->next_data[worker] = end;
    dp_net_set_params(&L->s.net, params);
    float loss = 0;
    for (long step = first; step < end; step++) {
        loss += s_train_step(L, worker, step, NULL) / (float)(c->dylu ? end - first : c->local_steps);
        dp_net_optim_step(&L->s.net, &c->inner, dp_optim_lr_at(&c->inner, step),
                          L->inner_state[worker], step + 1);
    }
    dp_net_get_params(&L->s.net, L->w_local);
    dp_net_pseudo_gradient(&L->s.net, params, L->w_local, grad);
    return loss;
}

float dp_lab_gradient(dp_lab_t *L, const float *params, int worker, long step,
                      const dp_deal_batch_t *dealt, float *grad)
{
    if (L->rl) return dp_lab_rl_gradient(L->rl, &L->s, &L->conf.train.a3c, params, worker, step, grad);
    if (L->conf.local_steps > 1) return s_local_round(L, params, worker, step, grad);
    dp_net_set_params(&L->s.net, params);
    float loss = s_train_step(L, worker, step, dealt);
    dp_net_get_grads(&L->s.net, grad);
    return loss;
}

void dp_lab_push(dp_lab_t *L, int k, int worker, long step, uint64_t version, const float *grad,
                 const dp_deal_batch_t *dealt, dp_push_outcome_t *o)
{
    dp_shard_t *s = &L->shard[k];
    dp_grad_slice_t g = {grad + s->lo, s->n * sizeof(float), s->lo};
    uint64_t bytes = s->n * sizeof(float);
    if (L->z) {
        /* as the worker's client compresses the slice and the shard expands
         * it (into its scratch, as downpour-ps does): the same floats */
        dp_compressor_t **z = &L->z[(size_t)worker * (size_t)L->conf.shards + (size_t)k];
        if (!*z) {
            *z = dp_malloc(sizeof **z);
            dp_compressor_init(*z, &L->conf.train.compress, s->n);
        }
        bytes = dp_compressor_encode(*z, grad + s->lo);
        dp_compressor_expand(*z, s->scratch);
        g.data = s->scratch;
    }
    if (worker == 0) L->bytes_chief += bytes;
    /* the daemon's own rules (server/core/push_apply.h), as downpour-ps applies an admitted push */
    const dp_push_apply_t a = {.policy = L->policy[k], .rows = L->sp ? &L->sp->rows[k] : NULL,
                               .rec = L->rec, .members = &L->members[k], .shard = k};
    dp_push_apply(&a, worker, version, &g, 1, false, o);
    L->pushes++;
    if (o->status == DP_PUSH_APPLIED && k == 0) dp_staleness_add(&L->per_worker[worker], o->staleness);
    if (L->conf.dylu) dp_record_round(L->rec, (uint64_t)L->round_n[worker]); /* as Push.local_steps */
    dp_push_apply_record(&a, worker, (uint64_t)step + 1, version, o, s->version, dealt);
}

void dp_lab_push_rl(dp_lab_t *L, int k, int worker, long step, uint64_t version, const float *grad,
                    const dp_lab_seg_t *g, dp_push_outcome_t *o)
{
    dp_record_account(L->rec, g->env_steps, (uint64_t)g->n, dp_lab_seg_returns(g));
    dp_lab_push(L, k, worker, step, version, grad, NULL, o);
    if (k == 0) dp_lab_rl_count(L->rl, g);
}

int dp_lab_members(dp_lab_t *L, int k, const char *state, int call)
{
    dp_members_t *m = &L->members[k];
    for (int i = 0; i < m->n && state[i]; i++) {
        m->w[i].finished = state[i] == 'F' || state[i] == 'X';
        m->w[i].left = state[i] == 'X';
        m->w[i].gone = state[i] == 'G';
    }
    if (!call) return 0;
    dp_record_members(L->rec, k, m);
    return dp_policy_members_changed(L->policy[k]);
}

int dp_lab_crew(dp_lab_t *L, int worker, dp_lab_crew_t what)
{
    int moved = 0;
    for (int k = 0; k < L->conf.shards; k++) {
        dp_members_t *m = &L->members[k];
        switch (what) {
        case DP_LAB_JOIN: dp_members_join(m, worker); break;
        case DP_LAB_LEAVE: dp_members_finish(m, worker, 1); break;
        case DP_LAB_FINISH: dp_members_finish(m, worker, 0); break;
        case DP_LAB_DIE: dp_members_drop(m, worker); break;
        }
        dp_record_members(L->rec, k, m);
        int v = dp_policy_members_changed(L->policy[k]);
        if (k == 0) moved = v;
    }
    return moved;
}

void dp_lab_counts(const dp_lab_t *L, dp_shard_counts_t *c, dp_staleness_t *all)
{
    *c = L->shard[0].counts;
    dp_staleness_init(all);
    dp_staleness_merge(all, &L->policy[0]->staleness);
}

/* An actor-critic run's end, as the worker's chief ends it
 * (worker/train/a3c_train.c): the greedy test return on the final weights, the
 * model file, summary.json with the run's account. */
static int s_finish_rl(dp_lab_t *L, long chief_steps, double train_s, char *err)
{
    const dp_lab_conf_t *c = &L->conf;
    dp_lab_rl_t *r = L->rl;
    float *params = L->s.h_params;
    dp_lab_params(L, -1, params);
    dp_net_set_params(&L->s.net, params);
    r->test_return = dp_a3c_test_return(r->kind, &L->s.net, c->train.seed, 0, DP_A3C_TEST_EPISODES);
    dp_shard_counts_t cnt;
    dp_staleness_t hist;
    dp_lab_counts(L, &cnt, &hist);
    uint64_t versions = 0; /* the chief's STATS view: summed over the shards */
    for (int k = 0; k < c->shards; k++) versions += L->shard[k].version;
    dp_rl_summary_t rl = {
        .kind = r->kind, .env_steps = r->run.env_steps, .episodes = r->run.episodes,
        .return_mean_100 = dp_episodes_mean(&r->run), .test_return = r->test_return,
        .solved_at = r->run.solved_at, .curve_at = r->run.curve_at, .curve_mean = r->run.curve_mean,
        .n_curve = r->run.n_curve,
    };
    dp_run_summary_t s = {
        .mode = dp_mode_name(c->mode), .workers = c->workers, .ps_shards = c->shards,
        .model = L->s.model.spec, .steps = chief_steps, .train_s = train_s, .t_start = L->s.t_start,
        .optim = &L->shard[0].optim, .version = versions, .applied = cnt.applied,
        .dropped = cnt.dropped, .rejected = cnt.rejected, .staleness_max = hist.max,
        .staleness_mean = dp_staleness_mean(&hist), .staleness_hist = &hist, .rl = &rl,
    };
    int rc = 0;
    if (c->train.save)
        rc = dp_checkpoint_save(c->train.save, &L->s.model, params, chief_steps, (long)versions, NULL, err);
    if (rc == 0) rc = dp_train_summary_write(&c->train, &s, err);
    if (rc == 0) rc = dp_record_close(&L->rec, err);
    dp_staleness_fini(&hist);
    return rc;
}

/* A sparse run's --save as its chief writes it: the dense layers and the
 * shards' rows in key order, with the servers' init and seed. */
static int s_save_sparse(dp_lab_t *L, const float *params, long steps, long version, char *err)
{
    const dp_lab_conf_t *c = &L->conf;
    dp_rows_t **tables = dp_calloc((size_t)c->shards, sizeof *tables);
    for (int k = 0; k < c->shards; k++) tables[k] = L->sp->rows[k].table;
    uint64_t *keys;
    float *rows;
    size_t n = dp_embed_rows_of(tables, c->shards, &keys, &rows);
    const dp_ps_rows_t *r0 = &L->sp->rows[0];
    int rc = dp_embed_save_file(c->train.save, &L->s.model, params, steps, version, keys, rows, n,
                                r0->init, r0->seed, c->train.batch, NULL, err);
    free(tables), free(keys), free(rows);
    return rc;
}

int dp_lab_finish(dp_lab_t *L, long chief_steps, double train_s, const struct dp_ps_membership *crew,
                  double *accuracy, double *loss, char *err)
{
    if (L->rl) {
        if (accuracy) *accuracy = 0;
        if (loss) *loss = 0;
        return s_finish_rl(L, chief_steps, train_s, err);
    }
    const dp_lab_conf_t *c = &L->conf;
    float *params = L->s.h_params;
    dp_lab_params(L, -1, params);
    dp_net_set_params(&L->s.net, params);
    double acc = 0, test_loss = 0;
    if (L->sp) {
        if (dp_lab_sparse_evaluate(L, &acc, &test_loss, &L->test_auc, err) != 0) return -1;
    } else {
        dp_session_evaluate(&L->s, 0, &acc, &test_loss);
    }
    if (accuracy) *accuracy = acc;
    if (loss) *loss = test_loss;
    dp_shard_counts_t cnt;
    dp_staleness_t hist;
    dp_lab_counts(L, &cnt, &hist);
    /* an epoch in the chief's steps (a sparse run: the file's batches shared by the crew) */
    long spe = L->sp ? (L->sp->data[0].steps_per_epoch + c->workers - 1) / c->workers
                     : dp_data_steps_per_epoch(L->s.train.n, c->train.batch, c->workers);
    uint64_t *held = L->sp ? dp_calloc((size_t)c->shards, sizeof *held) : NULL;
    for (int k = 0; held && k < c->shards; k++) {
        dp_ps_rows_stats_t st;
        dp_ps_rows_stats(&L->sp->rows[k], &st);
        held[k] = st.rows;
    }
    dp_sparse_summary_t sparse = {.test_auc = L->test_auc, .rows = held, .tables = c->shards};
    char rule[48], dc[48]; /* as the servers ran them: sync turned them off */
    dp_delay_lr_name(L->policy[0]->conf.delay_lr, L->policy[0]->conf.delay_k, rule, sizeof rule);
    dp_optim_dc_name(&L->shard[0].optim, dc, sizeof dc);
    dp_run_summary_t r = {
        .mode = dp_mode_name(c->mode), .workers = c->workers, .ps_shards = c->shards,
        .replicas = c->policy.replicas ? c->policy.replicas : c->workers,
        .staleness = c->mode == DP_MODE_SSP ? c->policy.staleness : -1,
        .steps = chief_steps, .epochs = (double)chief_steps / (double)spe,
        .test_accuracy = acc, .test_loss = test_loss,
        .images_per_s_per_worker = (double)chief_steps * c->train.batch / (train_s > 0 ? train_s : 1e-9),
        .train_s = train_s, .version = L->shard[0].version, .applied = cnt.applied,
        .dropped = cnt.dropped, .rejected = cnt.rejected,
        .staleness_mean = dp_staleness_mean(&hist), .staleness_max = hist.max,
        .staleness_hist = &hist, /* the simulated servers' optimizer, or the workers' inner */
        .optim = c->local_steps > 1 ? &c->inner : &c->optim,
        .outer = c->local_steps > 1 ? &c->optim : NULL,
        .delay_lr = rule, .delay_compensation = dc, .bytes_pushed = L->bytes_chief,
        .membership = crew, .min_workers = c->min_workers, .sparse = L->sp ? &sparse : NULL,
    };
    /* The chief's STATS view: the versions summed over the shards. */
    uint64_t versions = 0;
    for (int k = 0; k < c->shards; k++) versions += L->shard[k].version;
    r.version = versions;
    int rc;
    if (held) { /* the chief's file (worker/train/embed_train.h): the dense layers, every shard's rows */
        rc = c->train.save ? s_save_sparse(L, params, chief_steps, (long)versions, err) : 0;
    } else {
        rc = dp_session_save(&L->s, chief_steps, (long)versions, err);
    }
    if (rc == 0) rc = dp_session_summary(&L->s, &r, err);
    if (rc == 0) rc = dp_record_close(&L->rec, err);
    dp_staleness_fini(&hist);
    free(held);
    return rc;
}
