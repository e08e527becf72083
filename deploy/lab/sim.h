/* sim: `downpour sim` — M virtual workers on a simulated clock against the
 * lab engine (deploy/lab/engine.h), so the updates go through the daemons' own
 * policy and shard code and every gradient is a real one.
 *
 * The clock is an event queue of virtual finish times: a worker pulls (the
 * policy's pull_ready decides, as for a real pull: a sync worker waits for
 * the next version, an ssp worker more than S pushes ahead waits for the
 * slowest), computes its gradient at once on the weights it pulled, and
 * pushes it when its compute time — drawn from DIST, or the next of a real
 * run's step times (trace:DIR, deploy/lab/trace.h), times FACTOR for a
 * straggler — has passed on the simulated clock. Events at the same time go
 * in the order they were queued. An elastic crew (--workers MIN:MAX) has
 * its batches dealt by shard 0's dealer, and --churn changes it on the
 * same clock (sim_run.c says how). A model with embed:D (--data
 * libsvm:, deploy/lab/sparse.h) also pulls its batch's rows from each
 * shard at its pull and pushes their gradients before its dense push;
 * its crew is fixed, and the steps in flight at --updates are pushed.
 * The whole run is a function of the flags: the same command gives the
 * same bits. */
#ifndef DP_SIM_H
#define DP_SIM_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "deploy/lab/engine.h"
#include "deploy/lab/trace.h"

#define DP_SIM_MAX_WORKERS 4096

typedef enum { DP_DIST_CONST, DP_DIST_EXP, DP_DIST_LOGNORMAL, DP_DIST_TRACE } dp_dist_kind_t;

typedef struct {
    dp_dist_kind_t kind;
    double a, b;               /* const: ms; exp: mean ms; lognormal: mu, sigma (of ms) */
    dp_trace_t *trace;         /* trace: a real run's step times (deploy/lab/trace.h) */
} dp_dist_t;

/* --churn KIND:MEAN_S: a change of an elastic crew every exp(MEAN_S)
 * simulated seconds; a leaver goes after its push in flight (leave) or
 * dies with it (kill). */
typedef enum { DP_CHURN_NONE, DP_CHURN_LEAVE, DP_CHURN_KILL } dp_churn_kind_t;

typedef struct {
    dp_churn_kind_t kind;
    double mean_s;
} dp_churn_t;

typedef struct {
    dp_lab_conf_t lab;         /* lab.workers: MAX, lab.min_workers: MIN of an elastic crew */
    dp_churn_t churn;
    dp_dist_t compute;
    double *slow;              /* [workers] compute-time factor (--straggler), 1 by default */
    uint64_t updates;          /* stop at this server version */
    long eval_every;           /* updates between evaluations (0: at the end only) */
    int eval_limit;            /* test samples per periodic evaluation (0: all) */
    long diag_every;           /* updates between diagnostics (0: none) */
    int json;                  /* stdout: JSON lines, the result last */
    int progress;              /* dp_progress_mode_t: the live line on stderr (--no-progress) */
} dp_sim_conf_t;

/* "const:MS", "exp:MEAN_MS", "lognormal:MU:SIGMA", "trace:DIR" (DIR's
 * worker metrics loaded and checked here, so a bad trace is refused with
 * the flags). A d parsed before is freed first: d starts zeroed. */
int dp_dist_parse(dp_dist_t *d, const char *text, char *err);
void dp_dist_fini(dp_dist_t *d);
/* "leave:MEAN_S", "kill:MEAN_S". */
int dp_churn_parse(dp_churn_t *c, const char *text, char *err);
/* One compute time of d, in ms, from r (a trace's are its cursor's, not
 * a draw: the simulator reads them itself). */
double dp_dist_draw_ms(const dp_dist_t *d, dp_rng_t *r);
/* Uniform in (0, 1) from 53 random bits of r. */
double dp_uniform01(dp_rng_t *r);

/* Run it; *result gets the result object (the caller prints and frees
 * it). The lab writes conf.lab.train.save / summary / metrics if set. */
int dp_sim_run(const dp_sim_conf_t *c, cJSON **result, char *err);

#endif
