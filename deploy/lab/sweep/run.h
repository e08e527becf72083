/* sweep/run: one run of a sweep — its command line (`downpour local`,
 * `downpour-worker --standalone` or `downpour sim`, from a configuration
 * and a seed), whether its directory already holds it complete (a sweep is
 * resumed by running it again), and running it as a child with a progress
 * line. Each run has a directory of its own: DIR/command.txt, DIR/run.log
 * (its output), what the binary leaves (summary.json, metrics/...) and
 * DIR/complete once it exited 0 (the command again: a changed grid reruns). */
#ifndef DP_SWEEP_RUN_H
#define DP_SWEEP_RUN_H

#include <signal.h>
#include <stddef.h>

#include "deploy/lab/sweep/grid.h"
#include "worker/train/progress.h"

#define DP_SWEEP_ARGS 128

typedef struct {
    char buf[8192];                 /* the strings argv points into */
    size_t used;
    const char *argv[DP_SWEEP_ARGS + 1]; /* NULL-terminated */
    int argc;
} dp_sweep_cmd_t;

/* The command of run (pick, seed) in dir; bin_dir holds the binaries.
 * -1 with err when it does not fit or the cluster cannot run it. */
int dp_sweep_cmd_build(dp_sweep_cmd_t *cmd, const dp_sweep_grid_t *g, const int *pick,
                       const char *seed, const char *bin_dir, const char *dir, char *err);
/* The command as one line (arguments with blanks quoted). */
void dp_sweep_cmd_line(const dp_sweep_cmd_t *cmd, char *out, size_t n);

/* 1 when dir holds this very command complete. */
int dp_sweep_run_complete(const dp_sweep_cmd_t *cmd, const char *dir);

/* Runs cmd in dir (created), the progress line prefixed by prefix and
 * followed by the run's step and seconds. *status: the exit status (or
 * 128 + signal). -1 with err when it could not start or *stop was set
 * (the run is then stopped). */
int dp_sweep_run_exec(const dp_sweep_cmd_t *cmd, const char *dir, dp_progress_t *progress,
                      const char *prefix, volatile sig_atomic_t *stop, int *status, char *err);

/* The last non-empty line of dir/run.log (why a run failed). */
void dp_sweep_run_last_line(const char *dir, char *out, size_t n);

#endif
