#!/usr/bin/env bash
# test_devregion_cluster: the device region (proto/devregion.h) through the
# real binaries, downpour-ps and downpour-worker, on the CPU stand-in (the
# test hook DP_TEST_DEVMEM=standin, proto/devmem.h), against the same runs
# over ZeroMQ frames:
#  - async, 1 worker, 1 shard; sync, 2 workers, 2 shards: the final model
#    files are identical, byte for byte;
#  - the runs went through the region: each shard says it made one, each
#    worker that it maps it, and each shard's stop line counts every push
#    taken from the slots (12 steps a worker) and no push refused;
#  - a device worker (cpu:staged, the CPU backend behind a device's memory
#    model), sync, 2 x 2: the same, and every pull and push of it went
#    device to device (the backend's copy_peer into the network and out of
#    its gradient, the worker's count of them), none through the host; the
#    stand-in defers copy_peer's copies to the next synchronize, so a copy
#    not waited for before the unpin or the count shows in the model file;
#  - the overlapped loop of a device worker (cpu:staged, async, --overlap
#    on, 1 x 2): its communication thread lands the next weights in a
#    buffer of their own and the step boundary takes them (worker/train/
#    devside.h); the same model file as over frames, every pull and push
#    device to device; a boundary that let the forward run before its copy
#    landed computes on the old weights here (staged copies wait for the
#    synchronize) and shows in the model file;
#  - --stream-push of a device worker whose shards all map their regions
#    (sync, 2 x 2): the push goes whole through the slots, device to
#    device, and the model file is the one of frames in parts;
#  - two GPUs on one host, through the stand-in's hook: the region on
#    another device the worker reaches by peer access (standin:peer): the
#    same as above, the worker says so; one it cannot reach
#    (standin:nopeer): the worker declines the region with one line and
#    its tensors go through shared memory, the same model file again.
# The handshake, the restart and the hostile peers: test_ps_devregion.
# dp-test: unsanitized (the region protocol runs under the sanitizers in
# test_devregion and test_ps_devregion; this adds the launcher around it)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip devregion "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
common=(--seed 5 --steps 12 --batch 32 --threads 1 --no-progress)

# taken DIR: the pushes the shards' stop lines say they took from the slots, summed
taken() {
    grep -h "device region: .* pushes taken" "$1"/logs/ps-*.log |
        sed -E 's/.* ([0-9]+) pushes taken.*/\1/' | awk '{s += $1} END {print s + 0}'
}

# pair NAME SHARDS WORKERS FLAGS...: over frames, then through the region
pair() {
    local name=$1 shards=$2 workers=$3; shift 3
    "$L" local --ps-shards "$shards" --workers "$workers" "$@" "${common[@]}" --transport zmq \
        --out "$TMP/$name-zmq" >"$TMP/$name-zmq.log" 2>&1
    check "$name: the run over frames" test $? = 0
    DP_TEST_DEVMEM=standin "$L" local --ps-shards "$shards" --workers "$workers" "$@" \
        "${common[@]}" --out "$TMP/$name-dev" >"$TMP/$name-dev.log" 2>&1
    check "$name: the run through the device region" test $? = 0
    check "$name: the same model file either way, byte for byte" \
        cmp -s "$TMP/$name-zmq/model.safetensors" "$TMP/$name-dev/model.safetensors"
    local made mapped
    made=$(grep -l "device region on standin" "$TMP/$name-dev"/logs/ps-*.log | wc -l)
    check "$name: each of the $shards shards made a region ($made)" test "$made" = "$shards"
    mapped=$(grep -h "through the device region (standin" "$TMP/$name-dev"/logs/worker-*.log | wc -l)
    check "$name: each worker mapped each shard's ($mapped)" test "$mapped" = $((shards * workers))
    check "$name: every push taken from a slot ($(taken "$TMP/$name-dev"))" \
        test "$(taken "$TMP/$name-dev")" = $((12 * shards * workers))
    check "$name: no push refused" grep -q " 0 pushes refused" "$TMP/$name-dev"/logs/ps-0.log
    check "$name: none over frames: no region without the hook" \
        bash -c "! grep -q 'device region' $TMP/$name-zmq/logs/*.log"
}

pair async 1 1 --mode async
pair sync 2 2 --mode sync

# devcount DIR pulls|pushes: the workers' device-to-device count, summed
devcount() {
    local k=1; [ "$2" = pushes ] && k=2
    grep -h "device region: .* shard pulls and" "$1"/logs/worker-*.log |
        sed -E 's/.* ([0-9]+) shard pulls and ([0-9]+) shard pushes.*/\1 \2/' |
        awk -v k=$k '{s += $k} END {print s + 0}'
}

# staged HOOK NAME: a 2 x 2 sync run of cpu:staged workers under
# DP_TEST_DEVMEM=HOOK, against the same over frames
staged() {
    local hook=$1 name=$2 run=(--ps-shards 2 --workers 2 --mode sync --device cpu:staged
                                --model "fc:64 relu fc:10 softmax")
    [ -s "$TMP/staged-zmq/model.safetensors" ] ||
        "$L" local "${run[@]}" "${common[@]}" --transport zmq --out "$TMP/staged-zmq" \
            >"$TMP/staged-zmq.log" 2>&1
    DP_TEST_DEVMEM=$hook "$L" local "${run[@]}" "${common[@]}" --out "$TMP/$name" \
        >"$TMP/$name.log" 2>&1
    check "$name: the run (exit $?)" test -s "$TMP/$name/model.safetensors"
    check "$name: the same model file as over frames, byte for byte" \
        cmp -s "$TMP/staged-zmq/model.safetensors" "$TMP/$name/model.safetensors"
}

staged standin staged
check "staged: every pull through a ring went device to device ($(devcount "$TMP/staged" pulls))" \
    test "$(devcount "$TMP/staged" pulls)" = 48
check "staged: every push into a slot went device to device ($(devcount "$TMP/staged" pushes))" \
    test "$(devcount "$TMP/staged" pushes)" = 48
check "staged: every push taken from a slot ($(taken "$TMP/staged"))" test "$(taken "$TMP/staged")" = 48

# the overlapped loop, async, 1 worker x 2 shards (one worker: its order
# is the run's, so the model file is one)
ov=(--ps-shards 2 --workers 1 --mode async --overlap on --device cpu:staged
    --model "fc:64 relu fc:10 softmax")
"$L" local "${ov[@]}" "${common[@]}" --transport zmq --out "$TMP/overlap-zmq" \
    >"$TMP/overlap-zmq.log" 2>&1
check "overlap: the run over frames" test -s "$TMP/overlap-zmq/model.safetensors"
DP_TEST_DEVMEM=standin "$L" local "${ov[@]}" "${common[@]}" --out "$TMP/overlap" \
    >"$TMP/overlap.log" 2>&1
check "overlap: the run through the regions" test -s "$TMP/overlap/model.safetensors"
check "overlap: the overlapped loop ran" grep -q "overlap on: pulls and pushes on a thread" \
    "$TMP/overlap/logs/worker-0.log"
check "overlap: the same model file as over frames, byte for byte" \
    cmp -s "$TMP/overlap-zmq/model.safetensors" "$TMP/overlap/model.safetensors"
check "overlap: every pull through a ring went device to device ($(devcount "$TMP/overlap" pulls))" \
    test "$(devcount "$TMP/overlap" pulls)" = 24
check "overlap: every push into a slot went device to device ($(devcount "$TMP/overlap" pushes))" \
    test "$(devcount "$TMP/overlap" pushes)" = 24
check "overlap: every push taken from a slot ($(taken "$TMP/overlap"))" test "$(taken "$TMP/overlap")" = 24

# --stream-push, sync 2 x 2: with every shard's region mapped the push goes
# whole into the slots, device to device (its parts would hide nothing)
sp=(--ps-shards 2 --workers 2 --mode sync --device cpu:staged --stream-push on
    --model "fc:64 relu fc:10 softmax")
"$L" local "${sp[@]}" "${common[@]}" --transport zmq --out "$TMP/stream-zmq" >"$TMP/stream-zmq.log" 2>&1
DP_TEST_DEVMEM=standin "$L" local "${sp[@]}" "${common[@]}" --out "$TMP/stream" >"$TMP/stream.log" 2>&1
check "stream-push: the same model file as over frames (in parts), byte for byte" \
    cmp -s "$TMP/stream-zmq/model.safetensors" "$TMP/stream/model.safetensors"
check "stream-push: every push into a slot went device to device ($(devcount "$TMP/stream" pushes))" \
    test "$(devcount "$TMP/stream" pushes)" = 48

staged standin:peer peer
check "peer: the workers map the other device's region by peer access" \
    test "$(grep -h "by peer access to standin" "$TMP/peer"/logs/worker-*.log | wc -l)" = 4
check "peer: device to device all the same ($(devcount "$TMP/peer" pushes))" \
    test "$(devcount "$TMP/peer" pushes)" = 48

staged standin:nopeer nopeer
check "nopeer: each worker declines each shard's region in one line" \
    test "$(grep -h "cannot reach (no peer access): weights and gradients through its shared memory" \
        "$TMP/nopeer"/logs/worker-*.log | wc -l)" = 4
check "nopeer: no push through a slot ($(taken "$TMP/nopeer"))" test "$(taken "$TMP/nopeer")" = 0
check "nopeer: the shard's shared memory page-locked instead" \
    grep -q "shared memory page-locked" "$TMP/nopeer/logs/worker-0.log"

finish
