#!/usr/bin/env bash
# test_py_local: local steps from PyTorch (downpour.torch.Worker when the
# servers run --local-steps H), the user's loop keeping its own optimizer:
#  - exactness: H = 4, inner SGD lr 0.1 in the loop, outer SGD lr 1 on the
#    servers: 20 steps through the Worker end on the weights of the same 20
#    steps alone, to float rounding, with one push per round (5; each
#    returned at a round's end, None between) and pull() inside a round
#    leaving the module alone; 22 steps: the round finish() cuts short is
#    pushed too (6) — tests/integration/py_local.py
#  - compressed: the same with compress="topk:0.25": the servers end on the
#    rounds' top-k pseudo-gradients with error feedback, redone in Python
#    (and not on those without it); a bad value is one line
#  - DyLU: servers of --local-steps auto:4 and Worker(local_steps="auto"):
#    a crew of one is its own fastest, so the exact case holds, every round
#    pushed with its steps; local_steps="auto" against a fixed H: one line
#  - DiLoCo: examples/torch_diloco.py under downpour launch, 2 workers in
#    sync, inner AdamW, outer Nesterov (lr 0.7, momentum 0.9), H = 8: one
#    epoch reaches >= 0.85 test accuracy, each worker pushing once per 8
#    steps (58 rounds of its 468 steps, and its short last round: the
#    servers apply 2 x 59)
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
use_py_package 18 py_local data
PY=tests/integration/py_local.py

"$TORCH_PY" "$PY" init "$TMP/small.safetensors"
for case in "20 5" "22 6" "20 compressed"; do
    set -- $case
    rm -f "$TMP/ps.ready"
    bg "$BIN/downpour-ps" --init "$TMP/small.safetensors" --workers 1 --mode async --local-steps 4 \
        --outer-optimizer sgd --outer-lr 1 --bind tcp://127.0.0.1:0 --ready-file "$TMP/ps.ready" \
        >"$TMP/ps-$1.log" 2>&1
    t=0; until [ -s "$TMP/ps.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
    if [ "$2" = compressed ]; then
        run_counted "exact-$1" "$TORCH_PY" "$PY" compressed "$(cat "$TMP/ps.ready" 2>/dev/null)" "$1"
    else
        run_counted "exact-$1" "$TORCH_PY" "$PY" exact "$(cat "$TMP/ps.ready" 2>/dev/null)" "$1" "$2"
    fi
done

# DyLU: servers of --local-steps auto:4 (recorded: each round's steps in
# it), beside the last case's servers of a fixed 4 for the refusal
rm -f "$TMP/ps.ready" "$TMP/auto.ready"
bg "$BIN/downpour-ps" --init "$TMP/small.safetensors" --workers 1 --mode async --local-steps auto:4 \
    --outer-optimizer sgd --outer-lr 1 --bind tcp://127.0.0.1:0 --ready-file "$TMP/auto.ready" \
    --record "$TMP/auto.rec" >"$TMP/ps-auto.log" 2>&1
bg "$BIN/downpour-ps" --init "$TMP/small.safetensors" --workers 1 --mode async --local-steps 4 \
    --outer-optimizer sgd --outer-lr 1 --bind tcp://127.0.0.1:0 --ready-file "$TMP/ps.ready" \
    >"$TMP/ps-fixed.log" 2>&1
t=0; until [ -s "$TMP/auto.ready" ] && [ -s "$TMP/ps.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
run_counted "auto-20" "$TORCH_PY" "$PY" auto "$(cat "$TMP/auto.ready" 2>/dev/null)" 20 5 \
    "$(cat "$TMP/ps.ready" 2>/dev/null)"

"$TORCH_PY" examples/torch_fashion_mnist.py --write-init "$TMP/fm.safetensors" >/dev/null 2>&1
OMP_NUM_THREADS=1 "$BIN/downpour" launch --workers 2 --init "$TMP/fm.safetensors" --mode sync --local-steps 8 \
    --outer-optimizer nesterov --no-progress --out "$TMP/diloco" -- "$TORCH_PY" examples/torch_diloco.py \
    >"$TMP/diloco.log" 2>&1
rc=$?
check "DiLoCo: downpour launch of examples/torch_diloco.py exits 0 (got $rc)" test $rc = 0
acc=$(sed -n 's/^test accuracy \(0\.[0-9]*\);.*/\1/p' "$TMP/diloco/logs/worker-0.log")
check "DiLoCo: one epoch reaches ${acc:-?} >= 0.85 test accuracy" ge "${acc:-0}" 0.85
for i in 0 1; do
    check "DiLoCo: worker $i pushed once per 8 steps (58 rounds)" \
        grep -q "^worker $i: 58 pushes of rounds of 8 steps" "$TMP/diloco/logs/worker-$i.log"
done
check "DiLoCo: the servers applied 2 x 59 pushes (the short last rounds too)" \
    grep -q 'the servers applied 118 pushes' "$TMP/diloco/logs/worker-0.log"
finish
