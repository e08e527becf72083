/* pool: threads sharing one job with the caller (see pool.h).
 *
 * A job is cut into DP_POOL_BLOCKS_PER_THREAD blocks per thread, claimed
 * one at a time through one atomic word (job generation << 32 | next
 * block), so a thread the machine does not schedule in time holds nothing
 * up: the caller claims what is left and returns once every block is done,
 * not once every thread has woken. A thread acts on a job only after it
 * claimed a block of it (a compare-and-swap on that word, which fails once
 * the generation moved on), and a job is not over before its claimed
 * blocks are done, so fn and arg are that job's while it runs them. */
#include "server/core/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define DP_POOL_BLOCKS_PER_THREAD 4

struct dp_pool {
    int n;                   /* threads + the caller */
    int blocks;              /* blocks per job: n * DP_POOL_BLOCKS_PER_THREAD */
    pthread_t *th;           /* n - 1 threads */
    int started;             /* threads created */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic uint64_t state;  /* generation << 32 | next unclaimed block */
    atomic_int n_done;       /* blocks of the current job finished */
    int quit;
    dp_pool_fn fn;           /* the current job (written before its generation) */
    void *arg;
};

/* Claim and run blocks of generation gen until none is left. */
static void s_work(dp_pool_t *p, uint64_t gen)
{
    for (;;) {
        uint64_t s = atomic_load(&p->state);
        if (s >> 32 != gen || (s & 0xffffffffu) >= (uint64_t)p->blocks) return;
        if (!atomic_compare_exchange_weak(&p->state, &s, s + 1)) continue;
        p->fn(p->arg, (int)(s & 0xffffffffu), p->blocks);
        if (atomic_fetch_add(&p->n_done, 1) + 1 == p->blocks) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *s_main(void *a)
{
    dp_pool_t *p = a;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && atomic_load(&p->state) >> 32 == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = atomic_load(&p->state) >> 32;
        pthread_mutex_unlock(&p->mu);
        s_work(p, seen);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dp_pool_new(dp_pool_t **out, int n_threads, char *err)
{
    dp_pool_t *p = dp_calloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    p->blocks = p->n * DP_POOL_BLOCKS_PER_THREAD;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->state, 0);
    atomic_init(&p->n_done, 0);
    p->th = dp_calloc((size_t)p->n, sizeof *p->th);
    *out = p;
    for (int k = 1; k < p->n; k++) {
        int e = pthread_create(&p->th[k - 1], NULL, s_main, p);
        if (e != 0) {
            dp_pool_destroy(out);
            return dp_err(err, "cannot start optimizer thread %d of %d: %s", k, p->n - 1,
                          strerror(e));
        }
        p->started++;
    }
    return 0;
}

void dp_pool_run(dp_pool_t *p, dp_pool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->n_done, 0);
    uint64_t gen = (atomic_load(&p->state) >> 32) + 1;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->state, gen << 32); /* publishes fn and arg */
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    s_work(p, gen);
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->n_done) < p->blocks) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int dp_pool_size(const dp_pool_t *p)
{
    return p ? p->n : 1;
}

void dp_pool_destroy(dp_pool_t **p_p)
{
    if (!p_p || !*p_p) return;
    dp_pool_t *p = *p_p;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; k < p->started; k++) pthread_join(p->th[k], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
    *p_p = NULL;
}
