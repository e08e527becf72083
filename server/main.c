/* downpour-ps: the parameter-server daemon — flags to dp_ps_config_t, signal
 * handling (common/signals.h: the handler only sets a flag), then dp_ps_run
 * (server/loop/ps.h). Exit status 0 after a SHUTDOWN, 128 + the signal (130,
 * 143) after SIGINT / SIGTERM — either way the final checkpoint is written
 * first when --checkpoint-dir is given —, 2 on a bad flag (--device cuda:N
 * in a build without CUDA among them), 1 on a setup failure (a --device
 * this machine lacks, bind, model, a checkpoint of another run, workers
 * missing past --startup-timeout). */
#include <stdio.h>

#include "common/opts.h"
#include "common/signals.h"
#include "common/util.h"
#include "server/loop/ps.h"

static volatile sig_atomic_t s_stop, s_reload;

int main(int argc, char **argv)
{
    dp_log_init("downpour-ps");
    char err[DP_ERR_LEN] = "";
    /* The environment's knobs first, refused as a bad flag is. */
    if (dp_log_env(err) != 0) {
        fprintf(stderr, "downpour-ps: %s\n", err);
        return 2;
    }
    dp_ps_config_t cfg;
    dp_ps_config_default(&cfg);
    dp_opts_result_t r = dp_ps_parse_args(&cfg, argc, argv, err);
    if (r != DP_OPTS_PARSED) return dp_opts_exit_status("downpour-ps", r, err);
    int usage = 1;
    if (dp_ps_device_check(&cfg, &usage, err) != 0) { /* before anything starts */
        fprintf(stderr, "downpour-ps: %s\n", err);
        return usage ? 2 : 1;
    }
    dp_signals_install(&s_stop, 0);
    dp_signals_reload(&s_reload); /* SIGHUP: --curve-allow read again */
    cfg.reload = &s_reload;
    if (dp_ps_run(&cfg, &s_stop, err) != 0) {
        fprintf(stderr, "downpour-ps: %s\n", err);
        return 1;
    }
    if (s_stop) {
        dp_log_info("stopped by signal %d; %s%s", (int)s_stop,
                    cfg.checkpoint_dir[0] ? "checkpoint written in " : "nothing saved (no --checkpoint-dir)",
                    cfg.checkpoint_dir);
        return 128 + s_stop;
    }
    return 0;
}
