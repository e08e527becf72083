/* ps_client: the worker's DEALER sockets to every parameter-server shard
 * (see ps_client.h).
 *
 * One exchange = a request to some shards, then s_wait() collects the reply
 * of each (matched by request id; anything else from a shard — a heartbeat
 * answer, a late reply to an abandoned request — only proves it is alive).
 * Invariants: a shard's range [lo, hi) comes from its WELCOME and the ranges
 * tile [0, n_floats); push frames point into the caller's gradient and
 * c->inflight counts those ZeroMQ still holds, so push returns only once it
 * is 0; after a failed exchange the shards that did not answer get a fresh
 * socket (linger 0 drops what was queued, releasing the caller's buffer). */
#include "worker/ps_client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"

#define S_MAX_SHARDS 256

typedef struct {
    void *sock;
    char endpoint[256];
    uint64_t lo, hi;        /* floats this shard owns */
    uint64_t version;       /* shard version of the last pull */
    uint64_t min_version;   /* sync: the next pull waits for this version */
    int pulled;             /* a pull has completed */
    uint64_t want_req;      /* request awaited in the current exchange, 0 = none */
    int done;               /* its reply arrived */
    double last_heard;      /* dp_now() of its last message (or of our request) */
    double last_hb;         /* dp_now() of our last HEARTBEAT */
    dp_ps_info_t info;      /* from its WELCOME */
} s_shard_t;

struct dp_ps_client {
    void *ctx;
    int n;
    s_shard_t *sh;
    const dp_model_t *m;
    int worker_id;
    double timeout_s;
    uint64_t next_req;
    dp_ps_info_t info;
    int finished;
    volatile sig_atomic_t *stop;
    atomic_int inflight;    /* push frames ZeroMQ has not released yet */
};

/* Called for each matched reply; returns 0 or -1 with err (ends the wait). */
typedef int (*s_reply_fn)(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                          const dp_wire_frame_t *frames, int n_frames, void *arg, char *err);

static void s_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int s_open(dp_ps_client_t *c, int i, char *err)
{
    s_shard_t *s = &c->sh[i];
    s->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!s->sock) return dp_err(err, "%s: cannot create socket: %s", s->endpoint, zmq_strerror(errno));
    int zero = 0;
    int sndtimeo = (int)(c->timeout_s * 1000);
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    if (zmq_connect(s->sock, s->endpoint) != 0)
        return dp_err(err, "%s: bad ps endpoint: %s (expected tcp://HOST:PORT)", s->endpoint,
                      zmq_strerror(errno));
    return 0;
}

/* Replace the sockets of shards that did not answer: whatever ZeroMQ queued
 * there is dropped (and the caller's push buffer released). */
static void s_reset_unanswered(dp_ps_client_t *c)
{
    for (int i = 0; i < c->n; i++) {
        s_shard_t *s = &c->sh[i];
        if (!s->want_req || s->done) continue;
        zmq_close(s->sock);
        s->sock = NULL;
        char e2[DP_ERR_LEN];
        if (s_open(c, i, e2) != 0) dp_log_warn("%s", e2);
        s->want_req = 0;
    }
}

static void s_begin(dp_ps_client_t *c)
{
    for (int i = 0; i < c->n; i++) {
        c->sh[i].want_req = 0;
        c->sh[i].done = 0;
    }
}

static int s_request(dp_ps_client_t *c, int i, Downpour__Envelope *env,
                     const dp_wire_payload_t *pl, int n_pl, char *err)
{
    s_shard_t *s = &c->sh[i];
    env->request_id = ++c->next_req;
    char e2[DP_ERR_LEN];
    if (dp_wire_send(s->sock, NULL, env, pl, n_pl, e2) != 0)
        return dp_err(err, "%s: %s (is downpour-ps running?)", s->endpoint, e2);
    s->want_req = env->request_id;
    s->done = 0;
    s->last_heard = s->last_hb = dp_now();
    return 0;
}

static void s_heartbeat(dp_ps_client_t *c, int i)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HEARTBEAT, ++c->next_req, c->worker_id,
                     c->m->fingerprint);
    char e2[DP_ERR_LEN];
    if (dp_wire_send(c->sh[i].sock, NULL, &env, NULL, 0, e2) != 0)
        dp_log_debug("%s: heartbeat: %s", c->sh[i].endpoint, e2);
    c->sh[i].last_hb = dp_now();
}

/* Collect the replies of every shard with want_req set. */
static int s_wait(dp_ps_client_t *c, s_reply_fn fn, void *arg, char *err)
{
    double t0 = dp_now();
    double hb_every = c->timeout_s / 4 < 2.0 ? c->timeout_s / 4 : 2.0;
    zmq_pollitem_t items[S_MAX_SHARDS];
    int idx[S_MAX_SHARDS];
    for (;;) {
        int n = 0;
        for (int i = 0; i < c->n; i++)
            if (c->sh[i].want_req && !c->sh[i].done) {
                items[n] = (zmq_pollitem_t){c->sh[i].sock, 0, ZMQ_POLLIN, 0};
                idx[n++] = i;
            }
        if (n == 0) return 0;
        if (c->stop && *c->stop) return dp_err(err, "interrupted");
        double now = dp_now();
        for (int k = 0; k < n; k++) {
            s_shard_t *s = &c->sh[idx[k]];
            if (now - s->last_heard > c->timeout_s)
                return dp_err(err, "%s: no reply in %.0f s (is downpour-ps running?)", s->endpoint,
                              c->timeout_s);
            if (now - t0 > 20 * c->timeout_s)
                return dp_err(err, "%s: request still deferred after %.0f s", s->endpoint, now - t0);
            if (now - s->last_hb >= hb_every && now - s->last_heard >= hb_every)
                s_heartbeat(c, idx[k]);
        }
        int r = zmq_poll(items, n, 100);
        if (r < 0) {
            if (errno == EINTR) continue;
            return dp_err(err, "poll: %s", zmq_strerror(errno));
        }
        for (int k = 0; k < n && r > 0; k++) {
            if (!(items[k].revents & ZMQ_POLLIN)) continue;
            int i = idx[k];
            s_shard_t *s = &c->sh[i];
            dp_wire_rx_t rx;
            char e2[DP_ERR_LEN];
            while (!s->done && dp_wire_recv(s->sock, &rx, ZMQ_DONTWAIT, e2) == 0) {
                int rc = 0;
                Downpour__Envelope *env = NULL;
                dp_wire_frame_t frames[DP_WIRE_MAX_TENSORS];
                int nf = rx.n_parts - 1;
                if (rx.n_parts < 1 || rx.n_total > rx.n_parts) {
                    rc = dp_err(err, "%s: malformed reply: %d frames", s->endpoint, rx.n_total);
                    goto next;
                }
                env = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), e2);
                for (int f = 0; f < nf && f < DP_WIRE_MAX_TENSORS; f++) {
                    frames[f].data = zmq_msg_data(&rx.parts[1 + f]);
                    frames[f].len = zmq_msg_size(&rx.parts[1 + f]);
                }
                if (!env || dp_wire_check(env, frames, nf, e2) != 0) {
                    rc = dp_err(err, "%s: bad reply: %s", s->endpoint, e2);
                    goto next;
                }
                s->last_heard = dp_now();
                if (env->request_id != s->want_req) goto next; /* heartbeat or late reply */
                s->done = 1;
                rc = fn(c, i, env, frames, nf, arg, err);
            next:
                dp_wire_destroy(&env);
                dp_wire_rx_fini(&rx);
                if (rc != 0) return -1;
            }
        }
    }
}

/* Run one exchange: requests already sent; on failure reset the silent shards. */
static int s_finish_exchange(dp_ps_client_t *c, s_reply_fn fn, void *arg, char *err)
{
    int rc = s_wait(c, fn, arg, err);
    if (rc != 0) s_reset_unanswered(c);
    return rc;
}

/* ---- connect ---------------------------------------------------------- */

static int s_on_welcome(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                        const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf, (void)arg;
    s_shard_t *s = &c->sh[i];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", s->endpoint, env->error->message);
    if (env->type != DOWNPOUR__MSG_TYPE__WELCOME)
        return dp_err(err, "%s: answered HELLO with %s", s->endpoint, dp_wire_type_name(env->type));
    const Downpour__Welcome *w = env->welcome;
    if (w->shard_count != c->n || w->shard_index != i)
        return dp_err(err, "%s: is shard %d of %d, but it is listed at position %d of %d in the ps endpoints",
                      s->endpoint, w->shard_index, w->shard_count, i, c->n);
    if (w->n_floats != c->m->n_floats || w->range_lo > w->range_hi || w->range_hi > w->n_floats)
        return dp_err(err, "%s: bad range [%" PRIu64 ", %" PRIu64 ") of %" PRIu64 " floats (model has %zu)",
                      s->endpoint, w->range_lo, w->range_hi, w->n_floats, c->m->n_floats);
    if (w->mode < DOWNPOUR__MODE__SYNC || w->mode > DOWNPOUR__MODE__SSP)
        return dp_err(err, "%s: unknown mode %d", s->endpoint, (int)w->mode);
    /* Replies come in any order: compared across shards once all are in. */
    s->info = (dp_ps_info_t){(dp_mode_t)w->mode, w->num_workers, w->replicas, w->staleness,
                             w->shard_count};
    s->lo = w->range_lo;
    s->hi = w->range_hi;
    s->version = w->version;
    return 0;
}

int dp_ps_client_new(dp_ps_client_t **out, const char *endpoints, const dp_model_t *m,
                         int worker_id, double timeout_s, dp_ps_info_t *info, char *err)
{
    *out = NULL;
    if (!endpoints || !endpoints[0]) return dp_err(err, "no ps endpoints (give tcp://HOST:PORT)");
    if (!(timeout_s > 0)) timeout_s = 30;
    dp_ps_client_t *c = dp_calloc(1, sizeof *c);
    c->m = m;
    c->worker_id = worker_id;
    c->timeout_s = timeout_s;
    atomic_init(&c->inflight, 0);
    c->sh = dp_calloc(S_MAX_SHARDS, sizeof *c->sh);
    const char *p = endpoints;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= sizeof c->sh[0].endpoint || c->n == S_MAX_SHARDS) {
            dp_err(err, "bad ps endpoints '%s' (expected tcp://h:p[,tcp://h2:p2...], at most %d)",
                   endpoints, S_MAX_SHARDS);
            goto fail;
        }
        memcpy(c->sh[c->n].endpoint, p, len);
        c->sh[c->n].endpoint[len] = 0;
        c->n++;
        p += len + (e ? 1 : 0);
    }
    c->ctx = zmq_ctx_new();
    for (int i = 0; i < c->n; i++)
        if (s_open(c, i, err) != 0) goto fail;
    /* HELLO once: ZeroMQ queues it until the server is up, so one request
     * waiting up to timeout_s covers a server that starts late. */
    s_begin(c);
    for (int i = 0; i < c->n; i++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__HELLO, 0, worker_id, m->fingerprint);
        Downpour__Hello h = DOWNPOUR__HELLO__INIT;
        h.model_spec = (char *)m->spec;
        h.in_c = m->in_c;
        h.in_h = m->in_h;
        h.in_w = m->in_w;
        h.n_floats = m->n_floats;
        env.hello = &h;
        if (s_request(c, i, &env, NULL, 0, err) != 0) goto fail;
    }
    if (s_finish_exchange(c, s_on_welcome, NULL, err) != 0) goto fail;
    c->info = c->sh[0].info;
    for (int i = 1; i < c->n; i++) {
        const dp_ps_info_t *a = &c->sh[i].info, *b = &c->info;
        if (a->mode != b->mode || a->num_workers != b->num_workers || a->replicas != b->replicas ||
            a->staleness != b->staleness) {
            dp_err(err, "%s: runs %s with %d workers, R=%d, S=%d but %s runs %s with %d workers, R=%d, S=%d",
                   c->sh[i].endpoint, dp_mode_name(a->mode), a->num_workers, a->replicas,
                   a->staleness, c->sh[0].endpoint, dp_mode_name(b->mode), b->num_workers,
                   b->replicas, b->staleness);
            goto fail;
        }
    }
    uint64_t at = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->sh[i].lo != at) {
            dp_err(err, "%s: holds floats [%" PRIu64 ", %" PRIu64 ") but the previous shard ends at %" PRIu64
                        " (are the ps endpoints in shard order?)",
                   c->sh[i].endpoint, c->sh[i].lo, c->sh[i].hi, at);
            goto fail;
        }
        at = c->sh[i].hi;
    }
    if (at != m->n_floats) {
        dp_err(err, "the %d ps shards hold floats [0, %" PRIu64 ") but the model has %zu (missing a shard?)",
               c->n, at, m->n_floats);
        goto fail;
    }
    if (info) *info = c->info;
    *out = c;
    return 0;
fail:
    dp_ps_client_destroy(&c);
    return -1;
}

/* ---- pull ------------------------------------------------------------- */

static int s_on_params(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                       const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    s_shard_t *s = &c->sh[i];
    float *params = arg;
    char e2[DP_ERR_LEN];
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", s->endpoint, env->error->message);
    if (env->type != DOWNPOUR__MSG_TYPE__PARAMS)
        return dp_err(err, "%s: answered PULL with %s", s->endpoint, dp_wire_type_name(env->type));
    if (dp_wire_check_range(env, s->lo, s->hi, e2) != 0)
        return dp_err(err, "%s: bad PARAMS: %s", s->endpoint, e2);
    for (int f = 0; f < nf; f++)
        memcpy(params + env->tensors[f]->offset, frames[f].data, frames[f].len);
    s->version = env->params->version;
    s->pulled = 1;
    return 0;
}

int dp_ps_client_pull(dp_ps_client_t *c, float *params, char *err)
{
    s_begin(c);
    for (int i = 0; i < c->n; i++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PULL, 0, c->worker_id, c->m->fingerprint);
        Downpour__Pull p = DOWNPOUR__PULL__INIT;
        p.min_version = c->info.mode == DP_MODE_SYNC ? c->sh[i].min_version : 0;
        env.pull = &p;
        if (s_request(c, i, &env, NULL, 0, err) != 0) {
            s_reset_unanswered(c);
            return -1;
        }
    }
    return s_finish_exchange(c, s_on_params, params, err);
}

/* ---- push ------------------------------------------------------------- */

typedef struct {
    dp_push_result_t *res;
    double staleness_sum;
} s_push_acc_t;

static void s_push_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub((atomic_int *)hint, 1);
}

static void s_set_reason(dp_push_result_t *r, const char *endpoint, const char *why)
{
    /* Truncation is fine: the reason is for a log line. */
    if (!r->reason[0]) {
        int n = snprintf(r->reason, sizeof r->reason, "%.60s: %s", endpoint, why);
        (void)n;
    }
}

static int s_on_ack(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                    const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_shard_t *s = &c->sh[i];
    s_push_acc_t *acc = arg;
    dp_push_result_t *r = acc->res;
    uint64_t stamped = s->version;
    s->min_version = 0;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR) {
        r->rejected++;
        s_set_reason(r, s->endpoint, env->error->message);
        return 0;
    }
    if (env->type != DOWNPOUR__MSG_TYPE__ACK)
        return dp_err(err, "%s: answered PUSH with %s", s->endpoint, dp_wire_type_name(env->type));
    const Downpour__Ack *a = env->ack;
    switch (a->status) {
    case DOWNPOUR__ACK_STATUS__APPLIED: r->applied++; break;
    case DOWNPOUR__ACK_STATUS__DROPPED: r->dropped++; break;
    case DOWNPOUR__ACK_STATUS__REJECTED: r->rejected++; break;
    default: return dp_err(err, "%s: ACK with unknown status %d", s->endpoint, (int)a->status);
    }
    if (a->status != DOWNPOUR__ACK_STATUS__APPLIED)
        s_set_reason(r, s->endpoint, a->reason && a->reason[0] ? a->reason : "no reason given");
    /* Sync: our gradient is in this version's aggregate (applied, or a
     * duplicate of one that is) — the next pull waits for the step. */
    if (a->status == DOWNPOUR__ACK_STATUS__APPLIED ||
        (a->status == DOWNPOUR__ACK_STATUS__DROPPED && a->staleness == 0))
        s->min_version = stamped + 1;
    if (a->staleness > r->staleness_max) r->staleness_max = a->staleness;
    acc->staleness_sum += (double)a->staleness;
    r->version += a->version;
    return 0;
}

/* Wait (bounded) until ZeroMQ has let go of every push frame. */
static int s_wait_released(dp_ps_client_t *c, char *err)
{
    double t0 = dp_now();
    while (atomic_load(&c->inflight) > 0) {
        if (dp_now() - t0 > c->timeout_s)
            return dp_err(err, "ZeroMQ still holds %d gradient frames after %.0f s",
                          atomic_load(&c->inflight), c->timeout_s);
        s_sleep(50e-6);
    }
    return 0;
}

int dp_ps_client_push(dp_ps_client_t *c, const float *grads, float loss, int batch,
                      dp_push_result_t *res, char *err)
{
    dp_push_result_t local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    for (int i = 0; i < c->n; i++)
        if (!c->sh[i].pulled)
            return dp_err(err, "push before the first pull (the gradient needs a version)");
    s_begin(c);
    int rc = 0;
    for (int i = 0; i < c->n && rc == 0; i++) {
        s_shard_t *s = &c->sh[i];
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PUSH, 0, c->worker_id, c->m->fingerprint);
        Downpour__Push p = DOWNPOUR__PUSH__INIT;
        p.version = s->version;
        p.loss = loss;
        p.batch = batch;
        env.push = &p;
        Downpour__TensorDesc d;
        Downpour__TensorDesc *dv[1] = {&d};
        int64_t shape[1];
        size_t cnt = (size_t)(s->hi - s->lo);
        dp_wire_desc_fill(&d, shape, "params", grads + s->lo, cnt, s->lo, 0, 0);
        env.n_tensors = 1;
        env.tensors = dv;
        atomic_fetch_add(&c->inflight, 1);
        dp_wire_payload_t pl = {grads + s->lo, cnt * sizeof(float), s_push_release, &c->inflight};
        rc = s_request(c, i, &env, &pl, 1, err);
    }
    s_push_acc_t acc = {res, 0};
    if (rc == 0) rc = s_wait(c, s_on_ack, &acc, err);
    if (rc != 0) s_reset_unanswered(c);
    char e2[DP_ERR_LEN];
    if (s_wait_released(c, e2) != 0) {
        if (rc == 0) rc = dp_err(err, "%s", e2);
        dp_log_error("%s", e2);
    }
    if (rc == 0) res->staleness_mean = acc.staleness_sum / c->n;
    return rc;
}

uint64_t dp_ps_client_version(const dp_ps_client_t *c)
{
    uint64_t v = 0;
    for (int i = 0; i < c->n; i++) v += c->sh[i].version;
    return v;
}

/* ---- stats, finish, shutdown ---------------------------------------- */

typedef struct {
    dp_ps_stats_t st;
    int finished, gone, num_workers;
} s_stats_acc_t;

static int s_on_stats(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                      const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    s_stats_acc_t *a = arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", c->sh[i].endpoint, env->error->message);
    if (env->type != DOWNPOUR__MSG_TYPE__STATS || !env->stats)
        return dp_err(err, "%s: answered STATS with %s", c->sh[i].endpoint,
                      dp_wire_type_name(env->type));
    const Downpour__Stats *s = env->stats;
    if (i == 0) {
        a->st.applied = s->applied;
        a->st.dropped = s->dropped;
        a->st.rejected = s->rejected;
        a->st.staleness_mean = s->staleness_mean;
        a->st.staleness_max = s->staleness_max;
        a->finished = s->workers_finished;
        a->gone = s->workers_gone;
        a->num_workers = s->num_workers;
    }
    a->st.version += s->version;
    return 0;
}

static int s_stats(dp_ps_client_t *c, s_stats_acc_t *a, int only_first, char *err)
{
    memset(a, 0, sizeof *a);
    s_begin(c);
    for (int i = 0; i < (only_first ? 1 : c->n); i++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__STATS, 0, c->worker_id, c->m->fingerprint);
        if (s_request(c, i, &env, NULL, 0, err) != 0) {
            s_reset_unanswered(c);
            return -1;
        }
    }
    return s_finish_exchange(c, s_on_stats, a, err);
}

int dp_ps_client_stats(dp_ps_client_t *c, dp_ps_stats_t *out, char *err)
{
    s_stats_acc_t a;
    if (s_stats(c, &a, 0, err) != 0) return -1;
    *out = a.st;
    return 0;
}

static int s_on_bare(dp_ps_client_t *c, int i, const Downpour__Envelope *env,
                     const dp_wire_frame_t *frames, int nf, void *arg, char *err)
{
    (void)frames, (void)nf;
    int want = *(int *)arg;
    if (env->type == DOWNPOUR__MSG_TYPE__ERROR)
        return dp_err(err, "%s: %s", c->sh[i].endpoint, env->error->message);
    if ((int)env->type != want)
        return dp_err(err, "%s: answered %s with %s", c->sh[i].endpoint, dp_wire_type_name(want),
                      dp_wire_type_name(env->type));
    return 0;
}

int dp_ps_client_finish(dp_ps_client_t *c, char *err)
{
    s_begin(c);
    for (int i = 0; i < c->n; i++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__BARRIER, 0, c->worker_id, c->m->fingerprint);
        Downpour__Barrier b = DOWNPOUR__BARRIER__INIT;
        b.finished = 1;
        env.barrier = &b;
        if (s_request(c, i, &env, NULL, 0, err) != 0) {
            s_reset_unanswered(c);
            return -1;
        }
    }
    int want = DOWNPOUR__MSG_TYPE__BARRIER;
    if (s_finish_exchange(c, s_on_bare, &want, err) != 0) return -1;
    c->finished = 1;
    return 0;
}

int dp_ps_client_wait_all_finished(dp_ps_client_t *c, double timeout_s, char *err)
{
    if (!c->finished && dp_ps_client_finish(c, err) != 0) return -1;
    double t0 = dp_now();
    for (;;) {
        s_stats_acc_t a;
        if (s_stats(c, &a, 1, err) != 0) return -1;
        int done = a.finished + a.gone;
        if (done >= a.num_workers) return 0;
        if (dp_now() - t0 >= timeout_s)
            return dp_err(err, "%d of %d workers still running after %.0f s",
                          a.num_workers - done, a.num_workers, timeout_s);
        if (c->stop && *c->stop) return dp_err(err, "interrupted");
        s_sleep(0.1);
    }
}

int dp_ps_client_shutdown_servers(dp_ps_client_t *c, char *err)
{
    s_begin(c);
    for (int i = 0; i < c->n; i++) {
        Downpour__Envelope env;
        dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__SHUTDOWN, 0, c->worker_id, c->m->fingerprint);
        if (s_request(c, i, &env, NULL, 0, err) != 0) {
            s_reset_unanswered(c);
            return -1;
        }
    }
    int want = DOWNPOUR__MSG_TYPE__SHUTDOWN;
    return s_finish_exchange(c, s_on_bare, &want, err);
}

void dp_ps_client_set_stop_flag(dp_ps_client_t *c, volatile sig_atomic_t *flag)
{
    c->stop = flag;
}

void dp_ps_client_destroy(dp_ps_client_t **c_p)
{
    if (!c_p || !*c_p) return;
    dp_ps_client_t *c = *c_p;
    for (int i = 0; i < c->n; i++)
        if (c->sh[i].sock) zmq_close(c->sh[i].sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->sh);
    free(c);
    *c_p = NULL;
}
