#!/usr/bin/env bash
# a3c.sh: environment steps per second of the A3C worker (CartPole-v1, the
# default network and segment: fc:64 tanh fc:64 tanh ac, --t-max 5, one
# environment a worker, 1 thread a process), round by round on this machine:
#   c-alone     downpour-worker --standalone --env cartpole-v1
#   c-1         downpour local --env cartpole-v1 --workers 1 (one shard, async)
#   c-2         the same with --workers 2: the two workers' env steps summed
#               (the servers' count over the run's training seconds)
#   torch-1     examples/torch_a3c.py, the same loop in PyTorch, one worker
#               under `downpour launch --workers 1` (the same shard)
#   torch-2     the same with 2 workers: their env steps/s summed
# Ratios: 2 workers against 2x one worker, on each side; and C against
# PyTorch through the servers, one worker each.
# Knobs: BENCH_A3C_ROUNDS (3), BENCH_A3C_STEPS (100000 env steps a worker).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=a3c.sh
ROUNDS=${BENCH_A3C_ROUNDS:-3}
N=${BENCH_A3C_STEPS:-100000}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
export PYTHONPATH=$PWD/$BUILD/python OPENBLAS_NUM_THREADS=1
bench_require make "$BUILD/downpour" "$BUILD/downpour-ps" "$BUILD/downpour-worker"
out=$(mktemp -d)
bench_samples "$out"
bench_start "A3C on CartPole-v1: env steps per second, C worker and the PyTorch example"
rate() { # summary.json: env steps over the run's training seconds
    "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print("%.0f" % (d["env_steps"] / d["train_s"]))' "$1"
}
torch_rate() { # the workers' "N env steps/s" lines, summed
    sed -n 's/.*, \([0-9]*\) env steps\/s$/\1/p' "$@" | awk '{ s += $1 } END { printf "%.0f", s }'
}
spec="fc:64 tanh fc:64 tanh ac:2"
for ((r = 1; r <= ROUNDS; r++)); do
    bench_run c-alone "$out/alone.log" "$BUILD/downpour-worker" --standalone --env cartpole-v1 \
        --env-steps "$N" --threads 1 --summary "$out/alone.json"
    echo "c-alone $(rate "$out/alone.json")" >>"$RAW"
    for w in 1 2; do
        bench_run "c-$w" "$out/c$w.log" "$BUILD/downpour" local --env cartpole-v1 --workers $w --mode async \
            --env-steps $((w * N)) --threads 1 --no-progress --out "$out/c$w"
        echo "c-$w $(rate "$out/c$w/summary.json")" >>"$RAW"
        rm -rf "$out/t$w"
        bench_run "torch-$w" "$out/t$w.log" env OMP_NUM_THREADS=1 "$BUILD/downpour" launch --workers $w --mode async \
            --model "$spec" --input 4x1x1 --optimizer adam --lr 0.0015 --no-progress --out "$out/t$w" \
            -- "$PY" examples/torch_a3c.py --env-steps $((w * N))
        echo "torch-$w $(torch_rate "$out/t$w"/logs/worker-*.log)" >>"$RAW"
    done
    bench_round 5
done
bench_table '
    function note(k) {
        if (k == "c-2") return sprintf("  = %.2fx of 2 x c-1", med[k] / (2 * med["c-1"]))
        if (k == "torch-2") return sprintf("  = %.2fx of 2 x torch-1", med[k] / (2 * med["torch-1"]))
        if (k == "torch-1") return sprintf("  (c-1 = %.1fx of it)", med["c-1"] / med[k])
        return ""
    }
    function row(k) { med[k] = median(a, n[k])
                      printf "%-8s env steps/s median %7.0f  (%.0f-%.0f)%s\n", k, med[k], lo, hi, note(k) }
    END { rows("c-alone c-1 c-2 torch-1 torch-2", "c-alone")
          printf "load average (1, 5, 15 min) before: %s; after: %s\n", load0, load1 }'
