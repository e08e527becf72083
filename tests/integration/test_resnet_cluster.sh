#!/usr/bin/env bash
# test_resnet_cluster: a residual network with batch norm through the cluster.
#  - sync with 2 workers at batch b == standalone at batch 2b with
#    --bn-ghost-batch b (batch norm's statistics per worker's batch; the
#    running statistics as the servers combine them: the mean of the two
#    pushed values), weights and running statistics to float tolerance;
#    without ghost batches standalone at 2b is a different run
#  - async with 1 worker == standalone, bit for bit: the servers set the
#    running statistics to the pushed values instead of stepping them
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
finish
