#!/usr/bin/env bash
# test_standalone: downpour-worker --standalone on real Fashion-MNIST — the
# loss falls, the model saved loads into PyTorch with the same accuracy,
# `downpour eval` agrees, and bad input gives one clear line and no file.
source "$(dirname "$0")/lib.sh"

W=$BIN/downpour-worker
out=$TMP/sa
mkdir -p "$out"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip standalone "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi

"$W" --standalone --steps 150 --batch 64 --seed 3 --no-progress \
    --save "$out/model.safetensors" --summary "$out/summary.json" --metrics "$out/metrics.jsonl" \
    --tensorboard "$out/tb" --optimizer momentum --lr 0.01 \
    >"$out/log" 2>&1
check "standalone run exits 0" test $? = 0
acc=$(json "$out/summary.json" test_accuracy 2>/dev/null || echo 0)
check "150 steps reach test accuracy >= 0.65 (got $acc)" ge "$acc" 0.65
first=$(grep '"loss"' "$out/metrics.jsonl" | head -10 | "$TORCH_PY" -c 'import sys,json; l=[json.loads(x)["loss"] for x in sys.stdin]; print(sum(l)/len(l))')
last=$(grep '"loss"' "$out/metrics.jsonl" | grep -v '"event"' | tail -10 | "$TORCH_PY" -c 'import sys,json; l=[json.loads(x)["loss"] for x in sys.stdin]; print(sum(l)/len(l))')
check "training loss falls ($first -> $last)" ge "$(awk -v a="$first" -v b="$last" 'BEGIN{print a - b}')" 0.8
tb=$(ls "$out"/tb/events.out.tfevents.* 2>/dev/null | head -1)
check "TensorBoard event file written with train/loss and test/accuracy" \
    bash -c "[ -s '$tb' ] && grep -qa 'train/loss' '$tb' && grep -qa 'test/accuracy' '$tb'"
for k in mode workers ps_shards epochs steps test_accuracy test_loss images_per_s wall_s \
         updates_applied updates_dropped updates_rejected staleness_mean staleness_max; do
    json "$out/summary.json" "$k" >/dev/null 2>&1 || fail "summary has $k" "missing"
done
pass "summary.json has the DESIGN fields"

ev=$("$BIN/downpour" eval --checkpoint "$out/model.safetensors" 2>/dev/null)
ev_acc=$(echo "$ev" | "$TORCH_PY" -c 'import sys,json; print(json.load(sys.stdin)["test_accuracy"])' 2>/dev/null || echo -1)
check "downpour eval agrees with the summary ($ev_acc vs $acc)" near "$ev_acc" "$acc" 0.0005

if has_torch; then
    t=$("$TORCH_PY" tests/integration/torch_load.py "$out/model.safetensors" 2>"$out/torch.err")
    t_acc=$(echo "$t" | "$TORCH_PY" -c 'import sys,json; print(json.load(sys.stdin)["test_accuracy"])' 2>/dev/null || echo -1)
    check "PyTorch load_state_dict + eval gives the same accuracy ($t_acc vs $acc)" near "$t_acc" "$acc" 0.002
else
    skip "torch load" "Debian's python3-torch is not installed (make deps-test)"
fi

# A damaged checkpoint: one line naming the file and what is wrong.
head -c 100000 "$out/model.safetensors" >"$out/trunc.safetensors"
"$BIN/downpour" eval --checkpoint "$out/trunc.safetensors" >"$out/eval.out" 2>"$out/eval.err"
rc=$?
check "downpour eval refuses a truncated checkpoint (status $rc)" test $rc != 0
check "... with one line naming the file" bash -c "[ \$(wc -l <'$out/eval.err') = 1 ] && grep -q 'trunc.safetensors: truncated' '$out/eval.err'"

# Bad input: one clear line, non-zero exit, no file left behind.
bad() { # name expected-substring args...
    local name=$1 want=$2; shift 2
    rm -f "$out/bad.safetensors"
    "$W" --standalone --steps 2 --no-progress --save "$out/bad.safetensors" "$@" >"$out/bad.log" 2>&1
    local rc=$?
    if [ $rc = 0 ]; then fail "$name" "exit status 0"; return; fi
    if ! grep -q -- "$want" "$out/bad.log"; then fail "$name" "no line with '$want': $(tail -2 "$out/bad.log")"; return; fi
    if [ -e "$out/bad.safetensors" ] || ls "$out"/bad.safetensors.tmp* >/dev/null 2>&1; then fail "$name" "left a file"; return; fi
    [ "$(wc -l <"$out/bad.log")" -le 3 ] || { fail "$name" "more than 3 lines of error: $(cat "$out/bad.log")"; return; }
    pass "$name"
}
bad "missing data dir" "/nonexistent" --data fashion-mnist:/nonexistent
bad "unknown layer in the model spec" "banana" --model "conv5x5:32 banana fc:10 softmax"
bad "classes mismatch" "classes" --model "conv5x5:8 relu fc:7 softmax"
mkdir -p "$out/trunc"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    zcat "/usr/share/datasets/fashion-mnist/$f.gz" >"$out/trunc/$f"
done
head -c 1000000 "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz" | zcat 2>/dev/null >"$out/trunc/train-images-idx3-ubyte"
bad "truncated data file" "truncated" --data "fashion-mnist:$out/trunc"
bad "bad device" "cuda" --device cuda:7
# The CUDA backend is a module loaded on the first cuda:K (kernels/backend.h):
# no program maps NVIDIA's libraries to run on the CPU.
check "no program links a CUDA library (the backend is a module)" \
    bash -c "! ldd '$BIN/downpour-worker' '$BIN/downpour' '$BIN/downpour-ps' | grep -qE 'libcudart|libcudnn|libcublas'"
if [ -e "$BIN/lib/downpour-cuda.so" ]; then
    # loaded from beside the program: what fails then is the device (none
    # here) or nothing (on a GPU), never the loading
    "$W" --standalone --steps 1 --no-progress --device cuda:0 >"$out/cuda.log" 2>&1
    check "cuda:0 loads the CUDA module from the build ($(tail -1 "$out/cuda.log"))" \
        bash -c "! grep -qE 'not where it belongs|undefined symbol|DOWNPOUR_CUDA_MODULE' '$out/cuda.log'"
    DOWNPOUR_CUDA_MODULE=/nonexistent "$W" --standalone --steps 1 --no-progress --device cuda:0 \
        >"$out/cuda.log" 2>&1
    check "DOWNPOUR_CUDA_MODULE naming no file: one line naming it" \
        bash -c "grep -q 'DOWNPOUR_CUDA_MODULE=/nonexistent' '$out/cuda.log' && [ \$(wc -l <'$out/cuda.log') = 1 ]"
fi
bad "bad flag value" "batch" --batch zero
finish
