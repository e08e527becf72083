#!/usr/bin/env bash
# dp-test: unsanitized
# test_elastic_restart: shard 0 of an elastic crew (--workers 1:2, async)
# dies as by kill -9 (the hook DP_TEST_KILL_AT_VERSION, on a push computed
# on version 70 or later) and is restarted from its checkpoint (every 20
# versions). Its dealer comes back with its weights (server/crew/deal.h): the
# batches trained after the checkpoint were lost with their updates and
# are dealt again, so the run still trains each batch of its 2 epochs
# once. In async every applied push is one version and one batch trained,
# so the run ends at version 200 (+ one per batch trained twice), not at
# the restored version + 200 as a dealer begun afresh would make it.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks 6 restart "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
SCALE=${DP_TEST_TIMEOUT_SCALE:-1}
MODEL="fc:64 relu fc:10 softmax"
KILL_AT=70
BATCHES=100                   # a epoch: 3200 samples at batch 32
D=$TMP/run
mkdir -p "$D"
PORT=$("$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

shard() {
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$PORT" --workers 1:2 --mode async --model "$MODEL" \
        --seed 3 --checkpoint-dir "$D/ck" --checkpoint-every 20 --metrics "$D/ps.jsonl" \
        --metrics-every 0.1 >>"$D/ps.log" 2>&1
    PS=$!
}
worker() {
    local extra=()
    [ "$1" = 0 ] && extra=(--summary "$D/summary.json")
    bg "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$PORT" --task-index "$1" --model "$MODEL" --seed 3 \
        --epochs 2 --train-samples 3200 --batch 32 --delay-ms 10 --timeout $((5 * SCALE)) --threads 1 \
        --no-progress --metrics "$D/w$1.jsonl" "${extra[@]}" >>"$D/w$1.log" 2>&1
    W[$1]=$!
}

DP_TEST_KILL_AT_VERSION=$KILL_AT shard
worker 0; worker 1
wait_for $PS $((60 * SCALE)); ps_rc=$?
died=$(grep -m1 -o "DP_TEST_KILL_AT_VERSION: dying as by kill -9 at version [0-9]*" "$D/ps.log" | grep -o '[0-9]*$')
check "shard 0 died by the hook (status $ps_rc) at version ${died:-?} >= $KILL_AT" \
    test "$ps_rc" = 137 -a "${died:-0}" -ge $KILL_AT
shard
wait_for ${W[0]} $((90 * SCALE)); rc0=$?
wait_for ${W[1]} $((90 * SCALE)); rc1=$?
wait_for $PS 20 >/dev/null
ck=$(( ${died:-0} - ${died:-0} % 20 ))
check "the restart restored the checkpoint of version $ck with its deal" \
    bash -c "grep -q 'restored version $ck ' '$D/ps.log' &&
             grep -q 'restored the deal: [0-9]* of $((2 * BATCHES)) batches dealt' '$D/ps.log'"
check "both workers finish by themselves (exit $rc0 $rc1)" test "$rc0$rc1" = 00
# "TRAINED:REPEATED:RETRAINED" of each epoch, then the shard's last version
read -r E0 E1 <<<"$("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join("%d:%d:%d" % (e["trained"], e["repeated"], e["retrained_after_death"])
               for e in s["epoch_samples"]))' "$D/summary.json" 2>/dev/null)"
check "each epoch trained whole, no death counted ($E0 $E1)" \
    bash -c "[[ '$E0' =~ ^3200:[0-9]+:0$ && '$E1' =~ ^3200:[0-9]+:0$ ]]"
twice=$(( ($(echo "$E0" | cut -d: -f2) + $(echo "$E1" | cut -d: -f2)) / 32 ))
last=$(grep -o '"version":[0-9]*' "$D/ps.jsonl" | tail -1 | cut -d: -f2)
check "the run ends at version ${last:-?} = $((2 * BATCHES)) batches + $twice trained twice (a dealer begun afresh: $ck + $((2 * BATCHES)))" \
    test "${last:-0}" = $((2 * BATCHES + twice))
# A checkpoint whose deal was tampered with is refused with one line.
"$TORCH_PY" - "$D/ck/ps-shard-0-of-1.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
deal = json.loads(h["__metadata__"]["deal"])
deal["next"] = deal["total"] + 1
h["__metadata__"]["deal"] = json.dumps(deal)
h["__metadata__"]["finished"] = "0"
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
timeout $((20 * SCALE)) "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$PORT" --workers 1:2 --mode async \
    --model "$MODEL" --seed 3 --checkpoint-dir "$D/ck" --checkpoint-every 20 >"$D/bad.log" 2>&1; rc=$?
check "a checkpoint with a crafted deal: refused at start, one line (exit $rc)" \
    bash -c "[ $rc != 0 ] && [ $rc != 124 ] && grep -q \"corrupt shard checkpoint: deal: 'next' is not a whole number\" '$D/bad.log'"

finish
