#!/usr/bin/env bash
# resnet_recipe: resnet20 standalone on Fashion-MNIST with one stated recipe,
# Downpour (downpour-worker --standalone) beside PyTorch (torch_recipe.py,
# the same recipe as a PyTorch user writes it), the same epochs and the
# same seeds' count, test accuracy after every epoch.
#
#   docs/experiments/resnet_recipe.sh [OUT]     (default runs/resnet_recipe)
#
# The recipe: SGD momentum 0.9, lr 0.1 annealed by a cosine over the run
# (per step), weight decay 5e-4 on every parameter, batch 128, random crop
# (zero padding 4) and horizontal flip, per-channel normalisation by the
# training set's figures. Knobs (environment): MODEL (resnet20), EPOCHS
# (10), SEEDS ("1"), THREADS (1 per run), JOBS (2 runs at a time). Each
# run is resumable (skipped when its output is complete). Prints, per
# epoch, each side's mean test accuracy over the seeds, and the first epoch
# at which each side's mean reaches 0.93.
set -euo pipefail
cd "$(dirname "$0")/../.."
. docs/experiments/lib.sh
OUT=${1:-runs/resnet_recipe}
MODEL=${MODEL:-resnet20}
EPOCHS=${EPOCHS:-10}
SEEDS=${SEEDS:-1}
THREADS=${THREADS:-1}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
steps=$((60000 / 128))
one() { # "SIDE SEED": one run, skipped when its output is complete
    local side s
    read -r side s <<<"$1"
    local name=$side-s$s
    if [ "$side" = downpour ]; then
        [ -f "$OUT/$name.jsonl" ] && [ "$(grep -c '"event":"eval"' "$OUT/$name.jsonl")" = "$EPOCHS" ] && return 0
        build/downpour-worker --standalone --model "$MODEL" --batch 128 --optimizer momentum \
            --momentum 0.9 --lr 0.1 --lr-schedule cosine:$((steps * EPOCHS)) --weight-decay 5e-4 \
            --augment --normalize train --epochs "$EPOCHS" --eval-every "$steps" --seed "$s" \
            --threads "$THREADS" --metrics "$OUT/$name.jsonl" >"$OUT/$name.out" 2>&1
    else
        [ -f "$OUT/$name.jsonl" ] && [ "$(wc -l <"$OUT/$name.jsonl")" = "$EPOCHS" ] && return 0
        /usr/bin/python3 docs/experiments/torch_recipe.py --model "$MODEL" --epochs "$EPOCHS" \
            --seed "$s" --threads "$THREADS" >"$OUT/$name.jsonl" 2>"$OUT/$name.out"
    fi
}
runs=()
for s in $SEEDS; do runs+=("downpour $s" "torch $s"); done
exp_parallel one "${runs[@]}"
/usr/bin/python3 - "$OUT" "$EPOCHS" "$steps" <<'PY'
import glob, json, os, statistics, sys
out, epochs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
acc = {"downpour": {}, "torch": {}}
for p in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    side = os.path.basename(p).split("-")[0]
    for line in open(p):
        r = json.loads(line)
        if side == "downpour" and r.get("event") != "eval":
            continue
        e = r["step"] // steps if side == "downpour" else r["epoch"]
        acc[side].setdefault(e, []).append(r["test_accuracy"])
print("| epoch | Downpour | PyTorch | difference |")
print("|---:|---:|---:|---:|")
first = {}
for e in range(1, epochs + 1):
    m = {k: statistics.mean(v[e]) if v.get(e) else float("nan") for k, v in acc.items()}
    for k in m:
        if m[k] >= 0.93 and k not in first:
            first[k] = e
    print(f"| {e} | {m['downpour']:.4f} | {m['torch']:.4f} | {m['downpour'] - m['torch']:+.4f} |")
for k in ("downpour", "torch"):
    print(f"{k}: first epoch at >= 0.93: {first.get(k, 'not reached')}")
PY
