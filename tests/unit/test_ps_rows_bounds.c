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

#include "server/core/rows.h"
#include "server/loop/ps_loop.h"
#include "tests/ps_harness.h"
#include "tests/test.h"
#include "worker/client/ps_client.h"

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
/* The servers' count of refused requests (a ROWS_PULL refused is one), or
 * with rows set of refused row pushes (row_pushes_rejected). */
static uint64_t s_refused(dp_ps_client_t *c, int rows)
{
    dp_ps_stats_t st;
    char err[DP_ERR_LEN] = "";
    if (dp_ps_client_stats(c, &st, err) != 0) {
        fprintf(stderr, "  stats: %s\n", err);
        return UINT64_MAX;
    }
    return rows ? st.row_pushes_rejected : st.requests_refused;
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
    uint64_t rejected = s_refused(c, 0);
    uint64_t peak = s_vm_peak();
    raw_reply_t r = s_raw_pull(raw, &m, 1, keys, N, WIDE);
    uint64_t grown = s_vm_peak() - peak;
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "131072 keys in one request (this shard takes at most 64)") != NULL);
    if (!strstr(r.text, "131072 keys")) fprintf(stderr, "  reply: %s\n", r.text);
    CHECK_EQ(s_refused(c, 0), rejected + 1);
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
    uint64_t rejected = s_refused(c0, 1);
    CHECK_EQ(s_raw_pull(raw, &m, 1, keys, 8, D).type, DOWNPOUR__MSG_TYPE__ROWS);
    raw_reply_t r = s_raw_push(raw, &m, 1, 1ull << 62, 0, keys, 8, bad, D);
    CHECK_EQ(r.type, DOWNPOUR__MSG_TYPE__ERROR);
    CHECK(strstr(r.text, "implausible step 4611686018427387904 of worker 1: at most 1") != NULL);
    if (r.type != DOWNPOUR__MSG_TYPE__ERROR) fprintf(stderr, "  reply %d: %s\n", r.type, r.text);
    CHECK_EQ(s_refused(c0, 1), rejected + 1);
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

/* ---- a scan's page: its cost and its rows ------------------------------- */

/* A table of width 1 holding n rows, keys spread over the 64-bit range
 * (key i: the hash of i + 1, so neither their slots nor their insertion
 * order is their key order). */
static dp_rows_t *s_table(size_t n, uint32_t chunk)
{
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 1, DP_ROW_SGD);
    c.chunk_rows = chunk;
    c.evict_after = 4;
    c.sweep_per_push = 1;
    char err[DP_ERR_LEN] = "";
    dp_rows_t *t = dp_rows_new(&c, err);
    if (!t) {
        fprintf(stderr, "  %s\n", err);
        return NULL;
    }
    enum { B = 4096 };
    uint64_t keys[B];
    float w[B] = {0};
    for (size_t at = 0; at < n; at += B) {
        size_t k = n - at < B ? n - at : B;
        for (size_t j = 0; j < k; j++) keys[j] = dp_rows_hash(at + j + 1);
        if (dp_rows_put(t, keys, k, 1, w, err) != 0) fprintf(stderr, "  %s\n", err);
    }
    return t;
}

/* The entries the page of `page` keys from key 2^63 looks at. */
static uint64_t s_page_cost(const dp_rows_t *t, size_t page)
{
    uint64_t keys[64], visited = 0;
    size_t n = dp_rows_keys_page(t, 1ull << 63, page, keys, &visited);
    CHECK_EQ(n, page);
    return visited;
}

/* A page of 8 keys of a table of 2^18 rows looks at what a page of a table
 * of 64 does, within the factor its depth allows (log2 of the rows: 18
 * against 6), and far from the table's size: before, every page looked at
 * every slot (the 1-key scans that slowed another worker's pull 65-fold
 * at 3.1 M rows). */
static void test_scan_cost(void)
{
    enum { BIG = 1 << 18, SMALL = 64, PAGE = 8 };
    dp_rows_t *big = s_table(BIG, 4096), *small = s_table(SMALL, 16);
    if (!big || !small) return;
    uint64_t cb = s_page_cost(big, PAGE), cs = s_page_cost(small, PAGE);
    /* a bound stated from the structure: each of the page's keys (and the
     * one after it) costs at most a path of the tree, whose depth is
     * 2 log2 n on the average and, for these keys, under 4 log2 n */
    CHECK(cb <= (uint64_t)(PAGE + 1) * 4 * 18);
    CHECK(cs <= (uint64_t)(PAGE + 1) * 4 * 6);
    CHECK(cb <= 8 * cs);
    if (cb > (uint64_t)(PAGE + 1) * 4 * 18)
        fprintf(stderr, "  a page of %d keys looked at %" PRIu64 " entries of %d rows (%" PRIu64
                        " of %d)\n", PAGE, cb, BIG, cs, SMALL);
    CHECK_EQ(s_page_cost(big, 1) <= 2 * 4 * 18, 1);
    dp_rows_destroy(&big);
    dp_rows_destroy(&small);
}

/* Pages of 5 list every row once, ascending, with rows made and dropped
 * between pages: what the cursor promises (ps_rows.h, a page is the keys
 * >= from held when it is read): a row held throughout is listed once, a
 * row made behind the cursor is not and one made ahead of it is, a row
 * dropped before its page is not. */
static void test_scan_between_pages(void)
{
    enum { N = 200, PAGE = 5 };
    dp_rows_t *t = s_table(N, 16);
    if (!t) return;
    char err[DP_ERR_LEN] = "";
    uint64_t *seen = dp_malloc(2 * N * sizeof *seen), page[PAGE], from = 0, version = 0;
    size_t n = 0, got, made = 0;
    uint64_t behind = 0, ahead = 0;
    float g = 0.5f;
    do {
        got = dp_rows_keys_page(t, from, PAGE, page, NULL);
        for (size_t i = 0; i < got; i++) seen[n++] = page[i];
        if (got) from = page[got - 1] + 1;
        /* every fourth page: a row made just behind the cursor, one just
         * ahead (a push makes it), and the rows made two pages ago pushed
         * again at a version that leaves the table's first rows idle */
        if (got && n / PAGE % 4 == 0 && from > 2 && from < UINT64_MAX - 2) {
            uint64_t two[2] = {from - 2, from + 1};
            if (dp_rows_row(t, two[0], &(dp_rows_view_t){0}) != 0 &&
                dp_rows_row(t, two[1], &(dp_rows_view_t){0}) != 0) {
                float gg[2] = {g, g};
                CHECK_EQ(dp_rows_push(t, version, two, 2, 1, gg, err), 2);
                behind = two[0], ahead = two[1], made++;
                int listed_behind = 0;
                for (size_t i = 0; i < n; i++) listed_behind |= seen[i] == behind;
                CHECK(!listed_behind);
            }
        }
    } while (got == PAGE);
    CHECK(made > 5);
    int ascending = 1, found_ahead = 0, found_behind = 0;
    for (size_t i = 1; i < n; i++) ascending &= seen[i] > seen[i - 1];
    for (size_t i = 0; i < n; i++) found_ahead |= seen[i] == ahead, found_behind |= seen[i] == behind;
    CHECK(ascending);
    CHECK(found_ahead);
    CHECK(!found_behind);
    /* the first N rows once each: every one was held throughout */
    size_t once = 0;
    for (size_t j = 0; j < N; j++) {
        int k = 0;
        for (size_t i = 0; i < n; i++) k += seen[i] == dp_rows_hash(j + 1);
        once += k == 1;
    }
    CHECK_EQ(once, N);
    CHECK_EQ(n, N + made); /* and the rows made ahead, each once */
    /* dropped: the last row made ahead pushed at a later version, every
     * other row swept out idle; a scan from 0 lists that row alone */
    const uint64_t later = 100;
    CHECK_EQ(dp_rows_push(t, later, &ahead, 1, 1, &g, err), 1);
    for (int k = 0; k < 2 * N; k++) dp_rows_sweep(t, later, 64);
    dp_rows_stats_t st;
    dp_rows_stats(t, &st);
    CHECK_EQ(st.rows, 1);
    CHECK_EQ(dp_rows_keys_page(t, 0, PAGE, page, NULL), 1);
    CHECK_EQ(page[0], ahead);
    free(seen);
    dp_rows_destroy(&t);
}

/* The tree's priority of a key (server/core/rows.c's s_prio): to choose keys
 * against it. */
static uint64_t s_prio(uint64_t key)
{
    return dp_rows_hash(key ^ 0xd6e8feb86659fd93ULL);
}

/* Keys chosen against the tree's hash (an attacker can: it is public and
 * invertible): of 40000 keys, the longest run whose priorities ascend
 * with the keys (about 400), which makes the tree a chain that deep, past
 * the walk's stack of 64. Pages still list every key once, ascending. */
static void test_scan_deep_tree(void)
{
    enum { M = 40000, PAGE = 7 };
    uint64_t *k = dp_malloc(M * sizeof *k), *tail = dp_malloc(M * sizeof *tail);
    size_t *at = dp_malloc(M * sizeof *at), *prev = dp_malloc(M * sizeof *prev), len = 0;
    for (size_t i = 0; i < M; i++) k[i] = (uint64_t)i * 1000003u + 1; /* ascending */
    for (size_t i = 0; i < M; i++) { /* patience sorting on the priorities */
        size_t lo = 0, hi = len;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (s_prio(k[at[mid]]) < s_prio(k[i])) lo = mid + 1;
            else hi = mid;
        }
        prev[i] = lo ? at[lo - 1] : SIZE_MAX;
        at[lo] = i;
        if (lo == len) len++;
    }
    for (size_t i = at[len - 1], j = len; j-- > 0; i = prev[i]) tail[j] = k[i];
    CHECK(len > 3 * 64);
    dp_rows_conf_t c;
    dp_rows_conf_default(&c, 1, DP_ROW_SGD);
    char err[DP_ERR_LEN] = "";
    dp_rows_t *t = dp_rows_new(&c, err);
    float *w = dp_calloc(len, sizeof *w);
    CHECK_EQ(dp_rows_put(t, tail, len, 1, w, err), 0);
    uint64_t page[PAGE], from = 0, visits, most = 0;
    size_t n = 0, got, same = 0;
    do {
        got = dp_rows_keys_page(t, from, PAGE, page, &visits);
        for (size_t i = 0; i < got; i++, n++) same += n < len && page[i] == tail[n];
        if (got) from = page[got - 1] + 1;
        if (visits > most) most = visits;
    } while (got == PAGE);
    CHECK_EQ(n, len);
    CHECK_EQ(same, len);
    CHECK(most >= len / 2); /* the chain is that deep: the cost is time, bounded by its depth */
    free(k), free(tail), free(at), free(prev), free(w);
    dp_rows_destroy(&t);
}

DP_TESTS(T(test_pull_count_first), T(test_push_step_bound), T(test_scan_cost),
         T(test_scan_between_pages), T(test_scan_deep_tree))
