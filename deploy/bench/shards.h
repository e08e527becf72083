/* bench/shards: what `downpour bench wire` and `downpour bench scale` share:
 * the model they move (the default model, or one fc layer of about P floats)
 * and the real downpour-ps shards they measure, spawned on this host in a
 * scratch directory of their own, waited for, stopped and cleaned up. */
#ifndef DP_DEPLOY_BENCH_SHARDS_H
#define DP_DEPLOY_BENCH_SHARDS_H

#include <limits.h>
#include <sys/types.h>

#include "common/model.h"

#define DP_BENCH_MAX_SHARDS 64

typedef struct {
    char dir[64];               /* scratch directory: ready files, logs, ipc paths */
    char bin[PATH_MAX + 16];    /* the downpour-ps beside this binary */
    pid_t pid[DP_BENCH_MAX_SHARDS];
    char endpoints[DP_BENCH_MAX_SHARDS * 128]; /* "ep0,ep1,..." for the client */
    int n;                      /* shards started */
} dp_bench_shards_t;

/* How the shards are started: async, every shard on its part of spec. */
typedef struct {
    int shards;
    int ipc;                    /* ipc:// in the scratch directory, else tcp 127.0.0.1 */
    int workers;                /* --workers */
    int threads;                /* --threads; 0: the server's default */
    const char *optimizer;
    const char *spec, *input;   /* --model, --input */
} dp_bench_shards_conf_t;

/* The model to move: spec (NULL: the default model) on a 1x28x28 input, or
 * when params > 0 "fc:10 softmax" over about params floats (no input side
 * over 65536: a large one is laid out as 1 x (F / 1000) x 1000). input
 * gets the --input string the servers take. */
int dp_bench_model(dp_model_t *m, const char *spec, long params, char *input, size_t n, char *err);

/* The median of v[0..n) (n > 0), sorting v: what every bench reports. */
double dp_bench_median(double *v, int n);

/* The scratch directory /tmp/downpour-NAME-XXXXXX and the server binary
 * beside argv0. */
int dp_bench_shards_init(dp_bench_shards_t *b, const char *name, const char *argv0, char *err);
/* Spawn the shards one by one, each waited for until it listens (30 s). */
int dp_bench_shards_start(dp_bench_shards_t *b, const dp_bench_shards_conf_t *c, char *err);
/* SIGTERM every shard started, reap them. */
void dp_bench_shards_stop(dp_bench_shards_t *b);
/* Stop them and remove the scratch directory. */
void dp_bench_shards_fini(dp_bench_shards_t *b);

#endif
