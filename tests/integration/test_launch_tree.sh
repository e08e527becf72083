#!/usr/bin/env bash
# test_launch_tree: what `downpour launch` leaves of the processes it
# started, and where it writes, with a shell as the workers' command (no
# PyTorch needed; test_launch runs the Python loop):
#  - Ctrl-C (SIGINT) to the launcher while each worker, a `sh -c` that
#    started a `sleep` of its own, waits for it: exit 130, and neither the
#    shells, their sleeps nor the shard are left (each child's process
#    group is signalled whole), nor the launcher's guard
#  - SIGKILL to the launcher: its guard stops every group it started, the
#    sleeps a `sh -c` started included (PR_SET_PDEATHSIG alone reaches only
#    the direct children)
#  - an --out another user made first (a shared /tmp path), with
#    logs/ps-0.log a symlink to a file of ours: refused with one line, the
#    file unchanged; so is an --out writable by others
#  - a symlink in our own --out where a log goes is refused, not written
#    through
source "$(dirname "$0")/lib.sh"
S=${DP_TEST_TIMEOUT_SCALE:-1}
L=$BIN/downpour
export PIDS=$TMP/pids
mkdir -p "$PIDS"
# Each worker: a shell that starts a sleep, says both pids (written whole,
# then renamed) and waits for the sleep.
WORKER='sleep 1000 & echo "$$ $!" >"$PIDS/$RANK.tmp" && mv "$PIDS/$RANK.tmp" "$PIDS/$RANK"; wait'

# alive PID: the process runs (a zombie is not running).
alive() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
# tree_left: the pids of the run's tree still running (shells, sleeps, shard).
tree_left() {
    local p
    for p in $(cat "$PIDS"/[0-9] 2>/dev/null) ${SHARD:-}; do alive "$p" && printf '%s ' "$p"; done
}
none_left() { [ -z "$(tree_left)" ]; }
# start_run NAME: the launcher in the background (SIGINT at its default, as
# a terminal's Ctrl-C finds it), once both workers wait for their sleeps.
start_run() {
    rm -f "$PIDS"/*
    env --default-signal=INT "$L" launch --workers 2 --model "fc:10 softmax" --no-progress --grace 5 \
        --out "$TMP/$1" -- sh -c "$WORKER" >"$TMP/$1.log" 2>&1 &
    LP=$!
    T_PIDS+=("$LP")
    local t=0
    until [ -s "$PIDS/0" ] && [ -s "$PIDS/1" ]; do
        sleep 0.1; t=$((t + 1))
        [ $t -ge $((600 * S)) ] && break
    done
    SHARD=$(pgrep -f "$TMP/$1/metrics/ps-0.jsonl" | head -1)
    check "$1: both workers wait for a sleep of their own, the shard runs (${SHARD:-none})" \
        bash -c "[ -s '$PIDS/0' ] && [ -s '$PIDS/1' ] && [ -n '$SHARD' ]"
}
# kill_leftovers: what a failing run left, so that the next one starts clean.
kill_leftovers() { local p; for p in $(tree_left); do kill -KILL "$p" 2>/dev/null; done; }

start_run int
kill -INT "$LP"
wait_for "$LP" $((30 * S))
rc=$?
check "Ctrl-C: the launcher exits 130 (got $rc)" test $rc = 130
check "... saying every process ended" grep -q 'stopped by signal 2; every process ended' "$TMP/int.log"
check "... and none of its tree is left, the shells' sleeps included (left: $(tree_left))" none_left
check "... nor its guard (the launcher reaps it as it exits)" bash -c "! pgrep -f -- '--out $TMP/in[t]' >/dev/null"
kill_leftovers

start_run kill9
kill -KILL "$LP"
wait "$LP" 2>/dev/null
t=0
until none_left || [ $t -ge $((300 * S)) ]; do sleep 0.1; t=$((t + 1)); done
check "SIGKILL to the launcher: none of its tree is left, the shells' sleeps included (left: $(tree_left))" none_left
kill_leftovers

# --out made first by another user (nobody), a link planted where the
# shard's log goes, to a file of ours.
echo "mine" >"$TMP/mine.txt"
if [ "$(id -u)" = 0 ]; then
    theirs=$TMP/theirs
    mkdir -p "$theirs/logs" "$theirs/metrics"
    ln -s "$TMP/mine.txt" "$theirs/logs/ps-0.log"
    chown -R -h nobody "$theirs"
    "$L" launch --workers 1 --model "fc:10 softmax" --no-progress --out "$theirs" -- true >"$TMP/theirs.log" 2>&1
    rc=$?
    check "an --out of another user's: refused with one line naming its owner (status $rc)" \
        bash -c "[ $rc = 1 ] && grep -q 'belongs to uid [0-9]*, not to this user' '$TMP/theirs.log' &&
                 [ \$(wc -l <'$TMP/theirs.log') = 1 ]"
    check "... and the file its planted log pointed to is unchanged" grep -qx mine "$TMP/mine.txt"
else
    skip_checks 2 "an --out of another user's" "making a directory of nobody's needs root"
fi

mkdir -m 0777 "$TMP/open"
chmod 0777 "$TMP/open"
"$L" launch --workers 1 --model "fc:10 softmax" --no-progress --out "$TMP/open" -- true >"$TMP/open.log" 2>&1
rc=$?
check "an --out writable by others: refused with one line (status $rc)" \
    bash -c "[ $rc = 1 ] && grep -q 'writable by others (mode 0777)' '$TMP/open.log' &&
             [ \$(wc -l <'$TMP/open.log') = 1 ]"

# Our own --out, a link where a log goes (from anything that could write
# there): refused, never written through.
mkdir -p "$TMP/own/logs"
ln -s "$TMP/mine.txt" "$TMP/own/logs/ps-0.log"
"$L" launch --workers 1 --model "fc:10 softmax" --no-progress --out "$TMP/own" -- true >"$TMP/own.log" 2>&1
rc=$?
check "a symlink where a log goes: refused (status $rc), the file it points to unchanged" \
    bash -c "[ $rc = 1 ] && grep -q 'ps-0.log: cannot create' '$TMP/own.log' && grep -qx mine '$TMP/mine.txt'"
# --tee: every worker's lines on stdout, each prefixed with its rank, in
# its own order, a last line without its newline too; the logs whole; the
# summary names the chief's result (its log's last line).
"$L" launch --workers 2 --model "fc:10 softmax" --no-progress --tee --out "$TMP/tee" -- \
    sh -c 'echo "one of $RANK"; echo "two of $RANK"; printf "last of %s" "$RANK"' >"$TMP/tee.out" 2>"$TMP/tee.err"
rc=$?
check "--tee: exit 0 (got $rc)" test $rc = 0
for r in 0 1; do
    got=$(grep "^\[$r\]: " "$TMP/tee.out" | tr '\n' '|')
    check "--tee: worker $r's lines, prefixed [$r]:, in order ($got)" \
        test "$got" = "[$r]: one of $r|[$r]: two of $r|[$r]: last of $r|"
done
check "... its log holds them without the prefix" bash -c "[ \"\$(cat '$TMP/tee/logs/worker-1.log')\" = \"\$(printf 'one of 1\ntwo of 1\nlast of 1')\" ]"
check "... summary.json's chief_result is the chief's last line" \
    bash -c "grep -q '\"chief_result\":[[:space:]]*\"last of 0\"' '$TMP/tee/summary.json'"
finish
