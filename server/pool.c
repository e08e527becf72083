/* pool: threads sharing one job with the caller (see pool.h).
 *
 * Invariants: gen counts jobs started; a thread runs the job of each gen
 * once and then decrements pending; the caller waits until pending is 0
 * before it returns (so fn and arg live long enough). */
#include "server/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct dp_pool {
    int n;                   /* parts per job, threads + the caller */
    pthread_t *th;           /* n - 1 threads */
    int started;             /* threads created */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;       /* jobs started */
    int pending;             /* parts of the current job still running */
    int quit;
    dp_pool_fn fn;
    void *arg;
};

typedef struct {
    dp_pool_t *p;
    int k;
} s_slot_t;

static void *s_main(void *a)
{
    s_slot_t slot = *(s_slot_t *)a;
    free(a);
    dp_pool_t *p = slot.p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        dp_pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, slot.k, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dp_pool_new(dp_pool_t **out, int n_threads, char *err)
{
    dp_pool_t *p = dp_calloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = dp_calloc((size_t)p->n, sizeof *p->th);
    *out = p;
    for (int k = 1; k < p->n; k++) {
        s_slot_t *slot = dp_malloc(sizeof *slot);
        *slot = (s_slot_t){p, k};
        int e = pthread_create(&p->th[k - 1], NULL, s_main, slot);
        if (e != 0) {
            free(slot);
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
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
