/* data: global-batch sample order and a double-buffered prefetch thread. */
#include "worker/exec/data.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"

long dp_data_steps_per_epoch(int n, int batch, int world)
{
    if (batch < 1 || world < 1) return 0;
    return (long)n / ((long)batch * world);
}

static void s_permutation(int *perm, int n, unsigned long long seed, long epoch)
{
    dp_rng_t rng;
    dp_rng_seed(&rng, seed * 0x9e3779b97f4a7c15ULL + (unsigned long long)epoch + 1);
    for (int i = 0; i < n; i++) perm[i] = i;
    dp_rng_shuffle(&rng, perm, n);
}

/* Indices of (rank, step) given the permutation of step's epoch. */
static void s_slice(const int *perm, long steps_per_epoch, int batch, int rank, int world,
                    long step, int *idx)
{
    long j = step % steps_per_epoch;
    const int *from = perm + (j * world + rank) * (long)batch;
    memcpy(idx, from, (size_t)batch * sizeof(int));
}

void dp_data_batch_indices(int n, int batch, int rank, int world, unsigned long long seed,
                           long step, int *idx)
{
    long spe = dp_data_steps_per_epoch(n, batch, world);
    int *perm = dp_malloc((size_t)n * sizeof(int));
    s_permutation(perm, n, seed, step / spe);
    s_slice(perm, spe, batch, rank, world, step, idx);
    free(perm);
}

/* Is (epoch, index) a batch of n samples at batch? */
static int s_dealt_check(int n, int batch, uint64_t epoch, uint64_t index, char *err)
{
    if (batch >= 1 && index < (uint64_t)(n / batch) && epoch <= (uint64_t)LONG_MAX) return 0;
    return dp_err(err, "dealt batch %llu of epoch %llu is not one of this data's %d batches of %d",
                  (unsigned long long)index, (unsigned long long)epoch, batch > 0 ? n / batch : 0,
                  batch);
}

int dp_data_dealt_indices(int n, int batch, unsigned long long seed, uint64_t epoch,
                          uint64_t index, int *idx, char *err)
{
    if (s_dealt_check(n, batch, epoch, index, err) != 0) return -1;
    int *perm = dp_malloc((size_t)n * sizeof(int));
    s_permutation(perm, n, seed, (long)epoch);
    memcpy(idx, perm + index * (uint64_t)batch, (size_t)batch * sizeof(int));
    free(perm);
    return 0;
}

/* splitmix64's finaliser: a well-mixed 64-bit function of z. */
static uint64_t s_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void dp_data_augment(const dp_dataset_t *ds, float *x, int B, unsigned long long seed, long step,
                     unsigned long long sample0, float *tmp)
{
    const int P = DP_DATA_CROP_PAD, C = ds->c, H = ds->h, W = ds->w, span = 2 * P + 1;
    size_t hw = (size_t)H * (size_t)W;
    for (int b = 0; b < B; b++) {
        /* its own stream: "augment" in the seed keeps it apart from the
         * dropout masks' hash of the same coordinates */
        uint64_t h = s_mix(s_mix(s_mix(seed ^ 0x6175676d656e74ULL) ^ (uint64_t)step) ^ (sample0 + (uint64_t)b));
        int dy = (int)(h % (uint64_t)span) - P, dx = (int)(h / span % (uint64_t)span) - P;
        int flip = (int)(h / ((uint64_t)span * span) & 1);
        float *s = x + (size_t)b * C * hw;
        memcpy(tmp, s, (size_t)C * hw * sizeof *tmp);
        for (int c = 0; c < C; c++) {
            float zero = dp_dataset_zero(ds, c);
            for (int i = 0; i < H; i++) {
                int si = i + dy;
                for (int j = 0; j < W; j++) {
                    int sj = (flip ? W - 1 - j : j) + dx;
                    s[(size_t)c * hw + (size_t)i * W + j] = si >= 0 && si < H && sj >= 0 && sj < W
                        ? tmp[(size_t)c * hw + (size_t)si * W + sj] : zero;
                }
            }
        }
    }
}

/* The samples idx of step into slot: gathered, augmented, staged. */
static void s_fill(dp_batcher_t *bt, int slot, const int *idx, long step)
{
    dp_dataset_gather(bt->ds, idx, bt->batch, bt->x[slot], bt->y[slot]);
    if (bt->augment)
        dp_data_augment(bt->ds, bt->x[slot], bt->batch, bt->seed, step,
                        (unsigned long long)bt->rank * (unsigned long long)bt->batch, bt->aug_tmp);
    bt->be->ops->stage_upload(bt->be, bt->d_x[slot], bt->x[slot], bt->x_bytes);
    bt->be->ops->stage_upload(bt->be, bt->d_y[slot], bt->y[slot], bt->y_bytes);
}

/* Epoch's permutation into bt->perm, unless it is there. */
static void s_epoch(dp_batcher_t *bt, long epoch)
{
    if (epoch == bt->perm_epoch) return;
    s_permutation(bt->perm, bt->ds->n, bt->seed, epoch);
    bt->perm_epoch = epoch;
}

static void *s_producer(void *arg)
{
    dp_batcher_t *bt = arg;
    int *idx = dp_malloc((size_t)bt->batch * sizeof(int));
    for (long k = 0; k < bt->total_steps; k++) {
        long step = bt->first_step + k;
        int slot = (int)(k & 1); /* the consumer takes slots in the same order */
        pthread_mutex_lock(&bt->mu);
        while (bt->full[slot] && !bt->stop) pthread_cond_wait(&bt->cv, &bt->mu);
        int stop = bt->stop;
        pthread_mutex_unlock(&bt->mu);
        if (stop) break;
        s_epoch(bt, step / bt->steps_per_epoch);
        s_slice(bt->perm, bt->steps_per_epoch, bt->batch, bt->rank, bt->world, step, idx);
        s_fill(bt, slot, idx, step);
        pthread_mutex_lock(&bt->mu);
        bt->full[slot] = 1;
        bt->slot_step[slot] = step;
        bt->produced = step + 1;
        pthread_cond_broadcast(&bt->cv);
        pthread_mutex_unlock(&bt->mu);
    }
    free(idx);
    return NULL;
}

int dp_batcher_init(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                     int rank, int world, unsigned long long seed, long total_steps, char *err)
{
    return dp_batcher_init_at(bt, ds, be, batch, rank, world, seed, 0, total_steps, 0, err);
}

/* Buffers and settings of either kind of batcher; no thread yet. */
static void s_init_buffers(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                           int rank, int world, unsigned long long seed, int augment)
{
    bt->ds = ds;
    bt->be = be;
    bt->batch = batch;
    bt->rank = rank;
    bt->world = world;
    bt->seed = seed;
    bt->augment = augment;
    if (augment) bt->aug_tmp = dp_malloc((size_t)dp_dataset_sample_size(ds) * sizeof(float));
    bt->perm = dp_malloc((size_t)ds->n * sizeof(int));
    bt->perm_epoch = -1;
    bt->held = -1;
    bt->x_bytes = (size_t)batch * ds->c * ds->h * ds->w * sizeof(float);
    bt->y_bytes = (size_t)batch * sizeof(int);
    for (int s = 0; s < 2; s++) {
        bt->x[s] = be->ops->host_alloc(be, bt->x_bytes);
        bt->y[s] = be->ops->host_alloc(be, bt->y_bytes);
        bt->d_x[s] = be->ops->alloc(be, bt->x_bytes);
        bt->d_y[s] = be->ops->alloc(be, bt->y_bytes);
    }
    pthread_mutex_init(&bt->mu, NULL);
    pthread_cond_init(&bt->cv, NULL);
}

int dp_batcher_init_at(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                       int rank, int world, unsigned long long seed, long first_step,
                       long total_steps, int augment, char *err)
{
    memset(bt, 0, sizeof *bt);
    if (rank < 0 || rank >= world)
        return dp_err(err, "worker index %d out of range for %d workers", rank, world);
    bt->steps_per_epoch = dp_data_steps_per_epoch(ds->n, batch, world);
    if (bt->steps_per_epoch < 1)
        return dp_err(err, "%s: %d samples are fewer than one global batch (%d workers x batch %d)",
                      ds->name, ds->n, world, batch);
    s_init_buffers(bt, ds, be, batch, rank, world, seed, augment);
    bt->first_step = first_step < total_steps ? first_step : total_steps;
    bt->total_steps = total_steps - bt->first_step;
    if (pthread_create(&bt->thread, NULL, s_producer, bt) != 0) {
        dp_batcher_fini(bt);
        return dp_err(err, "cannot start the data thread");
    }
    bt->started = 1;
    return 0;
}

long dp_batcher_next(dp_batcher_t *bt, dp_batch_t *b)
{
    pthread_mutex_lock(&bt->mu);
    if (bt->held >= 0) {
        bt->full[bt->held] = 0;  /* the previous batch is done with */
        bt->held = -1;
        pthread_cond_broadcast(&bt->cv);
    }
    if (bt->consumed >= bt->total_steps) {
        pthread_mutex_unlock(&bt->mu);
        return -1;
    }
    int slot = (int)(bt->consumed & 1);
    while (!bt->full[slot]) pthread_cond_wait(&bt->cv, &bt->mu);
    bt->held = slot;
    long step = bt->slot_step[slot];
    bt->consumed++;
    pthread_mutex_unlock(&bt->mu);
    b->x = bt->x[slot];
    b->y = bt->y[slot];
    b->d_x = bt->d_x[slot];
    b->d_y = bt->d_y[slot];
    return step;
}

int dp_batcher_init_dealt(dp_batcher_t *bt, const dp_dataset_t *ds, dp_backend_t *be, int batch,
                          int rank, unsigned long long seed, int augment, char *err)
{
    memset(bt, 0, sizeof *bt);
    if (batch < 1 || ds->n < batch)
        return dp_err(err, "%s: %d samples are fewer than one batch of %d", ds->name, ds->n, batch);
    s_init_buffers(bt, ds, be, batch, rank, 1, seed, augment);
    bt->steps_per_epoch = ds->n / batch;
    bt->dealt = 1;
    return 0;
}

int dp_batcher_take(dp_batcher_t *bt, uint64_t epoch, uint64_t index, long step, dp_batch_t *b,
                    char *err)
{
    if (s_dealt_check(bt->ds->n, bt->batch, epoch, index, err) != 0) return -1;
    int slot = (int)(bt->consumed++ & 1);
    s_epoch(bt, (long)epoch);
    s_fill(bt, slot, bt->perm + index * (uint64_t)bt->batch, step);
    b->x = bt->x[slot];
    b->y = bt->y[slot];
    b->d_x = bt->d_x[slot];
    b->d_y = bt->d_y[slot];
    return 0;
}

void dp_batcher_fini(dp_batcher_t *bt)
{
    if (!bt->be) return;
    if (bt->started) {
        pthread_mutex_lock(&bt->mu);
        bt->stop = 1;
        pthread_cond_broadcast(&bt->cv);
        pthread_mutex_unlock(&bt->mu);
        pthread_join(bt->thread, NULL);
    }
    pthread_mutex_destroy(&bt->mu);
    pthread_cond_destroy(&bt->cv);
    for (int s = 0; s < 2; s++) {
        bt->be->ops->host_release(bt->be, bt->x[s]);
        bt->be->ops->host_release(bt->be, bt->y[s]);
        bt->be->ops->release(bt->be, bt->d_x[s]);
        bt->be->ops->release(bt->be, bt->d_y[s]);
    }
    free(bt->perm);
    free(bt->aug_tmp);
    memset(bt, 0, sizeof *bt);
}
