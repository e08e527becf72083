#!/usr/bin/env bash
# test_py_train: two PyTorch workers (tests/integration/py_worker.py: an
# ordinary training loop with downpour.torch.Worker, a small CNN with batch
# norm) train on Fashion-MNIST for one epoch against one downpour-ps started
# from the module's --init file, once async and once sync: the chief's
# final weights reach >= 0.85 test accuracy in sync, >= 0.82 in async (with
# the batch norm's running statistics, which travelled as state; async's
# apply order follows the two processes' timing, so its accuracy varies from
# run to run: 0.845 seen on a loaded 2-core machine), and staleness is measured on their
# pushes as on C workers' (the servers' histogram counts every applied
# push; async: the mean over both workers' pushes is above 0).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

use_py_package 9 py_train data
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
W=tests/integration/py_worker.py
INIT=$TMP/cnn.safetensors
check "save_init of the small CNN" "$TORCH_PY" "$W" --write-init "$INIT"
for mode in async sync; do
    d=$TMP/$mode
    mkdir -p "$d"
    bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$d/ready" --init "$INIT" \
        --workers 2 --mode $mode >"$d/ps.log" 2>&1
    ps_pid=$!
    t=0; until [ -s "$d/ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
    ep=$(cat "$d/ready")
    bg "$TORCH_PY" "$W" --ps "$ep" --task 1 --workers 2 --out "$d/w1.json" >"$d/w1.log" 2>&1
    w1=$!
    bg "$TORCH_PY" "$W" --ps "$ep" --task 0 --workers 2 --shutdown --out "$d/w0.json" >"$d/w0.log" 2>&1
    w0=$!
    wait_for $w0 $((600 * SCALE)); rc0=$?
    wait_for $w1 60; rc1=$?
    wait_for $ps_pid 30 >/dev/null
    check "$mode: both PyTorch workers finish (exit $rc0 $rc1)" test "$rc0$rc1" = 00 ||
        tail -3 "$d/w0.log" "$d/w1.log"
    acc=$(json "$d/w0.json" test_accuracy 2>/dev/null || echo 0)
    bar=0.85; [ $mode = async ] && bar=0.82
    check "$mode: test accuracy $acc >= $bar after one epoch" ge "$acc" $bar
    read -r applied hist_total mean < <("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))["stats"]
print(s["applied"], sum(s["staleness_hist"]), s["staleness_mean"])' "$d/w0.json" 2>/dev/null || echo "0 -1 0")
    s0=$(json "$d/w0.json" staleness 2>/dev/null || echo 0)
    s1=$(json "$d/w1.json" staleness 2>/dev/null || echo 0)
    check "$mode: the servers measured the staleness of all $applied applied pushes (histogram $hist_total)" \
        test "$applied" -gt 0 -a "$applied" = "$hist_total"
    if [ $mode = async ]; then
        check "async: staleness on the PyTorch workers' pushes: mean $mean (workers saw $s0, $s1) > 0" \
            bash -c "awk -v a=$mean -v b=$s0 -v c=$s1 'BEGIN { exit !(a > 0 && b > 0 && c > 0) }'"
    else
        check "sync: every push aggregated in its step: staleness $mean" test "$mean" = 0.0
    fi
done
finish
