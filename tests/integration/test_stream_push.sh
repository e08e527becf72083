#!/usr/bin/env bash
# test_stream_push: the push in parts (--stream-push, on by default for a
# CPU worker: each layer's gradient leaves as the backward makes it, the
# servers apply the step once all its parts are in) through the real
# binaries, against the same runs with --stream-push off (the whole push):
#  - async, 1 worker, through shared memory (forced: --transport shm), over
#    ZeroMQ frames, in bfloat16 frames, and with 2 shards; sync, 2 workers:
#    the final model files are identical, byte for byte, and the on runs'
#    metrics show parts that left during the backward (push_parts_early),
#    the off runs' none; the shard stepped each streamed push part by part
#    as its parts came (steps_early; in sync the push that completes a
#    step): every step with one shard, some with two (where a shard's slice
#    may come whole), with --stream-push off none
#  - --overlap and --local-steps push whole, and a worker asked for
#    --stream-push on with them says it is ignored
#  - `downpour local` turns the early step off when the workers' threads
#    take every core (--early-step off to the shards; a user's flag wins):
#    no step early (sync), the same model file as with it on
# (The pairs give --early-step on, so they hold whatever the core count.)
# Under SANITIZE=1 this script is skipped: every sanitized `downpour local`
# run of the other tests pushes in parts (the CPU default), and
# test_ps_parts runs the shard's checks of the parts and the early step
# sanitized.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip stream-push "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
common=(--seed 5 --steps 12 --batch 32 --threads 1 --no-progress --early-step on)

# early DIR: the pushes with parts sent during the backward, and all of them
early() {
    "$TORCH_PY" - "$1" <<'EOF'
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/metrics/worker-*.jsonl") for l in open(f)
         if '"status"' in l]
print(sum(l["push_parts_early"] > 0 for l in lines), len(lines))
EOF
}

# pair NAME WANT FLAGS...: the run with the default (on) and with off; the
# same bytes. WANT: the on run's shards stepped early "all" or "some"
pair() {
    local name=$1 want=$2; shift 2
    "$L" local "$@" "${common[@]}" --out "$TMP/$name-on" >"$TMP/$name-on.log" 2>&1
    check "$name: streamed run" test $? = 0
    "$L" local "$@" "${common[@]}" --stream-push off --out "$TMP/$name-off" >"$TMP/$name-off.log" 2>&1
    check "$name: whole-push run" test $? = 0
    check "$name: the same model file either way, byte for byte" \
        cmp -s "$TMP/$name-on/model.safetensors" "$TMP/$name-off/model.safetensors"
    read -r e n < <(early "$TMP/$name-on")
    check "$name: every push streamed parts during the backward ($e of $n)" test "$e" = "$n" -a "$n" -gt 0
    read -r e n < <(early "$TMP/$name-off")
    check "$name: --stream-push off: none did ($e of $n)" test "$e" = 0 -a "$n" -gt 0
    read -r e n < <(stepped "$TMP/$name-on")
    case $want in
    all) check "$name: every step made as its parts came ($e of $n)" test "$e" = "$n" -a "$n" -gt 0 ;;
    some) check "$name: steps made as their parts came ($e of $n)" test "$e" -gt 0 ;;
    esac
    read -r e n < <(stepped "$TMP/$name-off")
    check "$name: --stream-push off: every step whole ($e of $n)" test "$e" = 0 -a "$n" -gt 0
}

pair async-shm all --workers 1 --mode async --transport shm # shared memory or fail
check "async-shm: the worker says it pushes in parts" \
    grep -q "the push in parts as the backward makes them" "$TMP/async-shm-on/logs/worker-0.log"
pair async-zmq all --workers 1 --mode async --transport zmq
pair async-bf16 all --workers 1 --mode async --transport zmq --wire bf16
pair async-2shards some --workers 1 --mode async --ps-shards 2
pair sync all --workers 2 --mode sync

# every core taken: 2 workers of $(nproc) threads each
full=(--seed 5 --steps 12 --batch 32 --threads "$(nproc)" --no-progress --workers 2 --mode sync)
"$L" local "${full[@]}" --out "$TMP/full" >"$TMP/full.log" 2>&1
check "workers on every core: runs" test $? = 0
read -r e n < <(stepped "$TMP/full")
check "... the shards were told --early-step off, no step early ($e of $n)" test "$e" = 0 -a "$n" -gt 0
"$L" local "${full[@]}" --early-step on --out "$TMP/full-on" >"$TMP/full-on.log" 2>&1
check "... --early-step on given: runs" test $? = 0
read -r e n < <(stepped "$TMP/full-on")
check "... and the user's flag wins ($e of $n early)" test "$e" = "$n" -a "$n" -gt 0
check "... the same model file either way, byte for byte" \
    cmp -s "$TMP/full/model.safetensors" "$TMP/full-on/model.safetensors"
"$L" local --workers 1 --mode async --overlap on --stream-push on "${common[@]}" --out "$TMP/ov" >"$TMP/ov.log" 2>&1
check "--overlap on with --stream-push on runs" test $? = 0
check "... and says the streaming is ignored" grep -q "stream-push on: ignored with --overlap" "$TMP/ov/logs/worker-0.log"
read -r e n < <(early "$TMP/ov")
check "... and pushes whole ($e of $n streamed)" test "$e" = 0 -a "$n" -gt 0
"$L" local --workers 1 --mode async --local-steps 4 "${common[@]}" --out "$TMP/ls" >"$TMP/ls.log" 2>&1
check "--local-steps 4 runs" test $? = 0
read -r e n < <(early "$TMP/ls")
check "... and pushes whole ($e of $n streamed)" test "$e" = 0 -a "$n" -gt 0
finish
