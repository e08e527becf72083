#!/usr/bin/env bash
# test_recovery_cluster: faults in a running cluster, daemons started by hand.
#  (a) async, 2 workers, 1 shard checkpointing every 20 versions: kill -9
#      of the server mid-run (between two checkpoints) and a restart with the same flags on the same
#      port; the workers carry on by themselves and exit 0, the updates lost
#      since the checkpoint are reported (log, metrics, summary
#      updates_lost), the test accuracy is within 1 point of an undisturbed
#      run of the same length
#  (b) the same in sync mode
#  (c) sync, kill -9 of worker 1 of 2: worker 0 goes on within the stated
#      bound (heartbeat timeout 5 s + one 1 s beat); worker 1 restarted with
#      the same --task-index resumes after the steps the server holds, and
#      both finish
# Waits scale with DP_TEST_TIMEOUT_SCALE.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip recovery "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
STEPS=240                     # per worker
MODEL="fc:128 relu fc:10 softmax"
BOUND_S=6                     # a dead sync worker stops holding steps within this (README)
free_port() { "$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ps DIR PORT MODE: one shard for 2 workers, checkpoints in DIR/ck; appends to DIR/ps.log.
ps() {
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$2" --workers 2 --mode "$3" --model "$MODEL" \
        --seed 3 --lr-schedule "cosine:$((STEPS * 2))" --checkpoint-dir "$1/ck" --checkpoint-every 20 \
        --metrics "$1/ps.jsonl" --metrics-every 0.1 >>"$1/ps.log" 2>&1
    PS_PID=$!
}
# worker DIR PORT I: worker I, its log DIR/wI.log (appended), metrics DIR/wI.jsonl.
worker() {
    local extra=()
    [ "$3" = 0 ] && extra=(--summary "$1/summary.json")
    bg "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$2" --task-index "$3" --model "$MODEL" --seed 3 \
        --steps $STEPS --batch 32 --delay-ms 15 --timeout $((5 * SCALE)) --threads 1 --no-progress \
        --metrics "$1/w$3.jsonl" "${extra[@]}" >>"$1/w$3.log" 2>&1
    W_PID[$3]=$!
}
# version DIR: the shard's version in its last metrics line (0 if none yet).
version() { { grep -o '"version":[0-9]*' "$1/ps.jsonl" 2>/dev/null || echo '"version":0'; } | tail -1 | cut -d: -f2; }
# wait_until SECONDS COMMAND...: poll every 0.1 s; 0 once it holds, 1 when the time is up.
wait_until() {
    local limit=$(( $1 * 10 * SCALE )) t=0; shift
    until "$@"; do t=$((t + 1)); [ $t -ge $limit ] && return 1; sleep 0.1; done
}
version_ge() { [ "$(version "$1")" -ge "$2" ]; }
run_limit=$((60 * SCALE))

# run MODE NAME KILL: a cluster of 1 shard and 2 workers in $TMP/NAME. With
# KILL=1 the server is killed (-9) between two checkpoints and restarted
# with the same flags; to know exactly how many updates that loses, the
# workers are frozen (SIGSTOP) around the kill until the shard's metrics
# show its version V (they lag up to a second): V mod 20 are lost.
run() {
    local mode=$1 d=$TMP/$2 port v=0 try; port=$(free_port)
    mkdir -p "$d"
    ps "$d" "$port" "$mode"
    worker "$d" "$port" 0; worker "$d" "$port" 1
    if [ "$3" = 1 ]; then
        for try in 1 2 3 4 5 6; do
            wait_until 60 version_ge "$d" 60 || break
            kill -STOP "${W_PID[0]}" "${W_PID[1]}"
            sleep 1.3
            v=$(version "$d")
            [ $((v % 20)) -ge 8 ] && break
            kill -CONT "${W_PID[0]}" "${W_PID[1]}"; v=0
            sleep 0.3
        done
        if [ "$v" -gt 0 ]; then
            kill -KILL "$PS_PID"; wait "$PS_PID" 2>/dev/null
            ps "$d" "$port" "$mode"
            kill -CONT "${W_PID[0]}" "${W_PID[1]}"
        fi
        echo "$v" >"$d/killed_at"
    fi
    wait_for "${W_PID[0]}" "$run_limit"; echo $? >"$d/rc0"
    wait_for "${W_PID[1]}" "$run_limit"; echo $? >"$d/rc1"
    wait_for "$PS_PID" 10 >/dev/null
}

for mode in async sync; do
    run $mode $mode-ref 0
    run $mode $mode-kill 1
    d=$TMP/$mode-kill v=$(cat "$d/killed_at") lost_true=$(( $(cat "$d/killed_at") % 20 ))
    check "$mode: the undisturbed run finishes" test "$(cat "$TMP/$mode-ref/rc0")$(cat "$TMP/$mode-ref/rc1")" = 00
    check "$mode: server killed mid-run at version $v" test "$v" -gt 0
    check "$mode: the restarted shard restored its checkpoint of version $((v - lost_true))" \
        grep -q "restored version $((v - lost_true)) " "$d/ps.log"
    check "$mode: both workers finish by themselves after the restart (exit $(cat "$d/rc0") $(cat "$d/rc1"))" \
        test "$(cat "$d/rc0")$(cat "$d/rc1")" = 00
    check "$mode: the workers said HELLO again" grep -q "saying HELLO again" "$d/w0.log" "$d/w1.log"
    # The chief counts the versions it saw: in async the other worker's
    # last few pushes may have come after the chief's last reply.
    lost=$(json "$d/summary.json" updates_lost 2>/dev/null || echo -1)
    check "$mode: summary updates_lost $lost of the $lost_true lost (> 0, none invented)" \
        test "$lost" -le "$lost_true" -a "$lost" -gt 0
    check "$mode: the chief logged the loss" grep -q "update(s) since its checkpoint lost" "$d/w0.log"
    check "$mode: the metrics lines carry updates_lost" grep -q "\"updates_lost\":$lost" "$d/w0.jsonl"
    a=$(json "$TMP/$mode-ref/summary.json" test_accuracy 2>/dev/null || echo 0)
    b=$(json "$d/summary.json" test_accuracy 2>/dev/null || echo 1)
    check "$mode: accuracy after the restart $b within 1 point of the undisturbed $a" near "$a" "$b" 0.01
done

# (c) a sync worker dies: the other goes on within the bound, the dead one
# comes back with its task index and resumes where the server holds it.
d=$TMP/worker-kill port=$(free_port)
mkdir -p "$d"
ps "$d" "$port" sync
worker "$d" "$port" 0; worker "$d" "$port" 1
if wait_until 60 version_ge "$d" 60; then
    kill -KILL "${W_PID[1]}"; wait "${W_PID[1]}" 2>/dev/null
    t0=$(date +%s.%N)
    # The shard drops it (its log says so the moment it does) ...
    wait_until $((BOUND_S + 4)) grep -q "worker 1 silent" "$d/ps.log"
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    check "sync: the shard drops the dead worker ${dt} s after the kill (bound ${BOUND_S} s + 1 s slack)" \
        ge $(( (BOUND_S + 1) * SCALE )) "$dt"
    # ... and worker 0 goes on alone: the version moves again (the metrics
    # file is flushed each second, hence the margin).
    v0=$(version "$d")
    check "sync: worker 0 goes on alone" wait_until 10 version_ge "$d" $((v0 + 5))
    worker "$d" "$port" 1
    wait_for "${W_PID[1]}" "$run_limit"; rc1=$?
    wait_for "${W_PID[0]}" "$run_limit"; rc0=$?
    check "sync: the killed worker rejoins and finishes (exit $rc1), so does worker 0 (exit $rc0)" test "$rc0$rc1" = 00
    check "sync: the rejoining worker resumed after its held steps" grep -q "rejoining: the servers hold its steps" "$d/w1.log"
    check "sync: the shard counted it again" grep -q "worker 1 is back\|worker 1 joined" "$d/ps.log"
else
    fail "sync worker kill" "never reached version 60"
fi
wait_for "$PS_PID" 10 >/dev/null
finish
