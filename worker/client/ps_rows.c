/* ps_rows: the client's row requests (ROWS_PULL, ROWS_PUSH; issue 35) — a
 * batch's keys split by the shard that holds each (dp_rows_shard_of), one
 * request per shard, all in parallel through dp_ps_exchange; and the scan
 * of every shard's whole table, page by page, merged by key (the chief's
 * --save); see ps_client.h for the calls and server/core/ps_rows.h for the
 * shard's rules. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/core/rows.h" /* dp_rows_shard_of: where a key lives */
#include "worker/client/ps_client.h"
#include "worker/client/ps_exchange.h"

/* The keys of one call grouped by shard: shard i's are keys[at[i] ..
 * at[i + 1]), and pos[j] is where keys[j] stands in the caller's order. */
struct dp_ps_rows_req {
    size_t cap;            /* keys the buffers hold */
    uint64_t *keys;
    size_t *pos;
    float *buf;            /* cap x d: rows to push, grouped as keys (or the landing of a pull) */
    int d;
    size_t at[DP_ZSOCK_MAX_SHARDS + 1];
    uint64_t version[DP_ZSOCK_MAX_SHARDS]; /* each shard's Rows.version of the last pull */
    /* the call in progress */
    const uint64_t *caller_keys;
    float *out;            /* pull: n x d in the caller's order */
    uint64_t step;
    uint64_t held;
    dp_push_result_t *res; /* push */
};

void dp_ps_rows_req_free(dp_ps_rows_req_t *r)
{
    if (!r) return;
    free(r->keys), free(r->pos), free(r->buf);
    free(r);
}

/* The call's buffers for n keys of width d, and the keys grouped by shard
 * (a counting sort: stable, so each shard's keys keep the caller's order). */
static dp_ps_rows_req_t *s_group(dp_ps_client_t *c, const uint64_t *keys, size_t n, int d)
{
    if (!c->rows) c->rows = dp_calloc(1, sizeof *c->rows);
    dp_ps_rows_req_t *r = c->rows;
    if (n > r->cap || d != r->d) {
        size_t cap = n > r->cap ? n : r->cap;
        free(r->keys), free(r->pos), free(r->buf);
        r->keys = dp_malloc((cap ? cap : 1) * sizeof *r->keys);
        r->pos = dp_malloc((cap ? cap : 1) * sizeof *r->pos);
        r->buf = dp_malloc((cap ? cap : 1) * (size_t)d * sizeof *r->buf);
        r->cap = cap;
        r->d = d;
    }
    size_t count[DP_ZSOCK_MAX_SHARDS] = {0};
    for (size_t j = 0; j < n; j++) count[dp_rows_shard_of(keys[j], (uint32_t)c->n)]++;
    r->at[0] = 0;
    for (int i = 0; i < c->n; i++) r->at[i + 1] = r->at[i] + count[i];
    size_t fill[DP_ZSOCK_MAX_SHARDS];
    memcpy(fill, r->at, sizeof(size_t) * (size_t)c->n);
    for (size_t j = 0; j < n; j++) {
        size_t k = fill[dp_rows_shard_of(keys[j], (uint32_t)c->n)]++;
        r->keys[k] = keys[j];
        r->pos[k] = j;
    }
    r->caller_keys = keys;
    return r;
}

/* Tensor t of rq: a row message's frame at data, handed to ZeroMQ without a
 * copy (the call waits until ZeroMQ lets go: c->inflight). */
static void s_frame(dp_ps_client_t *c, dp_ps_req_t *rq, int t, const char *key, int dtype,
                    const void *data, size_t n, size_t width)
{
    dp_wire_desc_keyed(&rq->desc[t], rq->row_shape[t], key, dtype, data, n, width);
    rq->descs[t] = &rq->desc[t];
    rq->payload[t] = (dp_wire_payload_t){data, rq->desc[t].byte_length, dp_ps_frame_released, &c->inflight};
    atomic_fetch_add(&c->inflight, 1); /* dp_wire_send releases it, sent or not */
    rq->env.n_tensors = (size_t)t + 1;
    rq->env.tensors = rq->descs;
    rq->n_payloads = t + 1;
}

/* Each shard's part of r within what a shard takes in one request (more
 * would be a message over its limit, which ZeroMQ drops unanswered). */
static int s_bounded(const dp_ps_client_t *c, const dp_ps_rows_req_t *r, const char *what, char *err)
{
    for (int i = 0; i < c->n; i++)
        if (r->at[i + 1] - r->at[i] > DP_ROWS_DEFAULT_KEYS)
            return dp_err(err, "%s: %zu keys for shard %d: a request takes at most %u keys a "
                          "shard (split the keys)", what, r->at[i + 1] - r->at[i], i,
                          DP_ROWS_DEFAULT_KEYS);
    return 0;
}

/* ---- pull --------------------------------------------------------------- */

static void s_build_pull(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    dp_ps_rows_req_t *r = arg;
    Downpour__RowsPull *p = &rq->body.rows_pull;
    *p = (Downpour__RowsPull)DOWNPOUR__ROWS_PULL__INIT;
    p->width = (uint32_t)r->d;
    rq->env.rows_pull = p;
    s_frame(c, rq, 0, "keys", DOWNPOUR__DTYPE__UINT64, r->keys + r->at[i], r->at[i + 1] - r->at[i], 0);
}

static dp_ps_reply_t s_on_rows(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                               const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    dp_ps_rows_req_t *r = arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    size_t n = r->at[i + 1] - r->at[i];
    if (env->type != DOWNPOUR__MSG_TYPE__ROWS || !env->rows || nf != 1 ||
        env->tensors[0]->shape[0] != (int64_t)n || env->tensors[0]->shape[1] != r->d)
        return dp_err(err, "%s: answered ROWS_PULL of %zu keys with %s (not %zu rows of %d)",
                      c->sh[i].endpoint, n, dp_wire_type_name(env->type), n, r->d);
    const char *rows = frames[0].data;
    size_t row_bytes = (size_t)r->d * sizeof(float);
    for (size_t k = 0; k < n; k++) /* back into the caller's order */
        memcpy(r->out + r->pos[r->at[i] + k] * (size_t)r->d, rows + k * row_bytes, row_bytes);
    r->version[i] = env->rows->version;
    r->held += env->rows->held;
    c->bytes_pulled += frames[0].len;
    dp_ps_seen(&c->sh[i], env->rows->version);
    return DP_PS_REPLY_DONE;
}

int dp_ps_client_rows_pull(dp_ps_client_t *c, const uint64_t *keys, size_t n, int d, float *rows,
                           uint64_t *held, char *err)
{
    if (d < 1 || d > DP_ROWS_MAX_WIDTH) return dp_err(err, "rows pull: width %d (1 to %d)", d, DP_ROWS_MAX_WIDTH);
    dp_ps_rows_req_t *r = s_group(c, keys, n, d);
    if (s_bounded(c, r, "rows pull", err) != 0) return -1;
    r->out = rows;
    r->held = 0;
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__ROWS_PULL, .n_shards = c->n,
                         .build = s_build_pull, .on_reply = s_on_rows, .arg = r};
    int rc = dp_ps_exchange(c, &plan, err);
    char e2[DP_ERR_LEN];
    if (dp_ps_wait_released(c, e2) != 0 && rc == 0) rc = dp_err(err, "%s", e2);
    if (rc == 0 && held) *held = r->held;
    return rc;
}

/* ---- push --------------------------------------------------------------- */

static void s_build_push(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    dp_ps_rows_req_t *r = arg;
    Downpour__RowsPush *p = &rq->body.rows_push;
    *p = (Downpour__RowsPush)DOWNPOUR__ROWS_PUSH__INIT;
    p->version = r->version[i];
    p->step = r->step;
    p->width = (uint32_t)r->d;
    rq->env.rows_push = p;
    size_t n = r->at[i + 1] - r->at[i];
    s_frame(c, rq, 0, "keys", DOWNPOUR__DTYPE__UINT64, r->keys + r->at[i], n, 0);
    s_frame(c, rq, 1, "grads", DOWNPOUR__DTYPE__FLOAT32, r->buf + r->at[i] * (size_t)r->d, n,
            (size_t)r->d);
}

static dp_ps_reply_t s_on_ack(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                              const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    dp_ps_rows_req_t *r = arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    if (env->type != DOWNPOUR__MSG_TYPE__ACK || !env->ack)
        return dp_err(err, "%s: answered ROWS_PUSH with %s", c->sh[i].endpoint,
                      dp_wire_type_name(env->type));
    const Downpour__Ack *a = env->ack;
    dp_push_result_t *res = r->res;
    switch (a->status) {
    case DOWNPOUR__ACK_STATUS__APPLIED: res->applied++; break;
    case DOWNPOUR__ACK_STATUS__DROPPED: res->dropped++; break;
    default: res->rejected++; break;
    }
    if (a->status != DOWNPOUR__ACK_STATUS__APPLIED && !res->reason[0] && a->reason)
        snprintf(res->reason, sizeof res->reason, "%s", a->reason);
    if (a->staleness > res->staleness_max) res->staleness_max = a->staleness;
    res->staleness_mean += (double)a->staleness / c->n;
    res->version += a->version;
    dp_ps_seen(&c->sh[i], a->version);
    return DP_PS_REPLY_DONE;
}

int dp_ps_client_rows_push(dp_ps_client_t *c, const uint64_t *keys, size_t n, int d,
                           const float *grads, uint64_t step, dp_push_result_t *res, char *err)
{
    if (d < 1 || d > DP_ROWS_MAX_WIDTH) return dp_err(err, "rows push: width %d (1 to %d)", d, DP_ROWS_MAX_WIDTH);
    if (!c->rows) return dp_err(err, "rows push before any rows pull");
    uint64_t version[DP_ZSOCK_MAX_SHARDS];
    memcpy(version, c->rows->version, sizeof version); /* the last pull's, kept by s_group */
    dp_ps_rows_req_t *r = s_group(c, keys, n, d);
    memcpy(r->version, version, sizeof version);
    if (s_bounded(c, r, "rows push", err) != 0) return -1;
    for (size_t k = 0; k < n; k++) /* each shard's rows together, as its keys */
        memcpy(r->buf + k * (size_t)d, grads + r->pos[k] * (size_t)d, (size_t)d * sizeof *grads);
    memset(res, 0, sizeof *res);
    r->res = res;
    r->step = step;
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__ROWS_PUSH, .n_shards = c->n,
                         .build = s_build_push, .on_reply = s_on_ack, .arg = r};
    int rc = dp_ps_exchange(c, &plan, err);
    char e2[DP_ERR_LEN];
    if (dp_ps_wait_released(c, e2) != 0 && rc == 0) rc = dp_err(err, "%s", e2);
    res->bytes = n * (sizeof(uint64_t) + (size_t)d * sizeof(float));
    if (rc == 0) c->bytes_pushed += res->bytes;
    return rc;
}

/* ---- a scan: every row of every shard -----------------------------------
 * The cursor of each shard is the whole state of its read (the shard keeps
 * none), so an exchange repeated after a restart or a lost reply asks for
 * the same page again. */

/* The scan in progress: each shard's cursor and the rows read so far. */
typedef struct {
    int d;
    uint32_t page;                              /* keys a page asks for */
    Downpour__RowsScan ask[DP_ZSOCK_MAX_SHARDS]; /* each shard's request body */
    bool done[DP_ZSOCK_MAX_SHARDS];              /* read to its end */
    uint64_t *keys[DP_ZSOCK_MAX_SHARDS];         /* each shard's keys, ascending, and rows */
    float *rows[DP_ZSOCK_MAX_SHARDS];
    size_t n[DP_ZSOCK_MAX_SHARDS], cap[DP_ZSOCK_MAX_SHARDS];
    bool have_init;                              /* init and seed: the first page's */
    float init;
    uint64_t seed;
    uint64_t pages;
} s_scan_t;

static bool s_scan_done(const dp_ps_client_t *c, int i, void *arg)
{
    (void)c;
    return ((const s_scan_t *)arg)->done[i];
}

static void s_build_scan(dp_ps_client_t *c, int i, dp_ps_req_t *rq, void *arg)
{
    (void)c;
    s_scan_t *s = arg;
    Downpour__RowsPull *p = &rq->body.rows_pull;
    *p = (Downpour__RowsPull)DOWNPOUR__ROWS_PULL__INIT;
    p->width = (uint32_t)s->d;
    p->scan = &s->ask[i];
    rq->env.rows_pull = p;
}

/* Shard i's page: its keys its own, ascending, from the cursor on, no more
 * than asked; appended, and the cursor moved past them. */
static dp_ps_reply_t s_on_page(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                               const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    s_scan_t *s = arg;
    const char *ep = c->sh[i].endpoint;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) return dp_ps_refused(c, i, env, err);
    /* the wire checked the layout: keys [n] then rows [n, D], more only with a key */
    if (env->type != DOWNPOUR__MSG_TYPE__ROWS || !env->rows || nf != 2 ||
        env->tensors[1]->shape[1] != s->d)
        return dp_err(err, "%s: answered a scan of its rows with %s (not a page of keys and rows "
                      "of width %d)", ep, dp_wire_type_name(env->type), s->d);
    const Downpour__Rows *b = env->rows;
    size_t n = (size_t)env->tensors[0]->shape[0];
    if (n > s->page)
        return dp_err(err, "%s: a scan's page of %zu keys (%u asked)", ep, n, s->page);
    if (!s->have_init) s->init = b->init, s->seed = b->seed, s->have_init = true;
    else if (memcmp(&s->init, &b->init, sizeof b->init) != 0 || s->seed != b->seed)
        return dp_err(err, "%s: its rows start at init %g, seed %" PRIu64 "; another shard's at "
                      "%g, %" PRIu64 " (are the servers' --row-init and --seed the same?)", ep,
                      (double)b->init, b->seed, (double)s->init, s->seed);
    if (s->n[i] + n > s->cap[i]) {
        size_t cap = s->cap[i] ? s->cap[i] : 1;
        while (cap < s->n[i] + n) cap *= 2;
        s->keys[i] = dp_realloc(s->keys[i], cap * sizeof *s->keys[i]);
        s->rows[i] = dp_realloc(s->rows[i], cap * (size_t)s->d * sizeof *s->rows[i]);
        s->cap[i] = cap;
    }
    uint64_t *k = s->keys[i] + s->n[i];
    memcpy(k, frames[0].data, n * sizeof *k); /* a frame need not be aligned */
    for (size_t j = 0; j < n; j++) {
        uint64_t lo = j ? k[j - 1] : s->ask[i].from;
        if (k[j] < lo || (j && k[j] == lo))
            return dp_err(err, "%s: a scan's page from key %" PRIu64 " lists key %" PRIu64 " after "
                          "%" PRIu64 " (keys ascend from the cursor)", ep, s->ask[i].from, k[j], lo);
        if (dp_rows_shard_of(k[j], (uint32_t)c->n) != (uint32_t)i)
            return dp_err(err, "%s: a scan lists key %" PRIu64 ", which shard %u holds", ep, k[j],
                          dp_rows_shard_of(k[j], (uint32_t)c->n));
    }
    memcpy(s->rows[i] + s->n[i] * (size_t)s->d, frames[1].data, frames[1].len);
    s->n[i] += n;
    s->pages++;
    c->bytes_pulled += frames[0].len + frames[1].len;
    dp_ps_seen(&c->sh[i], b->version);
    if (!b->more) s->done[i] = true;
    else if (k[n - 1] == UINT64_MAX) /* n >= 1: the wire's rule */
        return dp_err(err, "%s: a scan says more rows follow key 2^64 - 1", ep);
    else s->ask[i].from = k[n - 1] + 1;
    return DP_PS_REPLY_DONE;
}

void dp_ps_table_free(dp_ps_table_t *t)
{
    free(t->keys), free(t->rows);
    memset(t, 0, sizeof *t);
}

/* The shards' rows merged by key into t: each shard's ascending, and no
 * key on two shards (s_on_page checked both), so the smallest head of k
 * lists is the next key. */
static void s_merge(const s_scan_t *s, int k, dp_ps_table_t *t)
{
    size_t total = 0, at[DP_ZSOCK_MAX_SHARDS] = {0}, d = (size_t)s->d;
    for (int i = 0; i < k; i++) total += s->n[i];
    t->keys = dp_malloc((total ? total : 1) * sizeof *t->keys);
    t->rows = dp_malloc((total ? total : 1) * d * sizeof *t->rows);
    for (size_t j = 0; j < total; j++) {
        int best = -1;
        for (int i = 0; i < k; i++)
            if (at[i] < s->n[i] && (best < 0 || s->keys[i][at[i]] < s->keys[best][at[best]])) best = i;
        t->keys[j] = s->keys[best][at[best]];
        memcpy(t->rows + j * d, s->rows[best] + at[best] * d, d * sizeof *t->rows);
        at[best]++;
    }
    t->n = total;
}

int dp_ps_client_rows_all(dp_ps_client_t *c, int d, uint32_t page, dp_ps_table_t *t, char *err)
{
    memset(t, 0, sizeof *t);
    if (d < 1 || d > DP_ROWS_MAX_WIDTH) return dp_err(err, "rows scan: width %d (1 to %d)", d, DP_ROWS_MAX_WIDTH);
    if (page > DP_WIRE_MAX_ROW_KEYS) return dp_err(err, "rows scan: pages of %u keys (at most %u)", page, DP_WIRE_MAX_ROW_KEYS);
    s_scan_t *s = dp_calloc(1, sizeof *s);
    s->d = d;
    s->page = page ? page : DP_ROWS_DEFAULT_KEYS;
    for (int i = 0; i < c->n; i++) {
        s->ask[i] = (Downpour__RowsScan)DOWNPOUR__ROWS_SCAN__INIT;
        s->ask[i].max_keys = s->page;
    }
    int rc = -1;
    dp_ps_plan_t plan = {.type = DOWNPOUR__MSG_TYPE__ROWS_PULL, .n_shards = c->n,
                         .skip = s_scan_done, .build = s_build_scan, .on_reply = s_on_page,
                         .arg = s};
    for (;;) {
        bool all = true;
        for (int i = 0; i < c->n; i++) all = all && s->done[i];
        if (all) break;
        if (dp_ps_exchange(c, &plan, err) != 0) goto done;
    }
    s_merge(s, c->n, t);
    t->init = s->init;
    t->seed = s->seed;
    t->pages = s->pages;
    rc = 0;
done:
    for (int i = 0; i < c->n; i++) free(s->keys[i]), free(s->rows[i]);
    free(s);
    if (rc != 0) dp_ps_table_free(t);
    return rc;
}
