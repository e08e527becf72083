#!/usr/bin/env bash
# test_compress_cluster: --compress and --error-feedback through the real daemons
# started by `downpour local` (2 workers, 2 shards: each worker compresses
# each shard's slice, each shard expands it):
#  - dense, top-1 % and sign, each with and without error feedback, async:
#    every run trains (nothing rejected), summary.json names compress and
#    error_feedback, every metrics line's bytes_pushed is the same exact
#    figure and the summary's bytes_pushed is the chief's pushes times it;
#    top-1 % moves <= 2.5 % of the dense push's bytes, sign <= 1/32 of it
#    plus a scale (and a byte of padding) per shard
#  - each run's record replays bit for bit (the workers' compression and
#    error feedback come back from the record's header)
#  - sync sums the shards' expansions: a sign run in sync replays too
#  - with --local-steps 4 (30 steps: 7 rounds of 4 and a last of 2), async
#    and sync: what is compressed is each round's pseudo-gradient, once per
#    push, so a metrics line every round, each the same bytes as a push
#    without local steps, the summary's bytes_pushed the chief's 8 rounds
#    times it; the record replays bit for bit; error feedback's residual
#    lives across rounds: on and off differ, and one worker's run is the
#    simulator's bit for bit (the same rule in the engine)
#  - a bad --compress or --error-feedback is one line, exit status 2
# dp-test: unsanitized (compression's encode and expand run under the
# sanitizers in test_ps_compress and test_compress)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip compress_cluster "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
D=$BIN/downpour
tiny=(--model "conv3x3:4 relu maxpool2 fc:10 softmax" --batch 16 --seed 3 --no-progress --threads 1)

# bytes a push of worker 0 moved, from its metrics: "N" when every line says N
per_push() {
    "$TORCH_PY" -c '
import json, sys
b = {l["bytes_pushed"] for l in map(json.loads, open(sys.argv[1])) if "status" in l}
print(b.pop() if len(b) == 1 else "varies:" + ",".join(map(str, sorted(b))))' "$1/metrics/worker-0.jsonl"
}

run() { # name mode compress ef [more flags for downpour local]
    local name=$1 mode=$2 z=$3 ef=$4
    shift 4
    "$D" local --workers 2 --ps-shards 2 --mode "$mode" --steps 20 "${tiny[@]}" --optimizer sgd --lr 0.05 \
        --compress "$z" --error-feedback "$ef" --out "$TMP/$name" --record "$TMP/$name.rec" "$@" \
        >"$TMP/$name.log" 2>&1
    check "local $mode --compress $z --error-feedback $ef $* exits 0" test $? = 0 || tail -5 "$TMP/$name.log"
    local got rej
    got=$(json "$TMP/$name/summary.json" compress 2>/dev/null)/$(json "$TMP/$name/summary.json" error_feedback 2>/dev/null)
    check "... summary.json names both ($got)" test "$got" = "$z/$ef"
    rej=$(json "$TMP/$name/summary.json" updates_rejected 2>/dev/null)
    check "... the shards took every push (rejected $rej)" test "$rej" = 0
    check "... the record's header has them" \
        bash -c "head -1 '$TMP/$name.rec' | grep -q '\"compress\":\"$z\"' && head -1 '$TMP/$name.rec' | grep -q '\"error_feedback\":\"$ef\"'"
    "$D" replay "$TMP/$name.rec" --out "$TMP/r$name" --json >"$TMP/r$name.out" 2>"$TMP/r$name.err"
    check "... replay exits 0" test $? = 0 || tail -3 "$TMP/r$name.err"
    check "... replay: bit-identical weights" cmp "$TMP/$name/model.safetensors" "$TMP/r$name/model.safetensors"
    check "... replay: every norm matched" grep -q '"matches_record":true' "$TMP/r$name.out"
}

bytes_ok() { # name dense-bytes-per-push relation
    local name=$1 dense=$2 rel=$3 p total steps
    p=$(per_push "$TMP/$name")
    total=$(json "$TMP/$name/summary.json" bytes_pushed 2>/dev/null)
    steps=$(json "$TMP/$name/summary.json" steps 2>/dev/null)
    check "... every push moved the same bytes ($p), the summary the chief's 20 ($total = $steps x $p)" \
        bash -c "[ '$steps' = 20 ] && [ '$total' = \$(( $steps * ${p//[^0-9]/0} )) ]"
    check "... $p bytes a push against $dense dense: $rel" \
        "$TORCH_PY" -c "import sys; p, d = $p if '$p'.isdigit() else -1, $dense; sys.exit(not (0 < p and $rel))"
}

run none async none on
dense=$(per_push "$TMP/none")
check "dense: every push moved the same bytes ($dense)" bash -c "[ '$dense' -gt 0 ] 2>/dev/null"
run topk async topk:0.01 on
bytes_ok topk "$dense" "p <= 0.025 * d"
run topk-off async topk:0.01 off
bytes_ok topk-off "$dense" "p <= 0.025 * d"
run sign async sign on
bytes_ok sign "$dense" "p <= d / 32 + 2 * (4 + 1)"
run sign-off async sign off
bytes_ok sign-off "$dense" "p <= d / 32 + 2 * (4 + 1)"
check "error feedback changes the run (top-k)" bash -c "! cmp -s '$TMP/topk/model.safetensors' '$TMP/topk-off/model.safetensors'"
check "error feedback changes the run (sign)" bash -c "! cmp -s '$TMP/sign/model.safetensors' '$TMP/sign-off/model.safetensors'"
run sign-sync sync sign on

# ---- local steps with compression -------------------------------------------
# The push of a round is its pseudo-gradient w0 - wH, compressed once (v =
# w0 - wH + e with error feedback, e = v - expand(sent) kept for the next
# round): a push, and its bytes, every H = 4 data steps.
p_topk=$(per_push "$TMP/topk") p_sign=$(per_push "$TMP/sign")
local_ok() { # name per-push-bytes-without-local-steps
    local name=$1 p=$2 steps h total lines
    steps=$(json "$TMP/$name/summary.json" steps 2>/dev/null)
    h=$(json "$TMP/$name/summary.json" local_steps 2>/dev/null)
    total=$(json "$TMP/$name/summary.json" bytes_pushed 2>/dev/null)
    check "... summary: 30 steps in rounds of 4 ($steps, local_steps $h)" test "$steps/$h" = 30/4
    lines=$("$TORCH_PY" -c '
import json, sys
print(",".join(str(l["step"]) for l in map(json.loads, open(sys.argv[1])) if "status" in l))' \
        "$TMP/$name/metrics/worker-0.jsonl")
    check "... a push per round, after data steps 3, 7, ..., 27, 29 ($lines)" test "$lines" = 3,7,11,15,19,23,27,29
    check "... every round's push the bytes of a push without local steps ($(per_push "$TMP/$name") = $p)" \
        test "$(per_push "$TMP/$name")" = "$p"
    check "... bytes_pushed: the chief's 8 rounds x $p ($total)" test "$total" = $((8 * p))
}
lsteps=(--steps 30 --local-steps 4)
run ltopk async topk:0.01 on "${lsteps[@]}"
local_ok ltopk "$p_topk"
run ltopk-off async topk:0.01 off "${lsteps[@]}"
local_ok ltopk-off "$p_topk"
check "local steps: error feedback changes the run (top-k)" \
    bash -c "! cmp -s '$TMP/ltopk/model.safetensors' '$TMP/ltopk-off/model.safetensors'"
run lsign-nes async sign on "${lsteps[@]}" --outer-optimizer nesterov
local_ok lsign-nes "$p_sign"
run lsign-sync sync sign on "${lsteps[@]}"
local_ok lsign-sync "$p_sign"
run ltopk-sync sync topk:0.01 off "${lsteps[@]}"
local_ok ltopk-sync "$p_topk"
# One worker, one shard: no schedule left to differ, so the daemons' run is
# the simulator's to the bit — the worker's client and the lab engine carry
# the same residual from round to round (32 steps: the simulator counts
# whole rounds, --updates 8).
one=(--local-steps 4 "${tiny[@]}" --optimizer sgd --lr 0.05 --lr-schedule constant --compress topk:0.01)
"$D" local --workers 1 --steps 32 "${one[@]}" --out "$TMP/one" >"$TMP/one.log" 2>&1
check "local, 1 worker, --local-steps 4 --compress topk:0.01 exits 0" test $? = 0 || tail -5 "$TMP/one.log"
"$D" sim --workers 1 --updates 8 "${one[@]/--no-progress/--json}" --out "$TMP/sone" >"$TMP/sone.out" 2>"$TMP/sone.err"
check "sim, the same: exits 0" test $? = 0 || tail -3 "$TMP/sone.err"
check "... its model is the daemons', bit for bit" cmp "$TMP/one/model.safetensors" "$TMP/sone/model.safetensors"

# Bad values: one line naming the flag, exit status 2, nothing started.
"$D" local --workers 1 --compress zip --out "$TMP/bad" >"$TMP/bad.out" 2>"$TMP/bad.err"
rc=$?
check "--compress zip: status 2 ($rc), one line" bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/bad.err') = 1 ] && grep -q \"compress 'zip': none, topk:FRACTION or sign\" '$TMP/bad.err'"
"$BIN/downpour-worker" --ps tcp://127.0.0.1:1 --compress topk:0.9 >"$TMP/bad2.out" 2>"$TMP/bad2.err"
rc=$?
check "--compress topk:0.9: status 2 ($rc), says the range" bash -c "[ $rc = 2 ] && grep -q 'fraction in (0, 0.5]' '$TMP/bad2.err'"
"$D" sim --workers 2 --error-feedback maybe >"$TMP/bad3.out" 2>"$TMP/bad3.err"
rc=$?
check "sim --error-feedback maybe: status 2 ($rc), one line" bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/bad3.err') = 1 ] && grep -q 'on or off' '$TMP/bad3.err'"
# A model with batch norm's statistics (state whose values a push carries)
# is not compressed: one line, in the simulator and on the real worker.
"$D" sim --workers 2 --updates 4 --batch 4 --model resnet8 --compress sign >"$TMP/bn.out" 2>"$TMP/bn.err"
rc=$?
check "sim --compress sign on resnet8: refused (status $rc) with one line" \
    bash -c "[ $rc != 0 ] && grep -q 'this model has state tensors' '$TMP/bn.err'"
"$D" local --workers 1 --steps 2 --batch 4 --model resnet8 --compress topk:0.01 --out "$TMP/bnl" \
    >"$TMP/bnl.out" 2>"$TMP/bnl.err"
rc=$?
check "local --compress on resnet8: refused (status $rc), the worker says why" \
    bash -c "[ $rc != 0 ] && grep -rq 'this model has state tensors' '$TMP/bnl.err' '$TMP/bnl/logs'"
finish
