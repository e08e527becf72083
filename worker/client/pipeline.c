/* pipeline: the communication thread (see pipeline.h).
 *
 * A ring of DP_PIPE_DEPTH jobs under one mutex: [head, head + count) are
 * outstanding; [head, head + ran) have run (their results wait to be
 * taken); the thread runs job head + ran when there is one. The job in
 * flight is read and written by the thread alone, outside the lock: the
 * poster does not touch a slot until it is taken, and count only grows at
 * the tail. */
#include "worker/client/pipeline.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dp_pipeline {
    dp_ps_client_t *ps;             /* the thread's from new to destroy */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;              /* a job posted, run or taken; quit set */
    dp_pipe_job_t ring[DP_PIPE_DEPTH];
    int head, count, ran;
    int quit;                       /* destroy: end once every job has run */
    int failed;                     /* a job failed: the rest fail with failed_err */
    char failed_err[DP_ERR_LEN];
};

/* One job on the client; the thread's alone while it runs. */
static void s_run(dp_pipeline_t *p, dp_pipe_job_t *j)
{
    double t0 = dp_now();
    if (p->failed) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "%s", p->failed_err);
        return;
    }
    if (j->op == DP_PIPE_PULL) {
        dp_ps_client_deal_step(p->ps, j->deal_step);
        j->rc = j->params ? dp_ps_client_pull(p->ps, j->params, j->err)
                          : dp_ps_client_pull_device(p->ps, j->sink, j->sink_arg, j->err);
        if (j->rc == 0) dp_ps_client_stamp(p->ps, &j->stamp);
        if (j->rc == 0 && j->deal_step && dp_ps_client_dealt(p->ps, &j->dealt) != 0)
            j->rc = dp_err(j->err, "shard 0 dealt no batch with the weights");
    } else {
        dp_ps_push_t push = {.grads = j->grads, .d_grads = j->d_grads, .loss = j->loss,
                             .batch = j->batch, .step = j->step, .stamp = &j->stamp};
        j->rc = dp_ps_client_push(p->ps, &push, &j->res, j->err);
    }
    j->updates_lost = dp_ps_client_updates_lost(p->ps);
    j->seconds = dp_now() - t0;
    if (j->rc != 0) {
        p->failed = 1;
        snprintf(p->failed_err, sizeof p->failed_err, "%s", j->err);
    }
}

static void *s_main(void *arg)
{
    dp_pipeline_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->ran == p->count && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
        if (p->ran == p->count) break; /* quit, and nothing left to run */
        dp_pipe_job_t *j = &p->ring[(p->head + p->ran) % DP_PIPE_DEPTH];
        pthread_mutex_unlock(&p->mu);
        s_run(p, j);
        pthread_mutex_lock(&p->mu);
        p->ran++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dp_pipeline_new(dp_pipeline_t **out, dp_ps_client_t *ps, char *err)
{
    dp_pipeline_t *p = dp_calloc(1, sizeof *p);
    p->ps = ps;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = pthread_create(&p->th, NULL, s_main, p);
    if (rc != 0) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        return dp_err(err, "cannot start the communication thread: %s", strerror(rc));
    }
    *out = p;
    return 0;
}

void dp_pipeline_post(dp_pipeline_t *p, const dp_pipe_job_t *job)
{
    pthread_mutex_lock(&p->mu);
    assert(p->count < DP_PIPE_DEPTH && !p->quit);
    dp_pipe_job_t *j = &p->ring[(p->head + p->count) % DP_PIPE_DEPTH];
    *j = *job;
    j->rc = 0;
    j->err[0] = 0;
    j->seconds = 0;
    p->count++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

int dp_pipeline_wait(dp_pipeline_t *p, dp_pipe_job_t *out)
{
    pthread_mutex_lock(&p->mu);
    if (p->count == 0) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    while (p->ran == 0) pthread_cond_wait(&p->cv, &p->mu);
    *out = p->ring[p->head];
    p->head = (p->head + 1) % DP_PIPE_DEPTH;
    p->count--;
    p->ran--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void dp_pipeline_destroy(dp_pipeline_t **p_p)
{
    if (!p_p || !*p_p) return;
    dp_pipeline_t *p = *p_p;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    *p_p = NULL;
}
