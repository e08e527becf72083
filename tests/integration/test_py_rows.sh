#!/usr/bin/env bash
# test_py_rows: a PyTorch module with a sparse embedding (nn.EmbeddingBag,
# sparse=True) as a worker of real downpour-ps shards, its rows on the
# servers (downpour.torch.Worker's pull(keys) and push):
#  - save_init leaves the embedding's weight out of the --init file and
#    names its width; two sparse embeddings and pull() without keys are
#    refused with a line
#  - one worker over 2 shards, the dense layer by the servers' SGD and the
#    rows by their sgd, adagrad, adam and sparse_adam (from zeros), ends on the weights
#    of the same steps in one process with torch.optim.SGD / Adagrad /
#    SparseAdam (the rows' sparse_adam) on the sparse embedding and Adam
#    (every key in every batch: the rows' step counts are Adam's one
#    count), to float rounding —
#    tests/integration/py_rows.py
# (the wire's row code runs under the sanitizers in test_ps_rows and
# test_embed_cluster; this is the Python side)
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
use_py_package 28 py_rows
PY=tests/integration/py_rows.py

run_py() { local name=$1; shift; run_counted "$name" "$TORCH_PY" "$PY" "$@"; }

for case in "sgd 40" "adagrad 40" "adam 12" "sparse_adam 40"; do
    set -- $case
    run_py "init-$1" init "$TMP/$1.safetensors" "$2"
    for i in 0 1; do rm -f "$TMP/ps$i.ready"; done
    for i in 0 1; do
        bg "$BIN/downpour-ps" --init "$TMP/$1.safetensors" --shard "$i/2" --workers 1 --mode async \
            --optimizer sgd --lr 0.1 --row-optimizer "$1" --row-lr 0.1 --row-init 0 \
            --bind tcp://127.0.0.1:0 --ready-file "$TMP/ps$i.ready" >"$TMP/ps-$1-$i.log" 2>&1
    done
    for i in 0 1; do t=0; until [ -s "$TMP/ps$i.ready" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done; done
    EP="$(cat "$TMP/ps0.ready" 2>/dev/null),$(cat "$TMP/ps1.ready" 2>/dev/null)"
    run_py "train-$1" train "$EP" "$1" "$2" 20
done
finish
