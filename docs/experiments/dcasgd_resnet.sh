#!/usr/bin/env bash
# dcasgd_resnet: docs/EXPERIMENTS.md section 7's residual-network row —
# DC-ASGD (Zheng et al. 2017) on resnet8 in the simulator (downpour sim:
# real gradients, the servers' own update and compensation code, batch
# norm's running statistics combined as the servers combine them):
# sequential SGD (1 worker: bit for bit the standalone trainer,
# test_lab_cluster) against ASGD and DC-ASGD-a (--delay-compensation
# adaptive:LAMBDA0) with 4 async workers, SEEDS seeds each, every run seeing
# the same number of training samples (SAMPLES, 48 000 by default: 0.8
# epoch, one update per batch in all three).
#
#   docs/experiments/dcasgd_resnet.sh [OUT]      (default runs/dcasgd_resnet)
#
# Knobs (environment): MODEL (resnet8: resnet20 is 3x the compute), SEEDS
# ("1 2 3"), SAMPLES (48000), BATCH (32), LR (0.05), LAMBDA0 (2, the
# paper's), JOBS (2 runs at a time). The recipe is section 9's: SGD momentum
# 0.9, lr LR annealed by a cosine over the run, weight decay 5e-4, --augment
# and --normalize train, compute times exp:100 (staleness geometric, mean
# 3). Prints one table row per configuration: test error mean +- sd over
# the seeds, the mean staleness, the pushes compensated.
set -euo pipefail
cd "$(dirname "$0")/../.."
. docs/experiments/lib.sh
OUT=${1:-runs/dcasgd_resnet}
MODEL=${MODEL:-resnet8}
SEEDS=${SEEDS:-1 2 3}
SAMPLES=${SAMPLES:-48000}
BATCH=${BATCH:-32}
LR=${LR:-0.05}
LAMBDA0=${LAMBDA0:-2}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
common=(--mode async --model "$MODEL" --batch "$BATCH" --updates $((SAMPLES / BATCH)) --optimizer momentum
        --momentum 0.9 --lr "$LR" --weight-decay 5e-4 --augment --normalize train --compute exp:100
        --threads 1 --json)
runs=()
for cfg in "1 off" "4 off" "4 adaptive:$LAMBDA0"; do
    for s in $SEEDS; do runs+=("$cfg $s"); done
done
one() {
    read -r M dc s <<<"$1"
    exp_sim "w$M-${dc%%:*}-s$s" --workers "$M" --delay-compensation "$dc" --seed "$s" "${common[@]}"
}
exp_parallel one "${runs[@]}"
exp_table <<'PY'
print("| configuration | seeds | test error | staleness mean | compensated |")
print("|---|---|---|---|---|")
names = {"w1-off": "sequential SGD (1 worker)", "w4-off": "ASGD, 4 workers",
         "w4-adaptive": "DC-ASGD-a, 4 workers"}
for key, name in names.items():
    rs = rows.get(key, [])
    if not rs:
        continue
    err = [1 - r["test_accuracy"] for r in rs]
    sd = statistics.stdev(err) if len(err) > 1 else 0.0
    comp = sum(r.get("dc_compensated", 0) for r in rs)
    pushes = sum(r["pushes"] for r in rs)
    off = key.endswith("-off")
    print(f"| {name} | {len(rs)} | {100 * statistics.mean(err):.2f} % ± {100 * sd:.2f} | "
          f"{statistics.mean(r['staleness_mean'] for r in rs):.2f} | "
          f"{comp if not off else '—'}{f' of {pushes}' if not off else ''} |")
PY
