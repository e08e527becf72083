#!/usr/bin/env bash
# test_signal_kinds: the one signal rule of worker/train/driver.c, held for
# every kind it runs (dense, embed: a model with an embedding on libsvm
# data, rl: an actor-critic):
#  - standalone: SIGTERM mid-run saves the model at the step reached
#    (--save), writes no summary, says so in one line, status 143;
#  - a fixed crew's worker: SIGTERM is a stop ("interrupted": at a step's
#    start, or its pull or push cut short),
#    nothing saved here, status 143;
#  - an elastic crew's worker (--workers 1:2): SIGTERM is a leave after its
#    whole step ("left after step N"), exit 0, and the chief ends the run
#    (exit 0, summary.json written, its membership holding the leave).
# Driven by the state reached (a step's metrics line; the workers' hold
# hook, DP_TEST_HOLD_DIR), never by timing.
source "$(dirname "$0")/lib.sh"

SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
"$BIN/downpour" gen-libsvm --out-train "$TMP/train.svm" --out-test "$TMP/test.svm" --samples 4000 \
    --test-samples 500 --keys 200 --nnz 8 --seed 3 >"$TMP/gen.out" 2>&1
check "gen-libsvm writes a data set" test $? = 0

AC="fc:16 tanh ac:2"
# kind KIND: its flags, the worker's in KW (its model and data, a run far
# longer than the test), the servers' in KP (--model, --input and the rest).
kind() {
    case $1 in
    dense) KW=(--model "fc:16 relu fc:10 softmax" --batch 16 --steps 1000000)
           KP=(--model "fc:16 relu fc:10 softmax") ;;
    embed) KW=(--model "embed:4 fc:2 softmax" --data "libsvm:$TMP/train.svm:$TMP/test.svm" --batch 32 --epochs 100000)
           KP=(--model "embed:4 fc:2 softmax" --input 1x1x1) ;;
    rl) KW=(--env cartpole-v1 --model "$AC" --envs 1 --t-max 5 --env-steps 100000000)
        KP=(--model "$AC" --input 4x1x1 --env cartpole-v1 --envs 1 --t-max 5) ;;
    esac
}
hold() { mkdir -p "$1" && : >"$1/hold-$2-$3"; }
held() { wait_until test -s "$1/held-$2-$3"; }
# ps KIND CREW LOG: one async shard for KIND's model, EP its endpoint.
ps() {
    rm -f "$TMP/ready"
    kind "$1"
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:*" --ready-file "$TMP/ready" --workers "$2" \
        --mode async --threads 1 "${KP[@]}" >"$3" 2>&1
    wait_until test -s "$TMP/ready"
    EP=$(cat "$TMP/ready")
}
# worker KIND TASK LOG [FLAG...]: a worker of EP in the background (W its
# pid), holding where $H asks it to.
worker() {
    local k=$1 task=$2 log=$3
    shift 3
    kind "$k"
    DP_TEST_HOLD_DIR=$H bg "$BIN/downpour-worker" --ps "$EP" --task-index "$task" "${KW[@]}" \
        --threads 1 --no-progress --timeout 30 "$@" >"$log" 2>&1
    W=$!
}

for k in dense embed rl; do
    O=$TMP/$k
    # ---- standalone: saved, no summary, 143 ------------------------------------
    kind $k
    bg "$BIN/downpour-worker" --standalone "${KW[@]}" --threads 1 --no-progress \
        --save "$O.safetensors" --summary "$O.json" --metrics "$O.jsonl" >"$O.log" 2>&1
    pid=$!
    wait_until grep -q '"step"' "$O.jsonl"
    kill -TERM "$pid"
    wait_for "$pid" $((60 * SCALE)); rc=$?
    check "$k standalone: SIGTERM stops it with status 143 (got $rc)" test "$rc" = 143
    check "$k standalone: the model so far is saved to --save" test -s "$O.safetensors"
    check "$k standalone: no summary for an unfinished run" test ! -e "$O.json"
    check "$k standalone: one line says where it stopped and what it saved" \
        grep -q "standalone: stopped by signal 15 at step [0-9]*; model saved to $O.safetensors" "$O.log"

    # ---- a fixed crew: a stop, 143 ---------------------------------------------
    H=$TMP/$k-fixed
    ps $k 1 "$O-fixed-ps.log"
    hold "$H" 0 3
    worker $k 0 "$O-fixed.log"
    held "$H" 0 3
    kill -TERM "$W"
    wait_for "$W" $((60 * SCALE)); rc=$?
    check "$k fixed crew: SIGTERM stops the worker with status 143 (got $rc)" test "$rc" = 143
    check "$k fixed crew: it says it was interrupted, nothing saved here" \
        bash -c "grep -q 'interrupted' '$O-fixed.log' && grep -q 'stopped by signal 15; nothing saved here' '$O-fixed.log'"

    # ---- an elastic crew: a leave, exit 0; the chief ends the run --------------
    H=$TMP/$k-elastic
    ps $k 1:2 "$O-elastic-ps.log"
    hold "$H" 0 5
    case $k in rl) short=(--env-steps 200) ;; dense) short=(--steps 8) ;; embed) short=(--steps 8 --epochs 1) ;; esac
    worker $k 0 "$O-chief.log" "${short[@]}" --summary "$O-crew.json"
    C=$W
    held "$H" 0 5
    hold "$H" 1 3
    worker $k 1 "$O-w1.log" "${short[@]}" # the crew's one data plan
    held "$H" 1 3
    kill -TERM "$W"
    wait_for "$W" $((60 * SCALE)); rc=$?
    check "$k elastic: SIGTERM is a leave after a whole step, exit 0 (got $rc)" test "$rc" = 0
    check "$k elastic: the worker says it left" grep -q "worker 1: left after step [0-9]* on signal 15" "$O-w1.log"
    rm -f "$H/hold-0-5"
    wait_for "$C" $((120 * SCALE)); rc=$?
    check "$k elastic: the chief ends the run, exit 0 (got $rc)" test "$rc" = 0
    check "$k elastic: summary.json's membership holds worker 1's leave" \
        "$TORCH_PY" -c 'import json, sys; m = json.load(open(sys.argv[1]))["membership"]
assert any(e["event"] == "leave" and e["task"] == 1 and e["why"] == "leave" for e in m), m' "$O-crew.json"
done
finish
