#!/usr/bin/env bash
# torch_local.sh: what local steps and downpour launch cost a PyTorch user,
# round by round on this machine (tests/bench/torch_local.py, the example's
# network, AdamW, batch 64, 1 thread a process):
#   alone       the loop alone, one process (x2: the ideal for 2 workers)
#   local 8     2 workers under `downpour launch --local-steps 8` (async,
#               outer Nesterov): their images/s summed
#   every step  the same 2 workers with a pull and a push every step (no
#               --local-steps, async): the communication local steps remove
#   own order   2 workers of an elastic crew (launch --workers 2:2, async),
#               each over a DataLoader in its own shuffled order
#   dealt       the same over the batches the servers deal
#               (Worker.sampler): its ratio to own order is the sampler's cost
#   start-up    from `downpour launch` starting to the chief's first step,
#               against the same shard and workers started by hand
# Knobs: BENCH_TL_ROUNDS (3), BENCH_TL_STEPS (200), BENCH_TL_ROWS (the runs
# to make, of "alone local8 every own dealt hand"; `own dealt` alone times
# the sampler, with the two in turn first and second, round by round, so
# a load that drifts falls on both).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=torch_local.sh
ROUNDS=${BENCH_TL_ROUNDS:-3}
ROWS=" ${BENCH_TL_ROWS:-alone local8 every own dealt hand} "
STEPS=${BENCH_TL_STEPS:-200}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
export PYTHONPATH=$PWD/$BUILD/python
bench_require make "$BUILD/downpour" "$BUILD/downpour-ps"
bench_openblas
out=$(mktemp -d)
bench_samples "$out"
bench_start "PyTorch workers with local steps, and downpour launch's start-up"
"$PY" examples/torch_fashion_mnist.py --write-init "$out/m.safetensors"
ips() { sed -n 's/^images_per_s //p' "$@" | awk '{ s += $1 } END { printf "%.0f", s }'; }
first() { sed -n 's/^first_step_at //p' "$1"; }
wants() { [[ $ROWS == *" $1 "* ]]; }
for ((r = 1; r <= ROUNDS; r++)); do
    made=0
    if wants alone; then
        "$PY" tests/bench/torch_local.py alone "$STEPS" >"$out/alone.log"
        echo "alone $(ips "$out/alone.log")" >>"$RAW"
        made=$((made + 1))
    fi
    pair=("own own 2:2 --mode async" "dealt dealt 2:2 --mode async")
    ((r % 2)) || pair=("${pair[1]}" "${pair[0]}")
    for how in "local8 worker 2 --mode async --local-steps 8 --outer-optimizer nesterov" \
        "every worker 2 --mode async" "${pair[@]}"; do
        set -- $how
        name=$1 loop=$2 crew=$3; shift 3
        wants "$name" || continue
        t0=$(date +%s.%N)
        "$BUILD/downpour" launch --workers "$crew" --init "$out/m.safetensors" "$@" --no-progress --out "$out/$name" \
            -- "$PY" tests/bench/torch_local.py "$loop" "$STEPS" >"$out/$name.log" 2>&1
        echo "$name $(ips "$out/$name"/logs/worker-*.log)" >>"$RAW"
        made=$((made + 1))
        [ "$name" = every ] && echo "startup-launch $(awk -v a="$t0" -v b="$(first "$out/$name/logs/worker-0.log")" 'BEGIN { printf "%.3f", b - a }')" >>"$RAW" && made=$((made + 1))
    done
    if wants hand; then
        # by hand: the shard, then the two workers, as README's manual recipe
        t0=$(date +%s.%N)
        rm -f "$out/ready"
        "$BUILD/downpour-ps" --init "$out/m.safetensors" --workers 2 --mode async --bind tcp://127.0.0.1:0 \
            --ready-file "$out/ready" >"$out/hand-ps.log" 2>&1 &
        ps=$!
        until [ -s "$out/ready" ]; do sleep 0.01; done
        ep=$(cat "$out/ready")
        RANK=1 "$PY" tests/bench/torch_local.py worker "$STEPS" "$ep" >"$out/hand-1.log" 2>&1 &
        w1=$!
        "$PY" tests/bench/torch_local.py worker "$STEPS" "$ep" >"$out/hand-0.log" 2>&1 || true
        wait $w1 $ps || true
        echo "startup-hand $(awk -v a="$t0" -v b="$(first "$out/hand-0.log")" 'BEGIN { printf "%.3f", b - a }')" >>"$RAW"
        made=$((made + 1))
    fi
    bench_round "$made"
done
bench_table '
    function ratios(nr,   j, t) { t = ""; for (j = 1; j <= nr; j++) { q[j] = v["dealt", j] / v["own", j]; t = t sprintf("%s%.2f", j > 1 ? " " : "", q[j]) }; return t }
    function row(k,   m, note, t) { m = median(a, n[k]); if (k == "alone") alone = m
                             note = ""
                             if (k ~ /^(local8|every)$/ && alone) note = sprintf("  = %.2fx of 2 x alone (of the medians)", m / (2 * alone))
                             else if (k == "dealt" && n["own"] == n[k]) { t = ratios(n[k]); note = sprintf("  = %.3fx of own order (the median of the rounds, each dealt / own: %s)", median(q, n[k]), t) }
                             printf "%-16s median %7.3f  (%.3f-%.3f)%s\n", k, m, lo, hi, note }
    END { rows("alone local8 every own dealt", n["alone"] ? "alone" : "own"); rows("startup-launch startup-hand", "startup-launch")
          printf "load average (1, 5, 15 min) before: %s; after: %s\n", load0, load1 }'
