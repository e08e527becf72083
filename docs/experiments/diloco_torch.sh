#!/bin/bash
# docs/experiments/diloco_torch.sh [BUILD [OUT]]: DiLoCo from PyTorch
# (examples/torch_diloco.py: two workers, inner AdamW at 1e-3, batch 64,
# one epoch of Fashion-MNIST, H = 8) under downpour launch, four outer
# arms: sync Nesterov, async plain Nesterov, async delayed Nesterov, and
# async delayed Nesterov with --local-steps auto:8 (DyLU). One line each:
# the chief's test accuracy. docs/EXPERIMENTS.md, section 6.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/diloco_torch}
mkdir -p "$R"
for arm in "sync --mode sync --local-steps 8 --outer-optimizer nesterov" \
           "async-nesterov --mode async --local-steps 8 --outer-optimizer nesterov" \
           "async-dn-auto --mode async --local-steps auto:8 --outer-optimizer delayed-nesterov" \
           "async-dn --mode async --local-steps 8 --outer-optimizer delayed-nesterov"; do
  set -- $arm; name=$1; shift
  rm -rf "$R/$name" # one run an arm: the example seeds itself (torch.manual_seed(0))
  PYTHONPATH=$PWD/$B/python "$B/downpour" launch --workers 2 "$@" --no-progress --out "$R/$name" \
    -- /usr/bin/python3 examples/torch_diloco.py >"$R/$name.log" 2>&1
  echo "$name rc=$? $(grep -h 'test accuracy' "$R/$name/logs/worker-0.log")"
done
