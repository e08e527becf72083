#!/usr/bin/env bash
# test_launch: `downpour launch` starting the shards and N copies of a
# Python command (the example PyTorch loop, examples/torch_fashion_mnist.py,
# run from a copy in $TMP so that `pgrep -f $TMP` finds every process the
# launcher started):
#  - async and sync with 2 workers: the run finishes, the chief prints its
#    test accuracy, every push is counted in summary.json, both workers
#    exit 0, and no process is left; the launcher's last line says what the
#    servers applied (their last record, not the workers' leave events) and
#    the chief's result
#  - the example's --dealt loop (Worker.sampler in a DataLoader) trains
#    the batches the servers deal, each counted in the chief's stats
#  - each worker's environment: TF_CONFIG's task index, RANK, LOCAL_RANK,
#    WORLD_SIZE, DOWNPOUR_PS (the shards the launcher printed)
#  - the exit status is the chief's; a worker that raises stops the run,
#    naming it and its traceback's last line
#  - SIGINT to the launcher mid-run: it exits 130 and leaves no process and
#    no shared-memory segment behind
#  - --curve: the workers reach CURVE shards with the keys handed over
#  - with neither --init nor --model, the chief's downpour.torch.Worker(model)
#    writes the servers' init file and the run goes on from it (README's
#    one command); a chief that never makes a Worker is named, nothing left
#  - bad input is one line before anything starts: a bad server flag, no
#    command, no --workers
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
use_py_package 39 launch data
L=$BIN/downpour
cp examples/torch_fashion_mnist.py "$TMP/train.py"
"$TORCH_PY" "$TMP/train.py" --write-init "$TMP/model.safetensors" >"$TMP/init.log" 2>&1
check "the example writes its --init file" test -s "$TMP/model.safetensors"
left() { ! pgrep -f "$TMP/" >/dev/null; }

for mode in async sync; do
    out=$TMP/run-$mode
    "$L" launch --workers 2 --init "$TMP/model.safetensors" --mode $mode --optimizer momentum --lr 0.01 --no-progress \
        --out "$out" -- "$TORCH_PY" "$TMP/train.py" --steps 40 >"$TMP/$mode.log" 2>&1
    rc=$?
    check "$mode: downpour launch --workers 2 -- python3 train.py exits 0 (got $rc)" test $rc = 0
    check "$mode: the chief prints its test accuracy" grep -q '^test accuracy 0\.[0-9]*;' "$out/logs/worker-0.log"
    acc=$(sed -n 's/^test accuracy \(0\.[0-9]*\);.*/\1/p' "$out/logs/worker-0.log")
    check "$mode: ... and trained (accuracy ${acc:-?} > 0.5 after 2 x 40 steps)" ge "${acc:-0}" 0.5
    applied=$(json "$out/summary.json" updates_applied 2>/dev/null)
    check "$mode: summary.json counts 80 pushes applied (${applied:-none})" test "${applied:-}" = 80
    check "$mode: ... and both workers' exit 0" \
        bash -c "\"$TORCH_PY\" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"worker_exit\"] != [0, 0])' '$out/summary.json'"
    check "$mode: no process of the run is left" left
    check "$mode: the last line says what the servers applied (80 pushes) and the chief's result" \
        grep -q "^downpour launch: done: $mode, 2 worker(s), 1 shard(s): 80 pushes applied .*the chief exited with status 0: test accuracy 0\.[0-9]*;" "$TMP/$mode.log"
done

# The example's --dealt loop: the servers' batches through Worker.sampler.
out=$TMP/dealt
"$L" launch --workers 2:2 --init "$TMP/model.safetensors" --mode async --optimizer momentum --lr 0.01 --no-progress \
    --out "$out" -- "$TORCH_PY" "$TMP/train.py" --dealt --steps 20 >"$TMP/dealt.log" 2>&1
rc=$?
check "--dealt: the example trains the servers' batches, the run exits 0 (got $rc)" test $rc = 0
check "--dealt: the chief counts 2 x 20 batches of 64 dealt and trained: $(grep -o 'epoch 0: [0-9]* samples trained' "$out/logs/worker-0.log")" \
    grep -q "; epoch 0: 2560 samples trained" "$out/logs/worker-0.log"

# The model from the chief's module: no --init, no --model.
out=$TMP/from-cmd
"$L" launch --workers 2 --mode async --optimizer momentum --lr 0.01 --no-progress --out "$out" -- \
    "$TORCH_PY" "$TMP/train.py" --steps 40 >"$TMP/from-cmd.log" 2>&1
rc=$?
check "no --init: the chief's module is the model, the run exits 0 (got $rc)" test $rc = 0
floats=$("$TORCH_PY" -c 'import sys, downpour.safetensors as s; print(sum(t.size for _, t in s.read(sys.argv[1])[0]))' \
    "$out/init.safetensors" 2>/dev/null)
check "... the servers hold the model of the file its Worker wrote (${floats:-no} floats)" \
    grep -q "of ${floats:-none}, async" "$out/logs/ps-0.log"
acc=$(sed -n 's/^test accuracy \(0\.[0-9]*\);.*/\1/p' "$out/logs/worker-0.log")
check "... and trained it (accuracy ${acc:-?} > 0.5)" ge "${acc:-0}" 0.5
"$L" launch --workers 2 --no-progress --out "$TMP/no-model" -- true >"$TMP/no-model.log" 2>&1
rc=$?
check "no --init and a chief that makes no Worker: status 1, named (got $rc)" \
    bash -c "[ $rc = 1 ] && grep -q 'worker-0 exited with status 0 before writing the model' '$TMP/no-model.log'"
check "... nothing left" left

# The variables each copy gets.
"$L" launch --workers 2 --model "fc:10 softmax" --no-progress --out "$TMP/env" -- \
    "$TORCH_PY" -c 'import json, os; t = json.loads(os.environ["TF_CONFIG"]); print(t["task"]["index"], os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], len(t["cluster"]["worker"]), os.environ["DOWNPOUR_PS"])' \
    >"$TMP/env.log" 2>&1
ps_at=$(sed -n 's/^downpour launch: 1 ps shard(s) at \([^ ]*\), .*/\1/p' "$TMP/env.log")
check "worker 1: TF_CONFIG's task 1, RANK 1, LOCAL_RANK 1, WORLD_SIZE 2, 2 workers, DOWNPOUR_PS the shard" \
    grep -qx "1 1 1 2 2 ${ps_at:-none}" "$TMP/env/logs/worker-1.log"
check "worker 0: task 0, RANK 0" grep -q '^0 0 0 2 2 ' "$TMP/env/logs/worker-0.log"

# The exit status is the chief's; a worker that raises stops the run.
"$L" launch --workers 2 --model "fc:10 softmax" --no-progress --out "$TMP/st" -- \
    sh -c 'exit $((RANK == 0 ? 3 : 0))' >"$TMP/st.log" 2>&1
rc=$?
check "the exit status is the chief's (3, got $rc)" test $rc = 3
cat >"$TMP/raiser.py" <<'PY'
import os, time
if os.environ["RANK"] == "1":
    raise ValueError("worker 1 gives up")
time.sleep(60)
PY
t0=$SECONDS
"$L" launch --workers 2 --model "fc:10 softmax" --no-progress --grace 2 --out "$TMP/raise" -- \
    "$TORCH_PY" "$TMP/raiser.py" >"$TMP/raise.log" 2>&1
rc=$?
check "a worker that raises stops the run at once (status $rc, $((SECONDS - t0)) s, not the chief's 60)" \
    bash -c "[ $rc != 0 ] && [ $((SECONDS - t0)) -lt 30 ]"
check "... naming it and its traceback's last line" \
    grep -q 'worker-1 exited with status 1; last log line: ValueError: worker 1 gives up' "$TMP/raise.log"
check "... and leaving no process" left

# Ctrl-C: SIGINT to the launcher (in the background, so given the default
# disposition) once both workers train.
out=$TMP/int
: >"$TMP/shm-mark"
env --default-signal=INT "$L" launch --workers 2 --init "$TMP/model.safetensors" --mode async --no-progress \
    --grace 5 --out "$out" -- "$TORCH_PY" "$TMP/train.py" --steps 100000 >"$TMP/int.log" 2>&1 &
lp=$!
t=0
until grep -q '"applied":[1-9]' "$out/metrics/ps-0.jsonl" 2>/dev/null || [ $t -ge 600 ]; do
    sleep 0.1; t=$((t + 1))
done
check "Ctrl-C: the run is training (pushes applied)" grep -q '"applied":[1-9]' "$out/metrics/ps-0.jsonl"
kill -INT $lp
wait_for $lp 30
rc=$?
check "Ctrl-C: the launcher exits 130 (got $rc)" test $rc = 130
check "... saying every process ended" grep -q 'stopped by signal 2; every process ended' "$TMP/int.log"
check "... and none is left" left
check "... nor a shared-memory segment" \
    bash -c "! find /dev/shm -maxdepth 1 -name 'downpour-*' -newer '$TMP/shm-mark' | grep -q ."

# --curve: keys for every shard and worker, the workers' through the environment.
"$L" launch --workers 2 --init "$TMP/model.safetensors" --mode async --curve --no-progress \
    --out "$TMP/curve" -- "$TORCH_PY" "$TMP/train.py" --steps 5 >"$TMP/curve.log" 2>&1
rc=$?
check "--curve: the run over CURVE finishes (status $rc)" test $rc = 0
check "... the shards admitted the workers by key" grep -q 'CURVE' "$TMP/curve/logs/ps-0.log"

# Bad input: one line, nothing started.
for bad in "--workers 2 --mode bogus -- true|server flags: --mode" \
           "--workers 2 --model fc:10\ softmax|no command" \
           "--model fc:10\ softmax -- true|--workers N is required"; do
    args=${bad%%|*} want=${bad#*|}
    eval "\"$L\" launch --out \"$TMP/bad\" $args" >"$TMP/bad.log" 2>&1
    rc=$?
    check "refused: launch $args (status $rc, '$want')" \
        bash -c "[ $rc = 2 ] && grep -q -- '$want' '$TMP/bad.log' && [ \$(wc -l <'$TMP/bad.log') = 1 ]"
done
check "... and nothing was started" left
finish
