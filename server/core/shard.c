/* shard: a parameter-server shard's state and update (see shard.h). */
#include "server/core/shard.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "common/util.h"
#include "proto/wire.h"
#include "server/core/pool.h"
#include "server/core/shard_dc.h"

/* Floats per block of an out-of-place step: the copy of a block is still in
 * L1 when the optimizer updates it, so the step moves the bytes an in-place
 * one does. */
#define S_BLOCK 4096

void dp_shard_range(size_t n, int i, int k, size_t *lo, size_t *hi)
{
    /* floor(i*n/k) in 128-bit-safe arithmetic (n < 2^40 and k small). */
    *lo = (size_t)(((unsigned __int128)n * (unsigned)i) / (unsigned)k);
    *hi = (size_t)(((unsigned __int128)n * (unsigned)(i + 1)) / (unsigned)k);
}

/* A state tensor whose values are a variance or a count (shard.h). */
static int s_never_negative(const char *name)
{
    static const char *tails[] = {".running_var", ".num_batches_tracked", ".count"};
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) {
        size_t t = strlen(tails[k]);
        if (n >= t && strcmp(name + n - t, tails[k]) == 0) return 1;
    }
    return strcmp(name, "num_batches_tracked") == 0 || strcmp(name, "running_var") == 0;
}

/* The state tensors' floats inside [lo, hi), as ranges local to the shard,
 * and those of them that must stay non-negative. */
static void s_find_state(dp_shard_t *s)
{
    const dp_model_t *m = &s->model;
    for (int i = 0; i < m->n_params; i++) {
        const dp_param_t *p = &m->params[i];
        size_t lo = p->offset > s->lo ? p->offset : s->lo;
        size_t hi = p->offset + p->count < s->hi ? p->offset + p->count : s->hi;
        if (p->trainable || lo >= hi) continue;
        s->state_ranges = dp_realloc(s->state_ranges, (size_t)(s->n_state_ranges + 1) *
                                                          sizeof *s->state_ranges);
        s->state_ranges[s->n_state_ranges][0] = lo - s->lo;
        s->state_ranges[s->n_state_ranges][1] = hi - s->lo;
        s->n_state_ranges++;
        if (!s_never_negative(p->name)) continue;
        s->bounded = dp_realloc(s->bounded, (size_t)(s->n_bounded + 1) * sizeof *s->bounded);
        s->bounded[s->n_bounded++] = (dp_shard_bound_t){lo - s->lo, hi - s->lo, i};
    }
}

int dp_shard_state_check(const dp_shard_t *s, const dp_grad_slice_t *g, int n, char *err)
{
    for (int b = 0; b < s->n_bounded; b++) {
        const dp_shard_bound_t *r = &s->bounded[b];
        for (int f = 0; f < n; f++) {
            size_t a = (size_t)g[f].offset - s->lo, z = a + g[f].len / sizeof(float);
            size_t lo = a > r->lo ? a : r->lo, hi = z < r->hi ? z : r->hi;
            for (size_t i = lo; i < hi; i++) {
                float v; /* the slice may sit at any byte address */
                memcpy(&v, (const char *)g[f].data + (i - a) * sizeof v, sizeof v);
                if (v >= 0.0f) continue;
                const dp_param_t *p = &s->model.params[r->param];
                return dp_err(err, "state tensor %s element %zu is %g: a variance or a count is "
                                   "never negative; the push is refused", p->name,
                              (size_t)(s->lo + i - p->offset), (double)v);
            }
        }
    }
    return 0;
}

int dp_shard_init_values(dp_shard_t *s, const dp_model_t *m, int index, int count,
                         const float *full, const dp_optim_conf_t *optim, char *err)
{
    memset(s, 0, sizeof *s);
    if (count < 1 || index < 0 || index >= count)
        return dp_err(err, "bad shard %d/%d (--shard I/K with 0 <= I < K)", index, count);
    s->model = *m;
    s->optim = *optim;
    s->index = index;
    s->count = count;
    dp_shard_range(m->n_floats, index, count, &s->lo, &s->hi);
    s->n = s->hi - s->lo;
    s->snap = dp_snap_new(s->n);
    s->w = s->snap->data;
    memcpy(s->w, full + s->lo, s->n * sizeof(float));
    s->state_per = dp_optim_state_floats(optim);
    s->state = dp_aligned_alloc((s->n * (size_t)s->state_per + 1) * sizeof(float));
    memset(s->state, 0, s->n * (size_t)s->state_per * sizeof(float));
    s->acc = dp_aligned_alloc((s->n + 1) * sizeof(float));
    memset(s->acc, 0, s->n * sizeof(float));
    s->scratch = dp_aligned_alloc((s->n + 1) * sizeof(float));
    s_find_state(s);
    return 0;
}

int dp_shard_init(dp_shard_t *s, const dp_model_t *m, int index, int count, uint64_t seed,
                  const dp_optim_conf_t *optim, char *err)
{
    /* Every shard draws the full vector so any sharding starts identical. */
    float *full = dp_aligned_alloc((m->n_floats + 1) * sizeof(float));
    dp_model_init_params(m, full, seed);
    int rc = dp_shard_init_values(s, m, index, count, full, optim, err);
    free(full);
    return rc;
}

void dp_shard_fini(dp_shard_t *s)
{
    if (s->spare) dp_snap_unref(NULL, s->spare);
    s->spare = NULL;
    if (s->snap) dp_snap_unref(NULL, s->snap);
    if (s->snap16) dp_snap_unref(NULL, s->snap16);
    s->snap16 = NULL;
    for (int i = 0; i < DP_SHARD_RETIRED; i++)
        if (s->retired[i]) dp_snap_unref(NULL, s->retired[i]);
    memset(s->retired, 0, sizeof s->retired);
    dp_pool_destroy(&s->pool);
    dp_shard_dc_fini(s); /* its slots and MS may be the device's */
    if (s->dev) {
        s->dev->ops->release(s->dev, s->d_w);
        s->dev->ops->release(s->dev, s->d_state);
        s->dev->ops->release(s->dev, s->d_g);
        s->d_w = s->d_state = s->d_g = NULL;
        s->dev->ops->destroy(s->dev); /* its table's: the shard links no device code */
        s->dev = NULL;
    }
    free(s->ahead);
    s->ahead = NULL;
    s->d_g_of = NULL;
    free(s->state);
    free(s->acc);
    free(s->scratch);
    free(s->worker_step);
    free(s->worker_seen);
    free(s->step_first);
    free(s->state_ranges);
    s->state_ranges = NULL;
    s->n_state_ranges = 0;
    free(s->bounded);
    s->bounded = NULL;
    s->n_bounded = 0;
    s->worker_step = s->worker_seen = NULL;
    s->step_first = NULL;
    s->n_workers = 0;
    s->snap = NULL;
    s->w = s->state = s->acc = s->scratch = NULL;
}

void dp_shard_track_steps(dp_shard_t *s, int n_workers)
{
    free(s->worker_step);
    free(s->worker_seen);
    free(s->step_first);
    s->worker_step = dp_calloc((size_t)n_workers, sizeof *s->worker_step);
    s->worker_seen = dp_calloc((size_t)n_workers, sizeof *s->worker_seen);
    s->step_first = dp_malloc((size_t)n_workers);
    memset(s->step_first, 1, (size_t)n_workers);
    s->n_workers = n_workers;
}

int dp_shard_step_check(const dp_shard_t *s, int worker, uint64_t step, char *why, size_t n)
{
    if (!s->worker_step || worker < 0 || worker >= s->n_workers || step == 0) return 0;
    uint64_t seen = s->worker_seen[worker];
    uint64_t slack = s->step_first[worker] ? s->step_slack : 0;
    /* seen + 1 + slack without wrapping: step - seen is compared instead */
    if (step <= seen || step - seen <= 1 + slack) return 0;
    /* short: the worker's log line keeps 160 characters of it */
    if (slack)
        snprintf(why, n,
                 "implausible step %" PRIu64 " of worker %d: at most %" PRIu64
                 " after a restart (last handled %" PRIu64 ", + 1 + --checkpoint-every %" PRIu64 ")",
                 step, worker, seen + 1 + slack, seen, slack);
    else
        snprintf(why, n,
                 "implausible step %" PRIu64 " of worker %d: at most %" PRIu64
                 " (one past the last handled, %" PRIu64 ")",
                 step, worker, seen + 1, seen);
    return -1;
}

void dp_shard_step_handled(dp_shard_t *s, int worker, uint64_t step)
{
    if (!s->worker_step || worker < 0 || worker >= s->n_workers || step == 0) return;
    if (step > s->worker_seen[worker]) s->worker_seen[worker] = step;
    s->step_first[worker] = 0;
}

int dp_shard_step_seen(const dp_shard_t *s, int worker, uint64_t step)
{
    if (!s->worker_step || worker < 0 || worker >= s->n_workers || step == 0) return 0;
    return step <= s->worker_step[worker];
}

void dp_shard_step_done(dp_shard_t *s, int worker, uint64_t step)
{
    if (!s->worker_step || worker < 0 || worker >= s->n_workers) return;
    if (step > s->worker_step[worker]) s->worker_step[worker] = step;
    if (step > s->worker_seen[worker]) s->worker_seen[worker] = step;
}

float dp_shard_lr(const dp_shard_t *s)
{
    return dp_optim_lr_at(&s->optim, (long)s->version);
}

static void s_run(dp_pool_t *p, dp_pool_fn fn, void *arg)
{
    if (p) dp_pool_run(p, fn, arg);
    else fn(arg, 0, 1);
}

int dp_shard_set_threads(dp_shard_t *s, int n_threads, char *err)
{
    dp_pool_destroy(&s->pool);
    if (n_threads <= 1) return 0;
    return dp_pool_new(&s->pool, n_threads, err);
}

/* dp_snap_alive: heap buffers made and not yet freed (any thread frees). */
static atomic_int s_alive;

int dp_snap_alive(void)
{
    return atomic_load(&s_alive);
}

dp_snap_t *dp_snap_new(size_t n)
{
    atomic_fetch_add(&s_alive, 1);
    dp_snap_t *b = dp_calloc(1, sizeof *b);
    atomic_init(&b->refs, 1);
    b->n = n;
    b->data = dp_aligned_alloc((n + 1) * sizeof(float));
    b->owned = 1;
    b->slot = -1;
    return b;
}

/* One step's work over floats [lo, hi) of the range: dst = step(src) by g,
 * or in place when dst == src. A sync step's g is acc, the sum of R
 * gradients: each block of it is made the mean (times scale) just before
 * it is stepped and cleared for the next version just after, while it is
 * in cache and on every thread of the sweep, instead of two more passes
 * over the range on the loop's thread alone (the same float operations per
 * element: the same bits). An early step writes state, its own, from
 * state_from, the live state, which is not touched; in sync it steps each block by
 * (acc + g) x scale made in a block of its own, the float operations of
 * accumulating g and scaling, with acc untouched. */
typedef struct {
    dp_shard_t *s;
    float *dst;
    const float *src, *g;
    float *acc;            /* g itself when it is sync's sum (scaled, then cleared); else NULL */
    float scale;           /* acc's 1 / R */
    float lr;
    long t;
    float *state;          /* the optimizer state stepped */
    const float *state_from; /* state is stepped from it (an early step), else NULL: in place */
    const float *acc_add;  /* an early sync step: acc, g is added to (into a block of its own) */
    size_t lo, hi;
} s_step_job_t;

/* Part k of nk of [lo, hi), cut at multiples of 16 floats from lo. */
static int s_subpart(size_t lo, size_t hi, int k, int nk, size_t *a, size_t *b)
{
    size_t n16 = (hi - lo + 15) / 16;
    *a = lo + n16 * (size_t)k / (size_t)nk * 16;
    *b = lo + n16 * (size_t)(k + 1) / (size_t)nk * 16;
    if (*b > hi) *b = hi;
    return *a < *b;
}

int dp_shard_part(const dp_shard_t *s, int k, int nk, size_t *lo, size_t *hi)
{
    return s_subpart(0, s->n, k, nk, lo, hi);
}

/* The optimizer on [lo, hi) of the arrays given (at: where they begin in
 * the range, for the state): the next version and an early step's state
 * made straight from the live ones, not copied in first and stepped in
 * place (the same bits; an early step of the default model's fc layers,
 * 6.4 MB, took 2.4-3.4 ms with the copies, BENCHMARKS.md "1 PS + 1
 * worker"). */
static void s_step_block(const s_step_job_t *j, float *dst, const float *src, const float *g,
                         size_t at, size_t lo, size_t hi)
{
    float *state = j->state ? j->state + at : NULL;
    const float *state_from = j->state_from ? j->state_from + at : state;
    dp_optim_step_from(&j->s->optim, j->lr, dst, src, g, state, state_from, j->s->n, lo, hi, j->t);
}

/* Part k of nk of a step, in blocks. */
static void s_step_part(void *arg, int k, int nk)
{
    const s_step_job_t *j = arg;
    dp_shard_t *s = j->s;
    size_t lo, hi;
    if (!s_subpart(j->lo, j->hi, k, nk, &lo, &hi)) return;
    for (size_t at = lo; at < hi; at += S_BLOCK) {
        size_t end = hi - at < S_BLOCK ? hi : at + S_BLOCK;
        if (j->acc)
            for (size_t i = at; i < end; i++) j->acc[i] *= j->scale;
        if (j->acc_add) {
            float mean[S_BLOCK];
            for (size_t i = at; i < end; i++) mean[i - at] = (j->acc_add[i] + j->g[i]) * j->scale;
            /* the block's arrays from at: state's vectors keep their stride n */
            s_step_block(j, j->dst + at, j->src + at, mean, at, 0, end - at);
            dp_model_copy_state(&s->model, s->lo + at, s->lo + at, s->lo + end, j->dst + at, mean);
            continue;
        }
        s_step_block(j, j->dst, j->src, j->g, 0, at, end);
        /* state that is not a gradient takes the pushed value (the mean in
         * sync) instead of the step: the one rule every optimizer step follows */
        dp_model_copy_state(&s->model, s->lo, s->lo + at, s->lo + end, j->dst, j->g);
        if (j->acc) memset(j->acc + at, 0, (end - at) * sizeof(float));
    }
}

/* A buffer for the next version when the live one is held elsewhere (or
 * for an early step): the spare, the owner's (shm slots), a retired one
 * nobody holds any more, or a new one (the oldest retired is then let go). */
dp_snap_t *dp_shard_take_buffer(dp_shard_t *s)
{
    if (s->spare) { /* a dropped early step's */
        dp_snap_t *b = s->spare;
        s->spare = NULL;
        return b;
    }
    if (s->take_buffer) {
        dp_snap_t *b = s->take_buffer(s->take_buffer_arg);
        if (b) return b;
    }
    for (int i = 0; i < DP_SHARD_RETIRED; i++) {
        dp_snap_t *b = s->retired[i];
        if (b && atomic_load(&b->refs) == 1) {
            s->retired[i] = NULL;
            return b;
        }
    }
    return dp_snap_new(s->n);
}

/* The old live buffer, ours still, kept for reuse (or let go). */
static void s_retire(dp_shard_t *s, dp_snap_t *old)
{
    if (old->slot >= 0) { /* the shm owner keeps its slots */
        dp_snap_unref(NULL, old);
        return;
    }
    for (int i = 0; i < DP_SHARD_RETIRED; i++)
        if (!s->retired[i]) {
            s->retired[i] = old;
            return;
        }
    dp_snap_unref(NULL, s->retired[0]);
    memmove(s->retired, s->retired + 1, (DP_SHARD_RETIRED - 1) * sizeof *s->retired);
    s->retired[DP_SHARD_RETIRED - 1] = old;
}

typedef struct {
    const dp_grad_slice_t *g;
    int n;
    atomic_int bad;
} s_finite_job_t;

static void s_finite_part(void *arg, int k, int nk)
{
    s_finite_job_t *j = arg;
    for (int f = 0; f < j->n; f++) {
        size_t cnt = j->g[f].len / 4;
        size_t lo = cnt * (size_t)k / (size_t)nk, hi = cnt * (size_t)(k + 1) / (size_t)nk;
        if (dp_wire_any_nonfinite((const char *)j->g[f].data + 4 * lo, hi - lo)) {
            atomic_store(&j->bad, 1);
            return;
        }
    }
}

int dp_shard_widen(dp_shard_t *s, dp_grad_slice_t *g, const int *bf16, int n)
{
    int any = 0;
    for (int f = 0; f < n; f++) any |= bf16[f];
    if (!any) return n;
    for (int f = 0; f < n; f++) {
        float *dst = s->scratch + (g[f].offset - s->lo);
        if (bf16[f]) dp_wire_from_bf16(dst, g[f].data, g[f].len / 2);
        else memcpy(dst, g[f].data, g[f].len);
    }
    g[0] = (dp_grad_slice_t){s->scratch, s->n * sizeof(float), s->lo};
    return 1;
}

dp_snap_t *dp_shard_snapshot_bf16(dp_shard_t *s)
{
    dp_snap_t *b = s->snap16;
    if (!b || b->version != s->version) {
        if (b && atomic_load(&b->refs) != 1) { /* a reply still sends it */
            dp_snap_unref(NULL, b);
            b = NULL;
        }
        if (!b) b = dp_snap_new((s->n + 1) / 2);
        dp_wire_to_bf16((uint16_t *)b->data, s->w, s->n);
        b->version = s->version;
        s->snap16 = b;
    }
    atomic_fetch_add(&b->refs, 1);
    return b;
}

int dp_shard_grad_nonfinite(dp_shard_t *s, const dp_grad_slice_t *g, int n)
{
    s_finite_job_t j = {g, n, 0};
    s_run(s->pool, s_finite_part, &j);
    return atomic_load(&j.bad);
}

typedef struct {
    dp_shard_t *s;
    const float *src;
    size_t off, cnt;
    atomic_int bad;
} s_copy_job_t;

static void s_copy_part(void *arg, int k, int nk)
{
    s_copy_job_t *j = arg;
    size_t lo = j->cnt * (size_t)k / (size_t)nk, hi = j->cnt * (size_t)(k + 1) / (size_t)nk;
    char err[DP_ERR_LEN];
    if (dp_wire_copy_finite(j->s->scratch + j->off + lo, j->src + j->off + lo, hi - lo, err) != 0)
        atomic_store(&j->bad, 1);
}

int dp_shard_copy_grad(dp_shard_t *s, const float *src, size_t off, size_t cnt, char *err)
{
    s_copy_job_t j = {s, src, off, cnt, 0};
    s_run(s->pool, s_copy_part, &j);
    if (!atomic_load(&j.bad)) return 0;
    /* name the element (the private copy is the one checked) */
    dp_wire_frame_t f = {s->scratch + off, cnt * sizeof(float)};
    if (dp_wire_check_finite(&f, 1, err) == 0) dp_err(err, "non-finite gradient");
    return -1;
}

/* The step's new buffer becomes the live one, at the next version. */
static void s_publish(dp_shard_t *s, dp_snap_t *old, int in_place)
{
    s->w = s->snap->data;
    s->version++;
    s->snap->version = s->version;
    s->snap->crc_ok = 0;
    if (!in_place) s_retire(s, old);
    if (s->on_step) s->on_step(s->on_step_arg, s->snap);
}

int dp_shard_set_device(dp_shard_t *s, dp_optim_dev_t *dev, char *err)
{
    (void)err;
    const dp_optim_dev_ops_t *o = dev->ops;
    size_t n_state = s->n * (size_t)s->state_per;
    s->dev = dev;
    s->d_w = o->alloc(dev, s->n * sizeof(float));
    s->d_g = o->alloc(dev, s->n * sizeof(float));
    s->d_state = s->state_per ? o->alloc(dev, n_state * sizeof(float)) : NULL;
    dp_shard_dc_to_device(s); /* compensation made before the device: its slots and MS go up */
    dp_shard_device_reload(s);
    return 0;
}

void dp_shard_device_reload(dp_shard_t *s)
{
    if (!s->dev) return;
    s->dev->ops->upload(s->dev, s->d_w, s->w, s->n * sizeof(float));
    if (s->state_per)
        s->dev->ops->upload(s->dev, s->d_state, s->state,
                            s->n * (size_t)s->state_per * sizeof(float));
    if (s->dc && s->dc->ms) s->dev->ops->upload(s->dev, s->dc->d_ms, s->dc->ms, s->n * sizeof(float));
}

void dp_shard_device_state(const dp_shard_t *s)
{
    if (!s->dev) return;
    if (s->state_per)
        s->dev->ops->download(s->dev, s->state, s->d_state,
                              s->n * (size_t)s->state_per * sizeof(float));
    if (s->dc && s->dc->ms)
        s->dev->ops->download(s->dev, s->dc->ms, s->dc->d_ms, s->n * sizeof(float));
}

/* The state tensors' floats of [lo, hi) of next (the device's) set to the
 * pushed value, src's (the host's): dp_model_copy_state's rule. */
static void s_state_up(dp_shard_t *s, float *d_next, const float *src, size_t lo, size_t hi)
{
    for (int r = 0; r < s->n_state_ranges; r++) {
        size_t a = s->state_ranges[r][0], b = s->state_ranges[r][1];
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a < b) s->dev->ops->upload(s->dev, d_next + a, src + a, (b - a) * sizeof(float));
    }
}

/* s_step_by on the device: the host's mean of acc (the same float
 * operation per element as s_step_part's), the gradient copied up, one
 * fused step in place there, the state tensors set to the pushed value
 * (dp_model_copy_state's rule), and the new version copied off into the
 * live host buffer (in place under s_step_by's rule, else a taken one)
 * before it is published. */
static void s_step_on_device(dp_shard_t *s, const float *g, float *acc, float scale, float lr,
                             int in_place)
{
    const dp_optim_dev_ops_t *o = s->dev->ops;
    dp_snap_t *old = s->snap;
    if (acc)
        for (size_t i = 0; i < s->n; i++) acc[i] *= scale;
    /* compensated on the device already (dp_shard_dc_apply): taken as it is */
    if (s->d_g_of != g) o->upload(s->dev, s->d_g, g, s->n * sizeof(float));
    s->d_g_of = NULL;
    o->step(s->dev, &s->optim, lr, s->d_w, s->d_w, s->d_g, s->d_state, s->d_state, s->n, 0, s->n,
            (long)s->version + 1);
    s_state_up(s, s->d_w, g, 0, s->n);
    if (!in_place) s->snap = dp_shard_take_buffer(s);
    o->snapshot(s->dev, s->snap->data, s->d_w, s->n * sizeof(float));
    if (acc) memset(acc, 0, s->n * sizeof(float)); /* while the copy runs */
    o->snapshot_wait(s->dev);
    s_publish(s, old, in_place);
}

/* A step by g at lr; acc (sync: g is acc) is made the mean by scale and
 * cleared on the way (s_step_job_t). */
static void s_step_by(dp_shard_t *s, const float *g, float *acc, float scale, float lr)
{
    s_step_job_t j = {s, s->w, s->w, g, acc, scale, lr, (long)s->version + 1, s->state, NULL, NULL,
                      0, s->n};
    /* in place only while no reply holds the live buffer and no other
     * process reads it (shm) */
    int in_place = atomic_load(&s->snap->refs) == 1 && s->snap->slot < 0 && !s->take_buffer;
    if (s->dev) {
        s_step_on_device(s, g, acc, scale, lr, in_place);
        return;
    }
    dp_snap_t *old = s->snap;
    if (!in_place) {
        s->snap = dp_shard_take_buffer(s);
        j.dst = s->snap->data;
    }
    s_run(s->pool, s_step_part, &j);
    s_publish(s, old, in_place);
}

void dp_shard_step(dp_shard_t *s, const dp_grad_slice_t *g, int n, float lr)
{
    /* From the slice itself when it is the whole range and float-aligned
     * (ZeroMQ's zero-copy receive may hand us any byte offset), else
     * gathered into scratch. */
    if (n == 1 && ((uintptr_t)g[0].data & 3) == 0) {
        s_step_by(s, g[0].data, NULL, 1.0f, lr);
        return;
    }
    for (int f = 0; f < n; f++) memcpy(s->scratch + (g[f].offset - s->lo), g[f].data, g[f].len);
    s_step_by(s, s->scratch, NULL, 1.0f, lr);
}

void dp_shard_keep_spare(dp_shard_t *s, dp_snap_t *b)
{
    if (s->spare) dp_snap_unref(NULL, s->spare); /* not reached: an early step takes the spare */
    s->spare = b;
}

/* dp_shard_step_ahead on the device: the part (sync: its mean, made on the
 * host with s_step_part's float operations) copied up into d_g and stepped
 * from the live d_w and d_state into next and state, the device's. */
static void s_step_ahead_device(dp_shard_t *s, float *next, float *state, const float *g,
                                int count, float lr, uint64_t version, size_t lo, size_t hi)
{
    const dp_optim_dev_ops_t *o = s->dev->ops;
    const float *src = g;
    if (count) {
        float scale = 1.0f / (float)count;
        if (!s->ahead) s->ahead = dp_aligned_alloc((s->n + 1) * sizeof(float));
        for (size_t i = lo; i < hi; i++) s->ahead[i] = (s->acc[i] + g[i]) * scale;
        src = s->ahead;
    }
    o->upload(s->dev, s->d_g + lo, src + lo, (hi - lo) * sizeof(float));
    s->d_g_of = NULL;
    o->step(s->dev, &s->optim, lr, next, s->d_w, s->d_g, s->state_per ? state : NULL, s->d_state,
            s->n, lo, hi, (long)version + 1);
    s_state_up(s, next, src, lo, hi);
}

void dp_shard_step_ahead(dp_shard_t *s, float *next, float *state, const float *g, int count,
                         float lr, uint64_t version, size_t lo, size_t hi)
{
    if (s->dev) {
        s_step_ahead_device(s, next, state, g, count, lr, version, lo, hi);
        return;
    }
    s_step_job_t j = {s, next, s->w, g, NULL, count ? 1.0f / (float)count : 1.0f, lr,
                      (long)version + 1, s->state_per ? state : s->state,
                      s->state_per ? s->state : NULL, count ? s->acc : NULL, lo, hi};
    s_run(s->pool, s_step_part, &j);
}

void dp_shard_adopt(dp_shard_t *s, dp_snap_t *next, float **state, float **d_next, bool of_acc)
{
    if (of_acc) { /* it averaged acc's gradients with its own */
        memset(s->acc, 0, s->n * sizeof(float));
        s->acc_count = 0;
    }
    dp_snap_t *old = s->snap;
    s->snap = next;
    float **live_state = s->dev ? &s->d_state : &s->state;
    if (s->state_per) {
        float *st = *live_state;
        *live_state = *state;
        *state = st;
    }
    if (s->dev) { /* the device's buffers swapped; the new version copied off */
        float *w = s->d_w;
        s->d_w = *d_next;
        *d_next = w;
        s->dev->ops->snapshot(s->dev, next->data, s->d_w, s->n * sizeof(float));
        s->dev->ops->snapshot_wait(s->dev);
    }
    s_publish(s, old, 0);
}

/* acc[off, off + cnt) += x[0, cnt), split over the sweep's threads. */
typedef struct {
    float *a;
    const float *x;
    size_t cnt;
} s_add_job_t;

static void s_add_part(void *arg, int k, int nk)
{
    const s_add_job_t *j = arg;
    size_t lo = j->cnt * (size_t)k / (size_t)nk, hi = j->cnt * (size_t)(k + 1) / (size_t)nk;
    for (size_t i = lo; i < hi; i++) j->a[i] += j->x[i];
}

void dp_shard_accumulate(dp_shard_t *s, const dp_grad_slice_t *g, int n)
{
    for (int f = 0; f < n; f++) {
        s_add_job_t j = {s->acc + (g[f].offset - s->lo), g[f].data, g[f].len / 4};
        if (((uintptr_t)g[f].data & 3) != 0) { /* realign first */
            memcpy(s->scratch, g[f].data, g[f].len);
            j.x = s->scratch;
        }
        s_run(s->pool, s_add_part, &j);
    }
    s->acc_count++;
}

void dp_shard_step_mean(dp_shard_t *s)
{
    if (s->acc_count == 0) return;
    s_step_by(s, s->acc, s->acc, 1.0f / (float)s->acc_count, dp_shard_lr(s));
    s->acc_count = 0;
}

void dp_snap_unref(void *data, void *hint)
{
    (void)data;
    dp_snap_t *snap = hint;
    if (atomic_fetch_sub(&snap->refs, 1) != 1) return;
    if (snap->owned) {
        free(snap->data);
        atomic_fetch_sub(&s_alive, 1);
    }
    free(snap);
}

dp_snap_t *dp_shard_snapshot(dp_shard_t *s)
{
    /* a restore or a test may have written w without a step */
    if (s->snap->version != s->version) {
        s->snap->version = s->version;
        s->snap->crc_ok = 0;
    }
    atomic_fetch_add(&s->snap->refs, 1);
    return s->snap;
}

uint32_t dp_snap_crc(dp_snap_t *snap)
{
    if (!snap->crc_ok) {
        snap->crc = dp_crc32(0, snap->data, snap->n * sizeof(float));
        snap->crc_ok = 1;
    }
    return snap->crc;
}
