/* shard: a parameter-server shard's state and update (see shard.h). */
#include "server/shard.h"

#include <stdlib.h>
#include <string.h>

#include "common/checksum.h"
#include "common/util.h"

void dp_shard_range(size_t n, int i, int k, size_t *lo, size_t *hi)
{
    /* floor(i*n/k) in 128-bit-safe arithmetic (n < 2^40 and k small). */
    *lo = (size_t)(((unsigned __int128)n * (unsigned)i) / (unsigned)k);
    *hi = (size_t)(((unsigned __int128)n * (unsigned)(i + 1)) / (unsigned)k);
}

int dp_shard_init(dp_shard_t *s, const dp_model_t *m, int index, int count, uint64_t seed,
                  const dp_optim_conf_t *optim, char *err)
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
    /* Every shard draws the full vector so any sharding starts identical. */
    float *full = dp_aligned_alloc(m->n_floats * sizeof(float));
    dp_model_init_params(&s->model, full, seed);
    s->w = dp_aligned_alloc((s->n + 1) * sizeof(float));
    memcpy(s->w, full + s->lo, s->n * sizeof(float));
    free(full);
    s->state_per = dp_optim_state_per_param(optim->kind);
    s->state = dp_aligned_alloc((s->n * (size_t)s->state_per + 1) * sizeof(float));
    memset(s->state, 0, s->n * (size_t)s->state_per * sizeof(float));
    s->acc = dp_aligned_alloc((s->n + 1) * sizeof(float));
    memset(s->acc, 0, s->n * sizeof(float));
    s->scratch = dp_aligned_alloc((s->n + 1) * sizeof(float));
    return 0;
}

void dp_shard_fini(dp_shard_t *s)
{
    if (s->snap) dp_snap_unref(NULL, s->snap);
    free(s->w);
    free(s->state);
    free(s->acc);
    free(s->scratch);
    free(s->worker_step);
    s->worker_step = NULL;
    s->n_workers = 0;
    s->snap = NULL;
    s->w = s->state = s->acc = s->scratch = NULL;
}

void dp_shard_track_steps(dp_shard_t *s, int n_workers)
{
    free(s->worker_step);
    s->worker_step = dp_calloc((size_t)n_workers, sizeof *s->worker_step);
    s->n_workers = n_workers;
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
}

float dp_shard_lr(const dp_shard_t *s)
{
    return dp_optim_lr_at(&s->optim, (long)s->version);
}

static void s_step_by(dp_shard_t *s, const float *g, float lr)
{
    dp_optim_step(&s->optim, lr, s->w, g, s->state, s->n, (long)s->version + 1);
    s->version++;
}

void dp_shard_step(dp_shard_t *s, const dp_grad_slice_t *g, int n, float lr)
{
    /* From the slice itself when it is the whole range and float-aligned
     * (ZeroMQ's zero-copy receive may hand us any byte offset), else
     * gathered into scratch. */
    if (n == 1 && ((uintptr_t)g[0].data & 3) == 0) {
        s_step_by(s, g[0].data, lr);
        return;
    }
    for (int f = 0; f < n; f++) memcpy(s->scratch + (g[f].offset - s->lo), g[f].data, g[f].len);
    s_step_by(s, s->scratch, lr);
}

void dp_shard_accumulate(dp_shard_t *s, const dp_grad_slice_t *g, int n)
{
    for (int f = 0; f < n; f++) {
        float *a = s->acc + (g[f].offset - s->lo);
        size_t cnt = g[f].len / 4;
        const float *x = g[f].data;
        if (((uintptr_t)g[f].data & 3) != 0) { /* realign first */
            memcpy(s->scratch, g[f].data, g[f].len);
            x = s->scratch;
        }
        for (size_t i = 0; i < cnt; i++) a[i] += x[i];
    }
    s->acc_count++;
}

void dp_shard_step_mean(dp_shard_t *s)
{
    if (s->acc_count == 0) return;
    float inv = 1.0f / (float)s->acc_count;
    for (size_t i = 0; i < s->n; i++) s->acc[i] *= inv;
    s_step_by(s, s->acc, dp_shard_lr(s));
    memset(s->acc, 0, s->n * sizeof(float));
    s->acc_count = 0;
}

void dp_snap_unref(void *data, void *hint)
{
    (void)data;
    dp_snap_t *snap = hint;
    if (atomic_fetch_sub(&snap->refs, 1) == 1) free(snap);
}

dp_snap_t *dp_shard_snapshot(dp_shard_t *s)
{
    if (!s->snap || s->snap->version != s->version) {
        if (s->snap) dp_snap_unref(NULL, s->snap);
        dp_snap_t *snap = dp_malloc(sizeof *snap + s->n * sizeof(float));
        atomic_init(&snap->refs, 1);
        snap->version = s->version;
        snap->n = s->n;
        memcpy(snap->data, s->w, s->n * sizeof(float));
        snap->crc = dp_crc32(0, snap->data, s->n * sizeof(float));
        s->snap = snap;
    }
    atomic_fetch_add(&s->snap->refs, 1);
    return s->snap;
}
