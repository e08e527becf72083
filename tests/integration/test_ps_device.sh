#!/usr/bin/env bash
# test_ps_device: `downpour-ps --device` before anything starts:
#  - cuda:0 here (no GPU on the machines that run `make test`): one line
#    naming the device, nothing bound (no --ready-file); exit 2 in a build
#    without CUDA (the build's lack: bad usage), 1 in a CUDA build whose
#    machine has no device (the machine's lack at run time); on a GPU
#    machine this version refuses with exit 2 (the shard is not yet moved
#    onto the GPU's step kernels, kernels/optim_dev.h)
#  - a misspelt device: one line, exit 2
#  - cpu: today's shard, which binds
source "$(dirname "$0")/lib.sh"

PS_ARGS=(--workers 1 --model "fc:10 softmax" --bind tcp://127.0.0.1:0 --startup-timeout 0.2)

# one_line NAME RC_WANT FILE RC_GOT: one stderr line, the exit status, nothing bound
one_line() {
    local lines
    lines=$(wc -l <"$3")
    check "$1: exit $4 (want $2), $lines line(s): $(head -c 300 "$3")" \
        bash -c "[ '$4' = '$2' ] && [ '$lines' = 1 ]"
}

if [ -e "$BIN/lib/downpour-cuda.so" ]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then want=2; else want=1; fi
else
    want=2
fi
"$BIN/downpour-ps" "${PS_ARGS[@]}" --device cuda:0 --ready-file "$TMP/ready.cuda" \
    >/dev/null 2>"$TMP/cuda.err"
one_line "--device cuda:0" "$want" "$TMP/cuda.err" $?
check "... names the device" grep -q "cuda:0" "$TMP/cuda.err"
check "... started nothing (no ready file)" test ! -e "$TMP/ready.cuda"
if [ ! -e "$BIN/lib/downpour-cuda.so" ]; then
    check "... says the build has no CUDA" grep -q "this build has no CUDA backend" "$TMP/cuda.err"
fi

"$BIN/downpour-ps" "${PS_ARGS[@]}" --device cuda:x --ready-file "$TMP/ready.bad" \
    >/dev/null 2>"$TMP/bad.err"
one_line "--device cuda:x" 2 "$TMP/bad.err" $?
check "... says what it expects" grep -q "expected cpu or cuda:N" "$TMP/bad.err"

"$BIN/downpour-ps" "${PS_ARGS[@]}" --device cpu --ready-file "$TMP/ready.cpu" \
    >/dev/null 2>"$TMP/cpu.err"
check "--device cpu: the shard on the host binds as without the flag" test -s "$TMP/ready.cpu"
finish
