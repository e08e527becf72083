#!/usr/bin/env bash
# test_py_sigint: Ctrl-C reaches a Python worker blocked inside the library
# (python/downpour/_sigint.py), over live servers in sync with 2 workers
# and a heartbeat timeout of 60 s, so that only the worker's own leaving
# lets the other go on:
#  - worker 1 pushes step 1 and pulls: the servers hold the pull (worker 0
#    has not pushed); SIGINT, sent once its main thread is blocked in the
#    library's poll, raises KeyboardInterrupt within 1 s, through the NumPy
#    Client and through downpour.torch.Worker
#  - the context manager then leaves: the servers log worker 1 left (before its last step),
#    the process is gone, and worker 0 takes its two steps at once, not
#    after the 60 s timeout
#  - a watcher that comes late (held back by its test gate while the main
#    thread takes the SIGINT, as when a call returns by itself just then)
#    does not interrupt the next call: a wait_all during which it comes
#    returns as worker 1 finishes
# Each side is tests/integration/py_sigint.py's.
source "$(dirname "$0")/lib.sh"

use_py_package 21 py_sigint
PY=tests/integration/py_sigint.py

# blocked_in_poll PID: its main thread is asleep in poll(2) or ppoll(2)
# (x86-64: 7, 271; arm64: ppoll 73): inside the library's wait, since the
# script prints "blocked" just before the call and nothing else there polls.
blocked_in_poll() {
    local nr
    read -r nr _ <"/proc/$1/task/$1/syscall" 2>/dev/null || return 1
    case "$nr" in 7|271|73) return 0 ;; *) return 1 ;; esac
}

# SIGTERM (pull:TERM, torch:TERM), at its default in the program: the same
# path, raising downpour.Terminated; the worker leaves and exits 143.
for case in pull:INT torch:INT pull:TERM torch:TERM; do
    kind=${case%:*} sig=${case#*:}
    [ "$sig" = INT ] || kind=$kind-term
    rm -f "$TMP/ps.ready"
    bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$TMP/ps.ready" --workers 2 --mode sync \
        --model "fc:10 softmax" --heartbeat-timeout 60 >"$TMP/ps-$kind.log" 2>&1
    ps_pid=$!
    t=0; until [ -s "$TMP/ps.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
    ep=$(cat "$TMP/ps.ready" 2>/dev/null)
    # A background job of a script starts with SIGINT ignored, and Python
    # keeps an ignored SIGINT ignored: give it the default disposition.
    bg env --default-signal=INT,TERM "$TORCH_PY" "$PY" subject "$ep" "${kind%-term}" >"$TMP/subject-$kind.out" 2>&1
    sub=$!
    t=0
    until { grep -q '^blocked' "$TMP/subject-$kind.out" && blocked_in_poll $sub; } || [ $t -ge 300 ]; do
        sleep 0.05; t=$((t + 1))
    done
    check "$kind: worker 1's pull is held by the servers (blocked in the library's poll)" blocked_in_poll $sub
    t0=$(date +%s.%N)
    kill -$sig $sub
    if [ "$sig" = INT ]; then raised=KeyboardInterrupt want=130; else raised=Terminated want=143; fi
    t=0; until grep -q "^$raised after" "$TMP/subject-$kind.out" || [ $t -ge 100 ]; do
        sleep 0.01; t=$((t + 1))
    done
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
    check "$kind: SIG$sig raises $raised out of the blocked pull in $dt s (< 1 s)" \
        bash -c "grep -q '^$raised after' '$TMP/subject-$kind.out' && awk 'BEGIN { exit !($dt < 1.0) }'"
    wait_for $sub 10
    rc=$?
    check "$kind: worker 1 exits by the $raised (status $rc: $want, 128 + SIG$sig)" test $rc = $want
    check "$kind: ... having left: the servers count it left" grep -q 'worker 1 left before its last step' "$TMP/ps-$kind.log"
    grep -q 'worker 1 left before its last step' "$TMP/ps-$kind.log" || tail -n 5 "$TMP/subject-$kind.out" "$TMP/ps-$kind.log"
    "$TORCH_PY" "$PY" chief "$ep" >"$TMP/chief-$kind.out" 2>&1
    secs=$(sed -n 's/^two steps in \([0-9.]*\) s$/\1/p' "$TMP/chief-$kind.out")
    check "$kind: worker 0 then steps without it (${secs:-?} s, not the 60 s timeout)" \
        awk -v s="${secs:-99}" 'BEGIN { exit !(s < 10) }'
    wait_for $ps_pid 10 >/dev/null 2>&1
done

rm -f "$TMP/ps.ready"
bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$TMP/ps.ready" --workers 2 --mode async \
    --model "fc:10 softmax" >"$TMP/ps-late.log" 2>&1
t=0; until [ -s "$TMP/ps.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
ep=$(cat "$TMP/ps.ready" 2>/dev/null)
bg "$TORCH_PY" "$PY" finisher "$ep" >"$TMP/finisher.out" 2>&1
timeout 30 env --default-signal=INT "$TORCH_PY" "$PY" late "$ep" >"$TMP/late.out" 2>&1
check "a late watcher's interrupt does not reach the next call (wait_all returns when worker 1 finishes)" \
    grep -qx 'wait_all ok' "$TMP/late.out"
finish
