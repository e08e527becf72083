#!/usr/bin/env bash
# test_ps_device: `downpour-ps --device`:
#  - cuda:0 on a machine without a GPU (those that run `make test`): one
#    line naming the device, nothing bound (no --ready-file); exit 2 in a
#    build without CUDA (the build's lack: bad usage), 1 in a CUDA build
#    (the machine's lack at run time). With a GPU it binds and says so.
#  - a misspelt device: one line, exit 2
#  - a sync run of 1 shard + 1 worker with the shard on cpu:staged (the CPU
#    step behind the device protocol: weights and state in the stand-in's
#    memory, each version copied off into the live buffer) ends on the
#    same checkpoint, bit for bit, as the same run on cpu
#  - through `downpour local --ps-device gpu` and its hook DP_TEST_PS_DEVICE
#    (cpu:staged), each against the same run with --ps-device cpu, the
#    final model byte for byte: the early step on the device (async 1
#    worker, sync 2 workers: steps made early, as their parts came), and
#    --local-steps with the outer nesterov and delayed-nesterov, async and
#    sync
#  - DC-ASGD on the device (compensation and its MS there): an async run of
#    3 workers recorded on cpu:staged, its pushes interleaved (--delay-ms),
#    replays on the host bit for bit, every norm matched (a compensated
#    gradient's included), with pushes compensated
source "$(dirname "$0")/lib.sh"

PS_ARGS=(--workers 1 --model "fc:10 softmax" --bind tcp://127.0.0.1:0 --startup-timeout 0.2)

# one_line NAME RC_WANT FILE RC_GOT: one stderr line, the exit status, nothing bound
one_line() {
    local lines
    lines=$(wc -l <"$3")
    check "$1: exit $4 (want $2), $lines line(s): $(head -c 300 "$3")" \
        bash -c "[ '$4' = '$2' ] && [ '$lines' = 1 ]"
}

gpu=0
if [ -e "$BIN/lib/downpour-cuda.so" ] && command -v nvidia-smi >/dev/null &&
    nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
"$BIN/downpour-ps" "${PS_ARGS[@]}" --device cuda:0 --ready-file "$TMP/ready.cuda" \
    >/dev/null 2>"$TMP/cuda.err"
rc=$?
if [ $gpu = 1 ]; then
    check "--device cuda:0 with a GPU: the shard binds (exit $rc after --startup-timeout)" \
        test -s "$TMP/ready.cuda"
    check "... and says where its weights are" grep -q "optimizer state on cuda:0" "$TMP/cuda.err"
else
    want=2
    [ -e "$BIN/lib/downpour-cuda.so" ] && want=1
    one_line "--device cuda:0" "$want" "$TMP/cuda.err" $rc
    check "... names the device" grep -q "cuda:0" "$TMP/cuda.err"
    check "... started nothing (no ready file)" test ! -e "$TMP/ready.cuda"
    if [ ! -e "$BIN/lib/downpour-cuda.so" ]; then
        check "... says the build has no CUDA" grep -q "this build has no CUDA backend" "$TMP/cuda.err"
    fi
fi

"$BIN/downpour-ps" "${PS_ARGS[@]}" --device cuda:x --ready-file "$TMP/ready.bad" \
    >/dev/null 2>"$TMP/bad.err"
one_line "--device cuda:x" 2 "$TMP/bad.err" $?
check "... says what it expects" grep -q "expected cpu, cpu:staged or cuda:N" "$TMP/bad.err"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks 24 staged "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
# run NAME DEVICE: 1 shard (sync) + 1 worker, 30 steps; the final checkpoint in $TMP/NAME/ck
run() {
    mkdir -p "$TMP/$1"
    bg "$BIN/downpour-ps" --workers 1 --mode sync --model "fc:10 softmax" --seed 3 \
        --bind tcp://127.0.0.1:0 --ready-file "$TMP/$1/ready" --device "$2" \
        --checkpoint-dir "$TMP/$1/ck" >"$TMP/$1/ps.log" 2>&1
    local ps=$!
    wait_until test -s "$TMP/$1/ready"
    "$BIN/downpour-worker" --ps "$(cat "$TMP/$1/ready")" --task-index 0 --model "fc:10 softmax" \
        --seed 3 --steps 30 --batch 16 --threads 1 --no-progress >"$TMP/$1/w.log" 2>&1
    wait_for $ps 60
}
run cpu cpu
rc_cpu=$?
run staged cpu:staged
rc_staged=$?
check "cpu and cpu:staged runs both ended (exit $rc_cpu, $rc_staged)" \
    bash -c "[ $rc_cpu = 0 ] && [ $rc_staged = 0 ]"
check "... the staged shard said where its weights are" \
    grep -q "optimizer state on cpu:staged" "$TMP/staged/ps.log"
ck_cpu=$(ls "$TMP"/cpu/ck/*.safetensors 2>/dev/null | head -1)
ck_staged=$(ls "$TMP"/staged/ck/*.safetensors 2>/dev/null | head -1)
check "... their checkpoints hold the same bits (weights and Adam's state)" \
    "$TORCH_PY" tests/integration/compare_st.py "${ck_cpu:-none}" "${ck_staged:-none}" --atol 0 --rtol 0

L=$BIN/downpour
# a convolution under the fc layers: its backward takes long enough that a
# push leaves in parts the shard sees apart (the fc layers' alone go whole)
LOCAL=(--model "conv5x5:16 relu maxpool2 fc:128 relu fc:10 softmax" --batch 32 --steps 8 --threads 1
       --ps-threads 1 --seed 5 --no-progress)
# pair NAME FLAGS...: the shard on cpu:staged and on cpu; the same model file
pair() {
    local name=$1; shift
    DP_TEST_PS_DEVICE=cpu:staged "$L" local "${LOCAL[@]}" "$@" --ps-device gpu \
        --out "$TMP/$name-staged" >"$TMP/$name-staged.log" 2>&1
    local rc=$?
    "$L" local "${LOCAL[@]}" "$@" --ps-device cpu --out "$TMP/$name-cpu" >"$TMP/$name-cpu.log" 2>&1
    check "$name: on cpu:staged and on cpu (exit $rc, $?)" \
        grep -q "state on cpu:staged" "$TMP/$name-staged/logs/ps-0.log"
    check "... the same model file, byte for byte" \
        cmp -s "$TMP/$name-cpu/model.safetensors" "$TMP/$name-staged/model.safetensors"
}
for mode in "async 1" "sync 2"; do
    read -r m w <<<"$mode"
    pair "early-$m" --workers "$w" --mode "$m" --early-step on --stream-push on
    read -r e n < <(stepped "$TMP/early-$m-staged")
    check "... steps on the device made early, as their parts came ($e of $n)" test "$e" -gt 0
    pair "nesterov-$m" --workers "$w" --mode "$m" --local-steps 3 --outer-optimizer nesterov
    # 4 rounds: the momentum's second turn reads what its first left
    pair "delayed-$m" --workers "$w" --mode "$m" --local-steps 2 \
        --outer-optimizer delayed-nesterov --outer-momentum-every 2
done

DP_TEST_PS_DEVICE=cpu:staged "$L" local "${LOCAL[@]}" --workers 3 --mode async --delay-ms 10 \
    --delay-compensation adaptive:2 --ps-device gpu --record "$TMP/dc.rec" --out "$TMP/dc" \
    >"$TMP/dc.log" 2>&1
check "DC-ASGD on cpu:staged, recorded (exit $?)" grep -q "state on cpu:staged" "$TMP/dc/logs/ps-0.log"
comp=$(grep -c '"dc":1' "$TMP/dc.rec")
check "... pushes were compensated ($comp)" test "$comp" -gt 0
"$L" replay "$TMP/dc.rec" --out "$TMP/rdc" --json >"$TMP/rdc.out" 2>"$TMP/rdc.err"
check "... replayed on the host (exit $?)" test -s "$TMP/rdc/model.safetensors"
check "... bit-identical weights" cmp -s "$TMP/dc/model.safetensors" "$TMP/rdc/model.safetensors"
check "... every norm matched" grep -q '"matches_record":true' "$TMP/rdc.out"
finish
