/* launcher: the `downpour` command's subcommands. */
#ifndef DP_LAUNCHER_H
#define DP_LAUNCHER_H

/* downpour local: a whole cluster (ps shards + workers) on this machine. */
int dp_local_main(int argc, char **argv);
/* downpour eval: test accuracy of a checkpoint. */
int dp_eval_main(int argc, char **argv);
/* `downpour keygen FILE`: a CURVE key pair (deploy/keygen.c). */
int dp_keygen_main(int argc, char **argv);
/* `downpour bench wire`: the wire against plain ZeroMQ (deploy/bench_wire.c). */
int dp_bench_main(int argc, char **argv);
/* `downpour bench scale`: pushes/s the servers sustain as workers grow
 * (deploy/bench_scale.c). argv[0] is "bench", argv[1] "scale". */
int dp_bench_scale_main(int argc, char **argv);
/* `downpour sweep`: a grid of runs and its report (deploy/sweep.c). */
int dp_sweep_main(int argc, char **argv);

#endif
