#!/usr/bin/env bash
# test_blas_core: a CPU result is a function of the ISA path and the thread
# count, not of the CPU model (kernels/cpu/blas.h). OpenBLAS picks its
# kernels, and so its summation order, from the CPU it detects; the
# environment's OPENBLAS_CORETYPE stands in for "another CPU" here. For each
# path this machine runs:
#  - `downpour sim` (fully connected layers, a convolution's GEMM forward and
#    dense backward, 2 kernel threads: the split GEMM) with
#    OPENBLAS_CORETYPE=Prescott and with Haswell gives the same
#    model.safetensors byte for byte (before the pin: different files);
#  - OpenBLAS runs the core the path pins (its own "Core:" line):
#    avx512 SkylakeX, avx2 Haswell, generic Prescott;
# and an OpenBLAS loaded before main on another core (LD_PRELOAD) is refused
# with one line and exit status 2 (its constructor ran before the pin).
source "$(dirname "$0")/lib.sh"

L=$BIN/downpour
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip blas_core "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
if ! grep -qw avx2 /proc/cpuinfo; then
    skip blas_core "no AVX2 here: OPENBLAS_CORETYPE=Haswell cannot stand in for another CPU"
    finish; exit
fi
run=(sim --workers 3 --compute exp:10 --updates 12 --seed 5 --batch 16 --threads 2
     --model "conv5x5:4:s2 relu fc:32 relu fc:10 softmax" --eval-limit 200)
declare -A pin=([avx512]=SkylakeX [avx2]=Haswell [generic]=Prescott)

for p in avx512 avx2 generic; do
    for ct in Prescott Haswell; do
        env DP_CPU_ISA=$p OPENBLAS_CORETYPE=$ct OPENBLAS_VERBOSE=2 "$L" "${run[@]}" \
            --out "$TMP/$p-$ct" >"$TMP/$p-$ct.log" 2>&1
        [ $? = 2 ] && grep -q "cannot run the $p path" "$TMP/$p-$ct.log" && break
    done
    if grep -q "cannot run the $p path" "$TMP/$p-Prescott.log"; then
        skip_checks 2 "$p" "this CPU cannot run the $p path"
        continue
    fi
    check "$p: OPENBLAS_CORETYPE=Prescott and =Haswell give the same model, byte for byte ($(tail -1 "$TMP/$p-Haswell.log"))" \
        cmp "$TMP/$p-Prescott/model.safetensors" "$TMP/$p-Haswell/model.safetensors"
    check "$p: OpenBLAS runs ${pin[$p]} both times ($(grep -h '^Core:' "$TMP/$p-Prescott.log" "$TMP/$p-Haswell.log" | paste -sd' '))" \
        test "$(cat "$TMP/$p-Prescott.log" "$TMP/$p-Haswell.log" | grep -c "^Core: ${pin[$p]}\$")" = 2
done

# Preloaded, OpenBLAS initialises before main: the pin cannot take, so the
# kernels refuse rather than compute with this CPU's choice. (ASan must be
# the first library loaded: no preloading under SANITIZE=1.)
if [ "${DP_SANITIZED:-0}" = 1 ]; then
    skip_checks 3 preload "LD_PRELOAD and the sanitizers' runtime do not mix"
else
    env DP_CPU_ISA=generic OPENBLAS_CORETYPE=Haswell LD_PRELOAD=libopenblas.so.0 "$L" "${run[@]}" \
        --out "$TMP/pre" >"$TMP/pre.log" 2>&1
    rc=$?
    check "preloaded on Haswell, the generic path: refused with status 2 (got $rc)" test $rc = 2
    check "in one line naming both cores ($(head -1 "$TMP/pre.log"))" \
        bash -c '[ "$(wc -l <"$1")" = 1 ] && grep -q "OpenBLAS runs its Haswell kernels where the generic path pins Prescott: it was loaded before main" "$1"' _ "$TMP/pre.log"
    env DP_CPU_ISA=generic OPENBLAS_CORETYPE=Prescott LD_PRELOAD=libopenblas.so.0 "$L" "${run[@]}" \
        --out "$TMP/pre-ok" >"$TMP/pre-ok.log" 2>&1
    check "preloaded on the pinned core itself: runs, and the same model as unpreloaded" \
        cmp "$TMP/generic-Prescott/model.safetensors" "$TMP/pre-ok/model.safetensors"
fi
finish
