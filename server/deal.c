/* deal: the epoch's batches handed out by shard 0 (server/deal.h). */
#include "server/deal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define K DP_DEAL_IN_FLIGHT
#define S_DIED 0x80u
#define S_COUNT 0x7fu

void dp_deal_init(dp_deal_t *d, int workers)
{
    memset(d, 0, sizeof *d);
    d->workers = workers;
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

int dp_deal_plan(dp_deal_t *d, uint64_t samples, uint32_t batch, uint64_t epochs, uint64_t steps,
                 char *why, size_t n)
{
    if (samples == 0 && batch == 0 && epochs == 0 && steps == 0) return 0;
    if (batch == 0 || samples < batch || (epochs == 0) == (steps == 0)) {
        snprintf(why, n, "bad data plan: %" PRIu64 " samples at batch %u for %" PRIu64
                 " epochs or %" PRIu64 " steps (one of the two)", samples, batch, epochs, steps);
        return -1;
    }
    uint64_t per_epoch = samples / batch;
    uint64_t total = epochs ? epochs * per_epoch : steps * (uint64_t)d->workers;
    if ((epochs && total / epochs != per_epoch) || (steps && total / steps != (uint64_t)d->workers) ||
        total > DP_DEAL_MAX_BATCHES) {
        snprintf(why, n, "bad data plan: more than %u batches in the run (%" PRIu64 " samples at "
                 "batch %u, %" PRIu64 " epochs, %" PRIu64 " steps)", DP_DEAL_MAX_BATCHES, samples,
                 batch, epochs, steps);
        return -1;
    }
    if (d->batch) {
        if (samples == d->samples && batch == d->batch && total == d->total) return 0;
        snprintf(why, n, "data plan mismatch: the servers deal %" PRIu64 " batches of %u from %"
                 PRIu64 " samples; this worker's is %" PRIu64 " of %u from %" PRIu64 " (give every "
                 "worker the same data, --batch and --epochs or --steps)", d->total, d->batch,
                 d->samples, total, batch, samples);
        return -1;
    }
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
        if (d->pool[k].died && d->pool[k].worker == worker && d->pool[k].step == step) return (long)k;
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
    dp_deal_slot_t s = {.worker = worker, .step = step};
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
        if (p->died) *c = (unsigned char)(((*c & S_COUNT) < S_COUNT ? *c + 1 : *c) | S_DIED);
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

static void s_count(dp_deal_t *d, dp_deal_batch_t b)
{
    unsigned char *c = &d->count[s_number(d, b)];
    if ((*c & S_COUNT) < S_COUNT) (*c)++;
}

static void s_pool_add(dp_deal_t *d, dp_deal_slot_t s, int died)
{
    s.died = died;
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
        if (used) s_count(d, s.b);
        else s_pool_add(d, s, 0); /* not trained: someone else takes it */
        return 1;
    }
    dp_deal_slot_t *lost = d->lost + (size_t)worker * K;
    k = s_find(lost, d->n_lost[worker], step);
    if (k >= 0) { /* a zombie: taken for dead, it trained the batch after all */
        *b = lost[k].b;
        s_remove(lost, &d->n_lost[worker], k);
        long p = s_pool_lost(d, worker, step);
        if (used && p >= 0) { /* nobody else was dealt it: trained once, here */
            s_pool_remove(d, (size_t)p);
            s_count(d, *b);
        }
        return 1; /* dealt to another already: its death counted this training */
    }
    d->foreign++;
    return 0;
}

int dp_deal_release(dp_deal_t *d, int worker, int died)
{
    if (!d->batch) return 0;
    dp_deal_slot_t *mine = d->flight + (size_t)worker * K;
    int n = d->n_flight[worker];
    for (int k = 0; k < n; k++) {
        s_pool_add(d, mine[k], died);
        if (!died) continue;
        dp_deal_slot_t *lost = d->lost + (size_t)worker * K;
        if (d->n_lost[worker] == K) s_remove(lost, &d->n_lost[worker], 0); /* its oldest */
        lost[d->n_lost[worker]++] = mine[k];
    }
    d->n_flight[worker] = 0;
    return n;
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
