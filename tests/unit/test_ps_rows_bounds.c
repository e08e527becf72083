/* test_ps_rows_bounds: the row tables' bounds against a hostile peer
 * (issue 55), each over a real socket where it concerns the wire:
 *  - a ROWS_PULL of more keys than max_keys (as many as the shard's message
 *    limit lets through) on a table of width 4096 is refused, counted, and
 *    costs the shard no memory sized by its count (the process's peak
 *    address space, /proc/self/status VmPeak, against a stated bound); the
 *    shard serves on;
 *  - a ROWS_PUSH at an implausible step (2^62, from a stranger who said
 *    HELLO under a free id) is refused and counted by the dense push's own
 *    step rule, and the real worker's row pushes apply after it;
 *  - a scan's page costs what it lists, not the table: the entries a page
 *    visits on a table of 2^18 rows are those of a page on a table of 64
 *    within a log factor, and pages list every row once, ascending, rows
 *    made and dropped between pages included as the cursor says. */
#include <inttypes.h>
#include <stdint.h>

#include "server/ps_loop.h"
#include "server/rows.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/ps_client.h"

#define TMO 5.0

/* The process's peak address space (VmPeak) in bytes, 0 when unread. */
static uint64_t s_vm_peak(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %" SCNu64 " kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* A shard of spec with a row table of width d (sgd, lr 1, zeros), max_keys
 * keys a request (0: the default), 2 workers, async. */
static int s_shard(srv_t *s, const char *spec, int d, uint32_t max_keys)
{
    srv_init(s, DP_MODE_ASYNC, 2);
    snprintf(s->cfg.model_spec, sizeof s->cfg.model_spec, "%s", spec);
    dp_rows_conf_default(&s->cfg.rows, d, DP_ROW_SGD);
    s->cfg.rows.max_keys = max_keys;
    s->cfg.row_lr = 1.0f;
    s->cfg.row_init = 0;
    if (srv_start(s) != 0) {
        fprintf(stderr, "  shard: %s\n", s->err);
        return -1;
    }
    return 0;
}

static int s_model(dp_model_t *m, const char *spec)
{
    char err[DP_ERR_LEN];
    if (dp_model_parse(m, spec, 1, 1, 1, err) == 0) return 0;
    fprintf(stderr, "  %s\n", err);
    return -1;
}

/* Worker wid's client of the shard at ep, 0 or -1 with err. */
static int s_client(dp_ps_client_t **c, const char *ep, const dp_model_t *m, int wid, char *err)
{
    return dp_ps_client_new(c, ep, m, wid, PS_OPTS(TMO), NULL, err);
}

/* A raw ROWS_PULL of worker wid: n keys of width d; the reply. */
static raw_reply_t s_raw_pull(void *sock, const dp_model_t *m, int wid, const uint64_t *keys,
                              size_t n, int d)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS_PULL, 21, wid, m->fingerprint);
    Downpour__RowsPull rp = DOWNPOUR__ROWS_PULL__INIT;
    rp.width = (uint32_t)d;
    env.rows_pull = &rp;
    Downpour__TensorDesc kd, *kdv[1] = {&kd};
    int64_t shape[2];
    dp_wire_desc_keyed(&kd, shape, "keys", DOWNPOUR__DTYPE__UINT64, keys, n, 0);
    env.n_tensors = 1;
    env.tensors = kdv;
    dp_wire_payload_t pl = {keys, n * sizeof *keys, NULL, NULL};
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &env, &pl, 1, err) != 0) return (raw_reply_t){.type = -1};
    return raw_reply(sock);
}

/* A raw ROWS_PUSH of worker wid at step and version: n keys, grads n x d. */
static raw_reply_t s_raw_push(void *sock, const dp_model_t *m, int wid, uint64_t step,
                              uint64_t version, const uint64_t *keys, size_t n, const float *g, int d)
{
    Downpour__Envelope env;
    dp_wire_env_init(&env, DOWNPOUR__MSG_TYPE__ROWS_PUSH, 22, wid, m->fingerprint);
    Downpour__RowsPush rp = DOWNPOUR__ROWS_PUSH__INIT;
    rp.width = (uint32_t)d;
    rp.step = step;
    rp.version = version;
    env.rows_push = &rp;
    Downpour__TensorDesc td[2], *tdv[2] = {&td[0], &td[1]};
    int64_t shape[2][2];
    dp_wire_desc_keyed(&td[0], shape[0], "keys", DOWNPOUR__DTYPE__UINT64, keys, n, 0);
    dp_wire_desc_keyed(&td[1], shape[1], "grads", DOWNPOUR__DTYPE__FLOAT32, g, n, (size_t)d);
    env.n_tensors = 2;
    env.tensors = tdv;
    dp_wire_payload_t pl[2] = {{keys, n * sizeof *keys, NULL, NULL},
                               {g, n * (size_t)d * sizeof *g, NULL, NULL}};
    char err[DP_ERR_LEN];
    if (dp_wire_send(sock, NULL, &env, pl, 2, err) != 0) return (raw_reply_t){.type = -1};
    return raw_reply(sock);
}

/* Worker 1 says HELLO on a raw socket of ep: the socket, or NULL. */
static void *s_raw_worker1(void *ctx, const char *ep, const dp_model_t *m)
{
    void *raw = raw_dealer(ctx, ep, 5000);
    Downpour__Envelope env;
    Downpour__Hello h;
    raw_hello_init(&env, &h, m, 1, 1);
    if (raw_request(raw, &env, NULL) == DOWNPOUR__MSG_TYPE__WELCOME) return raw;
    zmq_close(raw);
    return NULL;
}

/* shard 0's count of refused messages (STATS "rejected": malformed ones too). */
static uint64_t s_rejected(dp_ps_client_t *c)
{
    dp_ps_stats_t st;
    char err[DP_ERR_LEN] = "";
    if (dp_ps_client_stats(c, &st, err) != 0) {
        fprintf(stderr, "  stats: %s\n", err);
        return UINT64_MAX;
    }
    return st.rejected;
}

/* ---- a pull of too many keys ---------------------------------------------- */

#define WIDE 4096
#define WIDE_SPEC "embed:4096 fc:2 softmax"
#define WIDE_KEYS 64 /* max_keys: the message limit is 64 x (8 + 4 x 4096) bytes, 1 MiB */

/* The memory model of a refused request: the message itself (at most the
 * shard's limit, held by ZeroMQ while it is read, and its copy on the
 * sender's side), and nothing sized by the keys it names. Bound: two
 * message limits and 64 MiB (one glibc arena's reservation, should a
 * thread's first large allocation make one). The pull below names 2^17
 * keys (what the limit lets through): rows for them, before the count was
 * checked, were 2 GiB of address space. */
static void test_pull_count_first(void)
{
    srv_t s;
    if (s_shard(&s, WIDE_SPEC, WIDE, WIDE_KEYS) != 0) return;
    dp_model_t m;
    if (s_model(&m, WIDE_SPEC) != 0) return;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c = NULL;
    CHECK_EQ(s_client(&c, s.endpoint, &m, 0, err), 0);
    if (!c) return;
    /* the largest legitimate messages first (a pull and a push of
     * max_keys rows): the allocator's arenas and ZeroMQ's buffers made */
    enum { N = 1 << 17 };
    size_t limit = dp_ps_rows_max_bytes(&s.cfg, WIDE);
    CHECK(N * sizeof(uint64_t) <= limit);
    uint64_t *keys = dp_malloc(N * sizeof *keys);
    for (size_t i = 0; i < N; i++) keys[i] = i + 1;
    float *rows = dp_calloc((size_t)WIDE_KEYS * WIDE, sizeof *rows);
    dp_push_result_t res;
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, WIDE_KEYS, WIDE, rows, NULL, err), 0);
    CHECK_EQ(dp_ps_client_rows_push(c, keys, WIDE_KEYS, WIDE, rows, 1, &res, err), 0);
    CHECK_EQ(res.applied, 1);
    void *ctx = zmq_ctx_new();
    void *raw = s_raw_worker1(ctx, s.endpoint, &m);
    CHECK(raw != NULL);
    uint64_t rejected = s_rejected(c);
    uint64_t peak = s_vm_peak();
    raw_reply_t r = s_raw_pull(raw, &m, 1, keys, N, WIDE);
    uint64_t grown = s_vm_peak() - peak;
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "131072 keys in one request (this shard takes at most 64)") != NULL);
    if (!strstr(r.text, "131072 keys")) fprintf(stderr, "  reply: %s\n", r.text);
    CHECK_EQ(s_rejected(c), rejected + 1);
    uint64_t bound = 2 * (uint64_t)limit + (64u << 20);
    CHECK(peak > 0 && grown <= bound);
    if (grown > bound) fprintf(stderr, "  the peak grew %" PRIu64 " bytes (bound %" PRIu64 ")\n", grown, bound);
    /* still serving: the stranger's pull of 8 keys, the worker's of 64 */
    r = s_raw_pull(raw, &m, 1, keys, 8, WIDE);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ROWS);
    CHECK_EQ(dp_ps_client_rows_pull(c, keys, WIDE_KEYS, WIDE, rows, NULL, err), 0);
    if (raw) zmq_close(raw);
    zmq_ctx_term(ctx);
    free(keys), free(rows);
    dp_ps_client_destroy(&c);
    CHECK_EQ(srv_stop(&s), 0);
}

/* ---- a push at an implausible step ---------------------------------------- */

#define D 3
#define SPEC "embed:3 fc:2 softmax"

/* A stranger says HELLO as the free id 1, pulls 8 keys and pushes them at
 * step 2^62: refused (one line, counted), nothing applied. It leaves; the
 * real worker 1 joins, and its step 1 applies (sgd at lr 1 from zeros: the
 * rows read -g), not acknowledged as a repeat of the stranger's step. */
static void test_push_step_bound(void)
{
    srv_t s;
    if (s_shard(&s, SPEC, D, 0) != 0) return;
    dp_model_t m;
    if (s_model(&m, SPEC) != 0) return;
    char err[DP_ERR_LEN] = "";
    dp_ps_client_t *c0 = NULL, *c1 = NULL;
    CHECK_EQ(s_client(&c0, s.endpoint, &m, 0, err), 0);
    if (!c0) return;
    uint64_t keys[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float bad[8 * D], g[8 * D], rows[8 * D];
    for (int i = 0; i < 8 * D; i++) bad[i] = 100, g[i] = 0.25f * (float)(i % 5 + 1);
    void *ctx = zmq_ctx_new();
    void *raw = s_raw_worker1(ctx, s.endpoint, &m);
    CHECK(raw != NULL);
    uint64_t rejected = s_rejected(c0);
    CHECK_EQ(s_raw_pull(raw, &m, 1, keys, 8, D).type, DOWNPOUR__MSG_TYPE__ROWS);
    raw_reply_t r = s_raw_push(raw, &m, 1, 1ull << 62, 0, keys, 8, bad, D);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "implausible step 4611686018427387904 of worker 1: at most 1") != NULL);
    if (r.type != DOWNPOUR__MSG_TYPE__ERROR) fprintf(stderr, "  reply %d: %s\n", r.type, r.text);
    CHECK_EQ(s_rejected(c0), rejected + 1);
    if (raw) zmq_close(raw);
    int rc;
    SRV_REJOIN(rc, err, s_client(&c1, s.endpoint, &m, 1, err));
    CHECK_EQ(rc, 0);
    if (c1) {
        dp_push_result_t res;
        CHECK_EQ(dp_ps_client_rows_pull(c1, keys, 8, D, rows, NULL, err), 0);
        for (int i = 0; i < 8 * D; i++) CHECK(rows[i] == 0); /* the stranger's rows not applied */
        CHECK_EQ(dp_ps_client_rows_push(c1, keys, 8, D, g, 1, &res, err), 0);
        CHECK_EQ(res.applied, 1);
        CHECK_EQ(dp_ps_client_rows_pull(c1, keys, 8, D, rows, NULL, err), 0);
        int applied = 1;
        for (int i = 0; i < 8 * D; i++) applied &= rows[i] == -g[i];
        CHECK(applied);
    }
    zmq_ctx_term(ctx);
    dp_ps_client_destroy(&c0);
    dp_ps_client_destroy(&c1);
    CHECK_EQ(srv_stop(&s), 0);
}

DP_TESTS(T(test_pull_count_first), T(test_push_step_bound))
