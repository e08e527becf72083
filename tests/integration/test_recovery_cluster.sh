#!/usr/bin/env bash
# test_recovery_cluster: faults in a running cluster, daemons started by hand.
# Every fault is driven, not sampled: the server dies by the test hook
# DP_TEST_KILL_AT_VERSION (as by kill -9, on the chief's first push computed
# on version 70 or later, so the version it died at is in its log), and the
# waits are on log lines and versions.
#  (a) async, 2 workers, 1 shard checkpointing every 20 versions: the shard
#      dies between two checkpoints and is restarted with the same flags on
#      the same port; the workers say HELLO again by themselves and exit 0;
#      the restart restores the checkpoint before the death; the updates
#      lost are reported (log, metrics, summary updates_lost): at least the
#      versions the chief computed on, at most the true loss (another
#      worker's last pushes may come after the chief's last reply); the test
#      accuracy is within 1 point of an undisturbed run of the same length
#  (b) the same in sync mode, where the chief sees every version:
#      updates_lost equals the true loss
#  (c) sync, kill -9 of worker 1 of 2: worker 0 completes no step for at
#      most 6 s from the kill (docs/OPERATIONS.md: heartbeat timeout 5 s + one 1 s beat),
#      measured on worker 0's own metrics lines; worker 1 restarted with the
#      same --task-index is counted again ("is back", a line only a dropped
#      worker's return writes), resumes after the steps the server holds,
#      pulls before its first push (the requests the shard admitted, in
#      order, from its DP_LOG=debug log), and both finish
#  (d) a server back within two --timeouts: restarted half a --timeout
#      after both workers gave it up ("no reply in time; saying HELLO
#      again"), it is caught by their second HELLO and the run finishes
#  (e) a server that never comes back: the workers stop with "no reply"
#      after saying HELLO again, within two --timeouts (+ slack) of its death
# Waits and time bounds scale with DP_TEST_TIMEOUT_SCALE.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip recovery "Debian's dataset-fashion-mnist is not installed (make deps): its 35 checks not run"
    finish; exit
fi
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
STEPS=240                     # per worker
MODEL="fc:128 relu fc:10 softmax"
KILL_AT=70                    # the hook's version: 10 past the checkpoint at 60
BOUND_S=6                     # a dead sync worker holds the others for at most this (docs/OPERATIONS.md)
TIMEOUT=$((5 * SCALE))        # the workers' --timeout
free_port() { "$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }

# ps DIR PORT MODE: one shard for 2 workers, checkpoints in DIR/ck; appends to DIR/ps.log.
ps() {
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$2" --workers 2 --mode "$3" --model "$MODEL" \
        --seed 3 --lr-schedule "cosine:$((STEPS * 2))" --checkpoint-dir "$1/ck" --checkpoint-every 20 \
        --metrics "$1/ps.jsonl" --metrics-every 0.1 >>"$1/ps.log" 2>&1
    PS_PID=$!
}
# worker DIR PORT I: worker I, its log DIR/wI.log (appended), metrics DIR/wI.jsonl.
# Worker 0 reaches the shard through shared memory, worker 1 over ZeroMQ
# frames, where it pulls in parts (--stream-pull): a restart then tears
# pulls in parts too.
worker() {
    local extra=()
    [ "$3" = 0 ] && extra=(--summary "$1/summary.json")
    [ "$3" = 1 ] && extra=(--transport zmq)
    bg "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$2" --task-index "$3" --model "$MODEL" --seed 3 \
        --steps $STEPS --batch 32 --delay-ms 15 --timeout "$TIMEOUT" --threads 1 --no-progress \
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
# between LO HI V: LO <= V <= HI as floats.
between() { ge "$3" "$1" && ge "$2" "$3"; }
both_logged() { grep -q "$2" "$1/w0.log" && grep -q "$2" "$1/w1.log"; }
run_limit=$((60 * SCALE))
# hook_version DIR WHICH: from the hook's line in DIR/ps.log ("at version W
# (a push of worker 0 on version X)"), W (WHICH=at) or X (WHICH=on); -1 when
# it did not fire.
hook_version() {
    local v; v=$(grep -m1 -o "DP_TEST_KILL_AT_VERSION: dying .*" "$1/ps.log" |
                 sed -n "s/.* $2 version \([0-9]*\).*/\1/p")
    echo "${v:--1}"
}

# start_killed MODE DIR: a cluster of 1 shard and 2 workers in DIR whose
# shard dies by the hook; returns once it is dead, its status in DIR/ps_rc.
start_killed() {
    local port; port=$(free_port)
    mkdir -p "$2"; echo "$port" >"$2/port"
    DP_TEST_KILL_AT_VERSION=$KILL_AT ps "$2" "$port" "$1"
    worker "$2" "$port" 0; worker "$2" "$port" 1
    wait_for "$PS_PID" "$run_limit"; echo $? >"$2/ps_rc"
}
# finish_run DIR: wait for both workers (statuses in DIR/rc0, DIR/rc1) and the shard.
finish_run() {
    wait_for "${W_PID[0]}" "$run_limit"; echo $? >"$1/rc0"
    wait_for "${W_PID[1]}" "$run_limit"; echo $? >"$1/rc1"
    wait_for "$PS_PID" 10 >/dev/null
}

# Under the sanitizers, sync alone (its loss is exact): the shard's restore
# is the same code in both modes, and this script was the longest of CI's
# sanitized pass.
KILL_MODES="async sync"
[ "${DP_SANITIZED:-0}" = 1 ] && KILL_MODES=sync
for mode in $KILL_MODES; do
    # undisturbed
    d=$TMP/$mode-ref port=$(free_port)
    mkdir -p "$d"
    ps "$d" "$port" $mode; worker "$d" "$port" 0; worker "$d" "$port" 1
    finish_run "$d"
    check "$mode: the undisturbed run finishes" test "$(cat "$d/rc0")$(cat "$d/rc1")" = 00

    # killed by the hook, restarted at once with the same flags
    d=$TMP/$mode-kill
    start_killed $mode "$d"
    ps "$d" "$(cat "$d/port")" $mode
    finish_run "$d"
    w=$(hook_version "$d" at) x=$(hook_version "$d" on)
    ck=$(( w >= 0 ? w - w % 20 : -1 )) lost_true=$(( w >= 0 ? w % 20 : -1 ))
    check "$mode: the shard died by the hook as by kill -9 (status $(cat "$d/ps_rc")) at version $w >= $KILL_AT" \
        test "$(cat "$d/ps_rc")" = 137 -a "$w" -ge $KILL_AT
    check "$mode: the restarted shard restored its checkpoint of version $ck, the last before $w" \
        grep -q "restored version $ck " "$d/ps.log"
    check "$mode: both workers finish by themselves after the restart (exit $(cat "$d/rc0") $(cat "$d/rc1"))" \
        test "$(cat "$d/rc0")$(cat "$d/rc1")" = 00
    check "$mode: worker 0 said HELLO again" grep -q "saying HELLO again" "$d/w0.log"
    check "$mode: worker 1 said HELLO again" grep -q "saying HELLO again" "$d/w1.log"
    lost=$(json "$d/summary.json" updates_lost 2>/dev/null || echo -1)
    if [ $mode = sync ]; then
        # The shard's version was the chief's push's: the chief saw it.
        check "sync: summary updates_lost $lost = the $lost_true versions after the checkpoint" \
            test "$lost" = "$lost_true" -a "$w" = "$x"
    else
        # The chief computed on version x, so it saw at least x - ck lost.
        check "async: summary updates_lost $lost within [$((x - ck)), $lost_true] (the chief's view, none invented)" \
            test "$lost" -ge $((x - ck)) -a "$lost" -le "$lost_true" -a "$lost" -gt 0
    fi
    check "$mode: the chief logged the loss" grep -q "update(s) since its checkpoint lost" "$d/w0.log"
    check "$mode: the metrics lines carry updates_lost" grep -q "\"updates_lost\":$lost," "$d/w0.jsonl"
    a=$(json "$TMP/$mode-ref/summary.json" test_accuracy 2>/dev/null || echo 0)
    b=$(json "$d/summary.json" test_accuracy 2>/dev/null || echo 1)
    check "$mode: accuracy after the restart $b within 1 point of the undisturbed $a" near "$a" "$b" 0.01
done

# (c) a sync worker dies: the other goes on within the bound, the dead one
# comes back with its task index and resumes where the server holds it.
d=$TMP/worker-kill port=$(free_port)
mkdir -p "$d"
DP_LOG=debug ps "$d" "$port" sync
worker "$d" "$port" 0; worker "$d" "$port" 1
if wait_until 60 version_ge "$d" 60; then
    t_kill=$(now)
    kill -KILL "${W_PID[1]}"; wait "${W_PID[1]}" 2>/dev/null
    check "sync: the shard stops counting the dead worker (heartbeat timeout)" \
        wait_until $((BOUND_S + 10)) grep -q "worker 1 silent" "$d/ps.log"
    v0=$(version "$d")
    check "sync: worker 0 goes on alone" wait_until 10 version_ge "$d" $((v0 + 5))
    t_back=$(now)
    worker "$d" "$port" 1
    wait_for "${W_PID[1]}" "$run_limit"; rc1=$?
    wait_for "${W_PID[0]}" "$run_limit"; rc0=$?
    # The longest worker 0 went without completing a step, from the kill
    # until worker 1 was started again (the metrics lines' "t" is wall time).
    hold=$(grep '"status"' "$d/w0.jsonl" | "$TORCH_PY" -c '
import json, sys
a, b = float(sys.argv[1]), float(sys.argv[2])
ts = [json.loads(l)["t"] for l in sys.stdin]
last, gap = a, 0.0
for t in ts:
    if a < t <= b:
        gap, last = max(gap, t - last), t
print("%.2f" % gap)' "$t_kill" "$t_back")
    check "sync: the dead worker held worker 0 for $hold s (>= 3: it was held; <= $((BOUND_S * SCALE)) s, docs/OPERATIONS.md's bound)" \
        between 3 $((BOUND_S * SCALE)) "$hold"
    check "sync: the killed worker rejoins and finishes (exit $rc1), so does worker 0 (exit $rc0)" test "$rc0$rc1" = 00
    check "sync: the rejoining worker resumed after its held steps" grep -q "rejoining: the servers hold its steps" "$d/w1.log"
    check "sync: the shard counted it again (worker 1 is back, after it went silent)" \
        bash -c "sed -n '/worker 1 silent/,\$p' '$d/ps.log' | grep -q 'worker 1 is back'"
    # The shard's debug log lists each request it admits in arrival order:
    # after the dead worker's return, its first PULL comes before its first PUSH.
    first=$(sed -n '/worker 1 silent/,$p' "$d/ps.log" |
            grep -m1 -o -E "(PULL|PUSH) from worker 1$" | cut -d' ' -f1)
    check "sync: after its rejoin worker 1 pulls before its first push (the first of the two the shard got: ${first:-none})" \
        test "$first" = PULL
else
    fail "sync worker kill" "never reached version 60"
fi
wait_for "$PS_PID" 10 >/dev/null

# (d) and (e) wait out the workers' --timeout, which the sanitizers' scale
# makes 20 s: under them they are left out (the re-HELLO they lead to runs
# in (a) and (b) too), as most of this script's time there.
if [ "${DP_SANITIZED:-0}" = 1 ]; then
    skip_checks 8 "late and no restart" "the --timeout waits under the sanitizers (run in the plain pass)"
    finish; exit
fi
section_begin
# (d) back within two --timeouts: the shard is restarted only once both
# workers have given up the first wait and said HELLO again, and then half
# a --timeout into that second wait (a HELLO that waited less than its
# --timeout would be given up by then).
d=$TMP/late
start_killed async "$d"
check "late restart: the shard died by the hook (status $(cat "$d/ps_rc"))" test "$(cat "$d/ps_rc")" = 137
check "late restart: both workers gave up their first wait (--timeout $TIMEOUT s) and said HELLO again" \
    wait_until $((3 * TIMEOUT)) both_logged "$d" "no reply in time; saying HELLO again"
sleep "$(awk -v t="$TIMEOUT" 'BEGIN { print t / 2 }')"
ps "$d" "$(cat "$d/port")" async
finish_run "$d"
check "late restart: the second HELLO reaches it and both workers finish (exit $(cat "$d/rc0") $(cat "$d/rc1"))" \
    test "$(cat "$d/rc0")$(cat "$d/rc1")" = 00

# (e) never back: the workers stop with "no reply" within two --timeouts.
d=$TMP/gone
start_killed async "$d"
t_dead=$(now)
# A shard killed for good leaves its shared-memory segments (a restart
# would remove them): gone with it here.
rm -f /dev/shm/downpour-"$PS_PID"-*
rc=()
for i in 0 1; do
    wait_for "${W_PID[$i]}" $((4 * TIMEOUT)); rc[$i]=$?
done
dt=$(awk -v a="$t_dead" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
check "no restart: the shard died by the hook (status $(cat "$d/ps_rc"))" test "$(cat "$d/ps_rc")" = 137
check "no restart: both workers fail by themselves (exit ${rc[0]} ${rc[1]})" \
    bash -c "[ ${rc[0]} != 0 ] && [ ${rc[0]} != 124 ] && [ ${rc[1]} != 0 ] && [ ${rc[1]} != 124 ]"
check "no restart: ... within two --timeouts + 2 s of its death ($dt s, bound $((2 * TIMEOUT + 2 * SCALE)) s)" \
    ge $((2 * TIMEOUT + 2 * SCALE)) "$dt"
for i in 0 1; do
    check "no restart: worker $i said HELLO again, then stopped with 'no reply'" \
        bash -c "sed -n '/saying HELLO again/,\$p' '$d/w$i.log' | grep -q 'no reply in $TIMEOUT s'"
done
section_end "late and no restart" 8
finish
