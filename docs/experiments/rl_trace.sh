#!/bin/bash
# docs/experiments/rl_trace.sh [BUILD [OUT]]: section 11's grid (rl.sh) again
# at today's defaults, once on the simulator's constant exp:100 compute and
# once on this machine's own delays, so that the two differ only by the
# delays. First the traces: a real `downpour local --env E --workers 2
# --mode async --env-steps 20000` an environment (and a 4-worker one, for
# its statistics), each in OUT/traces/E-wW. Then, in the simulator, for
# cartpole-v1 and acrobot-v1: async (A3C), sync (A2C) at M = 1, 2, 4, 8,
# 16 and async with --delay-lr adaptive at M = 2, 4, 8, 16, 500 k env
# steps, Adam at the default 0.0007 (reward scale 0.1, the default), seeds
# 1-10, under OUT/exp and under OUT/trace (`--compute trace:OUT/traces/E-w2`,
# the environment's own 2-worker run): 560 runs, 9-11 s each here. Seeds 1-5
# of every cell run before seeds 6-10, so a cut-short run still has every
# cell (SEEDS="1,2,3,4,5" runs those only: a blank-separated list of
# seed lists, run in turn). Resumable (a finished run is skipped). JOBS
# sweeps at once (default 2). Then docs/experiments/rl_trace_report.py prints the tables.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/rl_trace}
ENVS=${ENVS:-cartpole-v1 acrobot-v1}
mkdir -p "$R/traces"
for env in $ENVS; do
    for w in 2 4; do
        d=$R/traces/$env-w$w
        [ -s "$d/summary.json" ] && continue
        rm -rf "$d"
        "$B/downpour" local --env "$env" --workers "$w" --mode async --env-steps 20000 --out "$d" \
            --no-progress >"$d.log" 2>&1 || { echo "trace $d failed: see $d.log" >&2; exit 1; }
    done
done
# One line a sweep: COMPUTE ENV ARM SEEDS.
for seeds in ${SEEDS:-1,2,3,4,5 6,7,8,9,10}; do
    for compute in exp trace; do
        for env in $ENVS; do
            echo "$compute $env modes $seeds"
            echo "$compute $env adaptive $seeds"
        done
    done
done | B=$B R=$R xargs -P "${JOBS:-2}" -L 1 bash -c '
    compute=$0 env=$1 arm=$2 seeds=$3
    extra=()
    [ "$compute" = trace ] && extra=(--args "--compute trace:$R/traces/$env-w2")
    common=(--cluster sim --lr 0.0007 --env-steps 500000 --seeds "$seeds" --no-plots --no-progress
            --env "$env" "${extra[@]}")
    case $arm in
    modes)    "$B/downpour" sweep "${common[@]}" --workers 1,2,4,8,16 --mode async,sync \
                  --out "$R/$compute/$env" ;;
    # (at M = 1 nothing is stale: the adaptive arm would be async)
    adaptive) "$B/downpour" sweep "${common[@]}" --workers 2,4,8,16 --mode async --delay-lr adaptive \
                  --out "$R/$compute/$env-adaptive" ;;
    esac >>"$R/$compute-$env-$arm.log" 2>&1'
python3 docs/experiments/rl_trace_report.py "$R" $ENVS
