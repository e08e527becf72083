#!/usr/bin/env bash
# test_matrix: every kind of model everywhere. Each kind — dense (an image
# classifier), sparse (embed:D on libsvm data) and RL (an actor-critic in
# cartpole-v1) — with a model given by --model, runs short:
#   standalone (downpour-worker --standalone), downpour local, by hand
#   (downpour-ps and two downpour-worker with TF-style cluster flags),
#   downpour launch (two downpour-worker as its command), downpour sim,
#   --record + downpour replay (the same bits), downpour sweep (sim) and
#   downpour eval of the saved model;
# each must exit 0, leave its files, and report its kind's own figure
# (test_accuracy; test_auc; return_mean_100 and test_return) for its model.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks 27 matrix "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
W=$BIN/downpour-worker D=$BIN/downpour
cd "$TMP" || exit 1
"$D" gen-libsvm --out-train tr.svm --out-test te.svm --samples 3000 --test-samples 600 --keys 4000 --nnz 8 \
    --seed 1 >/dev/null 2>&1
MODEL_dense="fc:32 relu fc:10 softmax" MODEL_sparse="embed:8 relu fc:2 softmax" MODEL_rl="fc:32 tanh ac"
WANT_dense="fc:32 relu fc:10 softmax" WANT_sparse="embed:8 relu fc:2 softmax" WANT_rl="fc:32 tanh ac:2"
# The kind's data and length flags, for a worker, the launcher and sim.
DATA_dense=(--train-samples 2000) DATA_sparse=(--data libsvm:tr.svm:te.svm) DATA_rl=(--env cartpole-v1)
LEN_dense=(--steps 20) LEN_sparse=(--steps 20) LEN_rl=(--env-steps 2000)
SIMLEN_dense=(--updates 30) SIMLEN_sparse=(--updates 30) SIMLEN_rl=(--env-steps 2000)
# figure KIND FILE: "ok" when the summary has the kind's figure (in range),
# else what it has.
figure() {
    "$TORCH_PY" - "$@" <<'PY'
import json, sys
kind, path = sys.argv[1], sys.argv[2]
s = json.load(open(path))
f = {"dense": ["test_accuracy"], "sparse": ["test_auc", "test_accuracy"], "rl": ["return_mean_100", "test_return"]}[kind]
ok = all(isinstance(s.get(k), (int, float)) for k in f)
ok = ok and (kind != "sparse" or 0 < s["test_auc"] <= 1) and (kind != "dense" or 0 < s["test_accuracy"] <= 1)
ok = ok and (kind != "rl" or (s["env"] == "cartpole-v1" and s["env_steps"] >= 2000))
print("ok" if ok else f"missing or off: {[(k, s.get(k)) for k in f]}")
PY
}
# model_of FILE: the model spec summary.json reports.
model_of() { json "$1" model 2>/dev/null; }
# cell KIND WHERE STATUS SUMMARY: the checks of one cell (STATUS: each
# process's exit, all 0).
cell() {
    local kind=$1 where=$2 rc=$3 s=$4 f
    f=$(figure "$kind" "$s" 2>&1 | tail -1)
    check "$kind $where: exit 0 (got $rc), its figure ($f)" bash -c "[[ '$rc' =~ ^0+$ ]] && [ '$f' = ok ]"
}

for kind in dense sparse rl; do
    mv=MODEL_$kind wv=WANT_$kind
    M=${!mv} WANT=${!wv}
    dv="DATA_$kind[@]" lv="LEN_$kind[@]" sv="SIMLEN_$kind[@]"
    DATA=("${!dv}") LEN=("${!lv}") SIMLEN=("${!sv}")
    # standalone
    "$W" --standalone --model "$M" "${DATA[@]}" "${LEN[@]}" --threads 1 --no-progress --save $kind-sa.st \
        --summary $kind-sa.json >$kind-sa.log 2>&1
    cell $kind standalone $? $kind-sa.json
    # downpour local
    "$D" local --workers 2 --model "$M" "${DATA[@]}" "${LEN[@]}" --threads 1 --no-progress --out $kind-lo \
        --record $kind-lo.rec >$kind-lo.log 2>&1
    rc=$?
    cell $kind "downpour local" $rc $kind-lo/summary.json
    got=$(model_of $kind-lo/summary.json)
    check "$kind local: the model given ($got), its file, both workers' metrics" \
        bash -c "[ '$got' = '$WANT' ] && [ -s $kind-lo/model.safetensors ] &&
                 [ -s $kind-lo/metrics/worker-0.jsonl ] && [ -s $kind-lo/metrics/worker-1.jsonl ]"
    # --record + downpour replay: the same bits
    "$D" replay $kind-lo.rec --out $kind-rep --json >$kind-rep.log 2>&1
    rc=$?
    check "$kind replay of the local run: exit 0 (got $rc), bit-identical weights, every push matched" \
        bash -c "[ $rc = 0 ] && cmp -s $kind-lo/model.safetensors $kind-rep/model.safetensors &&
                 grep -q '\"matches_record\":true' $kind-rep.log"
    # by hand: TF-style cluster flags, the servers told the model (and env)
    port=$((20000 + RANDOM % 30000))
    PH=127.0.0.1:$port WH=127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))
    CL=(--ps-hosts $PH --worker-hosts $WH)
    psx=(--model "$M"); [ $kind = rl ] && psx+=(--env cartpole-v1)
    [ $kind = dense ] && psx+=(--input 1x28x28)
    bg "$BIN/downpour-ps" --job-name ps --task-index 0 "${CL[@]}" "${psx[@]}" >$kind-hps.log 2>&1
    PSPID=$!
    bg "$W" --job-name worker --task-index 1 "${CL[@]}" --model "$M" "${DATA[@]}" "${LEN[@]}" --threads 1 \
        --no-progress --timeout 30 >$kind-h1.log 2>&1
    W1=$!
    "$W" --job-name worker --task-index 0 "${CL[@]}" --model "$M" "${DATA[@]}" "${LEN[@]}" --threads 1 \
        --no-progress --timeout 30 --summary $kind-h.json --save $kind-h.st >$kind-h0.log 2>&1
    rc=$?
    wait_for $W1 60; rc1=$?
    wait_for $PSPID 30 >/dev/null
    cell $kind "by hand (--job-name, --ps-hosts, --worker-hosts)" "$rc$rc1" $kind-h.json
    # downpour launch: two downpour-worker as the command (TF_CONFIG)
    lx=(--model "$M"); [ $kind = rl ] && lx+=(--env cartpole-v1)
    "$D" launch --workers 2 "${lx[@]}" --no-progress --out $kind-la -- "$W" --model "$M" "${DATA[@]}" "${LEN[@]}" \
        --threads 1 --no-progress --summary "$TMP/$kind-la.json" >$kind-la.log 2>&1
    rc=$?
    cell $kind "downpour launch -- downpour-worker" $rc $kind-la.json
    # downpour sim
    "$D" sim --workers 2 --model "$M" "${DATA[@]}" "${SIMLEN[@]}" --no-progress --out $kind-sim >$kind-sim.log 2>&1
    rc=$?
    cell $kind "downpour sim" $rc $kind-sim/summary.json
    # downpour sweep (the simulator), two lrs
    sx=(--model "$M"); [ $kind = rl ] && sx+=(--env cartpole-v1 --env-steps 2000)
    args="${DATA[*]} ${SIMLEN[*]}"; [ $kind = rl ] && args=""
    [ $kind = dense ] && args="--train-samples 2000 --updates 30"
    "$D" sweep --cluster sim --workers 2 "${sx[@]}" --lr 0.01,0.05 --seeds 1 ${args:+--args "$args"} --no-progress \
        --out $kind-sw >$kind-sw.log 2>&1
    rc=$?
    check "$kind sweep: exit 0 (got $rc), a report of 2 configurations, its plots" \
        bash -c "[ $rc = 0 ] && [ \$(grep -c '^| c0' $kind-sw/report.md) = 2 ] && ls $kind-sw/*.png >/dev/null"
    # downpour eval of the standalone model
    case $kind in
    dense) ev=(--limit 500) key=test_accuracy ;;
    sparse) ev=(--data libsvm:te.svm) key=test_auc ;;
    rl) ev=(--env cartpole-v1 --episodes 3) key=test_return ;;
    esac
    "$D" eval --checkpoint $kind-sa.st "${ev[@]}" >$kind-ev.json 2>$kind-ev.err
    rc=$?
    check "$kind eval: exit 0 (got $rc), its $key" bash -c "[ $rc = 0 ] && grep -q '\"$key\":' $kind-ev.json"
done
finish
