#!/usr/bin/env bash
# test_a3c_elastic: an actor-critic crew is elastic as a dense one is
# (--workers MIN:MAX under downpour local): it grows by `downpour scale`,
# shrinks by it (SIGTERM to the highest: each leaves after a whole segment's
# push, exit 0), and outlives --chaos kills; whatever the crew did, the
# servers' account of the run's env steps is exact: every applied push is
# one segment of K x T steps, and the run stops at its budget (each live
# worker's segment in flight past it at most). A3C (async) and A2C (sync).
# Driven by the workers' hold hook (DP_TEST_HOLD_DIR: a worker holds before
# a segment while a file exists), never by timing.
source "$(dirname "$0")/lib.sh"

SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
RL=(--env cartpole-v1 --envs 1 --t-max 5 --threads 1 --no-progress)
hold() { mkdir -p "$1" && : >"$1/hold-$2-$3"; }
held() { wait_until test -s "$1/held-$2-$3"; }
release() { rm -f "$1"/hold-*; }
scale() { "$BIN/downpour" scale "$1" "$2" >/dev/null; }
# account DIR BUDGET LIVE: "ok ..." when summary.json's env steps are its
# applied pushes x 5 (one segment each), at least BUDGET and less than a
# segment per LIVE worker past it, none rejected; else what is off.
account() {
    "$TORCH_PY" - "$@" <<'PY'
import json, sys
d, budget, live = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(d + "/summary.json"))
n, a, rj = s["env_steps"], s["updates_applied"], s["updates_rejected"]
ok = n == 5 * a and budget <= n < budget + 5 * live and rj == 0
print(("ok " if ok else "off: ") + f"{n} env steps, {a} pushes applied, {rj} rejected, budget {budget}")
PY
}
# crew DIR: "JOINS LEAVES LIVE_MAX" of summary.json's membership.
crew() {
    "$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
m = s["membership"]
print(sum(e["event"] == "join" for e in m), sum(e["event"] == "leave" and e["why"] == "leave" for e in m), s["live_max"])' "$1"
}

# ---- grow and shrink by downpour scale, async (A3C) and sync (A2C) ---------
# The chief holds before segment 40 while the crew grows to 3 (in sync
# the hold is lifted once both have said HELLO: no version fires without
# the chief's push); workers 1 and 2 hold before their segment 10 (joined,
# each with 9 pushes made); then scale 1: the two highest get SIGTERM, end
# that segment whole and leave; the chief goes on alone to the budget.
for mode in async sync; do
    D=$TMP/$mode H=$TMP/$mode-holds budget=4000
    hold "$H" 0 40; hold "$H" 1 10; hold "$H" 2 10
    DP_TEST_HOLD_DIR=$H bg "$BIN/downpour" local "${RL[@]}" --workers 1:3 --mode $mode --env-steps $budget \
        --seed 3 --out "$D" >"$TMP/$mode.out" 2>"$TMP/$mode.err"
    LOCAL=$!
    held "$H" 0 40
    scale "$D" 3
    if [ $mode = sync ]; then
        started() { grep -q "worker $1/3: sync mode" "$D/logs/worker-$1.log" 2>/dev/null; }
        wait_until started 1 && wait_until started 2
        rm -f "$H/hold-0-40"
    fi
    held "$H" 1 10 && held "$H" 2 10
    check "$mode: scale 3: workers 1 and 2 joined and pushed" \
        bash -c "[ -s '$H/held-1-10' ] && [ -s '$H/held-2-10' ]"
    scale "$D" 1
    left() { grep -q "worker $1: left after step 10 on signal 15" "$D/logs/worker-$1.log" 2>/dev/null; }
    wait_until left 2 && wait_until left 1
    check "$mode: scale 1: workers 2 and 1 left after a whole segment (10), on SIGTERM" \
        bash -c "grep -q 'worker 2: left after step 10 on signal 15' '$D/logs/worker-2.log' && grep -q 'worker 1: left after step 10 on signal 15' '$D/logs/worker-1.log'"
    release "$H"
    wait_for $LOCAL $((120 * SCALE)); rc=$?
    check "$mode: the run ends, exit 0 (got $rc)" test $rc = 0
    a=$(account "$D" $budget 3 2>&1)
    check "$mode: the env-step budget exact: $a" bash -c "[[ '$a' == ok* ]]"
    c=$(crew "$D" 2>&1)
    check "$mode: summary.json's crew: 3 joins, 2 leaves, 3 live at most ($c)" test "$c" = "3 2 3"
done

# ---- --chaos: workers killed and replaced, the account still exact ---------
# Every life of workers 1 and 2 holds before segment 5 and the chief
# before 30, so the run cannot end before the launcher has killed (never
# the chief) and replaced twice; the launcher is then stopped (SIGSTOP)
# while each worker's one live process holds, the crew let go, and the
# launcher woken once the servers are stopping.
D=$TMP/chaos H=$TMP/chaos-holds budget=4000
hold "$H" 0 30; hold "$H" 1 5; hold "$H" 2 5
DP_TEST_HOLD_DIR=$H bg "$BIN/downpour" local "${RL[@]}" --workers 3:3 --mode async --env-steps $budget \
    --seed 4 --chaos kill:0.3 --heartbeat-timeout 2 --out "$D" >"$TMP/chaos.out" 2>"$TMP/chaos.err"
LOCAL=$!
has() { [ "$(grep -c -- "$2" "$3" 2>/dev/null)" -ge "$1" ]; }
settled() {
    local w pids
    kill -STOP $LOCAL
    for w in 0 1 2; do
        pids=$(pgrep -f -- "--metrics $D/metrics/worker-$w.jsonl")
        [ -n "$pids" ] || { kill -CONT $LOCAL; return 1; }
        [ "$pids" = "$(cat "$H/held-$w-$([ $w = 0 ] && echo 30 || echo 5)" 2>/dev/null)" ] || { kill -CONT $LOCAL; return 1; }
    done
}
wait_until has 2 'worker [12] started' "$TMP/chaos.err" && wait_until settled
release "$H"
wait_until grep -q 'SHUTDOWN from worker 0' "$D/logs/ps-0.log"
kill -CONT $LOCAL
wait_for $LOCAL $((120 * SCALE)); rc=$?
check "chaos: the run finished (exit 0, got $rc)" test "$rc" = 0
check "chaos: workers killed and replaced, never the chief" \
    bash -c "grep -q -- '--chaos: worker [12] killed' '$TMP/chaos.err' && ! grep -q -- '--chaos: worker 0 killed' '$TMP/chaos.err'"
a=$(account "$D" $budget 3 2>&1)
check "chaos: the env-step budget exact: $a" bash -c "[[ '$a' == ok* ]]"
finish
