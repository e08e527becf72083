/* pipeline: the worker's communication thread, so that the wire runs while
 * the executor computes (worker/train/distributed.c, --overlap on). While step k
 * computes, this thread pushes step k-1's gradient and pulls the weights
 * step k+1 will use.
 *
 * Ownership: ZeroMQ sockets belong to one thread, and the client is not
 * thread-safe. From dp_pipeline_new to dp_pipeline_destroy the client is
 * this thread's alone (the caller must not touch it); thread creation and
 * join are the memory barriers ZeroMQ asks for when a socket changes
 * threads, and after destroy the client is the caller's again (finish,
 * the chief's end of run).
 *
 * Jobs run one at a time in the order they were posted, and their results
 * are taken in that order. A job that fails (a server gone, the stop flag)
 * makes every job after it fail with the same error without touching the
 * network, so a caller that stops early only waits for the job in flight:
 * every client call is bounded in time. A PULL reports the versions it got
 * (its stamp); a PUSH carries the stamp of the pull its gradient was
 * computed on, which need not be the client's last pull. */
#ifndef DP_PIPELINE_H
#define DP_PIPELINE_H

#include <stdint.h>

#include "common/util.h"
#include "worker/client/ps_client.h"

/* Jobs outstanding at most (posted, result not yet taken). The worker's
 * loop has three: a push in flight, the next pull, the next push. */
#define DP_PIPE_DEPTH 4

typedef enum { DP_PIPE_PULL, DP_PIPE_PUSH } dp_pipe_op_t;

typedef struct {
    dp_pipe_op_t op;
    /* in */
    float *params;           /* PULL: the whole vector lands here; untouched by the caller
                              * until the result is taken */
    dp_ps_params_sink_fn sink; /* PULL, params NULL: each tensor lent to sink, a shard's
                              * device region's entry to the client's device copies
                              * (dp_ps_client_pull_device) */
    void *sink_arg;
    const float *grads;      /* PUSH: the gradient; the same, ZeroMQ sends from it */
    const float *d_grads;    /* PUSH, grads NULL: the device buffer it is in (dp_ps_push_t's) */
    uint64_t step;           /* PUSH: the worker's step (1, 2, ...), applied once per shard */
    float loss;              /* PUSH: the batch's mean loss */
    int batch;               /* PUSH: its size */
    dp_ps_stamp_t stamp;     /* PUSH: the pull computed on (in); PULL: what it got (out) */
    uint64_t deal_step;      /* PULL: ask shard 0 for the batch of this push step (0: none) */
    dp_ps_dealt_t dealt;     /* PULL, with deal_step: the batch dealt (out) */
    /* out */
    dp_push_result_t res;    /* PUSH: what the shards said */
    uint64_t updates_lost;   /* dp_ps_client_updates_lost after the job */
    double seconds;          /* the job's time on the wire */
    int rc;                  /* 0, or -1 with err */
    char err[DP_ERR_LEN];
} dp_pipe_job_t;

typedef struct dp_pipeline dp_pipeline_t;

/* Start the thread; ps is its until dp_pipeline_destroy. */
int dp_pipeline_new(dp_pipeline_t **out, dp_ps_client_t *ps, char *err);

/* Queue a copy of job. More than DP_PIPE_DEPTH outstanding is a misuse
 * (asserted). */
void dp_pipeline_post(dp_pipeline_t *p, const dp_pipe_job_t *job);

/* Wait for the oldest outstanding job and copy its result into out: 0, or
 * -1 when none is outstanding. */
int dp_pipeline_wait(dp_pipeline_t *p, dp_pipe_job_t *out);

/* Let every queued job run (or fail fast after a failure), stop and join
 * the thread, free; results not taken are dropped. The client is the
 * caller's again. Safe twice. */
void dp_pipeline_destroy(dp_pipeline_t **p_p);

#endif
