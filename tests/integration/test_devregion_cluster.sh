#!/usr/bin/env bash
# test_devregion_cluster: the device region (proto/devregion.h) through the
# real binaries, downpour-ps and downpour-worker, on the CPU stand-in (the
# test hook DP_TEST_DEVMEM=standin, proto/devmem.h), against the same runs
# over ZeroMQ frames:
#  - async, 1 worker, 1 shard; sync, 2 workers, 2 shards: the final model
#    files are identical, byte for byte;
#  - the runs went through the region: each shard says it made one, each
#    worker that it maps it, and each shard's stop line counts every push
#    taken from the slots (12 steps a worker) and no push refused.
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

finish
