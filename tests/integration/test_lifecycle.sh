#!/usr/bin/env bash
# test_lifecycle: how the daemons start, stop and keep their checkpoints.
#  - SIGTERM / SIGINT stop the standalone trainer and downpour-ps promptly,
#    with status 143 / 130, saying what they saved
#  - a checkpoint directory belongs to one run: the same run restarted
#    restores; a finished run, or another run, is refused in one line unless
#    --resume, which continues it
#  - a server killed between writing a checkpoint and renaming it
#    (DP_TEST_CRASH_BEFORE_RENAME) leaves the previous one, which a restart
#    restores
#  - start-up waits name who is missing: the server's --startup-timeout the
#    worker ids, the worker's HELLO every silent shard endpoint
#  - each of these stops within 1 s (x DP_TEST_TIMEOUT_SCALE) of the
#    signal, timed from a steady state (training, listening, waiting)
#  - `downpour local` reads each shard's ready file, clears an earlier
#    run's TensorBoard files, and gives each launch its own run id; a child
#    that ignores SIGTERM is killed 10 s after it (and not before)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip lifecycle "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
S=${DP_TEST_TIMEOUT_SCALE:-1}
W=$BIN/downpour-worker
PS=$BIN/downpour-ps
L=$BIN/downpour
wk=(--batch 16 --threads 1 --no-progress --seed 3)

# docs/SECURITY.md, "Signals": a signal stops every binary "within a fraction of a second";
# measured from the kill to the exit, once the process is in its steady
# state (training, listening, waiting for its servers).
STOP_S=$((1 * S))
now() { date +%s.%N; }
# stop_in PID SIG: send SIG, wait for the exit; STOP_RC its status, STOP_DT the seconds it took.
stop_in() {
    local t0; t0=$(now)
    kill -"$2" "$1"
    wait_for "$1" $(( 10 * S )); STOP_RC=$?
    STOP_DT=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
}
quick() { ge "$STOP_S" "$STOP_DT"; }

# wait_file FILE PATTERN SECONDS: until FILE holds PATTERN.
wait_file() {
    local i
    for i in $(seq $(( $3 * 10 ))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# ---- signals -------------------------------------------------------------
"$W" --standalone --epochs 20 "${wk[@]}" --save "$TMP/sa.safetensors" --summary "$TMP/sa.json" \
    --metrics "$TMP/sa.jsonl" >"$TMP/sa.log" 2>&1 &
pid=$!; T_PIDS+=("$pid")
wait_file "$TMP/sa.jsonl" '"step"' $(( 60 * S ))
stop_in "$pid" TERM; rc=$STOP_RC
check "standalone: SIGTERM stops it with status 143 (got $rc)" test "$rc" = 143
check "standalone: ... within $STOP_S s of the signal, saving included (took $STOP_DT s)" quick
check "standalone: the model so far is saved to --save" test -s "$TMP/sa.safetensors"
check "standalone: no summary for an unfinished run" test ! -e "$TMP/sa.json"
check "standalone: the log says what was saved" grep -q "stopped by signal 15 at step .*model saved to" "$TMP/sa.log"

"$W" --standalone --epochs 20 "${wk[@]}" --metrics "$TMP/sa2.jsonl" >"$TMP/sa2.log" 2>&1 &
pid=$!; T_PIDS+=("$pid")
wait_file "$TMP/sa2.jsonl" '"step"' $(( 60 * S ))
stop_in "$pid" INT; rc=$STOP_RC
check "standalone: SIGINT stops it with status 130 (got $rc)" test "$rc" = 130
check "standalone: ... within $STOP_S s (took $STOP_DT s)" quick
check "standalone: without --save it says nothing was saved" grep -q "nothing saved (no --save)" "$TMP/sa2.log"

# start_ps NAME FLAGS...: a shard on a free loopback port; EP its endpoint,
# PS_PID its pid, $TMP/NAME.log its log.
start_ps() {
    local name=$1; shift
    rm -f "$TMP/$name.ready"
    bg "$PS" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/$name.ready" "$@" 2>"$TMP/$name.log"
    PS_PID=$!
    local i
    for i in $(seq $(( 100 * S ))); do [ -s "$TMP/$name.ready" ] && break; kill -0 "$PS_PID" 2>/dev/null || break; sleep 0.1; done
    EP=$(cat "$TMP/$name.ready" 2>/dev/null)
}

start_ps sig --checkpoint-dir "$TMP/ck-sig"
stop_in "$PS_PID" INT; rc=$STOP_RC
check "downpour-ps: SIGINT stops it with status 130 (got $rc)" test "$rc" = 130
check "downpour-ps: ... within $STOP_S s, its checkpoint written (took $STOP_DT s)" quick
check "downpour-ps: the log says the checkpoint was written" grep -q "stopped by signal 2; checkpoint written in" "$TMP/sig.log"

# ---- one run per checkpoint directory -------------------------------------
ck=$TMP/ck
run=(--workers 1 --mode async --seed 3 --checkpoint-dir "$ck" --checkpoint-every 5)
start_ps first "${run[@]}"
"$W" --ps "$EP" --task-index 0 --steps 20 "${wk[@]}" >"$TMP/w-first.log" 2>&1
check "first run: the worker finishes" test $? = 0
wait_for "$PS_PID" $(( 10 * S )); rc=$?
check "first run: the chief's SHUTDOWN stops the shard (status $rc)" test "$rc" = 0
check "first run: checkpoint written" test -s "$ck/ps-shard-0-of-1.safetensors"

start_ps again "${run[@]}"
wait_for "$PS_PID" $(( 10 * S )); rc=$?
check "same flags again: refused (status $rc)" test "$rc" = 1
check "same flags again: one line naming the finished run and --resume" \
    grep -q "downpour-ps: $ck holds the finished run cfg-[0-9a-f]*; use another --checkpoint-dir or --resume to continue it" "$TMP/again.log"
start_ps other "${run[@]}" --run-id other-run
wait_for "$PS_PID" $(( 10 * S )); rc=$?
check "another run id: refused (status $rc)" test "$rc" = 1
check "another run id: the line names both runs" grep -q "holds run cfg-[0-9a-f]*, not this run other-run" "$TMP/other.log"

# --resume continues the run; the hook kills the shard between writing its
# next checkpoint (version 25) and renaming it into place.
DP_TEST_CRASH_BEFORE_RENAME=ps-shard start_ps crash "${run[@]}" --resume
check "--resume: restores the finished run at version 20" grep -q "restored version 20 of run cfg-" "$TMP/crash.log"
"$W" --ps "$EP" --task-index 0 --steps 40 "${wk[@]}" --timeout 2 >"$TMP/w-crash.log" 2>&1 &
wpid=$!; T_PIDS+=("$wpid")
wait_for "$PS_PID" $(( 30 * S )); rc=$?
check "crash hook: the shard exits between write and rename (status $rc)" test "$rc" = 3
kill -KILL "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null
start_ps after "${run[@]}" --resume
check "after the crash: the previous checkpoint (version 20) is restored" grep -q "restored version 20 of run" "$TMP/after.log"
stop_in "$PS_PID" TERM; rc=$STOP_RC
check "after the crash: SIGTERM stops it with status 143 (got $rc)" test "$rc" = 143
check "downpour-ps: SIGTERM stops it within $STOP_S s (took $STOP_DT s)" quick

# The same run restarted after kill -9 (not finished) restores by itself:
# worker 1 of 2 is no chief, so nobody shuts the shard down.
ck2=$TMP/ck2
run2=(--workers 2 --mode async --seed 3 --checkpoint-dir "$ck2" --checkpoint-every 5)
start_ps crashed "${run2[@]}"
"$W" --ps "$EP" --task-index 1 --steps 12 "${wk[@]}" >"$TMP/w-crashed.log" 2>&1
check "unfinished run: worker 1 finishes" test $? = 0
kill -KILL "$PS_PID"; wait "$PS_PID" 2>/dev/null
start_ps restart "${run2[@]}"
check "kill -9, same flags: the run's checkpoint (version 10) is restored" grep -q "restored version 10 of run cfg-" "$TMP/restart.log"
kill -TERM "$PS_PID"; wait_for "$PS_PID" $(( 10 * S ))

# ---- start-up waits name the missing ----------------------------------------
start_ps startup --workers 3 --mode async --startup-timeout $(( 8 * S ))
"$W" --ps "$EP" --task-index 1 --steps 100000 "${wk[@]}" --timeout 2 >"$TMP/w-startup.log" 2>&1 &
wpid=$!; T_PIDS+=("$wpid")
wait_for "$PS_PID" $(( 30 * S )); rc=$?
check "--startup-timeout: the shard gives up (status $rc)" test "$rc" = 1
check "--startup-timeout: it names the workers that never said HELLO" \
    grep -q "2 of 3 workers never said HELLO within $(( 8 * S )) s (--startup-timeout): worker id(s) 0, 2" "$TMP/startup.log"
kill -KILL "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null

"$W" --ps "tcp://127.0.0.1:9,tcp://127.0.0.1:7" --task-index 0 --steps 1 "${wk[@]}" --timeout 1 >"$TMP/w-silent.log" 2>&1
check "worker: no server answers: status 1" test $? = 1
check "worker: the error names every silent shard" \
    grep -q "no reply in 1 s (is downpour-ps running?) from ps shard 0 at tcp://127.0.0.1:9, ps shard 1 at tcp://127.0.0.1:7" "$TMP/w-silent.log"

# A worker waiting for its servers (HELLO, --timeout 60) still stops at
# once. Its "server" is a TCP listener that accepts and never answers. The
# worker's heartbeat thread connects at start, its request socket once the
# data is loaded (0.3-0.8 s later here): with both connections in, the
# worker is waiting for its WELCOME.
bg "$TORCH_PY" -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(4)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
c1, _ = s.accept(); c2, _ = s.accept(); open(sys.argv[2], "w").write("connected")
time.sleep(600)' "$TMP/mute.port" "$TMP/mute.conn"
wait_file "$TMP/mute.port" . $(( 10 * S ))
"$W" --ps "tcp://127.0.0.1:$(cat "$TMP/mute.port")" --task-index 0 --steps 1 "${wk[@]}" --timeout 60 >"$TMP/w-wait.log" 2>&1 &
pid=$!; T_PIDS+=("$pid")
check "worker waiting for HELLO: it connected to its (mute) server" wait_file "$TMP/mute.conn" connected $(( 30 * S ))
stop_in "$pid" TERM; rc=$STOP_RC
check "worker waiting for HELLO: SIGTERM stops it with status 143 (got $rc)" test "$rc" = 143
check "worker waiting for HELLO: ... within $STOP_S s (took $STOP_DT s)" quick

# ---- downpour local ---------------------------------------------------------
out=$TMP/local
mkdir -p "$out/tensorboard"
touch "$out/tensorboard/events.out.tfevents.1.old.worker-0"
lflags=(local --workers 1 --mode async --steps 6 --batch 16 --no-progress --checkpoint-dir "$out/ck" --out "$out")
"$L" "${lflags[@]}" >"$TMP/l1.log" 2>&1
check "local: runs (status $?)" test $? = 0
check "local: an earlier run's TensorBoard file is gone" test ! -e "$out/tensorboard/events.out.tfevents.1.old.worker-0"
check "local: this run's TensorBoard file is there" bash -c "ls '$out'/tensorboard/events.out.tfevents.* >/dev/null"
check "local: the shard reported the port it bound" grep -q "^tcp://127.0.0.1:[0-9]*$" "$out/logs/ps-0.endpoint"
"$L" "${lflags[@]}" >"$TMP/l2.log" 2>&1
rc=$?
check "local again, same --checkpoint-dir: refused (status $rc)" test "$rc" = 1
check "local again: the reason is the other run" grep -q "holds .*run local-[0-9a-f]*.*--resume to continue it" "$TMP/l2.log"
"$L" "${lflags[@]}" --resume >"$TMP/l3.log" 2>&1
check "local --resume continues it (status $?)" test $? = 0

# `downpour local` stops its children in order: SIGTERM, then SIGKILL
# after 10 s. The launcher runs the daemons next to its own binary, so a
# copy of it in $TMP/bin runs the real downpour-ps and a fake worker that
# logs the SIGTERM it gets and goes on (SIGKILL alone ends it).
mkdir -p "$TMP/bin"
cp "$L" "$TMP/bin/downpour"
ln -s "$PS" "$TMP/bin/downpour-ps"
printf '%s\n' '#!/usr/bin/env bash' \
    'trap "echo \"fake worker: SIGTERM, going on\"" TERM' \
    'echo "fake worker: started"' \
    'while :; do sleep 0.1; done' >"$TMP/bin/downpour-worker"
chmod +x "$TMP/bin/downpour-worker"
bg "$TMP/bin/downpour" local --workers 1 --mode async --steps 6 --batch 16 --no-progress --out "$TMP/lk" >"$TMP/lk.log" 2>&1
lp=$!
check "local, stubborn worker: it started" wait_file "$TMP/lk/logs/worker-0.log" "fake worker: started" $(( 30 * S ))
t0=$(now)
kill -INT "$lp"
wait_for "$lp" $(( 30 * S )); rc=$?
dt=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
check "local, stubborn worker: SIGINT stops the launcher with status 130 (got $rc)" test "$rc" = 130
check "local, stubborn worker: its children got SIGTERM first (the worker's log, the shard's)" \
    bash -c "grep -q 'fake worker: SIGTERM' '$TMP/lk/logs/worker-0.log' && grep -q 'stopped by signal 15' '$TMP/lk/logs/ps-0.log'"
check "local, stubborn worker: SIGKILL came after the 10 s grace ($dt s, bound $((10 + 2 * S)) s)" \
    awk -v d="$dt" -v hi=$((10 + 2 * S)) 'BEGIN { exit !(d >= 10 && d <= hi) }'
# ([d]: the pattern must not match this check's own command line)
check "local, stubborn worker: nothing left running" bash -c "! pgrep -f '$TMP/bin/[d]ownpour-worker' >/dev/null"

finish
