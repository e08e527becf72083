/* args: downpour-worker's command line (and TF_CONFIG) into a
 * dp_train_conf_t — one option table (common/opts.h), which `downpour local`
 * also reads to check and pass on the flags marked DP_OPTS_PASS. */
#ifndef DP_WORKER_ARGS_H
#define DP_WORKER_ARGS_H

#include "common/cluster.h"
#include "common/opts.h"
#include "worker/train/train.h"

typedef struct {
    dp_train_conf_t conf;
    int standalone;            /* --standalone: train alone, no servers */
    dp_cluster_t cluster;      /* the cluster flags, then the resolved spec */
    char endpoints[8192];      /* conf.ps when the cluster spec gives the servers */
} dp_worker_args_t;

/* Defaults (dp_train_conf_default; no cluster flags). */
void dp_worker_args_default(dp_worker_args_t *a);

/* downpour-worker's option table, writing into a. */
void dp_worker_options(dp_opts_t *o, dp_worker_args_t *a);

/* Parse the flags, then find the servers: --ps, else the cluster flags or
 * TF_CONFIG (whose task index becomes conf.task_index). BAD with one line
 * in err. */
dp_opts_result_t dp_worker_parse_args(dp_worker_args_t *a, int argc, char **argv, char *err);

#endif
