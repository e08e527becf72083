/* downpour: libdownpour.so, the public face of the C worker's client
 * (downpour.h). Every request goes through worker/client/ps_client.h and its
 * heartbeats through worker/client/ps_beat.h, exactly as downpour-worker makes
 * them; what lives here is only the translation: a table or spec into a
 * dp_model_t, options into dp_ps_client_opts_t, TF_CONFIG into endpoints,
 * and a pull's ranges into the caller's per-tensor buffers.
 *
 * Only the downpour_* symbols leave the library (worker/lib/downpour.map),
 * so the dp_* code inside never clashes with a program's own. */
#include "worker/lib/downpour.h"

#include <inttypes.h>
#include <math.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dylu.h"
#include "common/cluster.h"
#include "common/model.h"
#include "common/rng.h"
#include "common/util.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"
#include "worker/client/ps_socket.h"

struct downpour {
    dp_model_t *model;             /* the table or spec; the client points at it */
    dp_ps_client_t *ps;
    dp_ps_beat_t *beat;
    dp_ps_info_t info;
    int task_index;
    char endpoints[DP_ZSOCK_MAX_SHARDS * DP_ZSOCK_ENDPOINT_LEN]; /* as connected */
    volatile sig_atomic_t stop;    /* downpour_interrupt */
    bool dealing;                  /* downpour_deal_plan: pulls ask shard 0 for a batch */
    uint64_t pushed;               /* the last step pushed (resume_step at first) */
    uint32_t round_steps;          /* DyLU: the next push's round (downpour_push_round; 0: none), */
    double own_ms, crew_ms;        /* ... this worker's step time (EWMA) and the crew's fastest */
};

/* The calling thread's last failure (downpour_last_error). */
static _Thread_local char s_err[DP_ERR_LEN];
static _Thread_local downpour_err_t s_code;

static void s_ok(void)
{
    s_err[0] = '\0';
    s_code = DOWNPOUR_OK;
}

static int s_fail(downpour_err_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_fail(downpour_err_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_err, sizeof s_err, fmt, ap);
    va_end(ap);
    s_code = code;
    return -1;
}

static downpour_err_t s_kind(dp_ps_err_t k)
{
    switch (k) {
    case DP_PS_OK: return DOWNPOUR_OK;
    case DP_PS_ERR_TIMEOUT: return DOWNPOUR_ERR_TIMEOUT;
    case DP_PS_ERR_DEFERRED: return DOWNPOUR_ERR_DEFERRED;
    case DP_PS_ERR_INTERRUPTED: return DOWNPOUR_ERR_INTERRUPTED;
    case DP_PS_ERR_REFUSED: return DOWNPOUR_ERR_REFUSED;
    case DP_PS_ERR_MODEL_MISMATCH: return DOWNPOUR_ERR_MODEL_MISMATCH;
    default: return DOWNPOUR_ERR_OTHER;
    }
}

/* A failed client call: its text is in s_err already, its kind from the client. */
static int s_client_failed(const downpour_t *h)
{
    s_code = s_kind(dp_ps_client_error(h->ps));
    return -1;
}

const char *downpour_version(void)
{
    return DOWNPOUR_VERSION;
}

int downpour_api_version(void)
{
    return DOWNPOUR_API_VERSION;
}

const char *downpour_last_error(void)
{
    return s_err;
}

downpour_err_t downpour_last_error_code(void)
{
    return s_code;
}

void downpour_opts_init(downpour_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->api = DOWNPOUR_API_VERSION;
    o->task_index = -1;
    o->timeout_s = 30;
}

const char *downpour_mode_name(downpour_mode_t m)
{
    return dp_mode_name((dp_mode_t)m);
}

/* The endpoints and task index: the options', else TF_CONFIG's (as
 * downpour-worker reads it without --ps). */
static int s_cluster(downpour_t *h, const downpour_opts_t *o)
{
    char err[DP_ERR_LEN];
    if (o->endpoints) {
        if (snprintf(h->endpoints, sizeof h->endpoints, "%s", o->endpoints) >=
            (int)sizeof h->endpoints)
            return s_fail(DOWNPOUR_ERR_ARGS, "endpoints: longer than %zu bytes",
                          sizeof h->endpoints - 1);
        h->task_index = o->task_index < 0 ? 0 : o->task_index;
        return 0;
    }
    dp_cluster_t *cl = dp_malloc(sizeof *cl);
    dp_cluster_init(cl);
    cl->flag_task_index = o->task_index;
    int rc = -1;
    const char *tf = getenv("TF_CONFIG");
    if (dp_cluster_resolve(cl, tf, err) != 0) {
        s_fail(DOWNPOUR_ERR_ARGS, "TF_CONFIG: %s", err);
    } else if (cl->n_ps == 0) {
        s_fail(DOWNPOUR_ERR_ARGS, "no parameter servers: give endpoints (\"tcp://H:P,...\") "
                                  "or set TF_CONFIG with a ps job");
    } else if (cl->job_name[0] && strcmp(cl->job_name, "worker") != 0 &&
               strcmp(cl->job_name, "chief") != 0) {
        s_fail(DOWNPOUR_ERR_ARGS, "TF_CONFIG: task type %s: a client is a worker task",
               cl->job_name);
    } else if (dp_cluster_ps_endpoints(cl, h->endpoints, sizeof h->endpoints, err) != 0) {
        s_fail(DOWNPOUR_ERR_ARGS, "TF_CONFIG: %s", err);
    } else {
        h->task_index = cl->task_index < 0 ? 0 : cl->task_index;
        rc = 0;
    }
    free(cl);
    return rc;
}

/* h->model is set: connect, HELLO, start the heartbeats. */
static int s_connect(downpour_t *h, const downpour_opts_t *o)
{
    char err[DP_ERR_LEN];
    dp_ps_client_opts_t co = {.timeout_s = o->timeout_s, .stop = &h->stop,
                              .session = dp_ps_session_new()};
    if (!o->curve_secret != !o->curve_server)
        return s_fail(DOWNPOUR_ERR_ARGS, "curve_secret and curve_server go together: give both "
                                         "(this worker's secret key and the servers' public "
                                         "keys) or neither");
    co.curve = (dp_ps_curve_t){o->curve_secret, o->curve_server};
    if (o->wire && dp_ps_wire_parse(o->wire, &co.wire, err) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "wire: %s", err);
    if (o->transport && dp_ps_transport_parse(o->transport, &co.transport, err) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "transport: %s", err);
    if (s_cluster(h, o) != 0) return -1;
    char (*eps)[DP_ZSOCK_ENDPOINT_LEN] = dp_malloc(DP_ZSOCK_MAX_SHARDS * sizeof *eps);
    int n_eps = dp_ps_endpoints_parse(h->endpoints, eps, err);
    free(eps);
    if (n_eps < 0) return s_fail(DOWNPOUR_ERR_ARGS, "%s", err);
    /* Beats first, so a worker that computes long between calls (or before
     * its first pull) is never taken for a dead one, as downpour-worker. */
    if (dp_ps_beat_new(&h->beat, h->endpoints, h->task_index, co.session, &co.curve, err) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "%s", err);
    dp_ps_err_t kind = DP_PS_OK;
    co.new_error = &kind;
    if (dp_ps_client_new(&h->ps, h->endpoints, h->model, h->task_index, &co, &h->info, s_err) != 0) {
        s_code = s_kind(kind);
        return -1;
    }
    if (h->task_index >= h->info.num_workers)
        return s_fail(DOWNPOUR_ERR_ARGS, "task index %d out of range: the servers expect %d "
                                         "workers", h->task_index, h->info.num_workers);
    return 0;
}

static int s_finish_connect(downpour_t **out, downpour_t *h, const downpour_opts_t *o)
{
    if (s_connect(h, o) != 0) {
        downpour_close(h);
        return -1;
    }
    h->pushed = dp_ps_client_resume_step(h->ps);
    *out = h;
    return 0;
}

static downpour_t *s_new(void)
{
    downpour_t *h = dp_calloc(1, sizeof *h);
    h->model = dp_calloc(1, sizeof *h->model);
    return h;
}

static int s_check_opts(downpour_t **out, const downpour_opts_t *o)
{
    s_ok();
    if (out) *out = NULL;
    if (!out || !o) return s_fail(DOWNPOUR_ERR_ARGS, "downpour_connect: out and opts are required");
    if (o->api != DOWNPOUR_API_VERSION)
        return s_fail(DOWNPOUR_ERR_ARGS, "downpour_opts_t of API version %d, this library is "
                                         "version %d (call downpour_opts_init first)",
                      o->api, DOWNPOUR_API_VERSION);
    return 0;
}

int downpour_connect_table(downpour_t **out, const downpour_tensor_t *t, int n,
                           const downpour_opts_t *o)
{
    return downpour_connect_table_rows(out, t, n, 0, o);
}

int downpour_connect_table_rows(downpour_t **out, const downpour_tensor_t *t, int n,
                                int rows_width, const downpour_opts_t *o)
{
    char err[DP_ERR_LEN];
    if (s_check_opts(out, o) != 0) return -1;
    if (n < 1 || n > DP_MAX_PARAMS || !t)
        return s_fail(DOWNPOUR_ERR_ARGS, "a table of %d tensors: 1 to %d", n, DP_MAX_PARAMS);
    /* downpour_tensor_t and dp_table_entry_t are the same fields; copied so
     * that each may change on its own. */
    dp_table_entry_t *e = dp_calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++)
        e[i] = (dp_table_entry_t){t[i].name, t[i].ndim, t[i].shape, t[i].trainable};
    downpour_t *h = s_new();
    int rc = dp_model_from_table(h->model, e, n, err);
    if (rc == 0 && rows_width) rc = dp_model_table_rows(h->model, rows_width, err);
    free(e);
    if (rc != 0) {
        downpour_close(h);
        return s_fail(DOWNPOUR_ERR_ARGS, "%s", err);
    }
    return s_finish_connect(out, h, o);
}

int downpour_connect_spec(downpour_t **out, const char *spec, int in_c, int in_h, int in_w,
                          const downpour_opts_t *o)
{
    char err[DP_ERR_LEN];
    if (s_check_opts(out, o) != 0) return -1;
    downpour_t *h = s_new();
    if (dp_model_parse(h->model, spec ? spec : DP_MODEL_DEFAULT_SPEC, in_c, in_h, in_w, err) != 0) {
        downpour_close(h);
        return s_fail(DOWNPOUR_ERR_ARGS, "model: %s", err);
    }
    return s_finish_connect(out, h, o);
}

int downpour_info(const downpour_t *h, downpour_info_t *out)
{
    s_ok();
    *out = (downpour_info_t){
        .mode = (downpour_mode_t)h->info.mode, .num_workers = h->info.num_workers,
        .replicas = h->info.replicas, .staleness = h->info.staleness,
        .num_shards = h->info.num_shards, .task_index = h->task_index,
        .resume_step = dp_ps_client_resume_step(h->ps), .local_steps = h->info.local_steps,
    };
    return 0;
}

size_t downpour_num_floats(const downpour_t *h)
{
    return h->model->n_floats;
}

int downpour_num_tensors(const downpour_t *h)
{
    return h->model->n_params;
}

int downpour_tensor(const downpour_t *h, int i, downpour_tensor_info_t *out)
{
    s_ok();
    if (i < 0 || i >= h->model->n_params)
        return s_fail(DOWNPOUR_ERR_ARGS, "tensor %d: the model has %d", i, h->model->n_params);
    const dp_param_t *p = &h->model->params[i];
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++) out->shape[d] = p->shape[d];
    out->offset = p->offset;
    out->count = p->count;
    out->trainable = p->trainable;
    return 0;
}

/* A dealing client's pull asks for the batch of its next push step. */
static void s_deal_step(downpour_t *h)
{
    if (h->dealing) dp_ps_client_deal_step(h->ps, h->pushed + 1);
}

int downpour_pull(downpour_t *h, float *params)
{
    s_ok();
    s_deal_step(h);
    if (dp_ps_client_pull(h->ps, params, s_err) != 0) return s_client_failed(h);
    return 0;
}

/* A pull's range [off, off + n) into the tensors it covers: a shard's range
 * starts and ends anywhere (the servers shard by bytes), so it may hold
 * the end of one tensor, whole ones, and the start of another. */
typedef struct {
    const dp_model_t *m;
    float *const *dst;
} s_scatter_t;

static void s_scatter(void *arg, size_t off, const float *data, size_t n)
{
    const s_scatter_t *s = arg;
    const dp_param_t *p = s->m->params;
    int lo = 0, hi = s->m->n_params - 1;
    while (lo < hi) { /* the last tensor starting at or before off */
        int mid = (lo + hi + 1) / 2;
        if (p[mid].offset <= off) lo = mid;
        else hi = mid - 1;
    }
    for (int i = lo; n > 0 && i < s->m->n_params; i++) {
        size_t at = off - p[i].offset, take = p[i].count - at; /* off >= p[i].offset */
        if (take > n) take = n;
        if (s->dst[i] && take) memcpy(s->dst[i] + at, data, take * sizeof(float));
        data += take, off += take, n -= take;
    }
}

int downpour_pull_tensors(downpour_t *h, float *const *dst)
{
    s_ok();
    s_scatter_t s = {h->model, dst};
    s_deal_step(h);
    if (dp_ps_client_pull_to(h->ps, s_scatter, &s, s_err) != 0) return s_client_failed(h);
    return 0;
}

uint64_t downpour_version_pulled(const downpour_t *h)
{
    return dp_ps_client_version(h->ps);
}

/* A push's result as the API says it. */
static void s_push_result(downpour_push_result_t *res, const dp_push_result_t *r)
{
    *res = (downpour_push_result_t){
        .applied = r->applied, .dropped = r->dropped, .rejected = r->rejected,
        .staleness_max = r->staleness_max, .staleness_mean = r->staleness_mean,
        .version = r->version,
    };
    snprintf(res->reason, sizeof res->reason, "%s", r->reason);
}

int downpour_rows_width(const downpour_t *h)
{
    return h->model->embed_dim;
}

/* The model has a row table; -1 and the error otherwise. */
static int s_has_rows(const downpour_t *h)
{
    if (h->model->embed_dim > 0) return 0;
    return s_fail(DOWNPOUR_ERR_ARGS, "rows: the model has no row table (a spec's embed:D, or "
                                     "downpour_connect_table_rows)");
}

int downpour_rows_pull(downpour_t *h, const uint64_t *keys, size_t n, float *rows)
{
    s_ok();
    if (s_has_rows(h) != 0) return -1;
    if (dp_ps_client_rows_pull(h->ps, keys, n, h->model->embed_dim, rows, NULL, s_err) != 0)
        return s_client_failed(h);
    return 0;
}

int downpour_rows_push(downpour_t *h, const uint64_t *keys, size_t n, const float *grads,
                       uint64_t step, downpour_push_result_t *res)
{
    s_ok();
    if (s_has_rows(h) != 0) return -1;
    dp_push_result_t r;
    if (dp_ps_client_rows_push(h->ps, keys, n, h->model->embed_dim, grads, step, &r, s_err) != 0)
        return s_client_failed(h);
    if (res) s_push_result(res, &r);
    return 0;
}

int downpour_set_compress(downpour_t *h, const char *compress, const char *error_feedback)
{
    s_ok();
    char err[DP_ERR_LEN];
    dp_compress_conf_t z = {.kind = DP_COMPRESS_NONE, .error_feedback = 1};
    if (compress && dp_compress_parse(compress, &z, err) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "compress: %s", err);
    if (error_feedback && dp_compress_ef_parse(error_feedback, &z.error_feedback, err) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "error_feedback: %s", err);
    dp_ps_client_set_compress(h->ps, &z);
    return 0;
}

int downpour_push(downpour_t *h, const float *grads, float loss, int batch, uint64_t step,
                  downpour_push_result_t *res)
{
    s_ok();
    dp_push_result_t r;
    dp_ps_push_t p = {.grads = grads, .loss = loss, .batch = batch, .step = step};
    if (h->info.local_auto) { /* DyLU: the round downpour_push_round told, the worker's speed */
        p.local_steps = h->round_steps;
        p.step_ms = dp_dylu_valid_ms(h->own_ms) ? (float)h->own_ms : 0;
        h->round_steps = 0;
    }
    if (dp_ps_client_push(h->ps, &p, &r, s_err) != 0) return s_client_failed(h);
    if (res) s_push_result(res, &r);
    if (r.crew_step_ms > 0) h->crew_ms = r.crew_step_ms;
    if (step > h->pushed) h->pushed = step;
    return 0;
}

int downpour_local_auto(const downpour_t *h)
{
    return h->info.local_auto;
}

int downpour_push_round(downpour_t *h, uint32_t steps, double round_ms)
{
    s_ok();
    if (!h->info.local_auto)
        return s_fail(DOWNPOUR_ERR_ARGS, "push round: the servers do not run --local-steps auto");
    if (steps < 1 || steps > (uint64_t)h->info.local_steps || !(round_ms >= 0) || !isfinite(round_ms))
        return s_fail(DOWNPOUR_ERR_ARGS, "push round: %u steps at %g ms a step: want 1..%ld steps "
                      "(--local-steps auto:%ld) and a finite time >= 0", steps, round_ms,
                      h->info.local_steps, h->info.local_steps);
    h->round_steps = steps;
    if (round_ms > 0) h->own_ms = dp_dylu_ewma(h->own_ms, round_ms);
    return 0;
}

long downpour_round_steps(const downpour_t *h)
{
    if (!h->info.local_auto) return h->info.local_steps;
    return dp_dylu_steps(h->info.local_steps, h->own_ms, h->crew_ms);
}

int downpour_deal_plan(downpour_t *h, uint64_t samples, uint32_t batch, uint64_t epochs,
                       uint64_t steps)
{
    s_ok();
    if (batch < 1 || samples < batch || samples > INT_MAX || (epochs == 0) == (steps == 0))
        return s_fail(DOWNPOUR_ERR_ARGS, "deal plan: %" PRIu64 " samples in batches of %u for %"
                      PRIu64 " epochs or %" PRIu64 " steps: want 1 <= batch <= samples <= %d and "
                      "one of epochs, steps", samples, batch, epochs, steps, INT_MAX);
    dp_ps_deal_plan_t p = {samples, batch, epochs, steps};
    if (dp_ps_client_plan(h->ps, &p, s_err) != 0) {
        h->dealing = false;
        return s_client_failed(h);
    }
    h->dealing = true;
    return 0;
}

int downpour_dealt(const downpour_t *h, downpour_dealt_t *out)
{
    s_ok();
    dp_ps_dealt_t d;
    if (!h->dealing || dp_ps_client_dealt(h->ps, &d) != 0)
        return s_fail(DOWNPOUR_ERR_ARGS, "no batch dealt: %s", h->dealing ? "the last pull brought "
                      "none" : "no downpour_deal_plan before the pull");
    *out = (downpour_dealt_t){.end = d.end, .step = h->pushed + 1, .epoch = d.epoch,
                              .index = d.index};
    return 0;
}

/* The same permutation as downpour-worker's (worker/exec/data.c
 * dp_data_dealt_indices; test_lib_deal holds the two equal). */
static void s_permutation(uint64_t samples, uint64_t seed, uint64_t epoch, int *perm)
{
    for (int i = 0; i < (int)samples; i++) perm[i] = i;
    dp_rng_t rng;
    dp_rng_seed(&rng, seed * 0x9e3779b97f4a7c15ULL + epoch + 1);
    dp_rng_shuffle(&rng, perm, (int)samples);
}

int downpour_deal_permutation(uint64_t samples, uint64_t seed, uint64_t epoch, int64_t *perm)
{
    s_ok();
    if (samples < 1 || samples > INT_MAX || epoch > (uint64_t)LONG_MAX)
        return s_fail(DOWNPOUR_ERR_ARGS, "epoch %" PRIu64 " of %" PRIu64 " samples: no "
                      "permutation (1 to %d samples)", epoch, samples, INT_MAX);
    int *p = dp_malloc((size_t)samples * sizeof *p);
    s_permutation(samples, seed, epoch, p);
    for (uint64_t i = 0; i < samples; i++) perm[i] = p[i];
    free(p);
    return 0;
}

int downpour_deal_indices(uint64_t samples, uint32_t batch, uint64_t seed, uint64_t epoch,
                          uint64_t index, int64_t *idx)
{
    s_ok();
    if (batch < 1 || samples > INT_MAX || index >= samples / batch || epoch > (uint64_t)LONG_MAX)
        return s_fail(DOWNPOUR_ERR_ARGS, "dealt batch %" PRIu64 " of epoch %" PRIu64 " is not one "
                      "of %" PRIu64 " samples' batches of %u", index, epoch, samples, batch);
    int *perm = dp_malloc((size_t)samples * sizeof *perm);
    s_permutation(samples, seed, epoch, perm);
    for (uint32_t k = 0; k < batch; k++) idx[k] = perm[index * batch + k];
    free(perm);
    return 0;
}

uint64_t downpour_updates_lost(const downpour_t *h)
{
    return dp_ps_client_updates_lost(h->ps);
}

int downpour_stats(downpour_t *h, downpour_stats_t *out)
{
    s_ok();
    dp_ps_stats_t st;
    if (dp_ps_client_stats(h->ps, &st, s_err) != 0) return s_client_failed(h);
    memset(out, 0, sizeof *out);
    out->applied = st.applied;
    out->dropped = st.dropped;
    out->rejected = st.rejected;
    out->version = st.version;
    out->staleness_mean = st.staleness_mean;
    out->staleness_max = st.staleness_max;
    size_t bins = st.staleness_bins < DOWNPOUR_STATS_BINS ? st.staleness_bins : DOWNPOUR_STATS_BINS;
    memcpy(out->staleness_hist, st.staleness_hist, bins * sizeof(uint64_t));
    out->staleness_bins = (int)bins;
    return 0;
}

int downpour_epoch_samples(downpour_t *h, downpour_epoch_samples_t *out, size_t cap, size_t *n)
{
    s_ok();
    dp_ps_membership_t m = {0};
    if (dp_ps_client_membership(h->ps, &m, s_err) != 0) return s_client_failed(h);
    for (size_t k = 0; k < m.n_epochs && k < cap; k++)
        out[k] = (downpour_epoch_samples_t){m.epochs[k].epoch, m.epochs[k].trained, m.epochs[k].repeated,
                                            m.epochs[k].retrained_after_death, m.epochs[k].batches};
    if (n) *n = m.n_epochs;
    dp_ps_membership_fini(&m);
    return 0;
}

int downpour_finish(downpour_t *h)
{
    s_ok();
    if (dp_ps_client_finish(h->ps, s_err) != 0) return s_client_failed(h);
    return 0;
}

int downpour_leave(downpour_t *h)
{
    s_ok();
    if (dp_ps_client_leave(h->ps, s_err) != 0) return s_client_failed(h);
    return 0;
}

int downpour_wait_all(downpour_t *h, double timeout_s)
{
    s_ok();
    if (dp_ps_client_wait_all_finished(h->ps, timeout_s, s_err) != 0) return s_client_failed(h);
    return 0;
}

int downpour_shutdown(downpour_t *h)
{
    s_ok();
    if (dp_ps_client_shutdown_servers(h->ps, s_err) != 0) return s_client_failed(h);
    return 0;
}

void downpour_interrupt(downpour_t *h)
{
    h->stop = 1;
}

void downpour_interrupt_clear(downpour_t *h)
{
    h->stop = 0;
}

void downpour_close(downpour_t *h)
{
    if (!h) return;
    dp_ps_client_destroy(&h->ps);
    dp_ps_beat_destroy(&h->beat);
    free(h->model);
    free(h);
}
