/* pool: a few threads that share one data-parallel job with the caller —
 * the shard's optimizer sweep over its range (--threads).
 *
 * dp_pool_run(p, fn, arg) runs fn(arg, k, n) once for every k in [0, n),
 * n a few parts per thread (1 without threads), each part on whichever of
 * the caller and the pool's threads claims it first, and returns when all
 * are done: a thread the machine does not schedule in time delays nothing.
 * Between jobs the threads sleep on a condition variable (no spinning: on a
 * small machine the server shares its cores with workers). One caller at a
 * time. */
#ifndef DP_POOL_H
#define DP_POOL_H

typedef struct dp_pool dp_pool_t;
typedef void (*dp_pool_fn)(void *arg, int k, int n);

/* n_threads >= 1 (1: no threads, dp_pool_run calls fn inline). -1 with err
 * when a thread cannot start. */
int dp_pool_new(dp_pool_t **out, int n_threads, char *err);
void dp_pool_run(dp_pool_t *p, dp_pool_fn fn, void *arg);
int dp_pool_size(const dp_pool_t *p);
void dp_pool_destroy(dp_pool_t **p_p); /* joins the threads; safe twice and on NULL */

#endif
