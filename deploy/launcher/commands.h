/* commands: every `downpour` subcommand's entry point, one per line of the
 * launcher's table (deploy/launcher/downpour.c). Each takes the command
 * line from its command's first word on: argv[0] is "local", or "bench"
 * with argv[1] "wire". */
#ifndef DP_COMMANDS_H
#define DP_COMMANDS_H

/* downpour local: a whole cluster (ps shards + workers) on this machine
 * (deploy/launcher/local.c). */
int dp_local_main(int argc, char **argv);
/* downpour launch: the shards, then N copies of any command as the workers
 * (deploy/launcher/launch.c). */
int dp_launch_main(int argc, char **argv);
/* downpour eval: test accuracy of a checkpoint (deploy/launcher/eval.c). */
int dp_eval_main(int argc, char **argv);
/* `downpour keygen FILE`: a CURVE key pair (deploy/launcher/keygen.c). */
int dp_keygen_main(int argc, char **argv);
/* `downpour bench wire`: the wire against plain ZeroMQ (deploy/bench/wire.c). */
int dp_bench_wire_main(int argc, char **argv);
/* `downpour bench scale`: pushes/s the servers sustain as workers grow
 * (deploy/bench/scale.c). */
int dp_bench_scale_main(int argc, char **argv);
/* `downpour bench rows`: rows pulled and pushed by key per second against
 * memcpy (deploy/bench/rows.c). */
int dp_bench_rows_main(int argc, char **argv);
/* `downpour scale DIR N`: a running downpour local's live worker count
 * (deploy/launcher/scale.c). */
int dp_scale_main(int argc, char **argv);
/* `downpour sim`: virtual workers on a simulated clock (deploy/lab/sim.c). */
int dp_sim_main(int argc, char **argv);
/* `downpour replay`: a record's schedule run again (deploy/lab/replay.c). */
int dp_replay_main(int argc, char **argv);
/* `downpour sweep`: a grid of runs and its report (deploy/lab/sweep/sweep.c). */
int dp_sweep_main(int argc, char **argv);
/* `downpour gen-libsvm`: sparse data of known truth, libsvm text
 * (deploy/lab/gen_libsvm.c). */
int dp_gen_libsvm_main(int argc, char **argv);

#endif
