/* downpour: the launcher. `downpour local` runs a whole cluster on this
 * machine; `downpour eval` scores a checkpoint. The daemons themselves are
 * downpour-ps and downpour-worker (see deploy/README.md for many machines). */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "deploy/launcher.h"
#include "deploy/sim.h"

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: downpour local --workers N [--ps-shards K] [--gpus 0,1] [--mode sync|async|ssp]\n"
            "                      [--out DIR] [any downpour-ps / downpour-worker flag]\n"
            "       downpour eval --checkpoint FILE [--data SPEC] [--device DEV]\n"
            "       downpour keygen FILE\n"
            "       downpour bench wire [--bytes N | --model SPEC] [--shards K] [--json]\n"
            "       downpour bench scale [--workers N] [--shards K] [--params P | --model SPEC] [--json]\n"
            "       downpour sim --workers M --compute DIST --updates N [--json]\n"
            "       downpour replay FILE --out DIR\n"
            "       downpour sweep [--grid FILE] [--mode LIST] [--lr LIST] ... [--out DIR]\n"
            "Run `downpour local --help` or `downpour eval --help` for details.\n");
}

int main(int argc, char **argv)
{
    dp_log_init("downpour");
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        s_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "local") == 0) return dp_local_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "eval") == 0) return dp_eval_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "keygen") == 0) return dp_keygen_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0 && argc > 2 && strcmp(argv[2], "scale") == 0)
        return dp_bench_scale_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0) return dp_bench_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "sim") == 0) return dp_sim_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "replay") == 0) return dp_replay_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "sweep") == 0) return dp_sweep_main(argc - 1, argv + 1);
    fprintf(stderr, "downpour: unknown command '%s' (local, eval, keygen, bench, sim, replay or sweep; see downpour --help)\n",
            argv[1]);
    return 2;
}
