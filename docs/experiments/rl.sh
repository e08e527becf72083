#!/bin/bash
# docs/experiments/rl.sh [BUILD [OUT]]: the seed's question in A3C's own
# setting. A3C (async) against A2C (sync) and async with the delay-adaptive
# step (--delay-lr adaptive), at M = 1, 2, 4, 8, 16 actor-learners, on
# CartPole-v1 and Acrobot-v1: 500 k env steps a run, Adam at lr 0.0007,
# 0.0015 (the default) and 0.003, seeds 1-10; every run in the simulator
# (downpour sim: the worker's own segments and the shard's own optimizer,
# one process, a run ~7 s here), 840 runs in all (the adaptive arm from M = 2). Resumable (a finished run
# is skipped). Then docs/experiments/rl_report.py prints the tables.
# ENVS="cartpole-v1" runs one environment; JOBS=2 runs two sweeps at once.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/rl}
ENVS=${ENVS:-cartpole-v1 acrobot-v1}
mkdir -p "$R"
common=(--cluster sim --workers 1,2,4,8,16 --lr 0.0007,0.0015,0.003
        --env-steps 500000 --seeds 1,2,3,4,5,6,7,8,9,10 --no-plots --no-progress)
arm() { # env arm
    case $2 in
    modes)    "$B/downpour" sweep "${common[@]}" --env "$1" --mode async,sync --out "$R/$1" ;;
    # (at M = 1 nothing is stale: the adaptive arm's runs would be async's)
    adaptive) "$B/downpour" sweep "${common[@]}" --workers 2,4,8,16 --env "$1" --mode async --delay-lr adaptive \
                  --out "$R/$1-adaptive" ;;
    esac >"$R/$1-$2.log" 2>&1
}
for env in $ENVS; do
    arm "$env" modes &
    [ "${JOBS:-1}" -gt 1 ] || wait
    arm "$env" adaptive
    wait
done
python3 docs/experiments/rl_report.py "$R" $ENVS
