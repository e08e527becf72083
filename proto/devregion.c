/* devregion: the device region protocol (see devregion.h for the layout,
 * the pin rule, pushes and restarts). */
#include "proto/devregion.h"

#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"

#define S_CTL_FLOATS ((sizeof(dp_devregion_ctl_t) + sizeof(float) - 1) / sizeof(float))
#define S_WCTL_FLOATS ((sizeof(dp_devregion_wctl_t) + sizeof(float) - 1) / sizeof(float))

static size_t s_stride(size_t n)
{
    return (n + 15) & ~(size_t)15; /* 64 bytes of floats */
}

static uint64_t s_generation(void)
{
    uint64_t g = 0;
    if (getrandom(&g, sizeof g, 0) != (ssize_t)sizeof g)
        g = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid() << 32;
    return g ? g : 1;
}

static void s_header(dp_devregion_shard_t *r)
{
    dp_devregion_ctl_t *c = r->ctl;
    c->magic = DP_DEVREGION_MAGIC;
    c->layout = DP_DEVREGION_LAYOUT;
    c->n = r->n;
    c->ring = (uint64_t)r->ring;
    c->workers = (uint64_t)r->workers;
    c->stride = r->stride;
    c->generation = r->generation;
    atomic_store(&c->retired, 0);
    atomic_store(&c->newest, 0);
    for (int e = 0; e < DP_DEVREGION_MAX_RING; e++) {
        atomic_store(&c->entry[e].seq, 0);
        atomic_store(&c->entry[e].version, 0);
    }
    for (int k = 0; k < DP_DEVREGION_MAX_WORKERS; k++) atomic_store(&c->taken[k], 0);
}

/* Slot k: its worker's control page, its gradient, its event. */
static int s_slot_create(dp_devregion_shard_t *r, int k, char *err)
{
    dp_devregion_slot_t *s = &r->slot[k];
    char what[32];
    snprintf(what, sizeof what, "devregion-w%d", k);
    if (dp_shm_create(&s->page, 0, what, S_WCTL_FLOATS, 1, DP_SHM_WRITABLE, err) != 0) return -1;
    s->wctl = (dp_devregion_wctl_t *)dp_shm_slot(&s->page, 0);
    memset(s->wctl, 0, sizeof *s->wctl);
    s->live = 1;
    snprintf(what, sizeof what, "devregion-g%d", k);
    if (r->ops->alloc(&s->grad, r->n * sizeof(float), DP_DEVMEM_WRITABLE, what, err) != 0)
        return -1;
    return r->ops->event_create(&s->ev, &s->wctl->events, &s->evh, err);
}

static void s_slot_free(dp_devregion_shard_t *r, int k)
{
    dp_devregion_slot_t *s = &r->slot[k];
    if (!s->live) return;
    r->ops->event_destroy(&s->ev);
    r->ops->free(&s->grad);
    dp_shm_close(&s->page);
    memset(s, 0, sizeof *s);
}

int dp_devregion_create(dp_devregion_shard_t *r, const dp_devmem_ops_t *ops, size_t n, int ring,
                        int workers, char *err)
{
    memset(r, 0, sizeof *r);
    r->ops = ops;
    r->writing = -1;
    if (n == 0 || n > ((size_t)1 << 40) || ring < 2 || ring > DP_DEVREGION_MAX_RING ||
        workers < 1 || workers > DP_DEVREGION_MAX_WORKERS)
        return dp_err(err, "device region: bad layout (%zu floats, ring %d, %d workers; ring 2..%d, "
                           "workers 1..%d)",
                      n, ring, workers, DP_DEVREGION_MAX_RING, DP_DEVREGION_MAX_WORKERS);
    r->n = n;
    r->stride = s_stride(n);
    r->ring = ring;
    r->workers = workers;
    r->generation = s_generation();
    int rc = dp_shm_create(&r->page, 0, "devregion", S_CTL_FLOATS, 1, DP_SHM_READ_ONLY, err);
    if (rc == 0) {
        r->ctl = (dp_devregion_ctl_t *)dp_shm_slot(&r->page, 0);
        s_header(r);
        rc = ops->alloc(&r->weights, (size_t)ring * r->stride * sizeof(float), DP_DEVMEM_READ_ONLY,
                        "devregion-ring", err);
    }
    for (int k = 0; rc == 0 && k < workers; k++) rc = s_slot_create(r, k, err);
    if (rc != 0) {
        for (int k = 0; k < workers; k++) s_slot_free(r, k);
        ops->free(&r->weights);
        dp_shm_close(&r->page);
        r->ctl = NULL;
        return -1;
    }
    return 0;
}

int dp_devregion_offer(const dp_devregion_shard_t *r, int k, dp_devregion_offer_t *o, char *err)
{
    memset(o, 0, sizeof *o);
    if (k < 0 || k >= r->workers || !r->slot[k].live)
        return dp_err(err, "device region: no slot %d (of %d)", k, r->workers);
    o->generation = r->generation;
    o->n = r->n;
    o->ring = (uint64_t)r->ring;
    o->workers = (uint64_t)r->workers;
    o->slot = (uint32_t)k;
    snprintf(o->ctl, sizeof o->ctl, "%s", r->page.name);
    snprintf(o->wctl, sizeof o->wctl, "%s", r->slot[k].page.name);
    if (r->ops->export_handle(&r->weights, &o->weights, err) != 0 ||
        r->ops->export_handle(&r->slot[k].grad, &o->grad, err) != 0)
        return -1;
    o->event = r->slot[k].evh;
    if (r->ops->device_of && r->ops->device_of(&r->weights, o->device, err) != 0) return -1;
    return 0;
}

/* Does any worker pin entry e? Read after the entry's seq went odd. */
static int s_pinned(const dp_devregion_shard_t *r, int e)
{
    for (int k = 0; k < r->workers; k++)
        if (r->slot[k].live &&
            atomic_load_explicit(&r->slot[k].wctl->pin, memory_order_seq_cst) == (uint64_t)e + 1)
            return 1;
    return 0;
}

float *dp_devregion_publish_begin(dp_devregion_shard_t *r, uint64_t version)
{
    assert(r->ctl && r->writing < 0); /* a region not released, one publish at a time */
    dp_devregion_ctl_t *c = r->ctl;
    int newest = (int)atomic_load_explicit(&c->newest, memory_order_relaxed) - 1;
    /* oldest first: the entry after the newest, around the ring */
    for (int i = 1; i <= r->ring; i++) {
        int e = (newest + i) % r->ring;
        if (e == newest) continue;
        uint64_t q = atomic_load_explicit(&c->entry[e].seq, memory_order_relaxed);
        atomic_store_explicit(&c->entry[e].seq, q + 1, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst); /* odd before we look at the pins */
        if (s_pinned(r, e)) {
            atomic_store_explicit(&c->entry[e].seq, q, memory_order_seq_cst);
            continue;
        }
        r->writing = e;
        r->writing_version = version;
        r->writing_seq = q;
        return (float *)r->weights.ptr + (size_t)e * r->stride;
    }
    r->busy++;
    return NULL;
}

void dp_devregion_publish_end(dp_devregion_shard_t *r)
{
    int e = r->writing;
    if (e < 0) return;
    dp_devregion_ctl_t *c = r->ctl;
    atomic_store_explicit(&c->entry[e].version, r->writing_version, memory_order_relaxed);
    atomic_store_explicit(&c->entry[e].seq, r->writing_seq + 2, memory_order_release);
    atomic_store_explicit(&c->newest, (uint64_t)e + 1, memory_order_release);
    r->writing = -1;
}

/* Refuse slot k's push p: nothing applied, taken moves to p so an honest
 * worker goes on; one line says why. */
static int s_refuse(dp_devregion_shard_t *r, int k, uint64_t p, char *err, const char *why)
{
    atomic_store_explicit(&r->ctl->taken[k], p, memory_order_release);
    r->refused++;
    return dp_err(err, "device region: slot %d push %llu refused: %s", k, (unsigned long long)p,
                  why);
}

int dp_devregion_take(dp_devregion_shard_t *r, int k, float *scratch, dp_devregion_apply_fn apply,
                      void *ctx, char *err)
{
    if (k < 0 || k >= r->workers || !r->slot[k].live)
        return dp_err(err, "device region: no slot %d (of %d)", k, r->workers);
    dp_devregion_slot_t *s = &r->slot[k];
    uint64_t taken = atomic_load_explicit(&r->ctl->taken[k], memory_order_relaxed);
    uint64_t p = atomic_load_explicit(&s->wctl->pushed, memory_order_acquire);
    if (p == taken) return 0;
    if (p != taken + 1) {
        char why[96];
        snprintf(why, sizeof why, "the count jumped from %llu", (unsigned long long)taken);
        return s_refuse(r, k, p, err, why);
    }
    /* the writes the push's record covers (the stand-in: its counter) */
    int done = r->ops->event_query(&s->ev, p, err);
    if (done <= 0) return done; /* 0: not yet, take it later */
    uint64_t floats = atomic_load_explicit(&s->wctl->floats, memory_order_relaxed);
    if (floats != r->n) {
        char why[96];
        snprintf(why, sizeof why, "%llu floats, expected %zu", (unsigned long long)floats, r->n);
        return s_refuse(r, k, p, err, why);
    }
    /* our copy first: the worker can write its slot while we look */
    if (r->ops->copy(scratch, s->grad.ptr, r->n * sizeof(float), err) != 0) return -1;
    atomic_store_explicit(&r->ctl->taken[k], p, memory_order_release); /* the slot is its again */
    int finite = r->ops->all_finite(scratch, r->n, err);
    if (finite < 0) return -1;
    if (!finite) return s_refuse(r, k, p, err, "not finite");
    return apply(ctx, scratch, r->n, err) == 0 ? 1 : -1;
}

void dp_devregion_drop(dp_devregion_shard_t *r, int k)
{
    if (k < 0 || k >= r->workers || !r->slot[k].live) return;
    /* any count the page says is only stored: the next push must be one more */
    uint64_t p = atomic_load_explicit(&r->slot[k].wctl->pushed, memory_order_acquire);
    atomic_store_explicit(&r->ctl->taken[k], p, memory_order_release);
}

void dp_devregion_retire(dp_devregion_shard_t *r)
{
    if (r->ctl) atomic_store_explicit(&r->ctl->retired, 1, memory_order_seq_cst);
}

/* Does slot k's worker still map the region: says so, and its pid lives? */
static int s_mapped(const dp_devregion_slot_t *s)
{
    uint64_t pid = atomic_load_explicit(&s->wctl->mapped, memory_order_acquire);
    if (pid == 0 || pid > INT32_MAX) return 0;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* The ring and the control page, which every worker maps. */
static void s_free_shared(dp_devregion_shard_t *r)
{
    r->ops->free(&r->weights);
    dp_shm_close(&r->page);
    r->ctl = NULL;
}

int dp_devregion_release(dp_devregion_shard_t *r)
{
    dp_devregion_retire(r);
    int held = 0;
    for (int k = 0; k < r->workers; k++) {
        if (!r->slot[k].live) continue;
        if (s_mapped(&r->slot[k])) held++;
        else s_slot_free(r, k);
    }
    if (held) return held;
    s_free_shared(r); /* every worker gone: the ring and the control page too */
    return 0;
}

int dp_devregion_release_last(dp_devregion_shard_t *r)
{
    int held = dp_devregion_release(r);
    if (!held || !r->ops->survives_free) return held;
    for (int k = 0; k < r->workers; k++) s_slot_free(r, k);
    s_free_shared(r);
    return held;
}

/* ---- the worker ---- */

/* What the control page must say: the offer's layout and generation,
 * not retired (a page is the shard's, but the offer came over the wire and
 * the page by a name: they must agree). */
static int s_check_ctl(const dp_devregion_worker_t *w, const dp_devregion_offer_t *o, char *err)
{
    const dp_devregion_ctl_t *c = w->ctl;
    if (c->magic != DP_DEVREGION_MAGIC || c->layout != DP_DEVREGION_LAYOUT || c->n != o->n ||
        c->ring != o->ring || c->workers != o->workers || c->stride != s_stride(o->n))
        return dp_err(err, "device region %s: header does not describe the offer (%llu floats, "
                           "ring %llu, %llu workers)",
                      o->ctl, (unsigned long long)o->n, (unsigned long long)o->ring,
                      (unsigned long long)o->workers);
    if (c->generation != o->generation)
        return dp_err(err, "device region %s: generation %llx, the offer says %llx (a restarted "
                           "shard: say HELLO again)",
                      o->ctl, (unsigned long long)c->generation, (unsigned long long)o->generation);
    if (atomic_load(&c->retired))
        return dp_err(err, "device region %s: retired (its shard left)", o->ctl);
    return 0;
}

static int s_attach(dp_devregion_worker_t *w, const dp_devregion_offer_t *o, char *err)
{
    if (o->n == 0 || o->n > ((uint64_t)1 << 40) || o->ring < 2 || o->ring > DP_DEVREGION_MAX_RING ||
        o->workers < 1 || o->workers > DP_DEVREGION_MAX_WORKERS || o->slot >= o->workers)
        return dp_err(err, "device region: bad offer (%llu floats, ring %llu, slot %u of %llu)",
                      (unsigned long long)o->n, (unsigned long long)o->ring, o->slot,
                      (unsigned long long)o->workers);
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)sizeof o->ctl - 1, o->ctl);
    if (dp_shm_open(&w->page, name, S_CTL_FLOATS, 1, DP_SHM_READ_ONLY, err) != 0) return -1;
    w->ctl = (const dp_devregion_ctl_t *)dp_shm_slot(&w->page, 0);
    if (s_check_ctl(w, o, err) != 0) return -1;
    w->n = o->n;
    w->stride = s_stride(o->n);
    w->ring = (int)o->ring;
    w->slot = (int)o->slot;
    w->generation = o->generation;
    snprintf(name, sizeof name, "%.*s", (int)sizeof o->wctl - 1, o->wctl);
    if (dp_shm_open(&w->wpage, name, S_WCTL_FLOATS, 1, DP_SHM_WRITABLE, err) != 0) return -1;
    w->wctl = (dp_devregion_wctl_t *)dp_shm_slot(&w->wpage, 0);
    const dp_devmem_ops_t *ops = w->ops;
    if (ops->map(&w->weights, &o->weights, (size_t)w->ring * w->stride * sizeof(float),
                 DP_DEVMEM_READ_ONLY, err) != 0 ||
        ops->map(&w->grad, &o->grad, w->n * sizeof(float), DP_DEVMEM_WRITABLE, err) != 0 ||
        ops->event_open(&w->ev, &w->wctl->events, &o->event, err) != 0)
        return -1;
    atomic_store_explicit(&w->wctl->pin, 0, memory_order_seq_cst);
    atomic_store_explicit(&w->wctl->mapped, (uint64_t)getpid(), memory_order_release);
    return 0;
}

int dp_devregion_attach(dp_devregion_worker_t *w, const dp_devmem_ops_t *ops,
                        const dp_devregion_offer_t *o, char *err)
{
    memset(w, 0, sizeof *w);
    w->ops = ops;
    w->pinned = -1;
    if (s_attach(w, o, err) != 0) {
        dp_devregion_detach(w);
        return -1;
    }
    return 0;
}

int dp_devregion_remap(dp_devregion_worker_t *w, const dp_devregion_offer_t *o, char *err)
{
    if (w->ctl && o->generation == w->generation) return 0;
    const dp_devmem_ops_t *ops = w->ops;
    dp_devregion_detach(w);
    return dp_devregion_attach(w, ops, o, err) == 0 ? 1 : -1;
}

const float *dp_devregion_pin(dp_devregion_worker_t *w, uint64_t *version, char *err)
{
    if (!w->ctl) return dp_err(err, "device region: not mapped"), NULL;
    dp_devregion_unpin(w);
    const dp_devregion_ctl_t *c = w->ctl;
    for (int t = 0; t < DP_DEVREGION_PIN_TRIES; t++) {
        if (atomic_load_explicit(&c->retired, memory_order_seq_cst))
            return dp_err(err, "device region %s: retired (its shard left): re-map from a new "
                               "offer", w->page.name), NULL;
        uint64_t ne = atomic_load_explicit(&c->newest, memory_order_acquire);
        if (ne == 0) return dp_err(err, "device region: no version published yet"), NULL;
        if (ne > (uint64_t)w->ring) return dp_err(err, "device region: newest entry %llu of %d", (unsigned long long)ne, w->ring), NULL;
        int e = (int)ne - 1;
        uint64_t q = atomic_load_explicit(&c->entry[e].seq, memory_order_acquire);
        if (q & 1) continue;
        uint64_t v = atomic_load_explicit(&c->entry[e].version, memory_order_relaxed);
        atomic_store_explicit(&w->wctl->pin, ne, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst); /* our pin before we look again */
        if (atomic_load_explicit(&c->entry[e].seq, memory_order_seq_cst) == q) {
            w->pinned = e;
            *version = v;
            return (const float *)w->weights.ptr + (size_t)e * w->stride;
        }
        atomic_store_explicit(&w->wctl->pin, 0, memory_order_seq_cst);
    }
    return dp_err(err, "device region: no version could be pinned in %d tries",
                  DP_DEVREGION_PIN_TRIES), NULL;
}

void dp_devregion_unpin(dp_devregion_worker_t *w)
{
    if (w->wctl) atomic_store_explicit(&w->wctl->pin, 0, memory_order_seq_cst);
    w->pinned = -1;
}

int dp_devregion_slot_free(const dp_devregion_worker_t *w)
{
    return w->wctl && w->ctl &&
           atomic_load_explicit(&w->ctl->taken[w->slot], memory_order_acquire) ==
               atomic_load_explicit(&w->wctl->pushed, memory_order_relaxed);
}

float *dp_devregion_slot(dp_devregion_worker_t *w)
{
    return dp_devregion_slot_free(w) ? w->grad.ptr : NULL;
}

int dp_devregion_push(dp_devregion_worker_t *w, void *stream, char *err)
{
    if (!dp_devregion_slot_free(w))
        return dp_err(err, "device region: slot %d: the last push is not taken yet", w->slot);
    atomic_store_explicit(&w->wctl->floats, w->n, memory_order_relaxed);
    /* Recorded, then waited for: the count then says the writes are done,
     * not only issued. The shard's query of the same event is its own
     * check that they are (a count its event never reached is not taken):
     * whether a peer process's query can see a record its writer has issued
     * but the device not yet reached is not something to lean on. */
    if (w->ops->event_record(&w->ev, stream, err) != 0 || w->ops->event_wait(&w->ev, err) != 0)
        return -1;
    /* last: the count says a whole gradient is there (release: after the
     * floats and the record) */
    atomic_fetch_add_explicit(&w->wctl->pushed, 1, memory_order_release);
    return 0;
}

dp_devregion_route_t dp_devregion_route(int same, int peer)
{
    return same ? DP_DEVREGION_LOCAL : peer ? DP_DEVREGION_PEER : DP_DEVREGION_HOST;
}

dp_devregion_route_t dp_devregion_reach(const dp_devmem_ops_t *ops, const char *device, char *why)
{
    char err[DP_ERR_LEN];
    int same = 0, peer = 0;
    if (!device[0] || !ops->reach) return DP_DEVREGION_LOCAL;
    if (ops->reach(device, &same, &peer, err) != 0) {
        dp_err(why, "device region on %s: %s", device, err);
        return DP_DEVREGION_HOST;
    }
    dp_devregion_route_t r = dp_devregion_route(same, peer);
    if (r == DP_DEVREGION_HOST)
        dp_err(why, "device region on %s, which this device cannot reach (no peer access)", device);
    else if (r == DP_DEVREGION_PEER && ops->peer_enable(device, err) != 0) {
        dp_err(why, "device region on %s: peer access: %s", device, err);
        r = DP_DEVREGION_HOST;
    }
    return r;
}

void dp_devregion_detach(dp_devregion_worker_t *w)
{
    const dp_devmem_ops_t *ops = w->ops;
    if (w->wctl) atomic_store_explicit(&w->wctl->pin, 0, memory_order_seq_cst);
    if (ops) {
        ops->event_destroy(&w->ev);
        ops->unmap(&w->grad);
        ops->unmap(&w->weights);
    }
    /* only once unmapped: the shard frees what nobody says it maps */
    if (w->wctl) atomic_store_explicit(&w->wctl->mapped, 0, memory_order_release);
    dp_shm_close(&w->wpage);
    dp_shm_close(&w->page);
    memset(w, 0, sizeof *w);
    w->ops = ops;
    w->pinned = -1;
}
