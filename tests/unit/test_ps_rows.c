/* test_ps_rows: a row table on the wire (server/core/ps_rows.h, the client's
 * dp_ps_client_rows_pull / rows_push) against real shards over ZeroMQ:
 *  - async over 2 shards: every pull equals a reference table in this
 *    process fed the same pushes (one table for every key: the per-row
 *    optimizer makes sharding invisible), bit for bit, over several steps
 *    that touch new and old keys; each key lives on the shard the hash
 *    names; the bytes moved are the rows touched, not the table;
 *  - bad input, each one refusal and nothing changed: a key of another
 *    shard, a key twice, a push of a key not pulled, a NaN, the wrong width,
 *    too many keys, a model without a row table; a repeated step applied
 *    once;
 *  - sync rows (--rows-mode sync with --mode sync): the step's rows are the
 *    mean of exactly the workers whose dense gradient the step took, applied
 *    when it fires, invisible before; with a backup worker (R = 1 of 2) the
 *    other's rows are dropped with its dense gradient;
 *  - hybrid (--mode sync --rows-mode async): a row push is visible to the
 *    other worker at once, before the dense step fires;
 *  - STATS counts rows per shard;
 *  - a scan (dp_ps_client_rows_all, the chief's --save) reads every row of
 *    every shard once, ascending, in pages of a bound, the bits of a pull;
 *    its cursor past the end, its page bound, its refusals. */
#include <inttypes.h>
#include <stdint.h>

#include "common/rng.h"
#include "server/core/rows.h"
#include "server/loop/ps_loop.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

#define TMO 5.0
#define D 3 /* an awkward width */
#define SPEC "embed:3 fc:2 softmax" /* logistic regression on a 3-wide embedding */

/* The clients' model: the shards parse the same spec. */
static void s_model(dp_model_t *m)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(m, SPEC, 1, 1, 1, err) != 0) fprintf(stderr, "  %s\n", err);
}

typedef struct {
    srv_t s[2];
    int k;
    char eps[600];
} shards_t;

/* k shards of SPEC, its row table of width D with sgd at lr 1 from zeros
 * (unless the case changes cfg after), mode and rows mode, workers. */
static void s_shards_init(shards_t *sh, int k, dp_mode_t mode, dp_mode_t rows_mode, int workers)
{
    memset(sh, 0, sizeof *sh);
    sh->k = k;
    for (int i = 0; i < k; i++) {
        srv_init(&sh->s[i], mode, workers);
        sh->s[i].cfg.shard_index = i;
        sh->s[i].cfg.shard_count = k;
        snprintf(sh->s[i].cfg.model_spec, sizeof sh->s[i].cfg.model_spec, "%s", SPEC);
        dp_rows_conf_default(&sh->s[i].cfg.rows, D, DP_ROW_SGD);
        sh->s[i].cfg.row_lr = 1.0f;
        sh->s[i].cfg.row_init = 0;
        sh->s[i].cfg.rows_mode = rows_mode;
    }
}

static int s_shards_start(shards_t *sh)
{
    sh->eps[0] = 0;
    for (int i = 0; i < sh->k; i++) {
        if (srv_start(&sh->s[i]) != 0) {
            fprintf(stderr, "  shard %d: %s\n", i, sh->s[i].err);
            return -1;
        }
        snprintf(sh->eps + strlen(sh->eps), sizeof sh->eps - strlen(sh->eps), "%s%s",
                 i ? "," : "", sh->s[i].endpoint);
    }
    return 0;
}

static void s_shards_stop(shards_t *sh)
{
    for (int i = 0; i < sh->k; i++) CHECK_EQ(srv_stop(&sh->s[i]), 0);
}

static dp_ps_client_t *s_client(const shards_t *sh, const dp_model_t *m, int worker)
{
    dp_ps_client_t *c = NULL;
    char err[DP_ERR_LEN] = "";
    if (dp_ps_client_new(&c, sh->eps, m, worker, PS_OPTS(TMO), NULL, err) != 0)
        fprintf(stderr, "  client %d: %s\n", worker, err);
    return c;
}

static void s_grads(float *g, size_t n, uint64_t seed)
{
    dp_rng_t r;
    dp_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) g[i] = dp_rng_uniform(&r) * 2 - 1;
}

/* ---- async against the reference ---------------------------------------- */

static void test_async_reference(void)
{
    shards_t sh;
    s_shards_init(&sh, 2, DP_MODE_ASYNC, 0, 1);
    for (int i = 0; i < 2; i++) { /* adagrad at lr 0.3 from the default start: seeded */
        dp_rows_conf_default(&sh.s[i].cfg.rows, D, DP_ROW_ADAGRAD);
        sh.s[i].cfg.row_lr = 0.3f;
        sh.s[i].cfg.row_init = -1;
    }
    CHECK_EQ(s_shards_start(&sh), 0);
    dp_model_t m;
    s_model(&m);
    dp_ps_client_t *c = s_client(&sh, &m, 0);
    CHECK(c != NULL);
    char err[DP_ERR_LEN] = "";
    dp_rows_conf_t rc;
    dp_rows_conf_default(&rc, D, DP_ROW_ADAGRAD);
    rc.optim.lr = 0.3f;
    rc.init = DP_ROWS_INIT_UNIFORM; /* the shards' default start, by their --seed (7) */
    rc.init_scale = dp_rows_init_default(DP_ROW_ADAGRAD);
    rc.seed = 7;
    dp_rows_t *ref = dp_rows_new(&rc, err);
    enum { N = 40 };
    uint64_t keys[N];
    float rows[N * D], want[N * D], g[N * D];
    int on[2] = {0, 0};
    uint64_t pulled_bytes = 0;
    for (int step = 1; step <= 6 && c; step++) {
        /* half the keys new each step, half seen before; the whole 64-bit range */
        for (int j = 0; j < N; j++)
            keys[j] = j % 2 ? (uint64_t)(j + step) * 0x9E3779B97F4A7C15ull : (uint64_t)j * 7919u;
        uint64_t held = 0;
        CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, &held, err), 0);
        long want_held = dp_rows_pull(ref, keys, N, D, want, err);
        CHECK_EQ((long)held, want_held);
        CHECK_EQ(memcmp(rows, want, sizeof rows), 0);
        s_grads(g, N * D, (uint64_t)step);
        dp_push_result_t res;
        CHECK_EQ(dp_ps_client_rows_push(c, keys, N, D, g, (uint64_t)step, &res, err), 0);
        CHECK_EQ(res.applied, 2);
        CHECK_EQ(res.bytes, (uint64_t)N * (8 + D * 4));
        CHECK(dp_rows_push(ref, 0, keys, N, D, g, err) >= 0);
        for (int j = 0; j < N; j++) on[dp_rows_shard_of(keys[j], 2)]++;
    }
    pulled_bytes = dp_ps_client_bytes_pulled(c);
    CHECK_EQ(pulled_bytes, (uint64_t)6 * N * D * 4); /* the rows touched, nothing more */
    CHECK(on[0] > 0 && on[1] > 0);                     /* both shards hold keys */
    /* the last state: one more pull */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, NULL, err), 0);
    dp_rows_pull(ref, keys, N, D, want, err);
    CHECK_EQ(memcmp(rows, want, sizeof rows), 0);
    /* STATS: the rows each shard holds add up to the reference's */
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    dp_rows_stats_t rs;
    dp_rows_stats(ref, &rs);
    CHECK_EQ(st.rows_shards, 2);
    CHECK_EQ(st.rows[0] + st.rows[1], rs.rows);
    CHECK(st.rows[0] > 0 && st.rows[1] > 0);
    CHECK_EQ(st.row_pushes, 12); /* 6 steps x 2 shards */
    if (err[0] && !c) fprintf(stderr, "  %s\n", err);
    dp_rows_destroy(&ref);
    dp_ps_client_destroy(&c);
    s_shards_stop(&sh);
}

/* ---- bad input ----------------------------------------------------------- */

/* A key shard i holds (of k). */
static uint64_t s_key_of(int i, int k, uint64_t from)
{
    while (dp_rows_shard_of(from, (uint32_t)k) != (uint32_t)i) from++;
    return from;
}

static void test_bad_input(void)
{
    shards_t sh;
    s_shards_init(&sh, 1, DP_MODE_ASYNC, 0, 1);
    sh.s[0].cfg.rows.max_keys = 8;
    CHECK_EQ(s_shards_start(&sh), 0);
    dp_model_t m;
    s_model(&m);
    dp_ps_client_t *c = s_client(&sh, &m, 0);
    char err[DP_ERR_LEN] = "";
    uint64_t keys[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    float rows[9 * D], before[9 * D], g[9 * D];
    s_grads(g, 9 * D, 3);
    dp_push_result_t res;
    /* the first pull and push, good */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 4, D, rows, NULL, err), 0);
    CHECK_EQ(dp_ps_client_rows_push(c, keys, 4, D, g, 1, &res, err), 0);
    CHECK_EQ(res.applied, 1);
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 4, D, before, NULL, err), 0);
    CHECK(before[0] != 0);
    /* too many keys: one refusal */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 9, D, rows, NULL, err), -1);
    CHECK(strstr(err, "9 keys in one request") != NULL);
    /* a key twice */
    uint64_t twice[2] = {5, 5};
    CHECK_EQ(dp_ps_client_rows_pull(c, twice, 2, D, rows, NULL, err), -1);
    CHECK(strstr(err, "key 5 asked twice") != NULL);
    /* the wrong width */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 4, D + 1, rows, NULL, err), -1);
    CHECK(strstr(err, "width 4") != NULL);
    /* a push of a key not pulled: pull 1..4, push 1..3 and 6 */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 4, D, rows, NULL, err), 0);
    uint64_t other[4] = {1, 2, 3, 6};
    CHECK_EQ(dp_ps_client_rows_push(c, other, 4, D, g, 2, &res, err), 0);
    CHECK_EQ(res.rejected, 1);
    CHECK(strstr(res.reason, "key 6 was not in this worker's last ROWS_PULL") != NULL);
    /* a NaN */
    float bad[4 * D];
    memcpy(bad, g, sizeof bad);
    bad[2 * D + 1] = NAN;
    CHECK_EQ(dp_ps_client_rows_push(c, keys, 4, D, bad, 3, &res, err), 0);
    CHECK_EQ(res.rejected, 1);
    CHECK(strstr(res.reason, "non-finite gradient of key 3 (element 1)") != NULL);
    /* a repeat of step 1: acknowledged, not applied again */
    CHECK_EQ(dp_ps_client_rows_push(c, keys, 4, D, g, 1, &res, err), 0);
    CHECK_EQ(res.applied, 1);
    CHECK(strstr(res.reason, "") != NULL);
    /* nothing above changed a row */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 4, D, rows, NULL, err), 0);
    CHECK_EQ(memcmp(rows, before, sizeof(float) * 4 * D), 0);
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    CHECK_EQ(st.row_pushes, 1);
    CHECK_EQ(st.row_pushes_rejected, 2);
    dp_ps_client_destroy(&c);
    s_shards_stop(&sh);

    /* a key of another shard: a client that thinks there is one shard
     * talks to shard 0 of 2 */
    s_shards_init(&sh, 2, DP_MODE_ASYNC, 0, 1);
    CHECK_EQ(s_shards_start(&sh), 0);
    shards_t one = sh;
    dp_model_t m2;
    s_model(&m2);
    /* a raw peer: ROWS_PULL of shard 1's key to shard 0 */
    void *ctx = zmq_ctx_new();
    void *raw = raw_dealer(ctx, sh.s[0].endpoint, 3000);
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, &m2, 0, 1);
    CHECK_EQ(raw_request(raw, &env, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    uint64_t k1 = s_key_of(1, 2, 100);
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS_PULL, 2, 0, m2.fingerprint);
    Downpour__RowsPull rp = DOWNPOUR__ROWS_PULL__INIT;
    rp.width = D;
    env.rows_pull = &rp;
    Downpour__TensorDesc kd;
    Downpour__TensorDesc *kdv[1] = {&kd};
    int64_t shape[2];
    dp_wire_desc_keyed(&kd, shape, "keys", DOWNPOUR__DTYPE__UINT64, &k1, 1, 0);
    env.n_tensors = 1;
    env.tensors = kdv;
    dp_wire_payload_t pl = {&k1, 8, NULL, NULL};
    CHECK_EQ(dp_wire_send(raw, NULL, &env, &pl, 1, err), 0);
    raw_reply_t r = raw_reply(raw);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    char want[160];
    snprintf(want, sizeof want, "key %" PRIu64 " is held by shard 1, not this one (0 of 2)", k1);
    CHECK(strstr(r.text, want) != NULL);
    /* a ROWS_PULL carrying floats instead of keys: malformed */
    dp_wire_desc_keyed(&kd, shape, "keys", DOWNPOUR__DTYPE__FLOAT32, &k1, 2, 0);
    CHECK_EQ(dp_wire_send(raw, NULL, &env, &pl, 1, err), 0);
    r = raw_reply(raw);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "not keys, UINT64") != NULL);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    s_shards_stop(&sh);

    /* a model without a row table */
    srv_t plain;
    srv_init(&plain, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&plain), 0);
    snprintf(one.eps, sizeof one.eps, "%s", plain.endpoint);
    dp_model_t conv;
    srv_small_model(&conv);
    c = s_client(&one, &conv, 0);
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, 2, D, rows, NULL, err), -1);
    CHECK(strstr(err, "no row table") != NULL);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&plain), 0);
}

/* ---- sync and hybrid ------------------------------------------------------ */

/* Worker w's dense push of zeros (the dense part is not what is tested). */
static void s_dense_push(dp_ps_client_t *c, const dp_model_t *m, uint64_t step, dp_push_result_t *res)
{
    char err[DP_ERR_LEN] = "";
    float *z = dp_calloc(m->n_floats, sizeof *z);
    CHECK_EQ(dp_ps_client_push(c, PS_PUSH_STEP(step, z, 0.5f, 1), res, err), 0);
    free(z);
}

static void s_dense_pull(dp_ps_client_t *c, const dp_model_t *m)
{
    char err[DP_ERR_LEN] = "";
    float *p = dp_malloc(m->n_floats * sizeof *p);
    CHECK_EQ(dp_ps_client_pull(c, p, err), 0);
    free(p);
}

static void test_sync_rows(void)
{
    for (int backup = 0; backup <= 1; backup++) {
        shards_t sh;
        s_shards_init(&sh, 1, DP_MODE_SYNC, DP_MODE_SYNC, 2);
        if (backup) sh.s[0].cfg.replicas = 1;
        CHECK_EQ(s_shards_start(&sh), 0);
        dp_model_t m;
        s_model(&m);
        dp_ps_client_t *a = s_client(&sh, &m, 0), *b = s_client(&sh, &m, 1);
        char err[DP_ERR_LEN] = "";
        uint64_t ka[2] = {10, 20}, kb[2] = {20, 30}, all[3] = {10, 20, 30};
        float ga[2 * D], gb[2 * D], rows[3 * D];
        s_grads(ga, 2 * D, 1);
        s_grads(gb, 2 * D, 2);
        dp_push_result_t res;
        s_dense_pull(a, &m);
        s_dense_pull(b, &m);
        CHECK_EQ(dp_ps_client_rows_pull(a, ka, 2, D, rows, NULL, err), 0);
        CHECK_EQ(dp_ps_client_rows_pull(b, kb, 2, D, rows, NULL, err), 0);
        CHECK_EQ(dp_ps_client_rows_push(a, ka, 2, D, ga, 1, &res, err), 0);
        CHECK_EQ(dp_ps_client_rows_push(b, kb, 2, D, gb, 1, &res, err), 0);
        /* not applied before the dense step fires */
        CHECK_EQ(dp_ps_client_rows_pull(a, all, 3, D, rows, NULL, err), 0);
        for (int i = 0; i < 3 * D; i++) CHECK(rows[i] == 0);
        /* with R = 1, b's dense push fires the step alone; else both */
        s_dense_push(b, &m, 1, &res);
        if (!backup) s_dense_push(a, &m, 1, &res);
        CHECK_EQ(dp_ps_client_rows_pull(a, all, 3, D, rows, NULL, err), 0);
        for (int j = 0; j < D; j++) {
            /* sgd at lr 1: w = -(sum of the taken rows) / (their count) */
            float w10 = backup ? 0 : -(ga[j] * 0.5f);
            float w20 = backup ? -gb[j] : -((ga[D + j] + gb[j]) * 0.5f);
            float w30 = backup ? -gb[D + j] : -(gb[D + j] * 0.5f);
            CHECK(fabsf(rows[j] - w10) < 1e-6f);
            CHECK(fabsf(rows[D + j] - w20) < 1e-6f);
            CHECK(fabsf(rows[2 * D + j] - w30) < 1e-6f);
        }
        if (backup) { /* a's dense push comes late: dropped, as its rows were */
            s_dense_push(a, &m, 1, &res);
            CHECK_EQ(res.dropped, 1);
        }
        dp_ps_client_destroy(&a);
        dp_ps_client_destroy(&b);
        s_shards_stop(&sh);
    }
}

static void test_hybrid(void)
{
    shards_t sh;
    s_shards_init(&sh, 1, DP_MODE_SYNC, DP_MODE_ASYNC, 2);
    CHECK_EQ(s_shards_start(&sh), 0);
    dp_model_t m;
    s_model(&m);
    dp_ps_client_t *a = s_client(&sh, &m, 0), *b = s_client(&sh, &m, 1);
    char err[DP_ERR_LEN] = "";
    uint64_t k[1] = {42};
    float g[D] = {1, -2, 0.5f}, rows[D];
    dp_push_result_t res;
    s_dense_pull(a, &m);
    CHECK_EQ(dp_ps_client_rows_pull(a, k, 1, D, rows, NULL, err), 0);
    CHECK_EQ(dp_ps_client_rows_push(a, k, 1, D, g, 1, &res, err), 0);
    CHECK_EQ(res.applied, 1);
    /* b sees a's row at once: the dense step has not fired */
    CHECK_EQ(dp_ps_client_rows_pull(b, k, 1, D, rows, NULL, err), 0);
    for (int j = 0; j < D; j++) CHECK(rows[j] == -g[j]);
    dp_ps_client_destroy(&a);
    dp_ps_client_destroy(&b);
    s_shards_stop(&sh);
    /* --rows-mode sync needs --mode sync */
    srv_t s;
    srv_init(&s, DP_MODE_ASYNC, 1);
    snprintf(s.cfg.model_spec, sizeof s.cfg.model_spec, "%s", SPEC);
    s.cfg.rows_mode = DP_MODE_SYNC;
    CHECK_EQ(srv_start(&s), -1);
    CHECK(strstr(s.err, "--rows-mode sync needs --mode sync") != NULL);
    srv_stop(&s);
}

/* ---- the largest requests ------------------------------------------------ */

/* A shard of a small dense model takes a row request of the most keys a
 * request holds (its message limit counts the rows, not just the dense
 * floats: 60000 keys of width 3 are 1.2 MB, which a 4-float model's limit
 * once dropped unanswered); one key more than the most is refused by the
 * client with a line, before anything is sent. */
static void test_large_request(void)
{
    shards_t sh;
    s_shards_init(&sh, 1, DP_MODE_ASYNC, 0, 1);
    CHECK_EQ(s_shards_start(&sh), 0);
    dp_model_t m;
    s_model(&m);
    dp_ps_client_t *c = s_client(&sh, &m, 0);
    if (!c) return;
    enum { N = 60000, MOST = DP_ROWS_DEFAULT_KEYS };
    uint64_t *keys = dp_malloc((MOST + 1) * sizeof *keys);
    float *rows = dp_malloc((size_t)(MOST + 1) * D * sizeof *rows);
    for (uint64_t i = 0; i <= MOST; i++) keys[i] = i * 7 + 1;
    char err[DP_ERR_LEN] = "";
    dp_push_result_t res;
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, NULL, err), 0);
    s_grads(rows, (size_t)N * D, 5);
    CHECK_EQ(dp_ps_client_rows_push(c, keys, N, D, rows, 1, &res, err), 0);
    CHECK_EQ(res.applied, 1);
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    CHECK_EQ(st.rows[0], N);
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, MOST + 1, D, rows, NULL, err), -1);
    CHECK(strstr(err, "at most 65536 keys a shard") != NULL);
    free(keys), free(rows);
    dp_ps_client_destroy(&c);
    s_shards_stop(&sh);
}

/* ---- a scan: every row, page by page -------------------------------------- */

/* A raw scan of shard at ep (worker 0 said HELLO on sock): from, max_keys
 * and width as given; the reply's type, and for a page its keys' count
 * and more; an ERROR's text into text. */
static int s_raw_scan(void *sock, const dp_model_t *m, uint64_t from, uint32_t max_keys,
                      uint32_t width, int keys_tensor, size_t *n, int *more, char *text, size_t cap)
{
    Downpour__Envelope env, *rep = NULL;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS_PULL, 9, 0, m->fingerprint);
    Downpour__RowsPull rp = DOWNPOUR__ROWS_PULL__INIT;
    Downpour__RowsScan scan = DOWNPOUR__ROWS_SCAN__INIT;
    scan.from = from;
    scan.max_keys = max_keys;
    rp.width = width;
    rp.scan = &scan;
    env.rows_pull = &rp;
    uint64_t k = 1;
    Downpour__TensorDesc kd;
    Downpour__TensorDesc *kdv[1] = {&kd};
    int64_t shape[2];
    dp_wire_desc_keyed(&kd, shape, "keys", DOWNPOUR__DTYPE__UINT64, &k, 1, 0);
    env.n_tensors = keys_tensor ? 1 : 0;
    env.tensors = kdv;
    char err[DP_ERR_LEN];
    dp_wire_payload_t pl = {&k, 8, NULL, NULL};
    if (dp_wire_send(sock, NULL, &env, &pl, keys_tensor ? 1 : 0, err) != 0) return -1;
    dp_wire_rx_t rx;
    if (dp_wire_recv(sock, &rx, 0, err) != 0) return -1;
    rep = dp_wire_decode(zmq_msg_data(&rx.parts[0]), zmq_msg_size(&rx.parts[0]), err);
    int type = rep ? (int)rep->type : -1;
    *n = 0, *more = 0, text[0] = 0;
    if (rep && rep->rows && rep->n_tensors == 2) *n = (size_t)rep->tensors[0]->shape[0], *more = rep->rows->more;
    if (rep && rep->error) snprintf(text, cap, "%s", rep->error->message);
    dp_wire_destroy(&rep);
    dp_wire_rx_fini(&rx);
    return type;
}

/* Two shards' tables read whole in pages of 7 keys: every row once, in
 * ascending key order, the same bits as a pull of those keys, the count
 * STATS gives, init and seed the shards' own; the scan leaves the
 * worker's pulled key set as it was (a push of the keys of its last pull
 * still applies). A shard whose max_keys is lower lists fewer keys a page
 * than asked (its bound: max_keys D / (D + 2)); a cursor past the last
 * key gives an empty page that says no more follow, one at the last key
 * that key alone; a scan of 0 keys or more than the wire's bound, one that
 * carries keys or asks the wrong width is refused with one line, and so
 * is one from a connection that said no HELLO; a model without a row
 * table has nothing to scan. */
static void test_scan(void)
{
    shards_t sh;
    s_shards_init(&sh, 2, DP_MODE_ASYNC, 0, 1);
    for (int i = 0; i < 2; i++) { /* the default start: uniform by (seed, key) */
        dp_rows_conf_default(&sh.s[i].cfg.rows, D, DP_ROW_ADAGRAD);
        sh.s[i].cfg.row_lr = 0.3f;
        sh.s[i].cfg.row_init = -1;
    }
    CHECK_EQ(s_shards_start(&sh), 0);
    dp_model_t m;
    s_model(&m);
    dp_ps_client_t *c = s_client(&sh, &m, 0);
    if (!c) return;
    char err[DP_ERR_LEN] = "";
    enum { N = 60, STEPS = 4 };
    uint64_t keys[N], last = 0;
    float g[N * D], rows[N * D];
    dp_push_result_t res;
    for (int step = 1; step <= STEPS; step++) { /* 150 distinct keys over the 64-bit range */
        for (int j = 0; j < N; j++) keys[j] = (uint64_t)(j + step * 30) * 0x9E3779B97F4A7C15ull;
        CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, NULL, err), 0);
        s_grads(g, N * D, (uint64_t)step);
        CHECK_EQ(dp_ps_client_rows_push(c, keys, N, D, g, (uint64_t)step, &res, err), 0);
        CHECK_EQ(res.applied, 2);
    }
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, NULL, err), 0); /* the pulled set */
    dp_ps_stats_t st;
    CHECK_EQ(dp_ps_client_stats(c, &st, err), 0);
    dp_ps_table_t t;
    CHECK_EQ(dp_ps_client_rows_all(c, D, 7, &t, err), 0);
    if (err[0]) fprintf(stderr, "  %s\n", err);
    CHECK_EQ((uint64_t)t.n, st.rows[0] + st.rows[1]);
    CHECK_EQ(t.n, (size_t)(N + (STEPS - 1) * 30));
    CHECK(t.pages >= (st.rows[0] + 6) / 7 + (st.rows[1] + 6) / 7);
    CHECK(t.init == DP_ROWS_DEFAULT_INIT);
    CHECK_EQ(t.seed, sh.s[0].cfg.seed);
    int ascending = 1, found = 0;
    for (size_t i = 1; i < t.n; i++) ascending &= t.keys[i] > t.keys[i - 1];
    CHECK(ascending);
    for (int j = 0; j < N + (STEPS - 1) * 30; j++) { /* every key pushed is there */
        uint64_t k = (uint64_t)(j + 30) * 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < t.n; i++) found += t.keys[i] == k;
    }
    CHECK_EQ(found, N + (STEPS - 1) * 30);
    /* the bits of a pull of the same keys, in pulls of at most 60 */
    int same = 1;
    float *pulled = dp_malloc((t.n ? t.n : 1) * D * sizeof *pulled);
    for (size_t at = 0; at < t.n; at += 60) {
        size_t n = t.n - at < 60 ? t.n - at : 60;
        CHECK_EQ(dp_ps_client_rows_pull(c, t.keys + at, n, D, pulled + at * D, NULL, err), 0);
    }
    same = t.n > 0 && memcmp(pulled, t.rows, t.n * D * sizeof *pulled) == 0;
    CHECK(same);
    free(pulled);
    /* the last pulls were of the table's keys; another pull, a scan, then its push applies */
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, N, D, rows, NULL, err), 0);
    dp_ps_table_t t2;
    CHECK_EQ(dp_ps_client_rows_all(c, D, 0, &t2, err), 0);
    CHECK_EQ(t2.n, t.n);
    CHECK_EQ(t2.pages, 2); /* one page a shard at the default bound */
    CHECK_EQ(dp_ps_client_rows_push(c, keys, N, D, g, STEPS + 1, &res, err), 0);
    CHECK_EQ(res.applied, 2);
    last = t.n ? t.keys[t.n - 1] : 0;
    dp_ps_table_free(&t);
    dp_ps_table_free(&t2);
    dp_ps_client_destroy(&c);

    /* raw scans of shard of the last key: bounds, cursors and refusals */
    int s = (int)dp_rows_shard_of(last, 2);
    void *ctx = zmq_ctx_new();
    void *raw = raw_dealer(ctx, sh.s[s].endpoint, 3000);
    Downpour__Envelope env;
    Downpour__Hello h;
    size_t n;
    int more;
    char text[DP_ERR_LEN + 64];
    /* a connection that said no HELLO reads nothing, like any request */
    CHECK_EQ(s_raw_scan(raw, &m, 0, 5, D, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "worker 0 has not said HELLO to this shard") != NULL);
    raw_hello_init(&env, &h, &m, 0, 1);
    CHECK_EQ(raw_request(raw, &env, NULL), DOWNPOUR__MSG_TYPE__WELCOME);
    CHECK_EQ(s_raw_scan(raw, &m, last, 5, D, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ROWS);
    CHECK(n == 1 && !more); /* the last key alone */
    CHECK_EQ(s_raw_scan(raw, &m, last + 1, 5, D, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ROWS);
    CHECK(n == 0 && !more); /* past the end */
    CHECK_EQ(s_raw_scan(raw, &m, 0, 5, D, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ROWS);
    CHECK(n == 5 && more);
    CHECK_EQ(s_raw_scan(raw, &m, 0, 0, D, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "malformed: ROWS_PULL scan of 0 keys a page (1 to 1048576)") != NULL);
    CHECK_EQ(s_raw_scan(raw, &m, 0, DP_WIRE_MAX_ROW_KEYS + 1, D, 0, &n, &more, text, sizeof text),
             DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "scan of 1048577 keys a page") != NULL);
    CHECK_EQ(s_raw_scan(raw, &m, 0, 5, D, 1, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "malformed: ROWS_PULL carries 1 tensors (it takes none: a scan names no keys)") != NULL);
    CHECK_EQ(s_raw_scan(raw, &m, 0, 5, D + 1, 0, &n, &more, text, sizeof text), DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(text, "rows of width 4 asked; this shard's are 3 wide") != NULL);
    zmq_close(raw);
    zmq_ctx_term(ctx);
    s_shards_stop(&sh);

    /* a shard of max_keys 8 lists 8 x 3 / 5 = 4 keys a page, whatever is asked */
    s_shards_init(&sh, 1, DP_MODE_ASYNC, 0, 1);
    sh.s[0].cfg.rows.max_keys = 8;
    CHECK_EQ(s_shards_start(&sh), 0);
    c = s_client(&sh, &m, 0);
    if (!c) return;
    uint64_t few[8] = {11, 12, 13, 14, 15, 16, 17, 18};
    CHECK_EQ(dp_ps_client_rows_pull(c, few, 8, D, rows, NULL, err), 0);
    CHECK_EQ(dp_ps_client_rows_push(c, few, 8, D, g, 1, &res, err), 0);
    CHECK_EQ(dp_ps_client_rows_all(c, D, 100, &t, err), 0);
    CHECK_EQ(t.n, 8);
    CHECK_EQ(t.pages, 2);
    CHECK(t.n == 8 && t.keys[0] == 11 && t.keys[7] == 18);
    dp_ps_table_free(&t);
    dp_ps_client_destroy(&c);
    s_shards_stop(&sh);

    /* nothing to scan: a model without a row table */
    srv_t plain;
    srv_init(&plain, DP_MODE_ASYNC, 1);
    CHECK_EQ(srv_start(&plain), 0);
    shards_t one;
    memset(&one, 0, sizeof one);
    snprintf(one.eps, sizeof one.eps, "%s", plain.endpoint);
    dp_model_t conv;
    srv_small_model(&conv);
    c = s_client(&one, &conv, 0);
    CHECK_EQ(dp_ps_client_rows_all(c, D, 0, &t, err), -1);
    CHECK(strstr(err, "no row table") != NULL);
    CHECK(t.n == 0 && t.keys == NULL);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&plain), 0);
}

/* ---- a shard restarted from its checkpoint ------------------------------ */

/* shards of s_shards_init (2, async, adam rows with admission and
 * eviction: every part of the table's state) writing to dir every version. */
static void s_ckpt_shards(shards_t *sh, const char *dir)
{
    s_shards_init(sh, 2, DP_MODE_ASYNC, 0, 1);
    for (int i = 0; i < 2; i++) {
        dp_rows_conf_default(&sh->s[i].cfg.rows, D, DP_ROW_ADAM);
        sh->s[i].cfg.rows.admit_after = 2;
        sh->s[i].cfg.rows.evict_after = 2;
        sh->s[i].cfg.row_lr = 0.1f;
        sh->s[i].cfg.row_init = -1;
        snprintf(sh->s[i].cfg.checkpoint_dir, sizeof sh->s[i].cfg.checkpoint_dir, "%s", dir);
        sh->s[i].cfg.checkpoint_every = 1;
    }
}

/* Step `step` of one worker: dense pull, rows pull of keys, rows push,
 * dense push (the version moves: a checkpoint). */
static void s_rows_step(dp_ps_client_t *c, const dp_model_t *m, const uint64_t *keys, int n,
                        uint64_t step, dp_push_result_t *res)
{
    char err[DP_ERR_LEN] = "";
    float rows[16 * D], g[16 * D];
    s_dense_pull(c, m);
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, (size_t)n, D, rows, NULL, err), 0);
    s_grads(g, (size_t)n * D, step);
    CHECK_EQ(dp_ps_client_rows_push(c, keys, (size_t)n, D, g, step, res, err), 0);
    dp_push_result_t dense;
    s_dense_push(c, m, step, &dense);
}

/* Two shards train 6 steps of rows (keys coming, going, pending), stop, and
 * start again from their checkpoints: every row reads as before, bit for
 * bit, STATS counts what it counted, step 6's rows again are a repeat (not
 * applied), and step 7 moves the restarted table as it moves one that
 * never stopped (a third pair of shards fed the same 7 steps). One rows file
 * per shard is left (the older versions' pruned); a corrupt one stops the
 * shard at start with one line naming it. */
static void test_restart_rows(void)
{
    char dir[] = "/tmp/test_ps_rows.XXXXXX", ref_dir[] = "/tmp/test_ps_rows_ref.XXXXXX";
    CHECK(mkdtemp(dir) != NULL && mkdtemp(ref_dir) != NULL);
    dp_model_t m;
    s_model(&m);
    shards_t sh, ref;
    s_ckpt_shards(&sh, dir);
    s_ckpt_shards(&ref, ref_dir);
    CHECK_EQ(s_shards_start(&sh), 0);
    CHECK_EQ(s_shards_start(&ref), 0);
    dp_ps_client_t *c = s_client(&sh, &m, 0), *r = s_client(&ref, &m, 0);
    if (!c || !r) return;
    enum { N = 12 };
    uint64_t keys[7][N];
    for (int t = 0; t < 7; t++) /* a sliding window: old keys go idle, new ones come */
        for (int j = 0; j < N; j++) keys[t][j] = (uint64_t)(t * 3 + j) * 0x9E3779B97F4A7C15ull + 1;
    dp_push_result_t res;
    for (int t = 0; t < 6; t++) {
        s_rows_step(c, &m, keys[t], N, (uint64_t)t + 1, &res);
        s_rows_step(r, &m, keys[t], N, (uint64_t)t + 1, &res);
    }
    char err[DP_ERR_LEN] = "";
    enum { ALL = 5 * 3 + N }; /* the distinct keys of steps 1..6 */
    uint64_t all[ALL];
    for (int i = 0; i < ALL; i++) all[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull + 1;
    float before[ALL * D], after[ALL * D];
    dp_ps_stats_t st0, st1;
    CHECK_EQ(dp_ps_client_rows_pull(c, all, ALL, D, before, NULL, err), 0);
    CHECK_EQ(dp_ps_client_stats(c, &st0, err), 0);
    dp_ps_client_destroy(&c);
    s_shards_stop(&sh);
    /* the second life */
    s_ckpt_shards(&sh, dir);
    CHECK_EQ(s_shards_start(&sh), 0);
    c = s_client(&sh, &m, 0);
    if (!c) return;
    CHECK_EQ(dp_ps_client_rows_pull(c, all, ALL, D, after, NULL, err), 0);
    CHECK_EQ(memcmp(before, after, sizeof before), 0);
    CHECK_EQ(dp_ps_client_stats(c, &st1, err), 0);
    CHECK_EQ(st1.rows_shards, 2);
    CHECK_EQ(st1.rows[0], st0.rows[0]);
    CHECK_EQ(st1.rows[1], st0.rows[1]);
    CHECK_EQ(st1.rows_evicted, st0.rows_evicted);
    CHECK_EQ(st1.row_pushes, st0.row_pushes);
    CHECK(st0.rows_evicted > 0); /* the window made idle rows go */
    /* step 6 again: acknowledged, not applied */
    float g[N * D], rows[N * D];
    CHECK_EQ(dp_ps_client_rows_pull(c, keys[5], N, D, rows, NULL, err), 0);
    s_grads(g, N * D, 99);
    CHECK_EQ(dp_ps_client_rows_push(c, keys[5], N, D, g, 6, &res, err), 0);
    CHECK_EQ(dp_ps_client_rows_pull(c, all, ALL, D, after, NULL, err), 0);
    CHECK_EQ(memcmp(before, after, sizeof before), 0);
    /* step 7 as on shards that never stopped */
    s_rows_step(c, &m, keys[6], N, 7, &res);
    s_rows_step(r, &m, keys[6], N, 7, &res);
    float want[N * D];
    CHECK_EQ(dp_ps_client_rows_pull(c, keys[6], N, D, rows, NULL, err), 0);
    CHECK_EQ(dp_ps_client_rows_pull(r, keys[6], N, D, want, NULL, err), 0);
    CHECK_EQ(memcmp(rows, want, sizeof rows), 0);
    dp_ps_client_destroy(&c);
    dp_ps_client_destroy(&r);
    s_shards_stop(&sh);
    s_shards_stop(&ref);
    /* one rows file per shard; a corrupt one refused at start, named */
    char cmd[600], line[512] = "";
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c 'ps-shard-.-of-2.rows-'", dir);
    FILE *f = popen(cmd, "r");
    if (f && fgets(line, sizeof line, f)) CHECK_EQ(atoi(line), 2);
    if (f) pclose(f);
    snprintf(cmd, sizeof cmd, "f=$(ls '%s'/ps-shard-1-of-2.rows-*) && printf 'X' | "
             "dd of=\"$f\" bs=1 seek=40 conv=notrunc 2>/dev/null", dir);
    CHECK_EQ(system(cmd), 0);
    s_ckpt_shards(&sh, dir);
    CHECK_EQ(srv_start(&sh.s[1]), -1);
    CHECK(strstr(sh.s[1].err, "rows corrupt: CRC-32 mismatch") != NULL && strstr(sh.s[1].err, ".rows-"));
    if (!strstr(sh.s[1].err, "CRC-32")) fprintf(stderr, "  %s\n", sh.s[1].err);
    srv_stop(&sh.s[1]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, ref_dir);
    CHECK_EQ(system(cmd), 0);
}

/* The rules without the wire (dp_ps_rows_pull / dp_ps_rows_push), as a
 * replay calls them: async applies at once with the staleness of its
 * pull, a repeat says so and changes nothing, a key not pulled or the
 * wrong width is rejected; sync waits for the dense step that takes it,
 * then applies the mean, and a push whose step fired without it drops. */
static void test_rules_without_wire(void)
{
    char err[DP_ERR_LEN] = "";
    dp_rows_conf_t rc;
    dp_rows_conf_default(&rc, D, DP_ROW_SGD);
    rc.optim.lr = 1;
    dp_ps_rows_t r;
    CHECK_EQ(dp_ps_rows_init(&r, D, &rc, DP_MODE_ASYNC, DP_MODE_ASYNC, 0, 1, 2, err), 0);
    uint64_t keys[2] = {9, 4}, other = 5;
    float rows[2 * D], g[2 * D] = {1, 2, 3, 4, 5, 6};
    CHECK_EQ(dp_ps_rows_pull(&r, 1, keys, 2, rows, err), 0); /* no row held yet */
    dp_push_outcome_t o;
    CHECK_EQ(dp_ps_rows_push(&r, 1, 1, 3, 5, D, keys, 2, g, &o), 0);
    CHECK(o.status == DP_PUSH_APPLIED && o.staleness == 2);
    CHECK_EQ(dp_ps_rows_pull(&r, 1, keys, 2, rows, err), 2);
    CHECK(rows[0] == -1 && rows[D] == -4); /* sgd at lr 1 from zeros, in the order asked */
    CHECK_EQ(dp_ps_rows_push(&r, 1, 1, 5, 5, D, keys, 2, g, &o), 1); /* step 1 again */
    CHECK_EQ(dp_ps_rows_push(&r, 1, 2, 5, 5, D, &other, 1, g, &o), 0);
    CHECK(o.status == DP_PUSH_REJECTED && strstr(o.reason, "not in this worker's last ROWS_PULL"));
    CHECK_EQ(dp_ps_rows_push(&r, 1, 2, 5, 5, D + 1, keys, 1, g, &o), 0);
    CHECK(o.status == DP_PUSH_REJECTED && strstr(o.reason, "width"));
    CHECK_EQ(r.pushes, 1);
    CHECK_EQ(r.rejected, 2);
    dp_ps_rows_fini(&r);
    CHECK_EQ(dp_ps_rows_init(&r, D, &rc, DP_MODE_SYNC, DP_MODE_SYNC, 0, 1, 2, err), 0);
    for (int w = 0; w < 2; w++) CHECK_EQ(dp_ps_rows_pull(&r, w, keys, 2, rows, err), 0);
    CHECK_EQ(dp_ps_rows_push(&r, 0, 1, 0, 0, D, keys, 2, g, &o), 0);
    CHECK(o.status == DP_PUSH_APPLIED);
    CHECK_EQ(dp_ps_rows_push(&r, 1, 1, 0, 0, D, keys, 1, g, &o), 0);
    dp_ps_rows_dense_taken(&r, 0, 0);
    dp_ps_rows_dense_taken(&r, 1, 0);
    dp_ps_rows_stepped(&r, 1); /* both taken: key 9 twice, key 4 once, over 2 */
    CHECK_EQ(dp_ps_rows_pull(&r, 0, keys, 2, rows, err), 2);
    CHECK(rows[0] == -1 && rows[D] == -2);
    CHECK_EQ(dp_ps_rows_push(&r, 1, 2, 0, 1, D, keys, 2, g, &o), 0); /* pulled at 0, the step fired */
    CHECK(o.status == DP_PUSH_DROPPED && o.staleness == 1);
    dp_ps_rows_fini(&r);
}

DP_TESTS(T(test_rules_without_wire), T(test_async_reference), T(test_bad_input), T(test_sync_rows), T(test_hybrid),
         T(test_large_request), T(test_scan), T(test_restart_rows))
