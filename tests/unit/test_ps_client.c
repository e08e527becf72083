/* test_ps_client: the worker's client (worker/client/ps_client.h) on its own,
 * against scripted fake shards — a ROUTER socket in a thread of this process
 * per shard, bound to a free loopback port — so that each rule of an
 * exchange can be provoked: every shard asked at once, STATS to shard 0
 * only while waiting for the others, a shard that defers but answers
 * heartbeats, a silent shard (and recovery once it answers again), a late
 * reply to an abandoned request, the stop flag, bad endpoint lists; a pull
 * in parts (the forward reads the first part while the rest is held back,
 * a shard that lies about its parts' order, runs or versions, one that
 * restarts after the caller read a part). Every case is bounded in time
 * by short client timeouts. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/model.h"
#include "common/util.h"
#include "proto/wire_zmq.h"
#include "tests/test.h"
#include "worker/client/ps_beat.h"
#include "worker/client/ps_client.h"

#define SMALL_SPEC "conv3x3:2 relu maxpool2 fc:4 softmax"
/* A client's options: timeout t, the defaults otherwise. */
#define TMO(t) (&(dp_ps_client_opts_t){.timeout_s = (t)})
/* A push of g (loss 1, batch 8), no step, the last pull's stamp. */
#define PUSH(g) (&(dp_ps_push_t){.grads = (g), .loss = 1.0f, .batch = 8})

/* ---- a fake shard ------------------------------------------------------ */

typedef struct fake fake_t;
static int seen(fake_t *f, int type);

/* What the fake does with a PULL. */
enum { F_ANSWER, F_DEFER /* never answers, answers heartbeats */, F_SILENT /* answers nothing */,
       F_LATE_FIRST /* a reply with another request id, then the real one */,
       /* a pull in parts (Pull.cuts), part 0 first; the rest once go is set: */
       F_PARTS /* as asked */, F_PARTS_SWAP /* parts 1 and 0 swapped */,
       F_PARTS_MIXED /* part 1 of a newer version */, F_PARTS_SHORT /* part 0 a float short */,
       F_PARTS_RESTART /* restarted (a new incarnation) before part 1; the repeat as asked */ };

struct fake {
    int index, count;         /* shard index of count */
    uint64_t lo, hi, n_floats;
    float *values;            /* [hi - lo], what PARAMS carries */
    atomic_int pull_mode;     /* F_* */
    atomic_int seen[DOWNPOUR__MSG_TYPE__ERROR + 1]; /* requests received, by type */
    atomic_int finished;      /* a BARRIER finished arrived */
    atomic_int go;            /* F_PARTS*: the parts after the first may go */
    atomic_int lacking;       /* the next PUSH is answered RECEIVED (its earlier parts lost), once */
    atomic_ullong incarnation; /* on every reply (0: none) */
    atomic_int stop;
    int started;              /* the thread runs */
    void *ctx, *sock;
    pthread_t th;
    char endpoint[256];
};

static int seen(fake_t *f, int type) { return atomic_load(&f->seen[type]); }

static void fake_send(fake_t *f, zmq_msg_t *id, const Downpour__Envelope *env,
                      const dp_wire_payload_t *pl, int n_pl)
{
    char err[DP_ERR_LEN];
    if (dp_wire_send(f->sock, id, env, pl, n_pl, err) != 0) fprintf(stderr, "  fake: %s\n", err);
}

static void fake_free(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* One PARAMS message of request_id: floats [a, b) of values + add, as part
 * `part` of `parts` (0: whole), of version; the copy is ZeroMQ's to free. */
typedef struct {
    uint64_t a, b;
    uint32_t part, parts;
    uint64_t version;
} fake_run_t;

static void fake_params_run(fake_t *f, zmq_msg_t *id, uint64_t request_id, float add,
                            const fake_run_t *r)
{
    size_t cnt = (size_t)(r->b - r->a);
    float *v = dp_malloc(cnt * sizeof *v);
    for (size_t k = 0; k < cnt; k++) v[k] = f->values[r->a - f->lo + k] + add;
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__PARAMS, request_id, -1, 0);
    env.incarnation = atomic_load(&f->incarnation);
    Downpour__Params p = DOWNPOUR__PARAMS__INIT;
    p.part = r->part;
    p.parts = r->parts;
    p.version = r->version;
    env.params = &p;
    Downpour__TensorDesc d;
    Downpour__TensorDesc *dv[1] = {&d};
    int64_t shape[1];
    dp_wire_desc_fill(&d, shape, "params", v, cnt, r->a, 0, 0);
    env.n_tensors = 1;
    env.tensors = dv;
    dp_wire_payload_t pl = {v, cnt * sizeof *v, fake_free, NULL};
    fake_send(f, id, &env, &pl, 1);
}

/* PARAMS for request_id, whole: values + add. */
static void fake_params(fake_t *f, zmq_msg_t *id, uint64_t request_id, float add)
{
    fake_run_t r = {f->lo, f->hi, 0, 0, 0};
    fake_params_run(f, id, request_id, add, &r);
}

/* Wait (at most 5 s) until the case lets the later parts go. */
static void fake_wait_go(fake_t *f)
{
    for (int t = 0; t < 5000 && !atomic_load(&f->go) && !atomic_load(&f->stop); t++) usleep(1000);
}

/* A pull in parts, the way mode scripts it: values + add (+ 10 from the
 * second pull on, another snapshot), version 7 (part 1 of F_PARTS_MIXED:
 * 8). */
static void fake_params_parts(fake_t *f, zmq_msg_t *id, const Downpour__Envelope *req, int mode)
{
    const Downpour__Pull *p = req->pull;
    uint32_t parts = (uint32_t)p->n_cuts + 1;
    float add = seen(f, DOWNPOUR__MSG_TYPE__PULL) > 1 ? 10.0f : 0.0f;
    fake_run_t run[DP_WIRE_MAX_PULL_PARTS];
    for (uint32_t k = 0; k < parts; k++)
        run[k] = (fake_run_t){k ? p->cuts[k - 1] : f->lo, k + 1 < parts ? p->cuts[k] : f->hi, k,
                              parts, 7};
    if (add == 0.0f && mode == F_PARTS_SHORT) run[0].b--;
    if (add == 0.0f && mode == F_PARTS_MIXED && parts > 1) run[1].version = 8;
    if (add == 0.0f && mode == F_PARTS_SWAP && parts > 1) {
        fake_run_t t = run[0];
        run[0] = run[1];
        run[1] = t;
    }
    for (uint32_t k = 0; k < parts; k++) {
        if (k == 1 && add == 0.0f) {
            fake_wait_go(f);
            if (mode == F_PARTS_RESTART) atomic_fetch_add(&f->incarnation, 1);
        }
        fake_params_run(f, id, req->request_id, add, &run[k]);
    }
}

/* Answer one request the way f is scripted to. */
static void fake_answer(fake_t *f, zmq_msg_t *id, const Downpour__Envelope *req)
{
    int type = req->type, mode = atomic_load(&f->pull_mode);
    atomic_fetch_add(&f->seen[type], 1);
    Downpour__Envelope env;
    dp_wire_env_init(&env, type, req->request_id, -1, 0);
    env.incarnation = atomic_load(&f->incarnation);
    Downpour__Welcome w = DOWNPOUR__WELCOME__INIT;
    Downpour__Ack a = DOWNPOUR__ACK__INIT;
    Downpour__Barrier b = DOWNPOUR__BARRIER__INIT;
    Downpour__Stats s = DOWNPOUR__STATS__INIT;
    switch (type) {
    case DOWNPOUR__MSG_TYPE__HELLO:
        env.type = DOWNPOUR__MSG_TYPE__WELCOME;
        w.mode = DOWNPOUR__MODE__ASYNC;
        w.num_workers = w.replicas = 1;
        w.shard_index = f->index;
        w.shard_count = f->count;
        w.range_lo = f->lo;
        w.range_hi = f->hi;
        w.n_floats = f->n_floats;
        env.welcome = &w;
        break;
    case DOWNPOUR__MSG_TYPE__PULL:
        if (mode == F_DEFER || mode == F_SILENT) return;
        if (mode >= F_PARTS) {
            fake_params_parts(f, id, req, mode);
            return;
        }
        if (mode == F_LATE_FIRST) fake_params(f, id, req->request_id - 1, 100.0f);
        fake_params(f, id, req->request_id, 0.0f);
        return;
    case DOWNPOUR__MSG_TYPE__HEARTBEAT:
        if (mode == F_SILENT) return;
        break;
    case DOWNPOUR__MSG_TYPE__PUSH:
        env.type = DOWNPOUR__MSG_TYPE__ACK;
        a.status = atomic_exchange(&f->lacking, 0) ? DOWNPOUR__ACK_STATUS__RECEIVED
                                                   : DOWNPOUR__ACK_STATUS__APPLIED;
        a.version = 1;
        env.ack = &a;
        break;
    case DOWNPOUR__MSG_TYPE__BARRIER:
        atomic_store(&f->finished, 1);
        env.barrier = &b;
        break;
    case DOWNPOUR__MSG_TYPE__STATS:
        s.num_workers = 1;
        s.workers_finished = atomic_load(&f->finished);
        s.version = 3;
        env.stats = &s;
        break;
    default: break; /* SHUTDOWN: a bare reply */
    }
    fake_send(f, id, &env, NULL, 0);
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while (!atomic_load(&f->stop)) {
        zmq_pollitem_t it = {f->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0) continue;
        dp_wire_rx_t rx;
        char err[DP_ERR_LEN];
        if (dp_wire_recv(f->sock, &rx, ZMQ_DONTWAIT, err) != 0) continue;
        Downpour__Envelope *env = rx.n_parts >= 2
            ? dp_wire_decode(zmq_msg_data(&rx.parts[1]), zmq_msg_size(&rx.parts[1]), err) : NULL;
        if (env) fake_answer(f, &rx.parts[0], env);
        else fprintf(stderr, "  fake: undecodable request: %s\n", err);
        dp_wire_destroy(&env);
        dp_wire_rx_fini(&rx);
    }
    return NULL;
}

/* Shard index of count of model m; PARAMS carry fill + float index. */
static int fake_start(fake_t *f, const dp_model_t *m, int index, int count)
{
    memset(f, 0, sizeof *f);
    atomic_store(&f->incarnation, 1); /* F_PARTS_RESTART moves it on */
    f->index = index;
    f->count = count;
    f->n_floats = m->n_floats;
    f->lo = m->n_floats * (uint64_t)index / (uint64_t)count;
    f->hi = m->n_floats * (uint64_t)(index + 1) / (uint64_t)count;
    f->values = dp_malloc((size_t)(f->hi - f->lo) * sizeof(float));
    for (uint64_t k = f->lo; k < f->hi; k++) f->values[k - f->lo] = (float)k;
    f->ctx = zmq_ctx_new();
    f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(f->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(f->sock, "tcp://127.0.0.1:*") != 0) return -1;
    size_t len = sizeof f->endpoint;
    zmq_getsockopt(f->sock, ZMQ_LAST_ENDPOINT, f->endpoint, &len);
    f->started = pthread_create(&f->th, NULL, fake_main, f) == 0;
    return f->started ? 0 : -1;
}

static void fake_stop(fake_t *f)
{
    atomic_store(&f->stop, 1);
    if (f->started) pthread_join(f->th, NULL);
    zmq_close(f->sock);
    zmq_ctx_term(f->ctx);
    free(f->values);
}


static dp_model_t s_small;
static void s_small_model(void)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(&s_small, SMALL_SPEC, 1, 8, 8, err) != 0) {
        fprintf(stderr, "model: %s\n", err);
        exit(1);
    }
}

/* params[k] == k + add for every float. */
static int s_params_ok(const float *p, size_t n, float add)
{
    for (size_t k = 0; k < n; k++)
        if (p[k] != (float)k + add) return 0;
    return 1;
}

/* n fake shards of model m, and a client connected to them. */
static int s_cluster_of(fake_t *f, int n, const dp_model_t *m, const dp_ps_client_opts_t *o,
                        dp_ps_client_t **c, dp_ps_info_t *info, char *err)
{
    char eps[1024] = "";
    int rc = 0;
    for (int i = 0; i < n; i++) {
        rc |= fake_start(&f[i], m, i, n);
        size_t at = strlen(eps);
        snprintf(eps + at, sizeof eps - at, "%s%s", i ? "," : "", f[i].endpoint);
    }
    if (rc != 0) return dp_err(err, "cannot start the fake shards");
    return dp_ps_client_new(c, eps, m, 0, o, info, err);
}

/* n fake shards of the small model, and a client connected to them. */
static int s_cluster(fake_t *f, int n, const dp_ps_client_opts_t *o, dp_ps_client_t **c,
                     dp_ps_info_t *info, char *err)
{
    s_small_model();
    return s_cluster_of(f, n, &s_small, o, c, info, err);
}

static void s_cluster_end(fake_t *f, int n, dp_ps_client_t **c)
{
    dp_ps_client_destroy(c);
    for (int i = 0; i < n; i++) fake_stop(&f[i]);
}

/* One fake shard and a client with options o on it; body runs with a
 * buffer of the small model's floats once both are up. */
typedef void (*s_one_body_t)(fake_t *f, dp_ps_client_t *c, float *p, char *err);

static void s_with_one_shard(const dp_ps_client_opts_t *o, s_one_body_t body)
{
    fake_t f;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(s_cluster(&f, 1, o, &c, NULL, err), 0);
    if (c) {
        float *p = dp_calloc(s_small.n_floats, sizeof *p);
        body(&f, c, p, err);
        free(p);
    }
    s_cluster_end(&f, 1, &c);
}

/* ---- cases ------------------------------------------------------------- */

/* Each operation reaches every shard once; waiting for the other workers
 * asks shard 0 only. */
static void test_every_shard_asked(void)
{
    fake_t f[2];
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    dp_ps_info_t info;
    CHECK_EQ(s_cluster(f, 2, TMO(5.0), &c, &info, err), 0);
    if (c) {
        CHECK_EQ(info.mode, DP_MODE_ASYNC);
        CHECK_EQ(info.num_shards, 2);
        size_t n = s_small.n_floats;
        float *p = dp_calloc(n, sizeof *p), *g = dp_calloc(n, sizeof *g);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK(s_params_ok(p, n, 0.0f));
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PUSH(g), &r, err), 0);
        CHECK_EQ(r.applied, 2);
        CHECK_EQ(r.version, 2);
        dp_ps_stats_t st;
        CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
        CHECK_EQ(st.version, 6); /* summed over shards */
        CHECK_EQ(dp_ps_client_wait_all_finished(c, 5.0, err), 0);
        CHECK_EQ(dp_ps_client_shutdown_servers(c, err), 0);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ(seen(&f[i], DOWNPOUR__MSG_TYPE__HELLO), 1);
            CHECK_EQ(seen(&f[i], DOWNPOUR__MSG_TYPE__PULL), 1);
            CHECK_EQ(seen(&f[i], DOWNPOUR__MSG_TYPE__PUSH), 1);
            CHECK_EQ(seen(&f[i], DOWNPOUR__MSG_TYPE__BARRIER), 1);
            CHECK_EQ(seen(&f[i], DOWNPOUR__MSG_TYPE__SHUTDOWN), 1);
        }
        CHECK_EQ(seen(&f[0], DOWNPOUR__MSG_TYPE__STATS), 2); /* stats + the wait */
        CHECK_EQ(seen(&f[1], DOWNPOUR__MSG_TYPE__STATS), 1);
        free(p), free(g);
    }
    s_cluster_end(f, 2, &c);
}

/* A shard that defers a pull but answers heartbeats is waited for past the
 * timeout, up to 20 timeouts; then the client asks again on a fresh socket. */
static void test_deferred_then_gives_up_body(fake_t *f, dp_ps_client_t *c, float *p, char *err)
{
    atomic_store(&f->pull_mode, F_DEFER);
    double t0 = dp_now();
    CHECK_EQ(dp_ps_client_pull(c, p, err), -1);
    double dt = dp_now() - t0;
    CHECK(dt >= 10.0 && dt < 20.0);
    CHECK(strstr(err, "request still deferred after 10 s") != NULL);
    CHECK_EQ(dp_ps_client_error(c), DP_PS_ERR_DEFERRED);
    CHECK(strstr(err, f->endpoint) != NULL);
    CHECK(seen(f, DOWNPOUR__MSG_TYPE__HEARTBEAT) >= 20);
    fprintf(stderr, "  (expected) %s\n", err);
    atomic_store(&f->pull_mode, F_ANSWER);
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    CHECK(s_params_ok(p, s_small.n_floats, 0.0f));
}

static void test_deferred_then_gives_up(void)
{
    s_with_one_shard(TMO(0.5), test_deferred_then_gives_up_body);
}

/* One silent shard of two fails pull and push with its endpoint named; once
 * it answers again, so does the client. */
static void test_silent_shard(void)
{
    fake_t f[2];
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(s_cluster(f, 2, TMO(1.0), &c, NULL, err), 0);
    if (c) {
        size_t n = s_small.n_floats;
        float *p = dp_calloc(n, sizeof *p), *g = dp_calloc(n, sizeof *g);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        atomic_store(&f[1].pull_mode, F_SILENT);
        double t0 = dp_now();
        CHECK_EQ(dp_ps_client_pull(c, p, err), -1);
        CHECK(dp_now() - t0 < 5.0);
        CHECK(strstr(err, "no reply in 1 s (is downpour-ps running?)") != NULL);
        CHECK(strstr(err, f[1].endpoint) != NULL);
        CHECK_EQ(dp_ps_client_error(c), DP_PS_ERR_TIMEOUT); /* the kind, not the text */
        atomic_store(&f[1].pull_mode, F_ANSWER);
        memset(p, 0, n * sizeof *p);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK_EQ(dp_ps_client_error(c), DP_PS_OK);
        CHECK(s_params_ok(p, n, 0.0f));
        dp_push_result_t r;
        CHECK_EQ(dp_ps_client_push(c, PUSH(g), &r, err), 0);
        CHECK_EQ(r.applied, 2);
        free(p), free(g);
    }
    s_cluster_end(f, 2, &c);
}

/* A reply carrying another request id (a late answer to an abandoned
 * request) only proves the shard alive; the pull takes the real one. */
static void test_late_reply_ignored_body(fake_t *f, dp_ps_client_t *c, float *p, char *err)
{
    atomic_store(&f->pull_mode, F_LATE_FIRST);
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    CHECK(s_params_ok(p, s_small.n_floats, 0.0f));
}

static void test_late_reply_ignored(void)
{
    s_with_one_shard(TMO(5.0), test_late_reply_ignored_body);
}

typedef struct {
    volatile sig_atomic_t *flag;
    double after_s;
} raiser_t;

static void *s_raise_later(void *arg)
{
    raiser_t *r = arg;
    usleep((useconds_t)(r->after_s * 1e6));
    *r->flag = 1;
    return NULL;
}

/* The stop flag ends a blocked pull soon, whatever the timeout. */
static void test_stop_flag(void)
{
    fake_t f;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    static volatile sig_atomic_t stop;
    dp_ps_client_opts_t o = {.timeout_s = 30.0, .stop = &stop};
    CHECK_EQ(s_cluster(&f, 1, &o, &c, NULL, err), 0);
    if (c) {
        float *p = dp_calloc(s_small.n_floats, sizeof *p);
        atomic_store(&f.pull_mode, F_DEFER);
        raiser_t r = {&stop, 0.3};
        pthread_t th;
        pthread_create(&th, NULL, s_raise_later, &r);
        double t0 = dp_now();
        CHECK_EQ(dp_ps_client_pull(c, p, err), -1);
        CHECK(dp_now() - t0 < 3.0);
        CHECK_STR(err, "interrupted");
        CHECK_EQ(dp_ps_client_error(c), DP_PS_ERR_INTERRUPTED);
        pthread_join(th, NULL);
        free(p);
    }
    s_cluster_end(&f, 1, &c);
}

/* Endpoint lists the client refuses before any network traffic. */
static void test_bad_endpoints(void)
{
    s_small_model();
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(dp_ps_client_new(&c, "", &s_small, 0, TMO(1.0), NULL, err), -1);
    CHECK(strstr(err, "no ps endpoints") != NULL);
    CHECK_EQ(dp_ps_client_new(&c, "tcp://127.0.0.1:1,,tcp://127.0.0.1:2", &s_small, 0, TMO(1.0), NULL, err), -1);
    CHECK(strstr(err, "bad ps endpoints") != NULL);
    CHECK_EQ(dp_ps_client_new(&c, "localhost:5000", &s_small, 0, TMO(1.0), NULL, err), -1);
    CHECK(strstr(err, "localhost:5000: bad ps endpoint") != NULL);
    CHECK(c == NULL);
    /* The heartbeat thread reads the list as the client does: an empty
     * entry is a typo named, not a shard skipped. */
    dp_ps_beat_t *b = NULL;
    CHECK_EQ(dp_ps_beat_new(&b, "tcp://127.0.0.1:1,,tcp://127.0.0.1:2", 0, 1, NULL, err), -1);
    CHECK(strstr(err, "bad ps endpoints") != NULL && strstr(err, "entry 2 is empty") != NULL);
    CHECK(b == NULL);
    CHECK_EQ(dp_ps_beat_new(&b, "tcp://127.0.0.1:1,", 0, 1, NULL, err), -1);
    CHECK(strstr(err, "entry 2 is empty") != NULL);
}

/* ---- a pull in parts ---------------------------------------------------- */

/* Three layers of 0.27, 4.2 and 0.02 MB: the client cuts each reply where
 * the second and the third begin (DP_PS_PULL_BUCKET_BYTES). */
#define PARTS_SPEC "fc:1024 fc:1024 fc:4 softmax"

/* One fake shard of PARTS_SPEC (into m), and a client connected to it. */
static int s_parts_cluster(dp_model_t *m, fake_t *f, dp_ps_client_t **c, char *err)
{
    if (dp_model_parse(m, PARTS_SPEC, 1, 8, 8, err) != 0) {
        fprintf(stderr, "model: %s\n", err);
        exit(1);
    }
    return s_cluster_of(f, 1, m, TMO(5.0), c, NULL, err);
}

/* The last part of a push answered RECEIVED (the shard lacks the parts
 * before it, lost with a dropped connection): the reply says "again", so
 * the client says HELLO at once, which discards them there, and pushes
 * again; the second ACK is the push's. */
static void test_push_again_when_parts_lost_body(fake_t *f, dp_ps_client_t *c, float *p, char *err)
{
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    atomic_store(&f->lacking, 1);
    dp_push_result_t r;
    double t0 = dp_now();
    CHECK_EQ(dp_ps_client_push(c, PUSH(p), &r, err), 0);
    CHECK(dp_now() - t0 < 2.0); /* at once, not after the 5 s timeout's repeat */
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(seen(f, DOWNPOUR__MSG_TYPE__HELLO), 2);
    CHECK_EQ(seen(f, DOWNPOUR__MSG_TYPE__PUSH), 2);
}

static void test_push_again_when_parts_lost(void)
{
    s_with_one_shard(TMO(5.0), test_push_again_when_parts_lost_body);
}

/* A push whose slice is final before push_end leaves then, once: push_end
 * awaits that request's ACK and sends nothing again (the shard sees one
 * PUSH; the fake takes no parts, so the push is one part, sent early). */
static void test_push_part_sent_once_body(fake_t *f, dp_ps_client_t *c, float *p, char *err)
{
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    dp_ps_push_t pp = {.grads = p, .loss = 1.0f, .batch = 8, .step = 1};
    CHECK_EQ(dp_ps_client_push_begin(c, &pp, err), 0);
    dp_ps_client_push_part(c, 0, s_small.n_floats);
    dp_push_result_t r;
    CHECK_EQ(dp_ps_client_push_end(c, &r, err), 0);
    CHECK_EQ(r.applied, 1);
    CHECK_EQ(r.parts, 1);
    CHECK_EQ(r.parts_early, 1);
    CHECK_EQ(seen(f, DOWNPOUR__MSG_TYPE__PUSH), 1);
}

static void test_push_part_sent_once(void)
{
    s_with_one_shard(TMO(5.0), test_push_part_sent_once_body);
}

/* pull_until returns once the first layer's part is in, while the shard
 * holds the rest back (the forward could run on it); pull_until(n_floats)
 * once all are, three messages of one version. */
static void test_pull_in_parts(void)
{
    dp_model_t m;
    fake_t f;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(s_parts_cluster(&m, &f, &c, err), 0);
    if (c) {
        size_t n = m.n_floats, lo, hi;
        float *p = dp_malloc(n * sizeof *p);
        for (size_t k = 0; k < n; k++) p[k] = -1.0f;
        CHECK(dp_model_layer_span(&m, 0, &lo, &hi));
        atomic_store(&f.pull_mode, F_PARTS);
        CHECK_EQ(dp_ps_client_pull_begin(c, p, err), 0);
        CHECK_EQ(dp_ps_client_pull_until(c, hi, err), DP_PULL_OK);
        CHECK(s_params_ok(p, hi, 0.0f));
        CHECK(p[hi] == -1.0f); /* the rest still held by the shard */
        atomic_store(&f.go, 1);
        CHECK_EQ(dp_ps_client_pull_until(c, n, err), DP_PULL_OK);
        CHECK(s_params_ok(p, n, 0.0f));
        CHECK_EQ(dp_ps_client_pull_parts(c), 3);
        CHECK_EQ(dp_ps_client_version(c), 7);
        /* a whole pull asks for no cuts, and gets one message */
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
        CHECK(s_params_ok(p, n, 10.0f));
        CHECK_EQ(dp_ps_client_pull_parts(c), 1);
        free(p);
    }
    s_cluster_end(&f, 1, &c);
}

/* A shard that lies about its parts (their order, a run, the version)
 * fails the pull with one line naming it; the client pulls on. */
static void test_pull_parts_lies(void)
{
    struct {
        int mode;
        const char *says;
    } lie[] = {
        {F_PARTS_SWAP, "bad PARAMS: part 1 where part 0 was due"},
        {F_PARTS_MIXED, "bad PARAMS: part 1 is of version 8, part 0 of 7 (a pull is one version)"},
        {F_PARTS_SHORT, "bad PARAMS: part 0 of 3 holds floats [0, 66559), not [0, 66560)"},
    };
    for (size_t k = 0; k < sizeof lie / sizeof lie[0]; k++) {
        dp_model_t m;
        fake_t f;
        char err[DP_ERR_LEN] = "";
        dp_ps_client_t *c = NULL;
        CHECK_EQ(s_parts_cluster(&m, &f, &c, err), 0);
        if (!c) {
            s_cluster_end(&f, 1, &c);
            continue;
        }
        float *p = dp_calloc(m.n_floats, sizeof *p);
        atomic_store(&f.pull_mode, lie[k].mode);
        atomic_store(&f.go, 1);
        CHECK_EQ(dp_ps_client_pull_begin(c, p, err), 0);
        CHECK_EQ(dp_ps_client_pull_until(c, m.n_floats, err), DP_PULL_FAILED);
        CHECK(strstr(err, lie[k].says) != NULL);
        CHECK(strstr(err, f.endpoint) != NULL);
        fprintf(stderr, "  (expected) %s\n", err);
        CHECK_EQ(dp_ps_client_pull(c, p, err), 0); /* the next pull, whole and honest */
        CHECK(s_params_ok(p, m.n_floats, 10.0f));
        free(p);
        s_cluster_end(&f, 1, &c);
    }
}

/* The shard restarts after the caller read the first part: the client
 * says HELLO again, takes the repeated reply whole, and says so (TORN): the
 * forward starts again on weights all of the new snapshot. */
static void test_pull_parts_torn(void)
{
    dp_model_t m;
    fake_t f;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(s_parts_cluster(&m, &f, &c, err), 0);
    if (c) {
        size_t n = m.n_floats, lo, hi;
        float *p = dp_calloc(n, sizeof *p);
        CHECK(dp_model_layer_span(&m, 0, &lo, &hi));
        atomic_store(&f.pull_mode, F_PARTS_RESTART);
        CHECK_EQ(dp_ps_client_pull_begin(c, p, err), 0);
        CHECK_EQ(dp_ps_client_pull_until(c, hi, err), DP_PULL_OK);
        CHECK(s_params_ok(p, hi, 0.0f));
        atomic_store(&f.go, 1);
        CHECK_EQ(dp_ps_client_pull_until(c, n, err), DP_PULL_TORN);
        CHECK(s_params_ok(p, n, 10.0f)); /* every float of the repeated reply */
        CHECK_EQ(seen(&f, DOWNPOUR__MSG_TYPE__HELLO), 2);
        CHECK_EQ(seen(&f, DOWNPOUR__MSG_TYPE__PULL), 2);
        CHECK_EQ(dp_ps_client_pull_until(c, n, err), DP_PULL_OK); /* the forward's second pass: all in */
        free(p);
    }
    s_cluster_end(&f, 1, &c);
}

DP_TESTS(T(test_every_shard_asked), T(test_deferred_then_gives_up), T(test_silent_shard),
         T(test_late_reply_ignored), T(test_stop_flag), T(test_bad_endpoints),
         T(test_pull_in_parts), T(test_pull_parts_lies), T(test_pull_parts_torn),
         T(test_push_again_when_parts_lost), T(test_push_part_sent_once))
