#!/usr/bin/env bash
# test_py_recovery: a server restarted mid-run under two PyTorch workers
# (py_worker.py, async, 1 shard checkpointing every 20 versions). The shard
# dies by the test hook DP_TEST_KILL_AT_VERSION (as by kill -9, on the
# chief's first push computed on version 70 or later) and is restarted with
# the same flags on the same port once it is dead: the Python workers say
# HELLO again by themselves (the C client's rejoin, in libdownpour.so), carry
# on and exit 0; the restart restored the checkpoint before the death, the
# chief reports the updates lost, every step of both workers was pushed
# once, and the model still learns (>= 0.7 after this short run).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

use_py_package 7 py_recovery data
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
W=tests/integration/py_worker.py
STEPS=150
TIMEOUT=$((5 * SCALE))
INIT=$TMP/cnn.safetensors
"$TORCH_PY" "$W" --write-init "$INIT"
port=$("$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ps() {
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$port" --init "$INIT" --workers 2 --mode async \
        --checkpoint-dir "$TMP/ck" --checkpoint-every 20 >>"$TMP/ps.log" 2>&1
    PS_PID=$!
}
DP_TEST_KILL_AT_VERSION=70 ps
bg "$TORCH_PY" "$W" --ps "tcp://127.0.0.1:$port" --task 1 --workers 2 --steps $STEPS \
    --timeout "$TIMEOUT" --out "$TMP/w1.json" >"$TMP/w1.log" 2>&1
w1=$!
bg "$TORCH_PY" "$W" --ps "tcp://127.0.0.1:$port" --task 0 --workers 2 --steps $STEPS \
    --timeout "$TIMEOUT" --shutdown --out "$TMP/w0.json" >"$TMP/w0.log" 2>&1
w0=$!
wait_for "$PS_PID" $((300 * SCALE)); ps_rc=$?
w=$(grep -m1 -o "DP_TEST_KILL_AT_VERSION: dying .*" "$TMP/ps.log" | sed -n 's/.* at version \([0-9]*\).*/\1/p')
check "the shard died by the hook as by kill -9 (status $ps_rc) at version ${w:-?} >= 70" \
    test "$ps_rc" = 137 -a "${w:-0}" -ge 70
ps
wait_for $w0 $((300 * SCALE)); rc0=$?
wait_for $w1 60; rc1=$?
wait_for "$PS_PID" 30 >/dev/null
ck=$(( ${w:-0} - ${w:-0} % 20 ))
check "the restarted shard restored its checkpoint of version $ck" grep -q "restored version $ck " "$TMP/ps.log"
check "both PyTorch workers carry on and finish (exit $rc0 $rc1)" test "$rc0$rc1" = 00 ||
    tail -3 "$TMP/w0.log" "$TMP/w1.log"
check "both said HELLO again by themselves" \
    bash -c "grep -q 'saying HELLO again' '$TMP/w0.log' && grep -q 'saying HELLO again' '$TMP/w1.log'"
lost=$(json "$TMP/w0.json" updates_lost 2>/dev/null || echo 0)
check "the chief reports the updates lost to the restart ($lost, at most $(( ${w:-0} - ck )))" \
    test "$lost" -gt 0 -a "$lost" -le $(( ${w:-0} - ck ))
s0=$(json "$TMP/w0.json" steps 2>/dev/null || echo 0) s1=$(json "$TMP/w1.json" steps 2>/dev/null || echo 0)
check "each worker pushed its $STEPS steps ($s0, $s1)" test "$s0$s1" = "$STEPS$STEPS"
acc=$(json "$TMP/w0.json" test_accuracy 2>/dev/null || echo 0)
check "the model still learns: test accuracy $acc >= 0.7" ge "$acc" 0.7
finish
