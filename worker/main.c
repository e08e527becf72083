/* downpour-worker: one per GPU or CPU slot. With --standalone it trains
 * alone (the baseline); otherwise it joins parameter servers given by --ps
 * or by the TensorFlow-style cluster flags / TF_CONFIG (worker/args.h).
 * Every kind of model (dense, a model with an embedding on --data libsvm,
 * an actor-critic with --env) runs through one driver (worker/train/driver.h).
 * Exit status 0 on success, 2 on a bad flag or cluster spec, 1 when the run
 * fails, 128 + the signal (130, 143) when SIGINT / SIGTERM stopped it: the
 * standalone trainer then saves its model to --save (if given), a cluster
 * worker saves nothing (the servers hold the weights and checkpoint them). */
#include <stdio.h>

#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "kernels/env.h"
#include "worker/args.h"
#include "worker/train/driver.h"

static volatile sig_atomic_t s_stop;

int main(int argc, char **argv)
{
    dp_log_init("downpour-worker");
    static dp_worker_args_t a; /* the cluster spec is large: keep it off the stack */
    dp_worker_args_default(&a);
    char err[DP_ERR_LEN] = "";
    /* The environment's knobs first, refused as a bad flag is. */
    if (dp_log_env(err) != 0 || dp_kernels_env(err) != 0) {
        fprintf(stderr, "downpour-worker: %s\n", err);
        return 2;
    }
    dp_opts_result_t parsed = dp_worker_parse_args(&a, argc, argv, err);
    if (parsed != DP_OPTS_PARSED) return dp_opts_exit_status("downpour-worker", parsed, err);
    dp_signals_install(&s_stop, 0);
    int r = dp_train_run(&a.conf, &s_stop, err); /* --standalone: a.conf.ps is NULL */
    if (r == DP_TRAIN_LEFT) return 0; /* an elastic crew's leave: asked for, done */
    if (s_stop) {
        if (r != 0) dp_log_warn("%s", err);
        if (!a.standalone)
            dp_log_info("stopped by signal %d; nothing saved here (the servers keep the weights)",
                        (int)s_stop);
        return 128 + s_stop;
    }
    if (r != 0) {
        dp_log_error("%s", err);
        return 1;
    }
    return 0;
}
