/* bench/rows: `downpour bench rows` — rows pulled and pushed by key per
 * second per shard (server/core/ps_rows.h), beside a memcpy of the same bytes.
 *
 * It starts K real downpour-ps shards on loopback serving "embed:D fc:2
 * softmax" (async, one worker, their default row optimizer), fills the
 * table with R rows (pushes of every key, max_keys at a time), then times
 * rounds of: a pull of N distinct random keys of the table (their rows into
 * a buffer), a push of those keys' gradients, and a memcpy of the N rows'
 * bytes (the floor: what moving them in memory costs). Rows per second are
 * N over the medians. Beside them, the bytes: a step's pull and push of N
 * keys move N (8 + 4 D) bytes each way, where a dense pull and push of the
 * same table would move R x D x 4. With --json the last line is one JSON
 * object. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/metrics.h"
#include "common/model.h"
#include "common/opts.h"
#include "common/rng.h"
#include "common/util.h"
#include "deploy/bench/shards.h"
#include "deploy/launcher/commands.h"
#include "server/core/rows.h"
#include "worker/client/ps_client.h"

typedef struct {
    int dim, shards, rounds, warmup, json;
    long keys, table;
} s_conf_t;

static const char s_synopsis[] =
    "usage: downpour bench rows [--dim D] [--keys N] [--table R] [--shards K] [--rounds N]\n"
    "                           [--warmup N] [--json]\n"
    "Times pulls and pushes of N rows by key against real downpour-ps shards on this\n"
    "machine holding a table of R rows of width D, beside a memcpy of the same bytes.\n"
    "\n";

static dp_opts_result_t s_parse(s_conf_t *c, int argc, char **argv, char *err)
{
    const dp_opts_flag_t t[] = {
        DP_FLAG_NUM("dim", DP_OPTS_INT, "D", &c->dim, 1, DP_ROWS_MAX_WIDTH, 0,
                    "the rows' width (default 16)"),
        DP_FLAG_NUM("keys", DP_OPTS_LONG, "N", &c->keys, 1, DP_ROWS_DEFAULT_KEYS, 0,
                    "distinct keys a request (default 4096)"),
        DP_FLAG_NUM("table", DP_OPTS_LONG, "R", &c->table, 1, 1L << 26, 0,
                    "rows in the table (default 262144)"),
        DP_FLAG_NUM("shards", DP_OPTS_INT, "K", &c->shards, 1, DP_BENCH_MAX_SHARDS, 0,
                    "parameter-server shards (default 1)"),
        DP_FLAG_NUM("rounds", DP_OPTS_INT, "N", &c->rounds, 1, 100000, 0,
                    "measured rounds (default 50)"),
        DP_FLAG_NUM("warmup", DP_OPTS_INT, "N", &c->warmup, 0, 100000, 0,
                    "rounds before them, not counted (default 5)"),
        DP_FLAG_SET("json", &c->json, 1, 0, "end with one JSON line"),
    };
    dp_opts_t o;
    dp_opts_init(&o, "downpour bench rows", s_synopsis, NULL);
    dp_opts_add(&o, t, (int)(sizeof t / sizeof t[0]));
    dp_opts_result_t r = dp_opts_parse(&o, argc, argv, err);
    if (r == DP_OPTS_PARSED && c->keys > c->table)
        r = dp_err(err, "--keys %ld of a table of %ld rows: at most its rows", c->keys, c->table);
    return r;
}

/* Key i of the table: spread over the 64-bit range, as feature ids are. */
static uint64_t s_key(long i)
{
    return dp_rows_hash((uint64_t)i + 1);
}

/* Every row of the table made: a pull and a push of each chunk of keys,
 * at steps 1, 2, ...; *step the next (a shard takes a worker's steps in
 * order: one past the last it handled at most). */
static int s_fill(const s_conf_t *c, dp_ps_client_t *pc, uint64_t *keys, float *rows, uint64_t *step,
                  char *err)
{
    size_t chunk = DP_ROWS_DEFAULT_KEYS / 2; /* each shard's part well within its max_keys */
    for (long at = 0; at < c->table; at += (long)chunk, (*step)++) {
        size_t n = (size_t)(c->table - at) < chunk ? (size_t)(c->table - at) : chunk;
        for (size_t j = 0; j < n; j++) keys[j] = s_key(at + (long)j);
        dp_push_result_t res;
        if (dp_ps_client_rows_pull(pc, keys, n, c->dim, rows, NULL, err) != 0 ||
            dp_ps_client_rows_push(pc, keys, n, c->dim, rows, *step, &res, err) != 0)
            return -1;
        if (res.rejected) return dp_err(err, "filling the table: a push refused: %s", res.reason);
    }
    return 0;
}

typedef struct {
    double *pull, *push, *copy; /* ms per measured round */
    int n;
    uint64_t pull_bytes, push_bytes; /* one round's, on the wire (keys and rows) */
} s_times_t;

static int s_measure(const s_conf_t *c, dp_ps_client_t *pc, s_times_t *t, char *err)
{
    size_t n = (size_t)c->keys, fill = DP_ROWS_DEFAULT_KEYS / 2, cap = n > fill ? n : fill;
    uint64_t *keys = dp_malloc(cap * sizeof *keys);
    float *rows = dp_aligned_alloc(cap * (size_t)c->dim * sizeof(float));
    float *grads = dp_aligned_alloc(n * (size_t)c->dim * sizeof(float));
    float *copy = dp_aligned_alloc(n * (size_t)c->dim * sizeof(float));
    uint8_t *taken = dp_calloc((size_t)c->table, 1);
    for (size_t i = 0; i < n * (size_t)c->dim; i++) grads[i] = 1e-3f * (float)((int)(i % 7) - 3);
    uint64_t step = 1;
    int rc = s_fill(c, pc, keys, rows, &step, err);
    dp_rng_t rng;
    dp_rng_seed(&rng, 7);
    for (int r = 0; r < c->warmup + c->rounds && rc == 0; r++, step++) {
        /* N distinct rows of the table */
        memset(taken, 0, (size_t)c->table);
        for (size_t j = 0; j < n;) {
            long i = (long)dp_rng_below(&rng, (uint64_t)c->table);
            if (!taken[i]) taken[i] = 1, keys[j++] = s_key(i);
        }
        uint64_t b0 = dp_ps_client_bytes_pulled(pc), p0 = dp_ps_client_bytes_pushed(pc);
        dp_push_result_t res;
        double t0 = dp_now();
        if (dp_ps_client_rows_pull(pc, keys, n, c->dim, rows, NULL, err) != 0) rc = -1;
        double t1 = dp_now();
        if (rc == 0 && dp_ps_client_rows_push(pc, keys, n, c->dim, grads, step, &res, err) != 0)
            rc = -1;
        double t2 = dp_now();
        memcpy(copy, rows, n * (size_t)c->dim * sizeof(float));
        __asm__ volatile("" : : "r"(copy) : "memory"); /* the copy counts as read */
        double t3 = dp_now();
        if (r < c->warmup || rc != 0) continue;
        t->pull[t->n] = (t1 - t0) * 1e3;
        t->push[t->n] = (t2 - t1) * 1e3;
        t->copy[t->n] = (t3 - t2) * 1e3;
        t->pull_bytes = dp_ps_client_bytes_pulled(pc) - b0 + n * sizeof(uint64_t); /* rows in, keys out */
        t->push_bytes = dp_ps_client_bytes_pushed(pc) - p0;
        t->n++;
    }
    free(keys), free(rows), free(grads), free(copy), free(taken);
    return rc;
}

static void s_report(const s_conf_t *c, s_times_t *t)
{
    double pull = dp_bench_median(t->pull, t->n), push = dp_bench_median(t->push, t->n);
    double cp = dp_bench_median(t->copy, t->n), N = (double)c->keys;
    double dense = (double)c->table * c->dim * 4;
    printf("rows: %ld of a table of %ld rows x %d, %d shard%s; medians of %d rounds\n", c->keys,
           c->table, c->dim, c->shards, c->shards > 1 ? "s" : "", t->n);
    printf("  pull %.3f ms (%.0f rows/s)   push %.3f ms (%.0f rows/s)\n", pull, N / pull * 1e3,
           push, N / push * 1e3);
    printf("  memcpy of the rows' bytes %.4f ms (%.0f rows/s): pull %.0fx, push %.0fx of it\n", cp,
           N / cp * 1e3, pull / cp, push / cp);
    printf("  bytes: a pull %" PRIu64 ", a push %" PRIu64 "; a dense pull of the table %.0f "
           "(%.0fx a pull)\n", t->pull_bytes, t->push_bytes, dense, dense / (double)t->pull_bytes);
    if (!c->json) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "dim", c->dim);
    cJSON_AddNumberToObject(o, "keys", (double)c->keys);
    cJSON_AddNumberToObject(o, "table", (double)c->table);
    cJSON_AddNumberToObject(o, "shards", c->shards);
    cJSON_AddNumberToObject(o, "rounds", t->n);
    cJSON_AddNumberToObject(o, "pull_ms", dp_metrics_round(pull, 4));
    cJSON_AddNumberToObject(o, "push_ms", dp_metrics_round(push, 4));
    cJSON_AddNumberToObject(o, "memcpy_ms", dp_metrics_round(cp, 5));
    cJSON_AddNumberToObject(o, "pull_rows_per_s", round(N / pull * 1e3));
    cJSON_AddNumberToObject(o, "push_rows_per_s", round(N / push * 1e3));
    cJSON_AddNumberToObject(o, "memcpy_rows_per_s", round(N / cp * 1e3));
    cJSON_AddNumberToObject(o, "pull_bytes", (double)t->pull_bytes);
    cJSON_AddNumberToObject(o, "push_bytes", (double)t->push_bytes);
    cJSON_AddNumberToObject(o, "dense_bytes", dense);
    char *line = cJSON_PrintUnformatted(o);
    printf("%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
}

static int s_run(const s_conf_t *c, const char *argv0, char *err)
{
    char spec[48];
    snprintf(spec, sizeof spec, "embed:%d fc:2 softmax", c->dim);
    dp_model_t m;
    if (dp_model_parse(&m, spec, 1, 1, 1, err) != 0) return -1;
    dp_bench_shards_t cl;
    if (dp_bench_shards_init(&cl, "bench-rows", argv0, err) != 0) return -1;
    dp_ps_client_t *pc = NULL;
    s_times_t t = {.pull = dp_calloc((size_t)c->rounds, sizeof(double)),
                   .push = dp_calloc((size_t)c->rounds, sizeof(double)),
                   .copy = dp_calloc((size_t)c->rounds, sizeof(double))};
    dp_bench_shards_conf_t sc = {.shards = c->shards, .workers = 1, .optimizer = "sgd",
                                 .spec = spec, .input = "1x1x1"};
    dp_ps_info_t info;
    dp_ps_client_opts_t opts = {.timeout_s = 60};
    int rc = -1;
    if (dp_bench_shards_start(&cl, &sc, err) == 0 &&
        dp_ps_client_new(&pc, cl.endpoints, &m, 0, &opts, &info, err) == 0 &&
        s_measure(c, pc, &t, err) == 0) {
        s_report(c, &t);
        rc = 0;
    }
    dp_ps_client_destroy(&pc);
    dp_bench_shards_fini(&cl);
    free(t.pull), free(t.push), free(t.copy);
    return rc;
}

int dp_bench_rows_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "rows") != 0) {
        fprintf(stderr, "downpour bench: expected `downpour bench rows` (see downpour bench rows --help)\n");
        return 2;
    }
    s_conf_t c = {.dim = 16, .keys = 4096, .table = 262144, .shards = 1, .rounds = 50, .warmup = 5};
    char err[DP_ERR_LEN] = "";
    dp_opts_result_t r = s_parse(&c, argc - 1, argv + 1, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour bench rows", r, err);
    if (s_run(&c, argv[0], err) != 0) {
        fprintf(stderr, "downpour bench rows: %s\n", err);
        return 1;
    }
    return 0;
}
