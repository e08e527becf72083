#!/usr/bin/env bash
# test_paths: every flag that names a file or folder to write creates the
# folders above it (common/util.h's dp_mkdirs / dp_mkdir_parents), so a
# first run in a fresh directory works as README shows it:
#  - `downpour local --workers 2 --mode sync --out runs/sync` (README's own
#    example) and its --record in a new nested folder
#  - downpour-worker --save, --summary, --metrics, --tensorboard
#  - downpour-ps --checkpoint-dir, --metrics, --record, --ready-file
#  - downpour sim --out, --metrics, --record; downpour replay --out;
#    downpour sweep --out
# Every path is relative and two folders deep under a directory that holds
# nothing, as a newcomer's would be.
source "$(dirname "$0")/lib.sh"

PS=$BIN/downpour-ps WK=$BIN/downpour-worker L=$BIN/downpour
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip paths "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
tiny=(--model "fc:16 relu fc:10 softmax" --batch 8 --seed 3 --no-progress)
mkdir "$TMP/fresh" && cd "$TMP/fresh" || exit 1

"$L" local --workers 2 --mode sync --out runs/sync --steps 2 "${tiny[@]}" \
    --record rec/a/sync.rec >"$TMP/local.log" 2>&1
check "README's example in a fresh directory: local --out runs/sync ($(tail -1 "$TMP/local.log"))" \
    test -s runs/sync/summary.json
check "local --record rec/a/sync.rec" test -s rec/a/sync.rec

"$WK" --standalone --steps 2 "${tiny[@]}" --save w/a/model.safetensors --summary w/b/summary.json \
    --metrics w/c/metrics.jsonl --tensorboard w/d/tb >"$TMP/worker.log" 2>&1
rc=$?  # before the message's $(...) resets it
check "worker exits 0 ($(tail -1 "$TMP/worker.log"))" test "$rc" = 0
check "worker --save w/a/model.safetensors" test -s w/a/model.safetensors
check "worker --summary w/b/summary.json" test -s w/b/summary.json
check "worker --metrics w/c/metrics.jsonl" test -s w/c/metrics.jsonl
check "worker --tensorboard w/d/tb" bash -c 'ls w/d/tb/events.out.tfevents.* >/dev/null'

bg "$PS" --bind "tcp://127.0.0.1:*" --checkpoint-dir p/a/ckpt --metrics p/b/metrics.jsonl \
    --record p/c/ps.rec --ready-file p/d/ready 2>"$TMP/ps.log"
ps_pid=$!
for _ in $(seq $((200 * ${DP_TEST_TIMEOUT_SCALE:-1}))); do
    [ -s p/d/ready ] && break
    kill -0 $ps_pid 2>/dev/null || break
    sleep 0.1
done
check "downpour-ps --ready-file p/d/ready ($(tail -1 "$TMP/ps.log"))" test -s p/d/ready
kill -TERM $ps_pid 2>/dev/null
wait_for $ps_pid 20
check "downpour-ps --checkpoint-dir p/a/ckpt" test -d p/a/ckpt
check "downpour-ps --metrics p/b/metrics.jsonl" test -e p/b/metrics.jsonl
check "downpour-ps --record p/c/ps.rec" test -s p/c/ps.rec

"$L" sim --workers 2 --compute const:1 --updates 4 "${tiny[@]:0:6}" --out s/a/out \
    --metrics s/b/metrics.jsonl --record s/c/sim.rec >"$TMP/sim.log" 2>&1
check "sim --out s/a/out ($(tail -1 "$TMP/sim.log"))" test -s s/a/out/summary.json
check "sim --metrics s/b/metrics.jsonl" test -e s/b/metrics.jsonl
check "sim --record s/c/sim.rec" test -s s/c/sim.rec
"$L" replay s/c/sim.rec --out s/d/replay >"$TMP/replay.log" 2>&1
check "replay --out s/d/replay ($(tail -1 "$TMP/replay.log"))" test -s s/d/replay/model.safetensors

"$L" sweep --cluster sim --workers 1 --compute const:1 --eval-every 0 --eval-limit 100 --no-progress \
    --args "--updates 4 --model 'fc:16 relu fc:10 softmax' --batch 8" --out sw/a/b >"$TMP/sweep.log" 2>&1
check "sweep --out sw/a/b ($(tail -1 "$TMP/sweep.log"))" test -s sw/a/b/report.md

# A file in the way is one line naming it, not a crash.
: >blocked
"$WK" --standalone --steps 1 "${tiny[@]}" --save blocked/m.safetensors >"$TMP/blocked.log" 2>&1
rc=$?
check "--save under a file: fails (status $rc), naming the folder" \
    bash -c '[ "$1" != 0 ] && grep -q "blocked/m.safetensors: cannot create its folder blocked: Not a directory" "$2"' _ $rc "$TMP/blocked.log"

cd / && finish
