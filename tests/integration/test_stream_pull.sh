#!/usr/bin/env bash
# test_stream_pull: the pull in parts (--stream-pull, on by default for a
# CPU worker over ZeroMQ frames: each shard's reply cut where a layer
# begins, the forward waiting for each layer's weights as it reaches the
# layer) through the real binaries, against the same runs with
# --stream-pull off (the whole pull):
#  - async over frames, in bfloat16 frames, sync with 2 workers: the final
#    model files are
#    identical, byte for byte (the same weights reach every layer, so no
#    staleness is added), the on runs' pulls took more PARAMS messages than
#    shards at every step (pull_parts), the off runs' one a shard
#  - through shared memory the pull stays whole (one message a shard)
#  - --overlap pulls whole, and a worker asked for --stream-pull on with it
#    says it is ignored
#  - over frames a record of a run pulling in parts (2 shards, 2 workers)
#    replays to the run's model file byte for byte, and CURVE carries the
#    parts (sync, 2 workers: the same model file as the plain whole pull's)
#  - a device's paths, on the CPU (--device cpu:staged: every transfer
#    through the copy ops, each layer's weights uploaded as they come, the
#    gradient's copies handed to the push as each is waited for): the
#    streams are off by default there and on when asked for, and the
#    model file is the cpu runs' (async: the pull in parts, the push
#    whole; sync, 2 workers: both in parts)
# Under SANITIZE=1 this script is skipped: the pull in parts runs
# sanitized in test_recovery_cluster (its worker 1 is over frames) and in
# the unit tests (test_ps_client, test_ps_bounds, test_net).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip stream-pull "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
common=(--seed 5 --steps 12 --batch 32 --threads 1 --no-progress)

# parts DIR SHARDS [FIELD]: the steps whose pull (or FIELD: push_parts,
# the push) took more messages than shards, those that took one a shard,
# and all steps
parts() {
    "$TORCH_PY" - "$1" "$2" "${3:-pull_parts}" <<'PY'
import glob, json, sys
lines = [json.loads(l) for f in glob.glob(sys.argv[1] + "/metrics/worker-*.jsonl") for l in open(f)
         if '"status"' in l]
k, field = int(sys.argv[2]), sys.argv[3]
print(sum(l.get(field, 0) > k for l in lines), sum(l.get(field, 0) == k for l in lines), len(lines))
PY
}

# pair NAME SHARDS FLAGS...: the run with the default (on) and with off;
# the same bytes
pair() {
    local name=$1 shards=$2; shift 2
    "$L" local "$@" "${common[@]}" --out "$TMP/$name-on" >"$TMP/$name-on.log" 2>&1
    check "$name: run pulling in parts" test $? = 0
    "$L" local "$@" "${common[@]}" --stream-pull off --out "$TMP/$name-off" >"$TMP/$name-off.log" 2>&1
    check "$name: whole-pull run" test $? = 0
    check "$name: the same model file either way, byte for byte" \
        cmp -s "$TMP/$name-on/model.safetensors" "$TMP/$name-off/model.safetensors"
    read -r more one n < <(parts "$TMP/$name-on" "$shards")
    check "$name: every pull came in parts ($more of $n)" test "$more" = "$n" -a "$n" -gt 0
    read -r more one n < <(parts "$TMP/$name-off" "$shards")
    check "$name: --stream-pull off: every pull whole ($one of $n)" test "$one" = "$n" -a "$n" -gt 0
}

pair async-zmq 1 --workers 1 --mode async --transport zmq
check "async-zmq: the worker says it pulls in parts" \
    grep -q "the pull in parts as the forward needs them" "$TMP/async-zmq-on/logs/worker-0.log"
pair async-bf16 1 --workers 1 --mode async --transport zmq --wire bf16
pair sync 1 --workers 2 --mode sync --transport zmq

"$L" local --workers 1 --mode async --transport shm "${common[@]}" --out "$TMP/shm" >"$TMP/shm.log" 2>&1
check "shared memory: runs" test $? = 0
read -r more one n < <(parts "$TMP/shm" 1)
check "... and pulls whole ($one of $n)" test "$one" = "$n" -a "$n" -gt 0
"$L" local --workers 1 --mode async --overlap on --stream-pull on "${common[@]}" --out "$TMP/ov" >"$TMP/ov.log" 2>&1
check "--overlap on with --stream-pull on runs" test $? = 0
check "... and says the pull in parts is ignored" grep -q "stream-pull on: ignored with --overlap" "$TMP/ov/logs/worker-0.log"

# Everywhere a run goes, over frames: a record replays bit for bit (2
# shards, 2 workers), and CURVE carries the parts
"$L" local --workers 2 --ps-shards 2 --mode async --transport zmq "${common[@]}" \
    --record "$TMP/rec.rec" --out "$TMP/rec" >"$TMP/rec.log" 2>&1
check "record: runs" test $? = 0
read -r more one n < <(parts "$TMP/rec" 2)
check "... every pull came in parts ($more of $n)" test "$more" = "$n" -a "$n" -gt 0
"$L" replay "$TMP/rec.rec" --out "$TMP/rep" --json >"$TMP/rep.out" 2>"$TMP/rep.err"
check "... its replay runs" test $? = 0
check "... and gives the run's model file, byte for byte" \
    cmp -s "$TMP/rec/model.safetensors" "$TMP/rep/model.safetensors"
"$L" local --workers 2 --mode sync --secure --transport zmq "${common[@]}" --out "$TMP/sec" >"$TMP/sec.log" 2>&1
check "CURVE: runs" test $? = 0
read -r more one n < <(parts "$TMP/sec" 1)
check "... every pull came in parts ($more of $n)" test "$more" = "$n" -a "$n" -gt 0
check "... the same model file as the plain whole pull's, byte for byte" \
    cmp -s "$TMP/sec/model.safetensors" "$TMP/sync-off/model.safetensors"

# staged NAME CPU_RUN PUSH FLAGS...: a run on cpu:staged with --stream-pull on
# and FLAGS: every pull in parts, every push whole or in parts (PUSH), and
# the model file of the cpu run CPU_RUN
staged() {
    local name=$1 cpu=$2 push=$3; shift 3
    "$L" local --transport zmq --device cpu:staged --stream-pull on "$@" "${common[@]}" \
        --out "$TMP/$name" >"$TMP/$name.log" 2>&1
    check "$name: runs" test $? = 0
    read -r more one n < <(parts "$TMP/$name" 1)
    check "$name: every pull came in parts ($more of $n)" test "$more" = "$n" -a "$n" -gt 0
    read -r more one n < <(parts "$TMP/$name" 1 push_parts)
    if [ "$push" = whole ]; then
        check "$name: every push whole, a device's default ($one of $n)" test "$one" = "$n" -a "$n" -gt 0
    else
        check "$name: every push in parts ($more of $n)" test "$more" = "$n" -a "$n" -gt 0
    fi
    check "$name: the cpu run's model file, byte for byte" \
        cmp -s "$TMP/$name/model.safetensors" "$TMP/$cpu/model.safetensors"
}
staged staged-async async-zmq-on whole --workers 1 --mode async
staged staged-sync sync-on parts --workers 2 --mode sync --stream-push on
finish
