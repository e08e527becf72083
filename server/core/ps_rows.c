/* ps_rows: the rules of a shard's row table (server/core/ps_rows.h),
 * without the wire: the handlers of ROWS_PULL and ROWS_PUSH that call them
 * are server/loop/ps_rows_wire.c. */
#include "server/core/ps_rows.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "common/util.h"

_Static_assert(DP_ROWS_MAX_WIDTH == DP_WIRE_MAX_ROW_WIDTH, "one bound on a row's width");
_Static_assert(DP_ROWS_MAX_KEYS == DP_WIRE_MAX_ROW_KEYS, "one bound on a request's keys");

int dp_ps_rows_init(dp_ps_rows_t *r, int d, const dp_rows_conf_t *c, dp_mode_t mode,
                    dp_mode_t dense_mode, uint32_t shard, uint32_t shards, int workers, char *err)
{
    memset(r, 0, sizeof *r);
    if (d <= 0) return 0;
    if (mode == DP_MODE_SYNC && dense_mode != DP_MODE_SYNC)
        return dp_err(err, "--rows-mode sync needs --mode sync (the rows are applied with the "
                           "dense step); with --mode %s the rows take async or ssp",
                      dp_mode_name(dense_mode));
    dp_rows_conf_t conf = *c;
    conf.width = d;
    char why[DP_ERR_LEN];
    r->table = dp_rows_new(&conf, why);
    if (!r->table) return dp_err(err, "the row table: %s", why);
    r->width = d;
    r->mode = mode;
    r->shard = shard;
    r->shards = shards;
    r->workers = workers;
    r->max_keys = conf.max_keys ? conf.max_keys : DP_ROWS_DEFAULT_KEYS;
    r->init = conf.init == DP_ROWS_INIT_UNIFORM ? conf.init_scale : 0;
    r->seed = conf.init == DP_ROWS_INIT_UNIFORM ? conf.seed : 0;
    r->last_step = dp_calloc((size_t)workers, sizeof *r->last_step);
    r->pulled = dp_calloc((size_t)workers, sizeof *r->pulled);
    r->n_pulled = dp_calloc((size_t)workers, sizeof *r->n_pulled);
    if (mode == DP_MODE_SYNC) {
        r->waiting = dp_calloc((size_t)workers, sizeof *r->waiting);
        for (int w = 0; w < workers; w++) r->waiting[w].version = UINT64_MAX;
    }
    return 0;
}

void dp_ps_rows_fini(dp_ps_rows_t *r)
{
    if (!r->table) return;
    for (int w = 0; w < r->workers; w++) {
        free(r->pulled[w]);
        if (r->waiting) free(r->waiting[w].keys), free(r->waiting[w].grads);
    }
    free(r->pulled), free(r->n_pulled), free(r->last_step), free(r->waiting);
    free(r->sum_keys), free(r->sum_grads), free(r->order);
    dp_rows_destroy(&r->table);
    memset(r, 0, sizeof *r);
}

void dp_ps_rows_stats(const dp_ps_rows_t *r, dp_ps_rows_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!r->table) return;
    dp_rows_stats_t s;
    dp_rows_stats(r->table, &s);
    *out = (dp_ps_rows_stats_t){.rows = s.rows, .created = s.created, .evicted = s.evicted,
                                .pushes = r->pushes, .rejected = r->rejected,
                                .staleness_sum = r->staleness_sum,
                                .staleness_max = r->staleness_max, .bytes = s.bytes};
}

/* ---- a checkpoint's rows -------------------------------------------------- */

#define S_MAGIC "DPPSROW1"

typedef struct {
    char magic[8];
    uint32_t workers, width;
    uint64_t pushes, rejected, repeats, dropped, staleness_sum, staleness_max;
} s_saved_t;

uint8_t *dp_ps_rows_save(const dp_ps_rows_t *r, size_t *len)
{
    if (!r->table) return NULL;
    size_t tlen, steps = (size_t)r->workers * sizeof *r->last_step;
    uint8_t *table = dp_rows_save(r->table, &tlen);
    *len = sizeof(s_saved_t) + steps + tlen + sizeof(uint32_t);
    uint8_t *buf = dp_malloc(*len), *p = buf;
    s_saved_t h = {.workers = (uint32_t)r->workers, .width = (uint32_t)r->width,
                   .pushes = r->pushes, .rejected = r->rejected, .repeats = r->repeats,
                   .dropped = r->dropped, .staleness_sum = r->staleness_sum,
                   .staleness_max = r->staleness_max};
    memcpy(h.magic, S_MAGIC, sizeof h.magic);
    memcpy(p, &h, sizeof h), p += sizeof h;
    memcpy(p, r->last_step, steps), p += steps;
    memcpy(p, table, tlen), p += tlen;
    uint32_t crc = dp_crc32(0, buf, (size_t)(p - buf));
    memcpy(p, &crc, sizeof crc);
    free(table);
    return buf;
}

int dp_ps_rows_load(dp_ps_rows_t *r, const uint8_t *buf, size_t len, char *err)
{
    if (!r->table) return dp_err(err, "rows for a model without a row table (embed:D)");
    s_saved_t h;
    size_t steps = (size_t)r->workers * sizeof *r->last_step;
    if (len < sizeof h + steps + sizeof(uint32_t)) return dp_err(err, "rows of %zu bytes: too short", len);
    uint32_t crc;
    memcpy(&crc, buf + len - sizeof crc, sizeof crc);
    if (dp_crc32(0, buf, len - sizeof crc) != crc) return dp_err(err, "rows corrupt: CRC-32 mismatch");
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, S_MAGIC, sizeof h.magic) != 0) return dp_err(err, "not a shard's rows");
    if (h.workers != (uint32_t)r->workers || h.width != (uint32_t)r->width)
        return dp_err(err, "rows of %u workers, width %u; this shard: %d workers, width %d",
                      h.workers, h.width, r->workers, r->width);
    if (dp_rows_load(r->table, buf + sizeof h + steps, len - sizeof h - steps - sizeof crc, err) != 0)
        return -1;
    memcpy(r->last_step, buf + sizeof h, steps);
    r->pushes = h.pushes, r->rejected = h.rejected, r->repeats = h.repeats;
    r->dropped = h.dropped, r->staleness_sum = h.staleness_sum, r->staleness_max = h.staleness_max;
    return 0;
}

static int s_cmp_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The message limit lets through far more keys than max_keys: a pull's 8
 * bytes a key against a push's 8 + 4 D. */
int dp_ps_rows_count_ok(const dp_ps_rows_t *r, size_t n, char *err)
{
    if (n > r->max_keys)
        return dp_err(err, "%zu keys in one request (this shard takes at most %u)", n, r->max_keys);
    return 0;
}

/* The n keys of a request (aligned, caller's) each of this shard and at
 * most max_keys of them; -1 with err. */
static int s_keys_ours(const dp_ps_rows_t *r, const uint64_t *keys, size_t n, char *err)
{
    if (dp_ps_rows_count_ok(r, n, err) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t owner = dp_rows_shard_of(keys[i], r->shards);
        if (owner != r->shard)
            return dp_err(err, "key %" PRIu64 " is held by shard %u, not this one (%u of %u)",
                          keys[i], owner, r->shard, r->shards);
    }
    return 0;
}

/* Is key in the worker's last pulled set? */
static bool s_pulled(const dp_ps_rows_t *r, int w, uint64_t key)
{
    return r->pulled[w] &&
           bsearch(&key, r->pulled[w], r->n_pulled[w], sizeof key, s_cmp_key) != NULL;
}

long dp_ps_rows_pull(dp_ps_rows_t *r, int w, const uint64_t *keys, size_t n, float *rows, char *err)
{
    r->n_pulled[w] = 0; /* until the pull is whole: no push may follow a refused one */
    if (s_keys_ours(r, keys, n, err) != 0) return -1;
    if (!r->pulled[w]) r->pulled[w] = dp_malloc((size_t)r->max_keys * sizeof(uint64_t));
    uint64_t *set = r->pulled[w];
    memcpy(set, keys, n * sizeof *set);
    qsort(set, n, sizeof *set, s_cmp_key);
    for (size_t i = 1; i < n; i++)
        if (set[i] == set[i - 1]) return dp_err(err, "key %" PRIu64 " asked twice", set[i]);
    long held = dp_rows_pull(r->table, keys, n, r->width, rows, err);
    if (held >= 0) r->n_pulled[w] = n;
    return held;
}

uint32_t dp_ps_rows_page(const dp_ps_rows_t *r)
{
    uint64_t d = (uint64_t)(r->width > 0 ? r->width : 1);
    uint64_t page = (uint64_t)r->max_keys * d / (d + 2);
    return page ? (uint32_t)page : 1;
}

/* The push's rows checked whole (this shard's keys, pulled, finite). */
static int s_push_check(const dp_ps_rows_t *r, int w, const uint64_t *keys, size_t n,
                        const void *grads, char *err)
{
    if (s_keys_ours(r, keys, n, err) != 0) return -1;
    for (size_t i = 0; i < n; i++)
        if (!s_pulled(r, w, keys[i]))
            return dp_err(err, "key %" PRIu64 " was not in this worker's last ROWS_PULL", keys[i]);
    size_t nf = n * (size_t)r->width;
    for (size_t i = 0; i < nf; i++) {
        float v;
        memcpy(&v, (const char *)grads + i * sizeof v, sizeof v); /* a frame need not be aligned */
        if (!isfinite(v))
            return dp_err(err, "non-finite gradient of key %" PRIu64 " (element %zu)",
                          keys[i / (size_t)r->width], i % (size_t)r->width);
    }
    return 0;
}

static void s_outcome(dp_push_outcome_t *o, int status, uint64_t staleness, const char *why)
{
    *o = (dp_push_outcome_t){.status = status, .staleness = staleness};
    snprintf(o->reason, sizeof o->reason, "%s", why);
}

void dp_ps_rows_refuse(dp_ps_rows_t *r, const char *why, dp_push_outcome_t *o)
{
    r->rejected++;
    s_outcome(o, DP_PUSH_REJECTED, 0, why);
}

int dp_ps_rows_push(dp_ps_rows_t *r, int w, uint64_t step, uint64_t pulled_at, uint64_t version,
                    int width, const uint64_t *keys, size_t n, const void *grads, dp_push_outcome_t *o)
{
    char why[DP_ERR_LEN];
    if (step && step <= r->last_step[w]) {
        r->repeats++;
        s_outcome(o, DP_PUSH_APPLIED, 0, "repeat: this step's rows are applied already");
        return 1;
    }
    if (pulled_at > version) {
        snprintf(why, sizeof why, "computed at version %" PRIu64 ", ahead of this shard's %" PRIu64,
                 pulled_at, version);
        goto rejected;
    }
    if (width != r->width) {
        snprintf(why, sizeof why, "rows of width %d pushed; this shard's are %d wide", width, r->width);
        goto rejected;
    }
    if (s_push_check(r, w, keys, n, grads, why) != 0) goto rejected;
    size_t nf = n * (size_t)r->width;
    if (r->mode != DP_MODE_SYNC) {
        float *g = dp_malloc((nf ? nf : 1) * sizeof *g);
        memcpy(g, grads, nf * sizeof *g);
        long stepped = dp_rows_push(r->table, version, keys, n, r->width, g, why);
        free(g);
        if (stepped < 0) goto rejected; /* checked above; a key twice is the table's to find */
        uint64_t stale = version - pulled_at;
        r->pushes++;
        r->staleness_sum += stale;
        if (stale > r->staleness_max) r->staleness_max = stale;
        if (step) r->last_step[w] = step;
        s_outcome(o, DP_PUSH_APPLIED, stale, "");
        return 0;
    }
    if (step) r->last_step[w] = step;
    if (pulled_at < version) { /* its step fired without it */
        r->dropped++;
        s_outcome(o, DP_PUSH_DROPPED, version - pulled_at, "stale: its step was taken without it");
        return 0;
    }
    dp_ps_rows_wait_t *wt = &r->waiting[w];
    if (!wt->keys) {
        wt->keys = dp_malloc((size_t)r->max_keys * sizeof *wt->keys);
        wt->grads = dp_malloc((size_t)r->max_keys * (size_t)r->width * sizeof *wt->grads);
    }
    memcpy(wt->keys, keys, n * sizeof *keys);
    memcpy(wt->grads, grads, nf * sizeof *wt->grads);
    wt->n = n;
    wt->version = pulled_at;
    wt->taken = false;
    s_outcome(o, DP_PUSH_APPLIED, 0, "");
    return 0;
rejected:
    dp_ps_rows_refuse(r, why, o);
    return 0;
}

void dp_ps_rows_dense_taken(dp_ps_rows_t *r, int worker, uint64_t version)
{
    if (!r->waiting) return;
    if (r->waiting[worker].version == version) r->waiting[worker].taken = true;
}

/* qsort_r's order of positions into the keys (arg): by key, then by
 * position (stable: worker order, then the push's own order). */
static int s_cmp_order(const void *a, const void *b, void *arg)
{
    const uint64_t *keys = arg;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    int c = s_cmp_key(&keys[x], &keys[y]);
    return c ? c : (x > y) - (x < y);
}

void dp_ps_rows_stepped(dp_ps_rows_t *r, uint64_t version)
{
    if (!r->waiting) return;
    /* the step that fired was version - 1: its taken pushes, in worker order */
    size_t total = 0;
    uint32_t pushes = 0;
    for (int w = 0; w < r->workers; w++) {
        dp_ps_rows_wait_t *wt = &r->waiting[w];
        if (wt->version == version - 1 && wt->taken) total += wt->n, pushes++;
        else if (wt->version < version) r->dropped++; /* not taken, or an older step's */
    }
    if (pushes) {
        size_t d = (size_t)r->width;
        uint64_t *all = dp_malloc((total ? total : 1) * sizeof *all);
        float *g = dp_malloc((total ? total : 1) * d * sizeof *g);
        size_t at = 0;
        for (int w = 0; w < r->workers; w++) {
            dp_ps_rows_wait_t *wt = &r->waiting[w];
            if (wt->version != version - 1 || !wt->taken) continue;
            memcpy(all + at, wt->keys, wt->n * sizeof *all);
            memcpy(g + at * d, wt->grads, wt->n * d * sizeof *g);
            at += wt->n;
        }
        /* sum each key's rows in a fixed order (worker, then position), then
         * divide by the pushes: the same bits for the same pushes */
        size_t *order = dp_malloc((total ? total : 1) * sizeof *order);
        for (size_t i = 0; i < total; i++) order[i] = i;
        qsort_r(order, total, sizeof *order, s_cmp_order, all);
        uint64_t *keys = dp_malloc((total ? total : 1) * sizeof *keys);
        float *sum = dp_calloc((total ? total : 1) * d, sizeof *sum);
        size_t n = 0;
        for (size_t i = 0; i < total; i++) {
            size_t k = order[i];
            if (n == 0 || keys[n - 1] != all[k]) keys[n++] = all[k];
            float *row = sum + (n - 1) * d;
            for (size_t j = 0; j < d; j++) row[j] += g[k * d + j];
        }
        float inv = 1.0f / (float)pushes;
        for (size_t i = 0; i < n * d; i++) sum[i] *= inv;
        char why[DP_ERR_LEN];
        if (dp_rows_push(r->table, version, keys, n, r->width, sum, why) < 0)
            dp_log_warn("the step's rows were not applied: %s", why); /* checked per push */
        else r->pushes += pushes;
        free(all), free(g), free(order), free(keys), free(sum);
    }
    for (int w = 0; w < r->workers; w++)
        if (r->waiting[w].version < version) r->waiting[w].version = UINT64_MAX;
}
