#!/usr/bin/env bash
# deploy/slurm/leave.sh: worker I of a running elastic Downpour job
# (downpour.sbatch with DP_WORKERS=MIN:MAX) leaves: it gets SIGTERM, ends
# its step in flight, tells the servers and exits 0 (its step goes on with
# the job's other tasks, if it has any).
#
#   deploy/slurm/leave.sh OUT I
#
# OUT is the job's output directory (its job.env). Any worker may be taken
# out this way, the job's own as well as one join.sh added; for a step of
# its own, `scancel --signal=TERM JOB.STEP` does the same. The signal is
# sent from a step of the job on each of its nodes, to the process whose
# command line names this job's metrics file for worker I, so no other job's
# worker is touched. Exit status 0 when a worker got it, 1 when none runs.
set -euo pipefail
me=leave.sh
die() { echo "$me: $*" >&2; exit 2; }

[ $# = 2 ] || die "usage: leave.sh OUT I"
out=$1 index=$2
[ -s "$out/job.env" ] || die "$out: no job.env (the output directory of a running downpour.sbatch job?)"
case $index in '' | *[!0-9]*) die "task index '$index': expected a number" ;; esac
# shellcheck source=/dev/null
source "$out/job.env"
[ -n "$DP_SBATCH_CREW" ] || die "job $DP_JOB_ID has a fixed crew: a worker of it cannot leave alone"
max=${DP_SBATCH_CREW#*:}
[ "$index" -lt "$max" ] || die "task index $index: the crew's are below $max"
# The worker's --metrics argument, as a pattern (its regex characters escaped).
mark=$(printf '%s' "--metrics $DP_SBATCH_OUT/metrics/worker-$index.jsonl" | sed 's/[][\.*^$+?(){}|]/\\&/g')
# One task per node of the job; each says whether it found the worker.
hits=$(srun --jobid="$DP_JOB_ID" --overlap --nodes="$DP_JOB_NODES" --ntasks-per-node=1 \
    --job-name="leave-$index" bash -c 'pkill -TERM -f -- "$1( |$)" && echo signalled; exit 0' _ "$mark" |
    grep -c '^signalled$' || true)
if [ "$hits" -ge 1 ]; then
    echo "$me: job $DP_JOB_ID: worker $index asked to leave (SIGTERM); it goes after its step in flight"
    exit 0
fi
echo "$me: job $DP_JOB_ID: no worker $index is running" >&2
exit 1
