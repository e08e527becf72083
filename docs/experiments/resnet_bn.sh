#!/usr/bin/env bash
# resnet_bn: what staleness does to a network with batch norm — a residual
# network on Fashion-MNIST in the simulator (downpour sim: real gradients,
# the servers' own update code, batch norm's running statistics combined as
# the servers combine them), standalone (1 worker: bit for bit the
# standalone trainer, test_lab_cluster) against sync and async with 4 and
# 8 workers, SEEDS seeds each, every run seeing the same number of training
# samples (SAMPLES, 24 000 by default: 0.4 epoch).
#
#   docs/experiments/resnet_bn.sh [OUT]       (default runs/resnet_bn)
#
# Knobs (environment): MODEL (resnet8: resnet20 is 3x the compute, about
# 2 min a run on one core of a 2-core machine), SEEDS ("1 2 3"), SAMPLES
# (24000), BATCH (32 per worker), LR (0.05), JOBS (2 runs at a time).
# The recipe: SGD momentum 0.9, lr LR annealed by a cosine over the run,
# weight decay 5e-4, --augment (crop + flip) and --normalize train; compute
# times exp:100 (async staleness geometric with mean M - 1). Prints one
# table row per configuration: test accuracy mean +- sd over the seeds,
# the servers' updates, the mean staleness.
set -euo pipefail
cd "$(dirname "$0")/../.."
. docs/experiments/lib.sh
OUT=${1:-runs/resnet_bn}
MODEL=${MODEL:-resnet8}
SEEDS=${SEEDS:-1 2 3}
SAMPLES=${SAMPLES:-24000}
BATCH=${BATCH:-32}
LR=${LR:-0.05}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
common=(--model "$MODEL" --batch "$BATCH" --optimizer momentum --momentum 0.9 --lr "$LR"
        --weight-decay 5e-4 --augment --normalize train --compute exp:100 --threads 1 --json)
runs=()
for cfg in "async 1" "sync 4" "sync 8" "async 4" "async 8"; do
    read -r mode M <<<"$cfg"
    # sync: one update per M batches; async (and 1 worker): one per batch
    if [ "$mode" = sync ]; then updates=$((SAMPLES / (M * BATCH))); else updates=$((SAMPLES / BATCH)); fi
    for s in $SEEDS; do runs+=("$mode $M $updates $s"); done
done
one() {
    read -r mode M updates s <<<"$1"
    exp_sim "$mode-$M-s$s" --mode "$mode" --workers "$M" --updates "$updates" --seed "$s" "${common[@]}"
}
exp_parallel one "${runs[@]}"
exp_table <<'PY'
print("| configuration | seeds | test accuracy | updates | staleness mean |")
print("|---|---|---|---|---|")
for (mode, m) in [("async", 1), ("sync", 4), ("sync", 8), ("async", 4), ("async", 8)]:
    rs = rows.get(f"{mode}-{m}", [])
    if not rs:
        continue
    acc = [r["test_accuracy"] for r in rs]
    sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
    name = "standalone (1 worker)" if m == 1 else f"{mode}, {m} workers"
    print(f"| {name} | {len(rs)} | {statistics.mean(acc):.4f} ± {sd:.4f} | {rs[0]['updates']} | "
          f"{statistics.mean(r['staleness_mean'] for r in rs):.2f} |")
PY
