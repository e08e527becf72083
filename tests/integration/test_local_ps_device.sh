#!/usr/bin/env bash
# test_local_ps_device: `downpour local --ps-device cpu|gpu`:
#  - gpu without --gpus, and a device not cpu or gpu: one line, exit 2,
#    nothing started
#  - gpu on a machine without a GPU (those that run `make test`): the
#    shard's own one-line refusal reaches the user as one line naming
#    cuda:0, a non-zero exit, no process of the run left behind
#  - through the test hook DP_TEST_PS_DEVICE=cpu:staged (the CPU stand-in of
#    the device protocol, bit for bit the CPU step): a sync run of 2 workers
#    and 2 shards with --ps-device gpu trains (summary.json, which records
#    where the shards were) and ends on the same weights, bit for bit, as
#    the same run with --ps-device cpu
#  - --ps-shards defaults to one shard per --gpus entry (--gpus 0,0: two)
#  - a device worker (cpu:staged) over shared memory page-locks the shard's
#    segments through its backend and unlocks each before the unmap; its
#    pull goes up from the segment; its weights are a CPU worker's
source "$(dirname "$0")/lib.sh"

L=$BIN/downpour
# one_line NAME FILE: the launcher said one line
one_line() { check "$1: one line: $(head -c 300 "$2")" test "$(wc -l <"$2")" = 1; }
# none_left DIR: no process of the run (its --out in the arguments) left
none_left() { ! ps -eo args= | grep -F -- "$1" | grep -qv grep; }

"$L" local --workers 2 --ps-device gpu --out "$TMP/nogpus" >/dev/null 2>"$TMP/nogpus.err"
check "--ps-device gpu without --gpus: exit 2" test $? = 2
one_line "... " "$TMP/nogpus.err"
check "... says to give --gpus" grep -q "give --gpus LIST" "$TMP/nogpus.err"
check "... started nothing" test ! -e "$TMP/nogpus/logs"
"$L" local --gpus 0 --ps-device tpu --out "$TMP/tpu" >/dev/null 2>"$TMP/tpu.err"
check "--ps-device tpu: exit 2" test $? = 2
check "... says what it expects" grep -q "expected cpu or gpu" "$TMP/tpu.err"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    skip_checks 4 nocuda "this machine has a GPU: the refusal is for machines without one"
else
    "$L" local --gpus 0,0 --ps-device gpu --model "fc:10 softmax" --steps 2 --no-progress \
        --out "$TMP/nocuda" >/dev/null 2>"$TMP/nocuda.err"
    rc=$?
    check "--ps-device gpu without a GPU: non-zero exit ($rc)" test $rc != 0
    one_line "... " "$TMP/nocuda.err"
    check "... the shard's refusal names cuda:0" grep -q "ps-0 .*cuda:0" "$TMP/nocuda.err"
    check "... no process of the run left behind" none_left "$TMP/nocuda"
fi

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks 10 staged "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
RUN=(--workers 2 --ps-shards 2 --mode sync --model "fc:64 relu fc:10 softmax" --batch 32 --steps 12
     --threads 1 --ps-threads 1 --seed 5 --no-progress)
DP_TEST_PS_DEVICE=cpu:staged "$L" local "${RUN[@]}" --ps-device gpu --out "$TMP/staged" >"$TMP/staged.log" 2>&1
check "--ps-device gpu on the staged stand-in: the run ends (exit $?)" test -s "$TMP/staged/summary.json"
check "... both shards kept their state on the stand-in" \
    bash -c "grep -q 'state on cpu:staged' '$TMP/staged/logs/ps-0.log' && grep -q 'state on cpu:staged' '$TMP/staged/logs/ps-1.log'"
check "... summary.json records where the shards were" \
    test "$(json "$TMP/staged/summary.json" ps_device)" = "cpu:staged,cpu:staged"
"$L" local "${RUN[@]}" --ps-device cpu --out "$TMP/cpu" >"$TMP/cpu.log" 2>&1
check "the same run with --ps-device cpu (exit $?)" test -s "$TMP/cpu/model.safetensors"
check "... the same final weights, bit for bit" "$TORCH_PY" tests/integration/compare_st.py \
    "$TMP/cpu/model.safetensors" "$TMP/staged/model.safetensors" --atol 0 --rtol 0

# --gpus 0,0: two workers on GPU 0 and, by default, two shards; the
# workers here are told --device cpu (a user's flag wins), the shards get
# the stand-in through the hook
DP_TEST_PS_DEVICE=cpu:staged "$L" local --gpus 0,0 --ps-device gpu --device cpu --mode sync \
    --model "fc:10 softmax" --batch 16 --steps 2 --no-progress --out "$TMP/pair" >"$TMP/pair.log" 2>&1
check "--gpus 0,0 --ps-device gpu: two shards by default ($(tail -c 200 "$TMP/pair.log"))" \
    test "$(json "$TMP/pair/summary.json" ps_shards)" = 2

# A device worker over shared memory (the host path, issue 54 item 3): the
# shard's segments are page-locked through the backend (cpu:staged keeps
# CUDA's bookkeeping: a segment locked twice fails, one left locked at the
# end is said), unlocked before each unmap, and the pull goes up from the
# parameter segment itself; the weights are the CPU worker's, bit for bit.
W=(--workers 1 --mode async --overlap off --transport shm --model "fc:64 relu fc:10 softmax" --batch 32
   --steps 12 --threads 1 --seed 5 --no-progress)
"$L" local "${W[@]}" --device cpu:staged --out "$TMP/wstaged" >"$TMP/wstaged.log" 2>&1
check "a cpu:staged worker over shared memory (exit $?)" test -s "$TMP/wstaged/model.safetensors"
check "... page-locked the shard's segments" \
    grep -q "the shards' shared memory page-locked" "$TMP/wstaged/logs/worker-0.log"
check "... and unlocked every one before unmapping it" \
    bash -c "! grep -q 'never undone\\|stays pageable' '$TMP/wstaged/logs/worker-0.log'"
"$L" local "${W[@]}" --out "$TMP/wcpu" >"$TMP/wcpu.log" 2>&1
check "... its weights are the cpu worker's, bit for bit" "$TORCH_PY" tests/integration/compare_st.py \
    "$TMP/wcpu/model.safetensors" "$TMP/wstaged/model.safetensors" --atol 0 --rtol 0
finish
