/* ps: one parameter-server shard — the library behind downpour-ps.
 *
 * A shard binds a ROUTER and runs a single-threaded zmq_poll loop (no locks).
 * It owns the contiguous float range [floor(i*n/K), floor((i+1)*n/K)) of the
 * flat parameter vector (model params in dp_model_t order), initialised by
 * dp_model_init_params over the FULL vector with the configured seed, so any
 * sharding and the standalone trainer start from identical weights. The
 * optimizer (kernels/optim.h) steps that range; its state is per element.
 *
 * Policies: sync (aggregate R gradients of the current version, average,
 * step once; older versions dropped; pulls deferred until the aggregate is
 * applied), async (apply on arrival; lr optionally / staleness), ssp (async,
 * but a pull from a worker more than S pushes ahead of the slowest live
 * worker is deferred). "Live" = not finished and heard from within
 * --heartbeat-timeout (a worker waiting on a deferred pull is live).
 *
 * Every message is validated (proto/wire.h + fingerprint, shard range,
 * finite values) before it touches state; a bad one gets an ERROR reply (or
 * an ACK "rejected" with the reason), is counted, and changes nothing. */
#ifndef DP_PS_H
#define DP_PS_H

#include <signal.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/opts.h"
#include "kernels/optim.h"
#include "proto/wire.h"

#define DP_PS_PATH_LEN 512

typedef struct {
    char bind[256];             /* e.g. "tcp://0.0.0.0:5555"; port "*" picks a free one */
    int shard_index;            /* i of K */
    int shard_count;            /* K */
    int num_workers;            /* N workers expected */
    dp_mode_t mode;
    int replicas;               /* R for sync; 0 = num_workers */
    int staleness;              /* S for ssp */
    int lr_staleness;           /* async / ssp: lr / max(1, staleness) */
    char model_spec[512];
    int in_c, in_h, in_w;
    uint64_t seed;              /* dp_model_init_params seed */
    dp_optim_conf_t optim;
    char checkpoint_dir[DP_PS_PATH_LEN]; /* "" = no checkpoints */
    long checkpoint_every;      /* versions between checkpoints; 0 = only at shutdown */
    char metrics_path[DP_PS_PATH_LEN];   /* "" = no metrics */
    double metrics_every;       /* seconds between metrics lines */
    double heartbeat_timeout;   /* seconds of silence before a worker is gone; 0 = never */
    char ready_file[DP_PS_PATH_LEN];     /* "" or a file that gets the bound endpoint */
    /* Called once bound (tests: learn the port of "tcp://127.0.0.1:*"). */
    void (*on_ready)(const char *endpoint, void *arg);
    void *on_ready_arg;
} dp_ps_config_t;

/* Defaults: bind all interfaces on port 5555, shard 0/1, 1 worker, sync, R = all, S = 0, default
 * model on 1x28x28, seed 1, momentum lr 0.05 mu 0.9, metrics every 5 s,
 * heartbeat timeout 60 s. */
void dp_ps_config_default(dp_ps_config_t *c);

/* Parse downpour-ps's flags (and TF_CONFIG through common/cluster.h) into c.
 * Returns 0, 1 when --help was printed to stdout, or -1 with one line in
 * err naming the flag. */
int dp_ps_parse_args(dp_ps_config_t *c, int argc, char **argv, char *err);
/* downpour-ps's option table, writing into c and cl's flag fields; `downpour
 * local` reads it to check and pass on the flags marked DP_OPTS_PASS. */
void dp_ps_options(dp_opts_t *o, dp_ps_config_t *c, dp_cluster_t *cl);

/* The float range shard i of k owns out of n. */
void dp_ps_shard_range(size_t n, int i, int k, size_t *lo, size_t *hi);

/* Checkpoint file of shard i of k under dir (out: DP_PS_PATH_LEN + 64). */
void dp_ps_checkpoint_path(char *out, size_t n, const char *dir, int i, int k);

/* Run the shard until *stop_flag becomes non-zero or a SHUTDOWN arrives.
 * Writes the final checkpoint (if configured), closes its socket and
 * returns 0; -1 with err on a setup failure (bad model, bind failure,
 * corrupt checkpoint). stop_flag may be NULL. */
int dp_ps_run(const dp_ps_config_t *cfg, volatile sig_atomic_t *stop_flag, char *err);

#endif
