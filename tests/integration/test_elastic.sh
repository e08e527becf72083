#!/usr/bin/env bash
# test_elastic: a crew that changes while it trains (--workers MIN:MAX),
# under `downpour local` and by hand. Every change is driven at a step a
# worker holds (the hook DP_TEST_HOLD_DIR, worker/train/distributed.c: it waits
# with that step's batch in hand, its heartbeats going on, until the test
# lets it go), so no run can end, nor any worker get ahead, while the test
# acts; every check is on what the run wrote (record, summary, logs), never
# on timing:
#  (a) sync 1:4: one worker starts, `downpour scale` adds two, one of them
#      is killed by SIGKILL (the launcher starts it again: it resumes), then
#      scale 1 sends SIGTERM to the two highest (each leaves after a whole
#      step and exits 0); the record replays with every step's norms
#      matched (each step's mean over exactly the gradients it aggregated,
#      recomputed by a shard fed the same gradients); no worker pushed a
#      gradient computed on a version older than the one it joined at;
#      summary.json's membership, live_min / live_max and the metrics
#      events agree with what was done
#  (b) async and (c) ssp 1:4: a crew growing 1 -> 4 -> 1; ssp's staleness
#      bound over the live workers holds in the record; each replays
#  (d) --chaos kill:SECONDS: workers killed and replaced, the run finishes
#  (e) by hand: an elastic worker's SIGTERM is a leave (exit 0, "left" in
#      the shard's log; the chief, who sets the data plan, beside it); a
#      fixed crew's is still a stop (143); the chief's
#      too is a leave, the run goes on, and a chief that comes back resumes
#      and ends the run; its summary's updates_rejected counts pushes only,
#      requests_refused beside it
#  (f) refusals: MIN above MAX, a task index at or above MAX, --chaos on a
#      fixed crew, a scale above MAX (refused by the command, exit 2; a
#      request written by hand ignored with a line), scale with no
#      launcher listening, a scale request that is not a number
#  (g) every sample once, in every mode: an epoch with joins, a SIGKILL and
#      SIGTERM leaves trains each batch of shard 0's deal exactly once (the
#      record's applied pushes), the killed worker's batch in flight again
#      and counted in summary.json's epoch_samples (as many as shard 0's
#      log says it held); the replay trains the dealt batches bit for bit;
#      a worker with another data plan is refused with one line
#  (i) summary.json's images_per_s is what the crew trained over the time
#      it took (a sync crew of 2 with room for 4), not the chief's rate
#      times MAX
#  (h) downpour sim --churn: a simulated elastic crew changing on the
#      simulated clock, by leaves (after the push in flight) and by deaths
#      (the push lost): every batch of the record applied once, none
#      repeated but a dead worker's, counted; the same flags give the same
#      bits, and the record replays them; the refusals
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip elastic "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
MODEL="fc:64 relu fc:10 softmax"
COMMON=(--model "$MODEL" --batch 32 --threads 1 --no-progress)
# The holds below keep a dealt batch in a worker's hand for as long as the
# test acts (seconds on a loaded machine): past shard 0's lease (at least
# 5 s) it would be dealt again and counted repeated. The leases have their
# own test (test_deal's test_lease, on a clock it drives).
export DP_TEST_LEASE_FLOOR=3600

# has N PATTERN FILE: FILE has at least N lines matching PATTERN.
has() { [ "$(grep -c -- "$2" "$3" 2>/dev/null)" -ge "$1" ]; }
# hold DIR TASK STEP: worker TASK of a run with DP_TEST_HOLD_DIR=DIR holds
# with step STEP's batch in hand, before computing it (every life of it
# that reaches that step), until `release` or a SIGTERM lets it go.
hold() { mkdir -p "$1" && : >"$1/hold-$2-$3"; }
# pid_other FILE PID: FILE holds a pid, not PID.
pid_other() { [ -s "$1" ] && [ "$(cat "$1")" != "$2" ]; }
# held DIR TASK STEP [PID]: wait (at most 120 s) until worker TASK holds
# there (a process other than PID: a later life); its pid, or 1 if never.
held() {
    wait_until pid_other "$1/held-$2-$3" "${4:-}" && cat "$1/held-$2-$3"
}
# release DIR [TASK STEP]: let that hold go (without TASK STEP: every hold of DIR).
release() { if [ $# = 3 ]; then rm -f "$1/hold-$2-$3"; else rm -f "$1"/hold-*; fi; }
scale() { "$BIN/downpour" scale "$1" "$2" >/dev/null; }
# record_check FILE MODE S: the record's invariants (python below), one
# line "ok ..." or the first violation.
record_check() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
path, mode, S = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l) for l in open(path)]
ev = [e for e in lines if "e" in e]
version, joined_at, state, bad, pushes, stale_max, live_max = 0, {}, "", [], 0, 0, 0
for e in ev:
    if e["e"] == "members":
        for w, c in enumerate(e["m"]):
            was = state[w] if w < len(state) else "G"
            if c == "L" and was != "L":
                joined_at[w] = version
        state = e["m"]
        live_max = max(live_max, state.count("L"))
    elif e["e"] == "push":
        pushes += 1
        w = e["w"]
        if e["v"] < joined_at.get(w, 0):
            bad.append(f"worker {w} pushed on version {e['v']}, older than its join at {joined_at[w]}")
        if e["st"] == "applied":
            stale_max = max(stale_max, e["stale"])
        version = max(version, e["after"])
if mode == "ssp" and stale_max > (live_max - 1) * (2 * S + 1):
    bad.append(f"ssp staleness {stale_max} over the bound {(live_max - 1) * (2 * S + 1)} of {live_max} live")
print(bad[0] if bad else f"ok {pushes} pushes, {live_max} live at most, staleness max {stale_max}")
EOF
}
# summary_crew DIR: "JOINS LEAVES WHYS LIVE_MIN LIVE_MAX" from summary.json.
summary_crew() {
    "$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
m = s["membership"]
j = sum(e["event"] == "join" for e in m); l = sum(e["event"] == "leave" for e in m)
print(j, l, ",".join(sorted({e["why"] for e in m})), s["live_min"], s["live_max"])' "$1"
}

# ---- (a) sync 1:4 under downpour local ------------------------------------
# The chief holds at step 40 while the crew grows (no version fires
# without it); worker 2 dies holding step 5 (the crew waits for its
# gradient); its next life, the crew of 3 waiting on it, holds at step 15
# while the crew shrinks. The heartbeat timeout is long, so the death is
# seen when the next life says HELLO, not by a crew that went on without it.
A=$TMP/sync HA=$TMP/sync-holds
hold "$HA" 0 40; hold "$HA" 2 5; hold "$HA" 2 15
DP_TEST_HOLD_DIR=$HA bg "$BIN/downpour" local --workers 1:4 --mode sync "${COMMON[@]}" --steps 40 \
    --delay-ms 5 --heartbeat-timeout $((60 * SCALE)) --seed 5 --out "$A" --record "$A/rec.jsonl" \
    >"$TMP/a.out" 2>"$TMP/a.err"
LOCAL=$!
held "$HA" 0 40 >/dev/null && scale "$A" 3
check "sync: scale 3 taken" grep -q "scale to 3 worker(s)" "$TMP/a.err"
"$BIN/downpour" scale "$A" 5 >"$TMP/s5.out" 2>"$TMP/s5.err"; rc=$?
check "scale 5 above MAX 4: the command refuses it (exit $rc), one line naming MAX" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/s5.err') = 1 ] && [ ! -s '$TMP/s5.out' ] && grep -q 'above the MAX 4' '$TMP/s5.err'"
# requests written by hand: the launcher's own checks
printf '5\n' >"$A/scale.request.tmp" && mv "$A/scale.request.tmp" "$A/scale.request"
wait_until test ! -e "$A/scale.request"
printf 'many\n' >"$A/scale.request.tmp" && mv "$A/scale.request.tmp" "$A/scale.request"
wait_until test ! -e "$A/scale.request"
# both newcomers said HELLO (the step the chief holds waits for them)
wait_until has 1 'worker 1 joined' "$A/logs/ps-0.log" && wait_until has 1 'worker 2 joined' "$A/logs/ps-0.log"
release "$HA" 0 40
# worker 2 has had steps applied (steps 0..4) before it dies with step 5's batch
W2=$(held "$HA" 2 5) && kill -KILL "$W2"
release "$HA" 2 5
# its next life said HELLO, resumed at step 5 and trained with the crew before it shrinks
held "$HA" 2 15 "$W2" >/dev/null && scale "$A" 1
wait_for $LOCAL $((120 * SCALE)); rc=$?
check "sync: the run finished (exit 0)" test "$rc" = 0
check "sync: the launcher survived the SIGKILL and started worker 2 again" \
    bash -c "grep -q 'worker 2 killed by signal 9; the run goes on' '$TMP/a.err' &&
             test \$(grep -c 'worker 2 started' '$TMP/a.err') -ge 2"
check "sync: worker 2 resumed after the steps the servers held" grep -q "rejoining" "$A/logs/worker-2.2.log"
check "sync: scale 1 sent SIGTERM to workers 2 and 1, the highest" \
    bash -c "grep -q 'worker 2 asked to leave' '$TMP/a.err' && grep -q 'worker 1 asked to leave' '$TMP/a.err'"
check "sync: the leavers left after a whole step and exited 0" \
    bash -c "grep -q 'worker 1: left after step' '$A/logs/worker-1.log' &&
             grep -q 'worker 1 left before its last step' '$A/logs/ps-0.log'"
read -r J L WHY LMIN LMAX <<<"$(summary_crew "$A")"
# worker 2's restart is a leave (gone after the heartbeat timeout, or
# replaced when its new process says HELLO first) and a join
check "sync: summary membership: 4 joins and 4 leaves, by leave, gone or replaced, finished ($J $L $WHY)" \
    bash -c "[ $J = 4 ] && [ $L = 4 ] && [[ $WHY == *leave* ]] && [[ $WHY == *hello* ]] && [[ $WHY == *finished* ]] &&
             [[ $WHY =~ gone|replaced ]]"
check "sync: live_min 1, live_max 3 ($LMIN $LMAX)" test "$LMIN $LMAX" = "1 3"
check "sync: the shard's metrics hold the same events" \
    bash -c "test \$(grep -c '\"event\":\"join\"' '$A/metrics/ps-0.jsonl') = $J"
check "sync: the chief logged the crew's changes, its metrics and TensorBoard carry workers" \
    bash -c "grep -q 'chief: 3 workers live at step' '$A/logs/worker-0.log' &&
             grep -q '\"workers\":3' '$A/metrics/worker-0.jsonl' && grep -qa workers '$A'/tensorboard/*"
OUT=$(record_check "$A/rec.jsonl" sync 0)
check "sync record: no newcomer pushed on weights older than its join ($OUT)" test "${OUT:0:2}" = ok
"$BIN/downpour" replay "$A/rec.jsonl" --out "$TMP/a-replay" >"$TMP/a-replay.log" 2>&1
check "sync: the replay matches every recorded step" grep -q "every recorded norm matched" "$TMP/a-replay.log"

# ---- (b, c) async and ssp 1:4: 1 -> 4 -> 1 --------------------------------
# The chief holds at step 30 while the crew grows; each newcomer pushes
# twice and holds its third step until the launcher asked it to leave, so
# none can finish its steps first however busy the machine is. Ssp's bound
# keeps the chief within a push of them, so it goes on once they are in;
# nothing would stop an async chief, so it holds until the crew shrank.
for mode in async ssp; do
    D=$TMP/$mode H=$TMP/$mode-holds
    hold "$H" 0 30; for w in 1 2 3; do hold "$H" $w 2; done
    DP_TEST_HOLD_DIR=$H bg "$BIN/downpour" local --workers 1:4 --mode $mode --staleness 1 "${COMMON[@]}" \
        --steps 20 --delay-ms 5 --seed 6 --out "$D" --record "$D/rec.jsonl" >"$TMP/$mode.out" 2>"$TMP/$mode.err"
    LOCAL=$!
    held "$H" 0 30 >/dev/null && scale "$D" 4
    for w in 1 2 3; do wait_until has 1 "worker $w joined" "$D/logs/ps-0.log"; done
    [ $mode = ssp ] && release "$H" 0 30
    for w in 1 2 3; do held "$H" $w 2 >/dev/null; done
    scale "$D" 1
    wait_until has 3 'asked to leave' "$TMP/$mode.err"
    release "$H"
    wait_for $LOCAL $((120 * SCALE)); rc=$?
    check "$mode: 1 -> 4 -> 1 finished (exit 0)" test "$rc" = 0
    read -r J L WHY LMIN LMAX <<<"$(summary_crew "$D")"
    check "$mode: 4 joins, 3 left before their last step ($J $WHY, live max $LMAX)" \
        bash -c "[ $J -ge 4 ] && [ \$(grep -c 'left before its last step' '$D/logs/ps-0.log') = 3 ] && [ $LMAX = 4 ]"
    OUT=$(record_check "$D/rec.jsonl" $mode 1)
    check "$mode record: ${mode/ssp/the staleness bound over the live workers holds, }joins ($OUT)" \
        test "${OUT:0:2}" = ok
    "$BIN/downpour" replay "$D/rec.jsonl" --out "$TMP/$mode-replay" >"$TMP/$mode-replay.log" 2>&1
    check "$mode: the replay matches every recorded step" grep -q "every recorded norm matched" "$TMP/$mode-replay.log"
done

# ---- (d) --chaos -----------------------------------------------------------
# Every life of every worker holds at step 5, so none can end the run
# before the launcher killed (never the chief) and replaced four. Then the
# launcher is stopped (SIGSTOP: no kill, no start) at a moment when each
# worker has one live process and it holds, so no process can come after
# the run ended; the crew is let go, and the launcher woken at the end.
D=$TMP/chaos H=$TMP/chaos-holds
for w in 0 1 2; do hold "$H" $w 5; done
DP_TEST_HOLD_DIR=$H bg "$BIN/downpour" local --workers 3:3 --mode async "${COMMON[@]}" --steps 20 \
    --delay-ms 5 --chaos kill:0.5 --heartbeat-timeout 2 --out "$D" >"$TMP/chaos.out" 2>"$TMP/chaos.err"
LOCAL=$!
# settled: the launcher stopped, each worker's one live process holds (a
# worker with none waits for its restart: the launcher goes on meanwhile)
settled() {
    local w pids
    kill -STOP $LOCAL
    for w in 0 1 2; do
        pids=$(pgrep -f -- "--metrics $D/metrics/worker-$w.jsonl")
        [ -n "$pids" ] || { kill -CONT $LOCAL; return 1; }
        [ "$pids" = "$(cat "$H/held-$w-5" 2>/dev/null)" ] || return 1
    done
}
wait_until has 4 'worker [12] started' "$TMP/chaos.err" && wait_until settled
release "$H"
wait_until grep -q 'stopping at version' "$D/logs/ps-0.log"
kill -CONT $LOCAL
wait_for $LOCAL $((120 * SCALE)); rc=$?
check "chaos: the run finished (exit 0)" test "$rc" = 0
check "chaos: workers killed and replaced" \
    bash -c "grep -q -- '--chaos: worker [12] killed' '$TMP/chaos.err' && grep -q 'worker [12] started' '$TMP/chaos.err'"
check "chaos: never the chief" bash -c "! grep -q -- '--chaos: worker 0 killed' '$TMP/chaos.err'"

# ---- (i) images_per_s: the crew's samples over its time ---------------------
# A sync crew of 2 with room for 4 (--workers 2:4): the chief trains about
# half of the epoch, so its own rate times MAX (what summary.json said) is
# about twice the crew's. The rate is the epoch's samples over crew_train_s
# (the chief's loop and its wait for the last worker), which lies between
# the chief's train_s and its wall_s, so the rate lies between the samples
# over each of those too (0.5 % for the rounding of printed figures).
D=$TMP/rate
"$BIN/downpour" local --workers 2:4 --mode sync "${COMMON[@]}" --epochs 1 --train-samples 3200 --seed 5 \
    --out "$D" >"$TMP/rate.out" 2>"$TMP/rate.err"; rc=$?
RATE=$("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
n = sum(e["trained"] for e in s["epoch_samples"])
lo, hi, r, t = n / s["wall_s"], n / s["train_s"], s["images_per_s"], s.get("crew_train_s", 0)
ok = n == 3200 and lo * 0.995 <= r <= hi * 1.005 and abs(r * t - n) <= 0.005 * n
print("%s %.0f images/s: %d samples over %.2f s (chief %.2f, wall %.2f: [%.0f, %.0f])" % (
      "ok" if ok else "off", r, n, t, s["train_s"], s["wall_s"], lo, hi))' "$D/summary.json" 2>&1)
check "sync 2:4: images_per_s is the crew's samples over its time (exit $rc; $RATE)" \
    bash -c "[ $rc = 0 ] && [ '${RATE:0:2}' = ok ]"

# ---- (e) by hand: SIGTERM is a leave in an elastic crew, a stop in a fixed one
PORT=$("$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# hand_ps CREW LOG: an async shard on PORT in the background (PS its pid).
hand_ps() {
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$PORT" --workers "$1" --mode async --model "$MODEL" >"$2" 2>&1
    PS=$!
}
# hand_worker TASK STEPS LOG [FLAG...]: a worker of that shard in the
# background (W its pid), holding where HH asks it to (hold "$HH" ...).
HH=$TMP/hand-holds
hand_worker() {
    local task=$1 steps=$2 log=$3; shift 3
    DP_TEST_HOLD_DIR=$HH bg "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$PORT" --task-index "$task" \
        "${COMMON[@]}" --steps "$steps" --delay-ms 5 "$@" >"$log" 2>&1
    W=$!
}
for crew in 1:2 2; do
    hand_ps $crew "$TMP/hand-ps.log"
    # an elastic crew's data plan is the chief's (server/loop/ps_deal.c): it
    # joins first and holds at its step 1
    C=
    if [ $crew = 1:2 ]; then
        hold "$HH" 0 1
        hand_worker 0 100000 "$TMP/hand-w0.log"
        C=$W
        held "$HH" 0 1 >/dev/null
    fi
    # the SIGTERM comes mid-run, while worker 1 holds step 20
    hold "$HH" 1 20
    hand_worker 1 100000 "$TMP/hand-w1.log"
    held "$HH" 1 20 >/dev/null && kill -TERM $W
    wait_for $W 30; rc=$?
    release "$HH"
    if [ $crew = 2 ]; then
        check "fixed crew: a worker's SIGTERM is a stop (143)" test "$rc" = 143
    else
        check "elastic: a worker's SIGTERM is a leave (exit 0)" test "$rc" = 0
        check "elastic: the shard logged it" grep -q "worker 1 left before its last step" "$TMP/hand-ps.log"
        "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$PORT" --task-index 2 "${COMMON[@]}" --steps 1 \
            --timeout 5 >"$TMP/hand-w2.log" 2>&1
        check "elastic: task index 2 of MAX 2 refused" grep -q "out of range" "$TMP/hand-w2.log"
        kill -TERM $C; wait_for $C 30 >/dev/null
    fi
    kill -TERM $PS; wait_for $PS 10 >/dev/null
done

# ---- (e2) the chief leaves and comes back -----------------------------------
# Worker 1 holds at step 20 until the chief is back, so the run cannot end
# without it; the chief leaves while it holds step 20 too.
hand_ps 1:2 "$TMP/chief-ps.log"
hold "$HH" 1 20; hold "$HH" 0 20
hand_worker 1 40 "$TMP/chief-w1.log"
W1=$W
hand_worker 0 40 "$TMP/chief-a.log"
C=$W
held "$HH" 0 20 >/dev/null && held "$HH" 1 20 >/dev/null && kill -TERM $C
wait_for $C 30; rc=$?
check "the chief's SIGTERM is a leave too (exit 0), and the run goes on" \
    bash -c "[ $rc = 0 ] && grep -q 'worker 0 left before its last step (1 live)' '$TMP/chief-ps.log' && kill -0 $W1"
release "$HH" 0 20
hand_worker 0 40 "$TMP/chief-b.log" --summary "$TMP/chief-summary.json"
C=$W
wait_until grep -q 'rejoining' "$TMP/chief-b.log"
release "$HH"
wait_for $C 60; rc=$?
wait_for $PS 30; ps_rc=$?
check "a chief that comes back resumes, ends the run and stops the servers" \
    bash -c "[ $rc = 0 ] && [ $ps_rc = 0 ] && grep -q 'rejoining: the servers hold its steps' '$TMP/chief-b.log' &&
             test -s '$TMP/chief-summary.json'"
RJ=$(json "$TMP/chief-summary.json" updates_rejected 2>/dev/null) RR=$(json "$TMP/chief-summary.json" requests_refused 2>/dev/null)
check "summary.json: updates_rejected counts pushes, refused requests apart (rejected $RJ, requests_refused $RR)" \
    bash -c "[ '$RJ' = 0 ] && [ -n '$RR' ] && [ '$RR' -ge 0 ]"

# ---- (f) refusals ------------------------------------------------------------
"$BIN/downpour-ps" --workers 3:2 >"$TMP/r1.log" 2>&1; rc=$?
check "MIN above MAX: one line, exit 2" bash -c "[ $rc = 2 ] && grep -q 'MIN 3 is above MAX 2' '$TMP/r1.log' && [ \$(wc -l <'$TMP/r1.log') = 1 ]"
# Shards that disagree on the crew: the worker names both ranges.
P2=$("$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$PORT" --shard 0/2 --workers 1:4 --mode async --model "$MODEL" >"$TMP/m0.log" 2>&1; M0=$!
bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$P2" --shard 1/2 --workers 4 --mode async --model "$MODEL" >"$TMP/m1.log" 2>&1; M1=$!
"$BIN/downpour-worker" --ps "tcp://127.0.0.1:$PORT,tcp://127.0.0.1:$P2" --task-index 0 "${COMMON[@]}" --steps 2 \
    --timeout 10 >"$TMP/mw.log" 2>&1; rc=$?
check "shards with different crews: the worker stops with one line naming both (1:4 and 4)" \
    bash -c "[ $rc != 0 ] && grep -q 'runs async with 4 workers, R=.* runs async with 1:4 workers' '$TMP/mw.log'"
kill -TERM $M0 $M1; wait_for $M0 30 >/dev/null; wait_for $M1 30 >/dev/null
"$BIN/downpour" local --workers 2 --chaos kill:5 >"$TMP/r2.log" 2>&1; rc=$?
check "--chaos on a fixed crew: refused (exit 2)" bash -c "[ $rc = 2 ] && grep -q 'needs an elastic crew' '$TMP/r2.log'"
check "scale above MAX: ignored, with a line" grep -q "scale 5 ignored: above --workers 1:4's MAX" "$TMP/a.err"
check "a scale request that is not a count: ignored, with a line" \
    grep -q "scale request ignored: scale 'many'" "$TMP/a.err"
mkdir -p "$TMP/nobody"
"$BIN/downpour" scale "$TMP/nobody" 2 >"$TMP/r3.log" 2>&1; rc=$?
check "scale with no launcher: fails at once (no lock held), no request left" \
    bash -c "[ $rc = 1 ] && grep -q 'no downpour local --workers MIN:MAX runs on' '$TMP/r3.log' && [ ! -e '$TMP/nobody/scale.request' ]"
"$BIN/downpour" scale "$TMP/missing" 2 >"$TMP/r4.log" 2>&1; rc=$?
check "scale of a missing directory: one line" bash -c "[ $rc = 1 ] && grep -q 'no such directory' '$TMP/r4.log'"
"$BIN/downpour" scale "$TMP/nobody" 0 >"$TMP/r5.log" 2>&1; rc=$?
check "scale 0: refused (exit 2)" test "$rc" = 2

# ---- (g) every sample once, whoever trains it --------------------------------
# samples_check REC EPOCHS BATCHES: shard 0's applied pushes in the record
# name each (epoch, batch) of the run exactly once: one line "ok ..." or
# the first violation.
samples_check() {
    "$TORCH_PY" - "$@" <<'EOF'
import collections, json, sys
path, epochs, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = collections.Counter()
for l in open(path):
    e = json.loads(l)
    if e.get("e") == "push" and e["s"] == 0 and e["st"] == "applied":
        seen[(e["be"], e["bi"])] += 1
want = {(ep, b) for ep in range(epochs) for b in range(batches)}
bad = [f"batch {k} applied {n} times" for k, n in sorted(seen.items()) if n != 1 or k not in want]
bad += [f"batch {k} never applied" for k in sorted(want - set(seen))]
print(bad[0] if bad else f"ok {len(seen)} batches applied once each")
EOF
}
# epoch_samples DIR: "TRAINED REPEATED RETRAINED" of each epoch, from summary.json.
epoch_samples() {
    "$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(" ".join("%d:%d:%d" % (e["trained"], e["repeated"], e["retrained_after_death"])
               for e in s["epoch_samples"]))' "$1"
}
# 2 epochs of 200 batches of 32. Workers 1 and 2 join while the chief holds
# at step 10; worker 2 is killed holding step 20's batch while the launcher
# is stopped (SIGSTOP), so the servers take it for dead (the heartbeat
# timeout) and deal that batch to another before its next life comes;
# worker 1 holds at step 25 until that life said HELLO (it resumes at step
# 20), then both leave by SIGTERM while the next life holds at step 30.
# Sync keeps worker 1 and the chief in step with the others, ssp within a
# push; async does not: there the chief holds until the crew shrank and
# worker 1 at step 20 until the death too. Under the sanitizers, async
# alone: the dealer's code is the same in every mode (test_deal runs it
# under them call by call), and the three runs were the longest part of
# CI's sanitized pass.
ONCE_MODES="sync async ssp"
[ "${DP_SANITIZED:-0}" = 1 ] && ONCE_MODES=async
for mode in $ONCE_MODES; do
    D=$TMP/once-$mode H=$TMP/once-$mode-holds
    hold "$H" 0 10; hold "$H" 2 20; hold "$H" 1 25; hold "$H" 2 30
    [ $mode = async ] && hold "$H" 1 20
    DP_TEST_HOLD_DIR=$H bg "$BIN/downpour" local --workers 1:3 --mode $mode --staleness 1 "${COMMON[@]}" \
        --epochs 2 --train-samples 6400 --delay-ms 2 --heartbeat-timeout 2 --seed 7 --out "$D" \
        --record "$D/rec.jsonl" >"$TMP/once-$mode.out" 2>"$TMP/once-$mode.err"
    LOCAL=$!
    held "$H" 0 10 >/dev/null && scale "$D" 3
    wait_until has 1 'worker 1 joined' "$D/logs/ps-0.log" && wait_until has 1 'worker 2 joined' "$D/logs/ps-0.log"
    [ $mode = async ] || release "$H" 0 10
    W2=$(held "$H" 2 20) && kill -STOP $LOCAL && kill -KILL "$W2"
    release "$H" 2 20
    wait_until grep -q 'worker 2 gone with 1 batch' "$D/logs/ps-0.log"
    [ $mode = async ] && release "$H" 1 20
    held "$H" 1 25 >/dev/null
    kill -CONT $LOCAL
    wait_until grep -q rejoining "$D/logs/worker-2.2.log"
    [ $mode = async ] || release "$H" 1 25
    held "$H" 2 30 >/dev/null && scale "$D" 1
    wait_until has 2 'asked to leave' "$TMP/once-$mode.err"
    release "$H"
    wait_for $LOCAL $((120 * SCALE)); rc=$?
    check "$mode once: joins, a SIGKILL and SIGTERM leaves, the run finished (exit 0)" \
        bash -c "[ $rc = 0 ] && grep -q 'worker 2 killed by signal 9' '$TMP/once-$mode.err' &&
                 grep -q 'worker 1: left after step' '$D/logs/worker-1.log'"
    OUT=$(samples_check "$D/rec.jsonl" 2 200)
    check "$mode once: every batch of both epochs applied exactly once ($OUT)" test "${OUT:0:2}" = ok
    # the killed worker's batch in flight (it held one): back to the pool, dealt again, counted
    LOST=$(grep -o 'worker 2 \(gone\|replaced\) with [0-9]* batch' "$D/logs/ps-0.log" | grep -o '[0-9]* batch' |
           awk '{ n += $1 } END { print n + 0 }')
    read -r E0 E1 <<<"$(epoch_samples "$D")"
    R=$((LOST * 32))
    check "$mode once: epoch_samples: 6400 trained a epoch, $R repeated, all after a death ($E0 $E1; $LOST lost batch)" \
        bash -c "[ $LOST = 1 ] && { [ '$E0 $E1' = '6400:$R:$R 6400:0:0' ] || [ '$E0 $E1' = '6400:0:0 6400:$R:$R' ]; }"
    "$BIN/downpour" replay "$D/rec.jsonl" --out "$TMP/once-$mode-replay" >"$TMP/once-$mode-replay.log" 2>&1
    ACC=$("$TORCH_PY" -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' "$D/summary.json")
    check "$mode once: the replay trains the dealt batches bit for bit (accuracy $ACC)" \
        bash -c "grep -q 'every recorded norm matched' '$TMP/once-$mode-replay.log' &&
                 grep -q 'test accuracy $ACC' '$TMP/once-$mode-replay.log'"
done
# A worker whose data plan differs from the crew's is refused with one line.
hand_ps 1:2 "$TMP/plan-ps.log"
hold "$HH" 0 2
hand_worker 0 2000 "$TMP/plan-w0.log"
held "$HH" 0 2 >/dev/null
"$BIN/downpour-worker" --ps "tcp://127.0.0.1:$PORT" --task-index 1 "${COMMON[@]}" --steps 60 \
    --timeout 5 >"$TMP/plan-w1.log" 2>&1; rc=$?
check "a worker with another data plan: refused, one line naming both" \
    bash -c "[ $rc != 0 ] && grep -q 'data plan mismatch: the servers deal 4000 batches of 32' '$TMP/plan-w1.log' &&
             grep -q 'this worker.s is 120 of 32' '$TMP/plan-w1.log'"
# the worker leaves before its server stops (its SIGTERM lets the hold go):
# a server gone first leaves its leave unanswered, and wait_for then waited
# out its 30 s
kill -TERM $W; wait_for $W 30 >/dev/null
release "$HH"
kill -TERM $PS; wait_for $PS 30 >/dev/null

# ---- (h) downpour sim --churn ------------------------------------------------------
# once_check REC RESULT: the record's applied pushes name each batch at most
# once, every batch of each epoch before the last; the result's epoch_samples
# agree: "ok DEATHS REPEATED RETRAINED" or the first violation.
once_check() {
    "$TORCH_PY" - "$@" <<'EOF'
import collections, json, sys
seen = collections.Counter()
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e.get("e") == "push" and e["st"] == "applied":
        seen[(e["be"], e["bi"])] += 1
r = json.loads(open(sys.argv[2]).read().splitlines()[-1])
eps = r["epoch_samples"]
bad = [f"batch {k} applied {n} times" for k, n in sorted(seen.items()) if n != 1]
for e in eps[:-1]:
    got = sum(1 for (ep, _) in seen if ep == e["epoch"])
    if got != e["batches"] or e["trained"] != 6400:
        bad.append(f"epoch {e['epoch']}: {got} of {e['batches']} batches applied, {e['trained']} trained")
rep = sum(e["repeated"] for e in eps)
ret = sum(e["retrained_after_death"] for e in eps)
gone = sum(1 for l in open(sys.argv[2]) if '"why":"gone"' in l)
if not r["joins"] or not r["leaves"] or not (2 <= r["live_min"] <= r["live_max"] <= 5):
    bad.append(f"joins {r['joins']} leaves {r['leaves']} live {r['live_min']}..{r['live_max']}")
print(bad[0] if bad else f"ok {gone} {rep} {ret}")
EOF
}
SIMF=(--model "$MODEL" --batch 32 --train-samples 6400 --compute exp:50 --updates 500 --json)
"$BIN/downpour" sim --workers 2:5 --churn leave:0.4 --mode async "${SIMF[@]}" --record "$TMP/sl.jsonl" \
    >"$TMP/sl.out" 2>"$TMP/sl.err"; rc=$?
OUT=$(once_check "$TMP/sl.jsonl" "$TMP/sl.out" 2>&1)
check "sim --churn leave: exit $rc; each batch applied once, nothing repeated ($OUT)" \
    bash -c "[ $rc = 0 ] && [ '$OUT' = 'ok 0 0 0' ]"
"$BIN/downpour" sim --workers 2:5 --churn kill:0.4 --mode sync "${SIMF[@]}" --record "$TMP/sk.jsonl" \
    --out "$TMP/sk" >"$TMP/sk.out" 2>"$TMP/sk.err"; rc=$?
read -r OK GONE REP RET <<<"$(once_check "$TMP/sk.jsonl" "$TMP/sk.out" 2>&1)"
check "sim --churn kill (sync): each batch applied once; the dead workers' retrained, counted ($OK, $GONE deaths, $REP repeated)" \
    bash -c "[ $rc = 0 ] && [ '$OK' = ok ] && [ '$REP' = '$RET' ] && [ '$REP' -gt 0 ] && [ '$REP' -le $((${GONE:-0} * 32)) ]"
check "... summary.json has the same epoch_samples and membership" "$TORCH_PY" -c '
import json, sys
s, r = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).read().splitlines()[-1])
assert [e["repeated"] for e in s["epoch_samples"]] == [e["repeated"] for e in r["epoch_samples"]]
assert sum(1 for e in s["membership"] if e["event"] == "join") == r["joins"]' "$TMP/sk/summary.json" "$TMP/sk.out"
"$BIN/downpour" sim --workers 2:5 --churn kill:0.4 --mode sync "${SIMF[@]}" >"$TMP/sk2.out" 2>&1
same() { cmp <(tail -1 "$1" | sed 's/"wall_s":[^,}]*//') <(tail -1 "$2" | sed 's/"wall_s":[^,}]*//'); }
check "sim --churn: the same flags, the same crew and bits" same "$TMP/sk.out" "$TMP/sk2.out"
"$BIN/downpour" replay "$TMP/sk.jsonl" --out "$TMP/sk-replay" >"$TMP/sk-replay.log" 2>&1
ACC=$("$TORCH_PY" -c 'import json, sys; print("%.4f" % json.load(open(sys.argv[1]))["test_accuracy"])' "$TMP/sk/summary.json")
check "sim --churn's record replays bit for bit (accuracy $ACC)" \
    bash -c "grep -q 'every recorded norm matched' '$TMP/sk-replay.log' && grep -q 'test accuracy $ACC' '$TMP/sk-replay.log'"
sim_refuses() { # WANT ARGS...: one line, exit 2
    local want=$1; shift
    "$BIN/downpour" sim "$@" --updates 10 >"$TMP/sr.log" 2>&1
    local rc=$?
    [ $rc = 2 ] && grep -q -- "$want" "$TMP/sr.log" && [ "$(wc -l <"$TMP/sr.log")" = 1 ] || { echo "rc $rc"; cat "$TMP/sr.log"; return 1; }
}
check "sim --churn on a fixed crew: refused" sim_refuses "--churn needs an elastic crew" --workers 4 --churn leave:1
check "sim --churn with MIN = MAX: refused" sim_refuses "--churn needs an elastic crew" --workers 3:3 --churn kill:1
check "sim --churn bogus:1: refused" sim_refuses "'bogus:1' is not leave:MEAN_S or kill:MEAN_S" --workers 1:3 --churn bogus:1
check "sim --workers 1:3 --epochs: refused" sim_refuses "give --updates" --workers 1:3 --epochs 1
finish
