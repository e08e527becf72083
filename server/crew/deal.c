/* deal: the epoch's batches handed out by shard 0 (server/crew/deal.h). */
#include "server/crew/deal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/util.h"

#define K DP_DEAL_IN_FLIGHT
#define S_DIED 0x80u
#define S_COUNT 0x7fu

void dp_deal_init(dp_deal_t *d, int workers)
{
    memset(d, 0, sizeof *d);
    d->workers = workers;
    d->lease_floor = DP_DEAL_LEASE_FLOOR;
    d->flight = dp_calloc((size_t)workers * K, sizeof *d->flight);
    d->n_flight = dp_calloc((size_t)workers, sizeof *d->n_flight);
    d->lost = dp_calloc((size_t)workers * K, sizeof *d->lost);
    d->n_lost = dp_calloc((size_t)workers, sizeof *d->n_lost);
    /* a batch returns to the pool only from a worker's flight, and new
     * ones are dealt only while the pool is empty: pool + flight <= w x K */
    d->cap_pool = (size_t)workers * K;
    d->pool = dp_calloc(d->cap_pool, sizeof *d->pool);
}

void dp_deal_fini(dp_deal_t *d)
{
    free(d->count);
    free(d->flight);
    free(d->n_flight);
    free(d->lost);
    free(d->n_lost);
    free(d->pool);
    memset(d, 0, sizeof *d);
}

/* The plan's batches per epoch and in all, or -1 with why when it is no plan. */
static int s_sizes(const dp_deal_t *d, uint64_t samples, uint32_t batch, uint64_t epochs,
                   uint64_t steps, uint64_t *per_epoch, uint64_t *total, char *why, size_t n)
{
    if (batch == 0 || samples < batch || (epochs == 0) == (steps == 0)) {
        snprintf(why, n, "bad data plan: %" PRIu64 " samples at batch %u for %" PRIu64
                 " epochs or %" PRIu64 " steps (one of the two)", samples, batch, epochs, steps);
        return -1;
    }
    *per_epoch = samples / batch;
    *total = epochs ? epochs * *per_epoch : steps * (uint64_t)d->workers;
    if ((epochs && *total / epochs != *per_epoch) || (steps && *total / steps != (uint64_t)d->workers) ||
        *total > DP_DEAL_MAX_BATCHES) {
        snprintf(why, n, "bad data plan: more than %u batches in the run (%" PRIu64 " samples at "
                 "batch %u, %" PRIu64 " epochs, %" PRIu64 " steps)", DP_DEAL_MAX_BATCHES, samples,
                 batch, epochs, steps);
        return -1;
    }
    return 0;
}

/* A plan of (per_epoch, total) against the one set: 0 when they agree. */
static int s_agrees(const dp_deal_t *d, uint64_t samples, uint32_t batch, uint64_t total,
                    char *why, size_t n)
{
    if (samples == d->samples && batch == d->batch && total == d->total) return 0;
    snprintf(why, n, "data plan mismatch: the servers deal %" PRIu64 " batches of %u from %"
             PRIu64 " samples; this worker's is %" PRIu64 " of %u from %" PRIu64 " (give every "
             "worker the same data, --batch and --epochs or --steps)", d->total, d->batch,
             d->samples, total, batch, samples);
    return -1;
}

int dp_deal_plan_check(const dp_deal_t *d, const dp_deal_terms_t *t, char *why, size_t n)
{
    uint64_t per_epoch, total;
    if (s_sizes(d, t->samples, t->batch, t->epochs, t->steps, &per_epoch, &total, why, n) != 0)
        return -1;
    return d->batch ? s_agrees(d, t->samples, t->batch, total, why, n) : 0;
}

int dp_deal_plan(dp_deal_t *d, uint64_t samples, uint32_t batch, uint64_t epochs, uint64_t steps,
                 char *why, size_t n)
{
    if (samples == 0 && batch == 0 && epochs == 0 && steps == 0) return 0;
    uint64_t per_epoch, total;
    if (s_sizes(d, samples, batch, epochs, steps, &per_epoch, &total, why, n) != 0) return -1;
    if (d->batch) return s_agrees(d, samples, batch, total, why, n);
    d->samples = samples;
    d->batch = batch;
    d->per_epoch = per_epoch;
    d->total = total;
    d->count = dp_calloc(total ? total : 1, 1);
    return 0;
}

int dp_deal_planned(const dp_deal_t *d)
{
    return d->batch != 0;
}

static uint64_t s_number(const dp_deal_t *d, dp_deal_batch_t b)
{
    return b.epoch * d->per_epoch + b.index;
}

static dp_deal_batch_t s_batch(const dp_deal_t *d, uint64_t g)
{
    return (dp_deal_batch_t){g / d->per_epoch, g % d->per_epoch};
}

/* Slot k of list (n entries) removed, the order kept. */
static void s_remove(dp_deal_slot_t *list, int *n, int k)
{
    memmove(list + k, list + k + 1, (size_t)(*n - k - 1) * sizeof *list);
    (*n)--;
}

static void s_pool_remove(dp_deal_t *d, size_t k)
{
    memmove(d->pool + k, d->pool + k + 1, (d->n_pool - k - 1) * sizeof *d->pool);
    d->n_pool--;
}

static int s_find(const dp_deal_slot_t *list, int n, uint64_t step)
{
    for (int k = 0; k < n; k++)
        if (list[k].step == step) return k;
    return -1;
}

/* The pool's entry a dead worker left for its step, or -1. */
static long s_pool_lost(const dp_deal_t *d, int worker, uint64_t step)
{
    for (size_t k = 0; k < d->n_pool; k++)
        if (d->pool[k].why != DP_DEAL_RETURNED && d->pool[k].worker == worker && d->pool[k].step == step) return (long)k;
    return -1;
}

dp_deal_answer_t dp_deal_ask(dp_deal_t *d, int worker, uint64_t step, dp_deal_batch_t *out,
                             char *why, size_t n)
{
    if (!d->batch) {
        snprintf(why, n, "no data plan: no worker's HELLO said what to deal");
        return DP_DEAL_REFUSED;
    }
    dp_deal_slot_t *mine = d->flight + (size_t)worker * K;
    int k = s_find(mine, d->n_flight[worker], step);
    if (k >= 0) { /* a repeated pull */
        *out = mine[k].b;
        return DP_DEAL_DEALT;
    }
    if (d->n_flight[worker] >= K) {
        snprintf(why, n, "worker %d holds %d batches in flight already (at most %d): push them first",
                 worker, K, K);
        return DP_DEAL_REFUSED;
    }
    dp_deal_slot_t s = {.worker = worker, .step = step, .at = d->clock};
    long back = s_pool_lost(d, worker, step); /* its own, back after it was taken for dead */
    if (back >= 0) {
        s.b = d->pool[back].b;
        s_pool_remove(d, (size_t)back);
        int *nl = &d->n_lost[worker];
        int j = s_find(d->lost + (size_t)worker * K, *nl, step);
        if (j >= 0) s_remove(d->lost + (size_t)worker * K, nl, j);
    } else if (d->n_pool > 0) {
        dp_deal_slot_t *p = &d->pool[0];
        s.b = p->b;
        /* the dead holder may have pushed part of it: it counts as trained */
        unsigned char *c = &d->count[s_number(d, p->b)];
        if (p->why == DP_DEAL_DIED) *c = (unsigned char)(((*c & S_COUNT) < S_COUNT ? *c + 1 : *c) | S_DIED);
        s_pool_remove(d, 0);
    } else if (d->next < d->total) {
        s.b = s_batch(d, d->next++);
    } else {
        /* only another's batch may come back for it: its own are in its pushes */
        return dp_deal_in_flight(d) - d->n_flight[worker] > 0 ? DP_DEAL_WAIT : DP_DEAL_END;
    }
    mine[d->n_flight[worker]++] = s;
    *out = s.b;
    return DP_DEAL_DEALT;
}

static void s_turn(dp_deal_t *d, double t);

static void s_count(dp_deal_t *d, dp_deal_batch_t b)
{
    unsigned char *c = &d->count[s_number(d, b)];
    if ((*c & S_COUNT) < S_COUNT) (*c)++;
}

static void s_pool_add(dp_deal_t *d, dp_deal_slot_t s, dp_deal_why_t why)
{
    s.why = why;
    if (d->n_pool < d->cap_pool) d->pool[d->n_pool++] = s; /* always: the bound above */
}

int dp_deal_pushed(dp_deal_t *d, int worker, uint64_t step, int used, dp_deal_batch_t *b)
{
    if (!d->batch) return 0;
    dp_deal_slot_t *mine = d->flight + (size_t)worker * K;
    int k = s_find(mine, d->n_flight[worker], step);
    if (k >= 0) {
        dp_deal_slot_t s = mine[k];
        s_remove(mine, &d->n_flight[worker], k);
        *b = s.b;
        if (used) {
            s_count(d, s.b);
            s_turn(d, d->clock - s.at);
        } else s_pool_add(d, s, DP_DEAL_RETURNED); /* not trained: someone else takes it */
        return 1;
    }
    dp_deal_slot_t *lost = d->lost + (size_t)worker * K;
    k = s_find(lost, d->n_lost[worker], step);
    if (k >= 0) { /* a zombie (taken for dead), a restored shard's or a lease's holder: it trained it */
        dp_deal_why_t why = lost[k].why;
        *b = lost[k].b;
        s_remove(lost, &d->n_lost[worker], k);
        long p = s_pool_lost(d, worker, step);
        if (used && p >= 0) { /* nobody else was dealt it: trained once, here */
            s_pool_remove(d, (size_t)p);
            s_count(d, *b);
        } else if (used && (why == DP_DEAL_RESTORED || why == DP_DEAL_EXPIRED)) {
            s_count(d, *b); /* another trained it too, and no death counted this one */
        }
        return 1; /* a death's: dealt to another already, the death counted this training */
    }
    d->foreign++;
    return 0;
}

int dp_deal_holds(const dp_deal_t *d, int worker, uint64_t step)
{
    return d->batch && (s_find(d->flight + (size_t)worker * K, d->n_flight[worker], step) >= 0 ||
                        s_find(d->lost + (size_t)worker * K, d->n_lost[worker], step) >= 0);
}

/* A holder's batch remembered for its late push. */
static void s_lost_add(dp_deal_t *d, dp_deal_slot_t s, dp_deal_why_t why)
{
    dp_deal_slot_t *lost = d->lost + (size_t)s.worker * K;
    if (d->n_lost[s.worker] == K) s_remove(lost, &d->n_lost[s.worker], 0); /* its oldest */
    s.why = why;
    lost[d->n_lost[s.worker]++] = s;
}

int dp_deal_release(dp_deal_t *d, int worker, int died)
{
    if (!d->batch) return 0;
    dp_deal_slot_t *mine = d->flight + (size_t)worker * K;
    int n = d->n_flight[worker];
    for (int k = 0; k < n; k++) {
        s_pool_add(d, mine[k], died ? DP_DEAL_DIED : DP_DEAL_RETURNED);
        if (died) s_lost_add(d, mine[k], DP_DEAL_DIED);
    }
    d->n_flight[worker] = 0;
    return n;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dp_deal_lease(const dp_deal_t *d)
{
    return d->lease;
}

/* A used push's turnaround into the ring, and the lease from its median
 * (here, not at every tick: the loop ticks after every poll). */
static void s_turn(dp_deal_t *d, double t)
{
    d->turn[d->next_turn] = t;
    d->next_turn = (d->next_turn + 1) % DP_DEAL_TURNS;
    if (d->n_turn < DP_DEAL_TURNS) d->n_turn++;
    double sorted[DP_DEAL_TURNS];
    memcpy(sorted, d->turn, d->n_turn * sizeof *sorted);
    qsort(sorted, d->n_turn, sizeof *sorted, s_cmp_double);
    double lease = DP_DEAL_LEASE_TURNS * sorted[d->n_turn / 2];
    d->lease = lease > d->lease_floor ? lease : d->lease_floor;
}

int dp_deal_tick(dp_deal_t *d, double now)
{
    if (now > d->clock) d->clock = now;
    double lease = dp_deal_lease(d);
    if (!d->batch || lease <= 0) return 0;
    int taken = 0;
    for (int w = 0; w < d->workers; w++) {
        dp_deal_slot_t *mine = d->flight + (size_t)w * K;
        for (int k = 0; k < d->n_flight[w];) {
            if (d->clock - mine[k].at <= lease) {
                k++;
                continue;
            }
            /* its holder's late push still counts (s_lost_add): once, or repeated */
            s_pool_add(d, mine[k], DP_DEAL_EXPIRED);
            s_lost_add(d, mine[k], DP_DEAL_EXPIRED);
            s_remove(mine, &d->n_flight[w], k);
            taken++;
        }
    }
    d->expired += (uint64_t)taken;
    return taken;
}

int dp_deal_in_flight(const dp_deal_t *d)
{
    int n = 0;
    for (int w = 0; w < d->workers; w++) n += d->n_flight[w];
    return n;
}

int dp_deal_done(const dp_deal_t *d)
{
    return d->next >= d->total && d->n_pool == 0 && dp_deal_in_flight(d) == 0;
}

size_t dp_deal_epochs(const dp_deal_t *d, dp_deal_epoch_t *out, size_t max)
{
    if (!d->batch || d->next == 0) return 0;
    uint64_t epochs = (d->next - 1) / d->per_epoch + 1;
    for (uint64_t e = 0; e < epochs && e < max; e++) {
        dp_deal_epoch_t *o = &out[e];
        uint64_t a = e * d->per_epoch, z = a + d->per_epoch;
        if (z > d->total) z = d->total;
        *o = (dp_deal_epoch_t){.epoch = e, .batches = z - a};
        for (uint64_t g = a; g < z; g++) {
            unsigned c = d->count[g] & S_COUNT;
            o->trained += c >= 1;
            o->repeated += c >= 2;
            o->retrained_after_death += c >= 2 && (d->count[g] & S_DIED);
        }
        o->trained *= d->batch;
        o->repeated *= d->batch;
        o->retrained_after_death *= d->batch;
    }
    return (size_t)epochs;
}

/* ---- a checkpoint's dealer ------------------------------------------------
 * The text: {"workers", "samples", "batch", "total", "next", "foreign",
 * "pool": [[batch number, worker, step, why]...], "flight": [[batch number,
 * worker, step]...], "lost": [[batch number, worker, step, why]...]}; the
 * counts travel apart (the checkpoint's "deal.count" tensor). */

static cJSON *s_slots_json(const dp_deal_t *d, const dp_deal_slot_t *s, size_t n, int with_why)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t k = 0; k < n; k++) {
        double v[4] = {(double)s_number(d, s[k].b), s[k].worker, (double)s[k].step, s[k].why};
        cJSON_AddItemToArray(a, cJSON_CreateDoubleArray(v, with_why ? 4 : 3));
    }
    return a;
}

char *dp_deal_save(const dp_deal_t *d)
{
    if (!d->batch) return NULL;
    cJSON *o = cJSON_CreateObject(), *flight = cJSON_CreateArray(), *lost = cJSON_CreateArray();
    cJSON_AddNumberToObject(o, "workers", d->workers);
    cJSON_AddNumberToObject(o, "samples", (double)d->samples);
    cJSON_AddNumberToObject(o, "batch", d->batch);
    cJSON_AddNumberToObject(o, "total", (double)d->total);
    cJSON_AddNumberToObject(o, "next", (double)d->next);
    cJSON_AddNumberToObject(o, "foreign", (double)d->foreign);
    cJSON_AddItemToObject(o, "pool", s_slots_json(d, d->pool, d->n_pool, 1));
    for (int w = 0; w < d->workers; w++) {
        cJSON *f = s_slots_json(d, d->flight + (size_t)w * K, (size_t)d->n_flight[w], 0);
        cJSON *l = s_slots_json(d, d->lost + (size_t)w * K, (size_t)d->n_lost[w], 1);
        cJSON *e;
        while ((e = cJSON_DetachItemFromArray(f, 0)) != NULL) cJSON_AddItemToArray(flight, e);
        while ((e = cJSON_DetachItemFromArray(l, 0)) != NULL) cJSON_AddItemToArray(lost, e);
        cJSON_Delete(f);
        cJSON_Delete(l);
    }
    cJSON_AddItemToObject(o, "flight", flight);
    cJSON_AddItemToObject(o, "lost", lost);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) { /* cJSON fails only when out of memory: abort, as dp_malloc does */
        dp_log_error("deal: out of memory writing the dealer's state");
        abort();
    }
    return text;
}

#define S_EXACT 9007199254740992.0 /* 2^53: every integer below it is exact in a JSON number */

/* o's field key as an integer in [lo, hi]. */
static int s_field(const cJSON *o, const char *key, double lo, double hi, uint64_t *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(uint64_t)v->valuedouble ||
        v->valuedouble < lo || v->valuedouble > hi)
        return dp_err(err, "deal: '%s' is not a whole number in [%.0f, %.0f]", key, lo, hi);
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* Entry k of list key: [batch number < next, worker < workers, step, (why)]. */
static int s_slot(const dp_deal_t *d, const cJSON *e, const char *key, int with_why,
                  dp_deal_slot_t *out, char *err)
{
    int n = with_why ? 4 : 3;
    double hi[4] = {(double)d->next - 1, d->workers - 1, S_EXACT, DP_DEAL_EXPIRED};
    uint64_t v[4] = {0, 0, 0, 0};
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != n)
        return dp_err(err, "deal: an entry of '%s' is not %d numbers", key, n);
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(e, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > hi[i] ||
            x->valuedouble != (double)(uint64_t)x->valuedouble)
            return dp_err(err, "deal: an entry of '%s' is out of range", key);
        v[i] = (uint64_t)x->valuedouble;
    }
    *out = (dp_deal_slot_t){.b = s_batch(d, v[0]), .worker = (int)v[1], .step = v[2],
                            .why = (dp_deal_why_t)v[3]};
    return 0;
}

/* The plan's fields of o into the zeroed-plan d (no counts yet). */
static int s_plan_fields(dp_deal_t *d, const cJSON *o, char *err)
{
    uint64_t workers, samples, batch, total, next, foreign;
    if (s_field(o, "workers", 1, 1 << 20, &workers, err) || s_field(o, "batch", 1, UINT32_MAX, &batch, err) ||
        s_field(o, "samples", (double)batch, S_EXACT, &samples, err) ||
        s_field(o, "total", 1, DP_DEAL_MAX_BATCHES, &total, err) ||
        s_field(o, "next", 0, (double)total, &next, err) || s_field(o, "foreign", 0, S_EXACT, &foreign, err))
        return -1;
    if ((int)workers != d->workers)
        return dp_err(err, "deal: the checkpoint's crew has %" PRIu64 " task indexes, this one %d "
                      "(was --workers changed?)", workers, d->workers);
    d->samples = samples;
    d->batch = (uint32_t)batch;
    d->per_epoch = samples / batch;
    d->total = total;
    d->next = next;
    d->foreign = foreign;
    return 0;
}

int dp_deal_saved_total(const char *text, uint64_t *total, char *err)
{
    cJSON *o = cJSON_Parse(text);
    int rc = o ? s_field(o, "total", 1, DP_DEAL_MAX_BATCHES, total, err)
               : dp_err(err, "deal: the dealer's state is not JSON");
    cJSON_Delete(o);
    return rc;
}

/* Every list of o into t (a dealer of d's crew with t's plan set). */
static int s_lists(dp_deal_t *t, const cJSON *o, char *err)
{
    static const char *keys[3] = {"pool", "flight", "lost"};
    size_t cap = (size_t)t->workers * K;
    for (int l = 0; l < 3; l++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, keys[l]), *e;
        if (!cJSON_IsArray(a)) return dp_err(err, "deal: no list '%s'", keys[l]);
        cJSON_ArrayForEach(e, a) {
            dp_deal_slot_t s;
            if (s_slot(t, e, keys[l], l != 1, &s, err) != 0) return -1;
            int *n = l == 1 ? &t->n_flight[s.worker] : &t->n_lost[s.worker];
            if ((l == 0 && t->n_pool >= cap) || (l != 0 && *n >= K))
                return dp_err(err, "deal: '%s' holds more batches than a crew of %d may", keys[l],
                              t->workers);
            if (l == 0) t->pool[t->n_pool++] = s;
            else (l == 1 ? t->flight : t->lost)[(size_t)s.worker * K + (size_t)(*n)++] = s;
        }
    }
    if (t->n_pool + (size_t)dp_deal_in_flight(t) > cap)
        return dp_err(err, "deal: more batches back and in flight than a crew of %d may hold", t->workers);
    return 0;
}

int dp_deal_restore(dp_deal_t *d, const char *text, const unsigned char *count, uint64_t total,
                    char *err)
{
    cJSON *o = cJSON_Parse(text);
    if (!o) return dp_err(err, "deal: the dealer's state is not JSON");
    dp_deal_t t;
    dp_deal_init(&t, d->workers);
    t.lease_floor = d->lease_floor;
    int rc = -1;
    if (s_plan_fields(&t, o, err) != 0 || s_lists(&t, o, err) != 0) goto done;
    if (t.total != total) {
        dp_err(err, "deal: %" PRIu64 " counts for a plan of %" PRIu64 " batches", total, t.total);
        goto done;
    }
    for (uint64_t g = 0; g < total; g++)
        if (g >= t.next && count[g]) {
            dp_err(err, "deal: batch %" PRIu64 " counted though never dealt", g);
            goto done;
        }
    t.count = dp_malloc(total);
    memcpy(t.count, count, total);
    /* in flight at the checkpoint: what the holder trained since was lost
     * with the shard's updates, so the batch is dealt again; the holder's
     * own late push of it still counts once (s_lost_add) */
    for (int w = 0; w < t.workers; w++) {
        for (int k = 0; k < t.n_flight[w]; k++) {
            dp_deal_slot_t s = t.flight[(size_t)w * K + k];
            s_pool_add(&t, s, DP_DEAL_RESTORED);
            s_lost_add(&t, s, DP_DEAL_RESTORED);
        }
        t.n_flight[w] = 0;
    }
    dp_deal_fini(d);
    *d = t;
    rc = 0;
done:
    if (rc != 0) dp_deal_fini(&t);
    cJSON_Delete(o);
    return rc;
}
