#!/usr/bin/env bash
# test_resnet_cluster: a residual network with batch norm through the cluster.
#  - sync with 2 workers at batch b == standalone at batch 2b with
#    --bn-ghost-batch b (batch norm's statistics per worker's batch; the
#    running statistics as the servers combine them: the mean of the two
#    pushed values), weights and running statistics to float tolerance;
#    without ghost batches standalone at 2b is a different run
#  - async with 1 worker == standalone, bit for bit: the servers set the
#    running statistics to the pushed values instead of stepping them
#  - 3 shards (each a third of the floats, tensors split where the cut
#    falls) == 1 shard, bit for bit
#  - downpour eval of the saved model gives the chief's accuracy and loss,
#    at any evaluation batch (the running statistics, not the batch's)
#  - a run stopped at step 4 and resumed from its checkpoint (--resume) ends
#    with the uninterrupted run's bits, running statistics and counter
#    included
#  - --wire bf16 (running statistics rounded to 8 bits of mantissa) trains:
#    its test loss below chance and near the fp32 wire's
#  - --augment and --normalize train keep sync(2 x b) == standalone(2b,
#    ghost b): the crops are drawn by the sample's place in the global batch
#    (and an augmented run is another run than a plain one)
#  - CIFAR-10 (a generated file in its binary format, 3x32x32): resnet20
#    with --augment --normalize train, sync with 2 workers == standalone
#    with ghost batches; the file records 3 means and 3 stds; downpour eval
#    of it gives the chief's figures (it normalises the test set as trained)
#  - every preset README names (resnet32, resnet44, resnet56, resnet110
#    beside resnet20 above) trains a step standalone and in a sync cluster
#    of 2 workers with the same weights, and its saved file reloads in
#    downpour eval with the chief's figures and in PyTorch strictly with
#    the same ones (the canonical spec is the preset's name, however long
#    its text)
# dp-test: unsanitized
# (Under SANITIZE=1 its training would add minutes to CI for no new code:
# the layers run under ASan in test_kernels, test_net and test_torch_parity,
# the state rule in test_ps_init and test_lab.)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip resnet "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
spec="conv3x3:8 bn relu res( conv3x3:8 bn relu conv3x3:8 bn ) relu res( conv3x3:16:s2 bn relu conv3x3:16 bn ) relu gap fc:10 softmax"
common=(--seed 5 --optimizer momentum --lr 0.05 --momentum 0.9 --no-progress --model "$spec")
compare() { "$TORCH_PY" tests/integration/compare_st.py "$@" >"$TMP/compare.log" 2>&1 || { cat "$TMP/compare.log"; return 1; }; }

"$BIN/downpour-worker" --standalone --steps 8 --batch 32 --bn-ghost-batch 16 --threads 1 "${common[@]}" \
    --save "$TMP/ghost.safetensors" >"$TMP/ghost.log" 2>&1
check "standalone at batch 32, ghost batches of 16" test $? = 0
"$BIN/downpour-worker" --standalone --steps 8 --batch 32 --threads 1 "${common[@]}" \
    --save "$TMP/plain.safetensors" >"$TMP/plain.log" 2>&1
check "standalone at batch 32" test $? = 0
"$L" local --workers 2 --mode sync --batch 16 --steps 8 --threads 1 "${common[@]}" --out "$TMP/sync" >"$TMP/sync.log" 2>&1
check "local sync, 2 workers, batch 16" test $? = 0
check "sync(2 x 16) == standalone(32, ghost 16): weights and running statistics" \
    compare "$TMP/sync/model.safetensors" "$TMP/ghost.safetensors" --rtol 2e-3 --atol 2e-5
check "standalone(32) without ghost batches is another run" \
    bash -c "! \"$TORCH_PY\" tests/integration/compare_st.py '$TMP/sync/model.safetensors' '$TMP/plain.safetensors' --rtol 2e-3 --atol 2e-5 >/dev/null"

"$BIN/downpour-worker" --standalone --steps 8 --batch 16 --threads 1 "${common[@]}" \
    --save "$TMP/sa16.safetensors" >"$TMP/sa16.log" 2>&1
check "standalone at batch 16" test $? = 0
"$L" local --workers 1 --mode async --batch 16 --steps 8 --threads 1 --overlap off "${common[@]}" \
    --out "$TMP/async1" >"$TMP/async1.log" 2>&1
check "local async, 1 worker" test $? = 0
check "async(1 worker) == standalone, bit for bit, running statistics included" \
    compare "$TMP/async1/model.safetensors" "$TMP/sa16.safetensors" --rtol 0 --atol 0
# Sharding: each shard a contiguous third of the floats, whatever tensors
# the cuts fall in; the same run bit for bit.
"$L" local --workers 2 --ps-shards 3 --mode sync --batch 16 --steps 8 --threads 1 "${common[@]}" \
    --out "$TMP/sync3" >"$TMP/sync3.log" 2>&1
check "local sync, 2 workers, 3 shards" test $? = 0
check "3 shards == 1 shard, bit for bit" \
    compare "$TMP/sync3/model.safetensors" "$TMP/sync/model.safetensors" --rtol 0 --atol 0

# downpour eval: the chief's figures from the file alone, at any batch.
for b in 256 7; do
    "$L" eval --checkpoint "$TMP/sync/model.safetensors" --batch $b >"$TMP/eval$b.json" 2>"$TMP/eval$b.err"
    check "downpour eval --batch $b exits 0" test $? = 0
done
ev=$("$TORCH_PY" - "$TMP/eval256.json" "$TMP/eval7.json" "$TMP/sync/summary.json" <<'PY' 2>&1
import json, sys
a, b, s = (json.load(open(p)) for p in sys.argv[1:4])
ok = a["test_accuracy"] == b["test_accuracy"] == round(s["test_accuracy"], 4) and \
    abs(a["test_loss"] - s["test_loss"]) < 1e-3 and abs(b["test_loss"] - s["test_loss"]) < 1e-3
print("same" if ok else f"eval {a} / {b} vs summary {s['test_accuracy']} {s['test_loss']}")
PY
)
check "downpour eval: the chief's accuracy and loss, at batch 256 and 7 ($ev)" test "$ev" = same

# --resume: stopped after 4 of 8 steps, then continued from the checkpoint.
resume=(--workers 1 --mode async --batch 16 --threads 1 --overlap off --lr-schedule cosine:8
        --checkpoint-dir "$TMP/ck" "${common[@]}")
"$L" local "${resume[@]}" --steps 4 --out "$TMP/first" >"$TMP/first.log" 2>&1
check "async, 1 worker, the first 4 of 8 steps with --checkpoint-dir" test $? = 0
"$L" local "${resume[@]}" --steps 8 --resume --out "$TMP/resumed" >"$TMP/resumed.log" 2>&1
check "... --resume runs the other 4" \
    bash -c "[ $? = 0 ] && grep -rq 'resuming at step 5 of 8' '$TMP/resumed/logs'"
check "... and ends with the uninterrupted run's bits, running statistics included" \
    compare "$TMP/resumed/model.safetensors" "$TMP/async1/model.safetensors" --rtol 0 --atol 0

# bf16 on the wire (ZeroMQ frames: --transport zmq) rounds the running
# statistics as it rounds the gradients; the run still trains.
for w in fp32 bf16; do
    "$L" local --workers 2 --ps-shards 3 --mode sync --batch 16 --steps 40 --threads 1 --transport zmq \
        --wire $w "${common[@]}" --out "$TMP/wire-$w" >"$TMP/wire-$w.log" 2>&1
    check "local sync --wire $w, 40 steps" test $? = 0
done
lb=$(json "$TMP/wire-bf16/summary.json" test_loss 2>/dev/null || echo 9)
lf=$(json "$TMP/wire-fp32/summary.json" test_loss 2>/dev/null || echo 0)
check "--wire bf16 trains: test loss $lb below chance (ln 10 = 2.30) by 0.05" ge 2.25 "$lb"
check "... and within 0.05 of the fp32 wire's ($lf)" near "$lb" "$lf" 0.05
# Augmentation and normalisation in the data thread: the same samples in
# the same crops, whether one worker takes 2b or two take b each.
aug=(--augment --normalize train)
"$BIN/downpour-worker" --standalone --steps 8 --batch 32 --bn-ghost-batch 16 --threads 1 "${common[@]}" "${aug[@]}" \
    --save "$TMP/ghost-aug.safetensors" >"$TMP/ghost-aug.log" 2>&1
check "standalone --augment --normalize train, batch 32, ghost batches of 16" test $? = 0
"$L" local --workers 2 --mode sync --batch 16 --steps 8 --threads 1 "${common[@]}" "${aug[@]}" \
    --out "$TMP/sync-aug" >"$TMP/sync-aug.log" 2>&1
check "local sync --augment --normalize train, 2 workers, batch 16" test $? = 0
check "sync(2 x 16) == standalone(32, ghost 16), augmented and normalised" \
    compare "$TMP/sync-aug/model.safetensors" "$TMP/ghost-aug.safetensors" --rtol 2e-3 --atol 2e-5
check "... and is another run than the plain one" \
    bash -c "! \"$TORCH_PY\" tests/integration/compare_st.py '$TMP/sync-aug/model.safetensors' '$TMP/sync/model.safetensors' --rtol 2e-3 --atol 2e-5 >/dev/null"

# CIFAR-10's binary format (1 label byte + 3x32x32 planes per record),
# generated: 5 training files of 16 records and a test file of 40.
"$TORCH_PY" - "$TMP/cifar" <<'PY'
import os, random, sys
d = sys.argv[1]
os.makedirs(d)
rnd = random.Random(7)
def write(name, n):
    with open(os.path.join(d, name), "wb") as f:
        for _ in range(n):
            label = rnd.randrange(10)
            # a class-dependent tint per plane, so there is something to learn
            f.write(bytes([label]) + bytes(min(255, rnd.randrange(128) + 12 * label * (p + 1) // 3)
                                           for p in range(3) for _ in range(1024)))
for i in range(1, 6):
    write(f"data_batch_{i}.bin", 16)
write("test_batch.bin", 40)
PY
cif=(--data "cifar10:$TMP/cifar" --model resnet20 --seed 2 --optimizer momentum --lr 0.05 --no-progress --threads 1 "${aug[@]}")
# The convolutions' GEMM ways (DP_CONV_DIRECT=0) for this pair: the direct
# 3x3 backward sums a batch of 8 in another order than two of 4, and ghost
# batch norms of 4 samples of these nearly flat planes grow that rounding
# (about 1e-5 a step) to 4e-4 in three steps on the AVX-512 path, where the
# GEMM ways agree to 3e-8 (the direct ways are held against the reference
# by test_kernels, and sync == standalone with them by the 1x28x28 runs
# above).
DP_CONV_DIRECT=0 "$BIN/downpour-worker" --standalone --steps 3 --batch 8 --bn-ghost-batch 4 "${cif[@]}" \
    --save "$TMP/cifar-sa.safetensors" --summary "$TMP/cifar-sa.json" >"$TMP/cifar-sa.log" 2>&1
check "cifar10 (generated): resnet20 standalone, 3 steps at batch 8 (ghost 4)" test $? = 0
DP_CONV_DIRECT=0 "$L" local --workers 2 --mode sync --batch 4 --steps 3 "${cif[@]}" --out "$TMP/cifar-sync" \
    >"$TMP/cifar-sync.log" 2>&1
check "cifar10: resnet20, local sync with 2 workers at batch 4" test $? = 0
# (atol 1e-5: the two gradients of 4 averaged against one of 8, 20 layers
# of float sums in another order; weights are ~0.05)
check "... == standalone(8, ghost 4), 3x32x32 crops and flips included" \
    compare "$TMP/cifar-sync/model.safetensors" "$TMP/cifar-sa.safetensors" --rtol 2e-4 --atol 1e-5
meta=$("$TORCH_PY" -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read(); m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
print(m.get("input"), m.get("normalize"))' "$TMP/cifar-sa.safetensors" 2>&1)
check "... the file records the input 3x32x32 and 3 means / 3 stds ($meta)" \
    bash -c "echo '$meta' | grep -Eq '^3x32x32 [0-9.]+,[0-9.]+,[0-9.]+/[0-9.]+,[0-9.]+,[0-9.]+$'"
"$L" eval --checkpoint "$TMP/cifar-sa.safetensors" --data "cifar10:$TMP/cifar" >"$TMP/cifar-eval.json" 2>"$TMP/cifar-eval.err"
check "downpour eval of it on cifar10 exits 0" test $? = 0
ev=$("$TORCH_PY" - "$TMP/cifar-eval.json" "$TMP/cifar-sa.json" <<'PY' 2>&1
import json, sys
a, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
same = a["test_accuracy"] == round(s["test_accuracy"], 4) and abs(a["test_loss"] - s["test_loss"]) < 1e-3
print("same" if same else f"{a} vs {s['test_accuracy']} {s['test_loss']}")
PY
)
check "... with the chief's accuracy and loss: the test set normalised as trained ($ev)" test "$ev" = same

# Every preset, everywhere a model goes: a step standalone (ghost batches
# of the cluster's), the same step in a sync cluster, and the file read
# back by downpour eval.
for n in 32 44 56 110; do
    pre=(--data "cifar10:$TMP/cifar" --model resnet$n --seed 3 --optimizer momentum --lr 0.05 --no-progress
         --threads 1)
    "$BIN/downpour-worker" --standalone --steps 1 --batch 4 --bn-ghost-batch 2 "${pre[@]}" \
        --save "$TMP/r$n-sa.safetensors" --summary "$TMP/r$n-sa.json" >"$TMP/r$n-sa.log" 2>&1
    check "resnet$n: a step standalone at batch 4 (ghost 2)" test $? = 0
    "$L" local --workers 2 --mode sync --batch 2 --steps 1 "${pre[@]}" --out "$TMP/r$n-sync" \
        >"$TMP/r$n-sync.log" 2>&1
    check "resnet$n: a step in a sync cluster of 2 workers at batch 2" test $? = 0
    check "... == standalone(4, ghost 2)" \
        compare "$TMP/r$n-sync/model.safetensors" "$TMP/r$n-sa.safetensors" --rtol 2e-3 --atol 1e-4
    "$L" eval --checkpoint "$TMP/r$n-sa.safetensors" --data "cifar10:$TMP/cifar" >"$TMP/r$n-eval.json" \
        2>"$TMP/r$n-eval.err"
    ev=$("$TORCH_PY" - "$TMP/r$n-eval.json" "$TMP/r$n-sa.json" "$TMP/r$n-sa.safetensors" resnet$n <<'PY' 2>&1
import json, struct, sys
a, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
b = open(sys.argv[3], "rb").read()
spec = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"].get("spec")
same = a["test_accuracy"] == round(s["test_accuracy"], 4) and abs(a["test_loss"] - s["test_loss"]) < 1e-3
print("same" if same and spec == sys.argv[4] else f"{a} vs {s['test_accuracy']} {s['test_loss']}, spec {spec}")
PY
)
    check "resnet$n: its file (spec resnet$n by name) reloads in downpour eval with the chief's figures ($ev)" \
        test "$ev" = same
    "$TORCH_PY" tests/integration/torch_load.py "$TMP/r$n-sa.safetensors" --data "$TMP/cifar" \
        >"$TMP/r$n-torch.json" 2>"$TMP/r$n-torch.err"
    pt=$("$TORCH_PY" - "$TMP/r$n-torch.json" "$TMP/r$n-eval.json" <<'PY' 2>&1
import json, sys
t, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
same = t["test_accuracy"] == e["test_accuracy"] and abs(t["test_loss"] - e["test_loss"]) < 1e-3
print("same" if same else f"torch {t} vs eval {e}")
PY
)
    check "resnet$n: PyTorch loads it strictly and scores it as downpour eval does ($pt)" test "$pt" = same
done
finish
