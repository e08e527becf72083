#!/usr/bin/env bash
# test_py_mixed: a mixed cluster — a C downpour-worker (the chief) and a
# PyTorch worker (py_worker.py --spec: tests/torch_net.py's module of the
# seed CNN, connecting with the spec model) train together on the same
# downpour-ps (--model SPEC, async): both finish, the servers applied both
# workers' pushes, and the model the chief saves loads into both (PyTorch
# with load_state_dict(strict=True): torch_load.py; Downpour: downpour eval)
# with the same test accuracy and above what either alone would reach so
# early (>= 0.75).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

use_py_package 6 py_mixed data
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
SPEC="conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax"
STEPS=150
bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$TMP/ready" --model "$SPEC" \
    --workers 2 --mode async >"$TMP/ps.log" 2>&1
ps_pid=$!
t=0; until [ -s "$TMP/ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
ep=$(cat "$TMP/ready")
bg "$TORCH_PY" tests/integration/py_worker.py --ps "$ep" --task 1 --workers 2 --spec "$SPEC" \
    --steps $STEPS --out "$TMP/w1.json" >"$TMP/w1.log" 2>&1
w1=$!
bg "$BIN/downpour-worker" --ps "$ep" --task-index 0 --model "$SPEC" --steps $STEPS --batch 64 \
    --threads 1 --no-progress --save "$TMP/model.safetensors" --summary "$TMP/summary.json" \
    >"$TMP/w0.log" 2>&1
w0=$!
wait_for $w0 $((600 * SCALE)); rc0=$?
wait_for $w1 60; rc1=$?
check "the C worker and the PyTorch worker both finish (exit $rc0 $rc1)" test "$rc0$rc1" = 00 ||
    tail -3 "$TMP/w0.log" "$TMP/w1.log"
applied=$(json "$TMP/summary.json" updates_applied 2>/dev/null || echo 0)
steps1=$(json "$TMP/w1.json" steps 2>/dev/null || echo 0)
check "the servers applied both workers' pushes: $applied = 2 x $STEPS (the PyTorch worker's: $steps1)" \
    test "$applied" = $((2 * STEPS)) -a "$steps1" = $STEPS
acc_c=$(json "$TMP/summary.json" test_accuracy 2>/dev/null || echo 0)
out=$("$TORCH_PY" tests/integration/torch_load.py "$TMP/model.safetensors" 2>"$TMP/torch_load.err")
check "the saved model loads into PyTorch strictly" test $? = 0 || cat "$TMP/torch_load.err"
acc_t=$(sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p' <<<"$out")
out=$("$BIN/downpour" eval --checkpoint "$TMP/model.safetensors" 2>"$TMP/eval.err")
check "... and into Downpour (downpour eval)" test $? = 0 || cat "$TMP/eval.err"
acc_e=$(sed -n 's/.*"test_accuracy": *\([0-9.]*\).*/\1/p' <<<"$out")
check "the same accuracy both ways: PyTorch ${acc_t:-?}, downpour eval ${acc_e:-?}, the chief's ${acc_c}" \
    near "${acc_t:-0}" "${acc_e:-1}" 0.002
check "the model both trained scores ${acc_e:-?} >= 0.75" ge "${acc_e:-0}" 0.75
wait_for $ps_pid 10 >/dev/null
finish
