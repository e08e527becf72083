#!/usr/bin/env bash
# deploy/slurm/join.sh: one more worker for a running elastic Downpour job
# (downpour.sbatch with DP_WORKERS=MIN:MAX), as a job step of that job.
#
#   deploy/slurm/join.sh OUT [--task-index I] [srun flags...]
#   deploy/slurm/join.sh runs/slurm-1234 --nodelist=gpu07 --gpus-per-task=1
#
# OUT is the job's output directory (DP_OUT, on the shared filesystem): its
# job.env names the job and the crew, its worker-task.sh is the body every
# worker task runs. The step runs one task with `srun --jobid=JOB --overlap`
# (the job's nodes; srun flags pick one) and logs to OUT/logs/worker-I.STEP.log.
# The task index is I, or else the lowest one below MAX that no running step
# of the job holds (steps are named after their indexes: workers-A-B for the
# job's own, worker-I for a join); two joins at once may pick the same one,
# and the second is refused by the servers ("held by a live worker"): give
# --task-index, or join one at a time. srun returns when the worker ends:
# exit 0 when the data ran out or it left. To take it out again:
#   scancel --signal=TERM JOB.STEP      (it leaves after a whole step, exit 0)
set -euo pipefail
me=join.sh
die() { echo "$me: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: join.sh OUT [--task-index I] [srun flags...]"
out=$1; shift
[ -s "$out/job.env" ] && [ -s "$out/worker-task.sh" ] ||
    die "$out: no job.env / worker-task.sh (the output directory of a running downpour.sbatch job?)"
index=
if [ "${1:-}" = --task-index ]; then
    [ $# -ge 2 ] || die "--task-index needs a value"
    index=$2; shift 2
fi
# shellcheck source=/dev/null
source "$out/job.env"
[ -n "$DP_SBATCH_CREW" ] ||
    die "job $DP_JOB_ID has a fixed crew (submit with DP_WORKERS=MIN:MAX to let workers join)"
max=${DP_SBATCH_CREW#*:}

# held: the task indexes the job's running steps hold, one per line.
held() {
    squeue -h -s -j "$DP_JOB_ID" -o '%j' 2>/dev/null | while read -r name; do
        case $name in
        worker-[0-9]*) echo "${name#worker-}" ;;
        workers-[0-9]*-[0-9]*)
            local range=${name#workers-}
            seq "${range%-*}" "${range#*-}" ;;
        esac
    done
}
state=$(squeue -h -j "$DP_JOB_ID" -o '%T' 2>/dev/null || true)
[ "$state" = RUNNING ] || die "job $DP_JOB_ID is not running (squeue: ${state:-no such job})"
if [ -z "$index" ]; then
    taken=" $(held | tr '\n' ' ') "
    for ((i = 0; i < max; i++)); do
        case $taken in *" $i "*) ;; *) index=$i; break ;; esac
    done
    [ -n "$index" ] || die "job $DP_JOB_ID: all $max task indexes are held (MAX of DP_WORKERS=$DP_SBATCH_CREW)"
fi
case $index in '' | *[!0-9]*) die "--task-index $index: expected a number" ;; esac
[ "$index" -lt "$max" ] || die "--task-index $index: the crew's task indexes are below $max"

echo "$me: job $DP_JOB_ID: worker $index joins (log: $out/logs/worker-$index.<step>.log)"
# The job's settings reach the task through srun's environment.
export DP_TASK_INDEX=$index
exec srun --jobid="$DP_JOB_ID" --overlap --nodes=1 --ntasks=1 --job-name="worker-$index" \
    --output="$out/logs/worker-$index.%s.log" "$@" bash "$out/worker-task.sh"
