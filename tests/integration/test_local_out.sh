#!/usr/bin/env bash
# test_local_out: what `downpour local --out DIR` leaves, and what it
# removes of an earlier run in the same DIR (docs/OPERATIONS.md, "The binaries").
#  - a run of 2 shards and 2 workers, then one of 1 and 1 in the same DIR:
#    the earlier summary, model, TensorBoard files and the metrics and logs
#    of its shard 1 and worker 1 (which the second run does not overwrite)
#    are gone; a file of the user's in metrics/ and logs/ stays
#  - removed first, not at the end: while a third run trains, the second
#    run's summary.json and model.safetensors are already gone
#  - an elastic crew (--workers 1:2) whose DIR holds a FIFO as
#    scale.request (planted by anything that could write there): the
#    launcher's loop does not block on it, says so in one line, and the run
#    finishes; scale.lock is 0600 (an earlier run's 0644 one too), so
#    another user cannot hold a shared lock on it that would keep the next
#    launcher on DIR from starting
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip local_out "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
S=${DP_TEST_TIMEOUT_SCALE:-1}
L=$BIN/downpour
out=$TMP/out
small=(--mode async --model "fc:10 softmax" --batch 16 --seed 3 --no-progress --out "$out")

"$L" local --workers 2 --ps-shards 2 --steps 4 "${small[@]}" >"$TMP/a.log" 2>&1
check "first run (2 shards, 2 workers) exits 0" test $? = 0
check "... leaving shard 1's and worker 1's metrics and logs" \
    test -s "$out/metrics/ps-1.jsonl" -a -s "$out/metrics/worker-1.jsonl" -a -s "$out/logs/ps-1.log" -a -s "$out/logs/worker-1.log"
old_tb=$(cd "$out/tensorboard" && ls events.out.tfevents.* 2>/dev/null | tr '\n' ' ')
check "... and TensorBoard files ($old_tb)" test -n "$old_tb"
# The second run's files may bear the same names (a TensorBoard file is
# named by the second it was opened in): the first run's are marked by
# their content instead.
for f in $old_tb; do printf 'dp-first-run' >>"$out/tensorboard/$f"; done
cp "$out/model.safetensors" "$TMP/a.safetensors"
echo "mine" >"$out/metrics/notes.txt"
echo "mine" >"$out/logs/notes.log"

"$L" local --workers 1 --steps 4 "${small[@]}" >"$TMP/b.log" 2>&1
check "second run (1 shard, 1 worker) in the same DIR exits 0" test $? = 0
left=$(cd "$out" && ls metrics/ps-1.jsonl metrics/worker-1.jsonl logs/ps-1.log logs/ps-1.endpoint logs/worker-1.log 2>/dev/null | tr '\n' ' ')
check "the first run's shard 1 and worker 1 metrics and logs are gone (left: ${left:-none})" test -z "$left"
left=$(cd "$out/tensorboard" && grep -l 'dp-first-run' events.out.tfevents.* 2>/dev/null | tr '\n' ' ')
check "the first run's TensorBoard files are gone (left: ${left:-none})" test -z "$left"
check "summary.json is the second run's (workers $(json "$out/summary.json" workers 2>/dev/null))" \
    test "$(json "$out/summary.json" workers 2>/dev/null)" = 1
check "model.safetensors is the second run's" bash -c "[ -s '$out/model.safetensors' ] && ! cmp -s '$out/model.safetensors' '$TMP/a.safetensors'"
check "files of the user's in metrics/ and logs/ stay" test -s "$out/metrics/notes.txt" -a -s "$out/logs/notes.log"

# A third run, long enough to be caught training: the second run's results
# are gone before it ends (the launcher removes them first).
# (Its pushes are told from the second run's, in the same file until the
# launcher replaces it, by their wall-clock time "t".)
t0=$(date +%s.%N)
"$L" local --workers 1 --steps 1000000 "${small[@]}" >"$TMP/c.log" 2>&1 &
pid=$!; T_PIDS+=("$pid")
# training: a push of the third run is in worker 0's metrics.
training() {
    "$TORCH_PY" -c 'import json, sys
sys.exit(0 if any(json.loads(l)["t"] > float(sys.argv[2]) for l in open(sys.argv[1]) if "\"status\"" in l) else 1)' \
        "$out/metrics/worker-0.jsonl" "$t0" 2>/dev/null
}
for _ in $(seq $((600 * S))); do
    training && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
check "a third run is training" training
check "... and the second run's summary.json and model.safetensors are already gone" \
    test ! -e "$out/summary.json" -a ! -e "$out/model.safetensors"
kill -TERM "$pid"
wait_for "$pid" $((20 * S))

# A FIFO as scale.request, an earlier run's scale.lock at 0644.
el=$TMP/elastic
mkdir -p "$el"
mkfifo "$el/scale.request"
: >"$el/scale.lock"
chmod 0644 "$el/scale.lock"
"$L" local --workers 1:2 --epochs 1 --train-samples 320 --mode async --model "fc:10 softmax" --batch 16 \
    --seed 3 --no-progress --out "$el" >"$TMP/el.log" 2>&1 &
pid=$!; T_PIDS+=("$pid")
wait_for "$pid" $((120 * S))
rc=$?
check "a FIFO as scale.request: the elastic run is not blocked on it and finishes (status $rc)" test $rc = 0
check "... saying it ignored it, in one line" \
    grep -q 'scale request ignored: .*scale.request: not a regular file' "$TMP/el.log"
check "scale.lock is 0600 ($(stat -c %a "$el/scale.lock"))" test "$(stat -c %a "$el/scale.lock")" = 600
# From the hostile side: another user (nobody), who can reach DIR, cannot
# open the lock to hold it shared.
if [ "$(id -u)" = 0 ]; then
    chmod 0711 "$TMP"
    check "... another user cannot take a shared lock on it" \
        bash -c "! setpriv --reuid=nobody --regid=nogroup --clear-groups flock -n -s '$el/scale.lock' true 2>/dev/null"
    chmod 0700 "$TMP"
else
    skip "scale.lock from another user" "acting as nobody needs root"
fi
finish
