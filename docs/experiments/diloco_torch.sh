#!/bin/bash
# docs/experiments/diloco_torch.sh [BUILD [OUT]]: DiLoCo from PyTorch
# (examples/torch_diloco.py: two workers, inner AdamW at 1e-3, batch 64,
# one epoch of Fashion-MNIST, H = 8) under downpour launch, the outer arms:
# sync Nesterov, async plain Nesterov, async delayed Nesterov at its
# default outer lr (0.5) and at Nesterov's 0.7, and async delayed Nesterov
# with --local-steps auto:8 (DyLU). REPS runs an arm (default 3: the
# example seeds itself, torch.manual_seed(0), so runs differ by the
# asynchrony's order alone). One line a run: the chief's test accuracy.
# docs/EXPERIMENTS.md, section 6.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/diloco_torch}
REPS=${REPS:-3}
mkdir -p "$R"
for rep in $(seq 1 "$REPS"); do
  for arm in "sync --mode sync --local-steps 8 --outer-optimizer nesterov" \
             "async-nesterov --mode async --local-steps 8 --outer-optimizer nesterov" \
             "async-dn --mode async --local-steps 8 --outer-optimizer delayed-nesterov" \
             "async-dn-lr0.7 --mode async --local-steps 8 --outer-optimizer delayed-nesterov --outer-lr 0.7" \
             "async-dn-auto --mode async --local-steps auto:8 --outer-optimizer delayed-nesterov"; do
    set -- $arm; name=$1; shift
    rm -rf "$R/$name-$rep"
    PYTHONPATH=$PWD/$B/python "$B/downpour" launch --workers 2 "$@" --no-progress --out "$R/$name-$rep" \
      -- /usr/bin/python3 examples/torch_diloco.py >"$R/$name-$rep.log" 2>&1
    echo "$name rep $rep rc=$? $(grep -h 'test accuracy' "$R/$name-$rep/logs/worker-0.log")"
  done
done
