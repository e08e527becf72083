#!/usr/bin/env bash
# test_precision: --precision fp32|bf16 through the tools, bf16 on the
# emulated path (the test hook DP_TEST_BF16=emulated: this CPU may have no
# native one). Tolerance: a bf16 run's loss within 0.02 of fp32's (RL: the
# mean step loss within 5 %), and never bit-identical to it (the bf16 path
# ran). Each run a few steps on 256 Fashion-MNIST images (idx: its own test
# split, so the final evaluation is short).
#  - standalone bf16 against fp32: the seed CNN, resnet20, an embed model
#    (its fc layers), an actor-critic on cartpole-v1; summary.json's
#    "precision", the start line's "bf16 (emulated)"
#  - downpour eval --precision bf16 of the embed model gives its run's test
#    loss and AUC bit for bit (fp32 another)
#  - downpour local, 2 async workers in bf16, --record: each worker's start
#    line names the path, the record's header "precision":"bf16", and
#    downpour replay gives the model byte for byte (with --precision fp32
#    over the header: another model, the norms flagged; a header whose
#    precision is fp16: one line, nothing replayed); downpour sim --record
#    and its replay the same
#  - without the hook (where the CPU has no native path) --precision bf16 is
#    one line and exit 2 under downpour-worker, local (no daemon started,
#    no --out made) and sim, and the bf16 record's replay one line (exit 1);
#    bf16 on cuda one line and exit 2 (eval); --precision fp16 exit 2
#    everywhere
# dp-test: unsanitized
# (Its runs train; the emulated path's C code runs under the sanitizers in
# test_bf16_emulated.)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip precision "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
W=$BIN/downpour-worker
L=$BIN/downpour
cd "$TMP"
"$TORCH_PY" - "$TMP" <<'EOF'
import gzip, sys
d = "/usr/share/datasets/fashion-mnist/"
img = gzip.open(d + "train-images-idx3-ubyte.gz").read()
lab = gzip.open(d + "train-labels-idx1-ubyte.gz").read()
n = 256
open(sys.argv[1] + "/img", "wb").write(img[:4] + n.to_bytes(4, "big") + img[8:16] + img[16:16 + n * 784])
open(sys.argv[1] + "/lab", "wb").write(lab[:4] + n.to_bytes(4, "big") + lab[8:8 + n])
EOF
D="idx:$TMP/img,$TMP/lab"
export DP_TEST_BF16=emulated

# pair NAME FLAGS...: the same standalone run in fp32 and in bf16
pair() {
    local name=$1 p; shift
    for p in fp32 bf16; do
        "$W" --standalone --threads 1 --no-progress --precision "$p" "$@" --summary "$name-$p.json" \
            --save "$name-$p.safetensors" --metrics "$name-$p.jsonl" >"$name-$p.log" 2>&1 ||
            { fail "$name: $p run" "exit $? ($(tail -1 "$name-$p.log"))"; return 1; }
    done
    check "$name: summary.json's precision fp32, bf16" \
        test "$(json "$name-fp32.json" precision) $(json "$name-bf16.json" precision)" = "fp32 bf16"
    check "$name: the start line names bf16 (emulated)" grep -q " in bf16 (emulated)" "$name-bf16.log"
    check "$name: the bf16 model is not fp32's, bit for bit" bash -c "! cmp -s $name-fp32.safetensors $name-bf16.safetensors"
}
# near_loss NAME KEY: bf16's KEY within 0.02 of fp32's and not equal to it
near_loss() {
    local a b
    a=$(json "$1-fp32.json" "$2") b=$(json "$1-bf16.json" "$2")
    check "$1: bf16 $2 $b within 0.02 of fp32's $a, not equal" bash -c "[ '$a' != '$b' ] && awk -v a=$a -v b=$b 'BEGIN { d = a - b; exit !(d <= 0.02 && d >= -0.02) }'"
}

pair cnn --data "$D" --steps 4 --batch 16 && near_loss cnn train_loss && near_loss cnn test_loss
pair resnet --data "$D" --model resnet20 --steps 2 --batch 4 && near_loss resnet train_loss
"$L" gen-libsvm --out-train train.svm --out-test test.svm --samples 2000 --test-samples 500 --keys 200 \
    --nnz 8 --seed 3 >gen.log 2>&1
check "gen-libsvm" test $? = 0
pair embed --model 'embed:8 relu fc:16 relu fc:2 softmax' --data libsvm:train.svm:test.svm --steps 4 \
    --batch 32 && near_loss embed train_loss && near_loss embed test_loss
pair rl --env cartpole-v1 --env-steps 200 --seed 3 &&
    check "rl: bf16's mean step loss within 5 % of fp32's, not equal" "$TORCH_PY" -c '
import json
m = [[json.loads(l)["loss"] for l in open(f) if "\"loss\"" in l] for f in ("rl-fp32.jsonl", "rl-bf16.jsonl")]
a, b = (sum(x) / len(x) for x in m)
assert len(m[0]) == len(m[1]) == 40 and m[0] != m[1] and abs(a - b) <= 0.05 * abs(a), (a, b)'

# -- downpour eval in the precision asked ---------------------------------------
"$L" eval --checkpoint embed-bf16.safetensors --data libsvm:test.svm --threads 1 --precision bf16 >ev16.json 2>ev.err
check "eval --precision bf16 exits 0" test $? = 0
"$L" eval --checkpoint embed-bf16.safetensors --data libsvm:test.svm --threads 1 >ev32.json 2>>ev.err
check "eval in bf16 gives the bf16 run's test loss and AUC bit for bit, fp32 others" "$TORCH_PY" -c '
import json
s = json.load(open("embed-bf16.json")); e16 = json.load(open("ev16.json")); e32 = json.load(open("ev32.json"))
assert (e16["test_loss"], e16["test_auc"]) == (s["test_loss"], s["test_auc"]), (e16, s)
assert e32["test_loss"] != s["test_loss"], e32'

# -- downpour local, record and replay; sim ---------------------------------------
"$L" local --workers 2 --mode async --data "$D" --steps 4 --batch 16 --threads 1 --precision bf16 \
    --out loc --record loc.rec --no-progress >loc.log 2>&1
check "local: 2 async workers in bf16 exit 0" test $? = 0
check "local: both workers' start lines say bf16 (emulated)" \
    test "$(grep -l 'steps on cpu in bf16 (emulated)' loc/logs/worker-*.log | wc -l)" = 2
check "local: summary.json's precision is bf16" test "$(json loc/summary.json precision)" = bf16
check "local: the record's header carries the precision" bash -c "head -1 loc.rec | grep -q '\"precision\":\"bf16\"'"
"$L" replay loc.rec --out rep --no-progress >rep.log 2>&1
check "replay of the bf16 record exits 0" test $? = 0
check "replay gives the recorded model byte for byte" cmp rep/model.safetensors loc/model.safetensors
"$L" replay loc.rec --out rep32 --precision fp32 --no-progress >rep32.log 2>&1
check "replayed in fp32 over the header: another model, the norms flagged" \
    bash -c "! cmp -s rep32/model.safetensors loc/model.safetensors && grep -q 'differ from the record' rep32.log"
# a header whose precision is no precision (the footer's hash made right):
# refused with one line, nothing replayed
"$TORCH_PY" - loc.rec bad.rec <<'EOF'
import json, sys
lines = open(sys.argv[1], "rb").read().split(b"\n")[:-2]
h = json.loads(lines[0]); h["precision"] = "fp16"; lines[0] = json.dumps(h, separators=(",", ":")).encode()
def fnv(data, v=0xcbf29ce484222325):
    for b in data:
        v = ((v ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return v
body = b"".join(l + b"\n" for l in lines)
foot = json.dumps({"end": "downpour_record", "events": len(lines) - 1, "fnv1a": "%016x" % fnv(body)}, separators=(",", ":"))
open(sys.argv[2], "wb").write(body + foot.encode() + b"\n")
EOF
"$L" replay bad.rec --out repbad --no-progress >repbad.log 2>&1
rc=$?
check "a record whose header's precision is fp16: refused (status $rc), one line, no model" \
    bash -c "[ $rc = 1 ] && [ \$(grep -c . repbad.log) = 1 ] && grep -q \"'precision' is not fp32 or bf16\" repbad.log && [ ! -e repbad/model.safetensors ]"
"$L" sim --workers 2 --data "$D" --updates 8 --batch 16 --precision bf16 --out sim --record sim.rec >sim.log 2>&1
check "sim in bf16 exits 0, summary.json's precision bf16" test "$(json sim/summary.json precision)" = bf16
"$L" replay sim.rec --out srep --no-progress >srep.log 2>&1
check "the sim's record replays to its model byte for byte" cmp srep/model.safetensors sim/model.safetensors

# -- refusals --------------------------------------------------------------------
# refused CMD...: exit 2 and one line naming --precision
refused() {
    local name=$1; shift
    "$@" >ref.out 2>ref.err
    local rc=$?
    check "$name: exit 2 ($rc), one line: $(head -1 ref.err)" \
        bash -c "[ $rc = 2 ] && [ \$(wc -l <ref.err) = 1 ] && grep -q -- '--precision' ref.err"
}
unset DP_TEST_BF16
if grep -qw 'avx512_bf16\|amx_bf16' /proc/cpuinfo; then
    skip_checks 5 "bf16 refused" "this CPU has a native bf16 path"
else
    refused "worker --precision bf16 without a bf16 path" "$W" --standalone --data "$D" --steps 1 --precision bf16
    refused "local --precision bf16" "$L" local --data "$D" --steps 1 --precision bf16 --out never
    check "... local started nothing (no --out made)" test ! -e never
    refused "sim --precision bf16" "$L" sim --data "$D" --updates 1 --precision bf16
    "$L" replay loc.rec --out rep-refused --no-progress >rep-refused.log 2>&1
    rc=$?
    check "replay of the bf16 record here: refused (status $rc), one line, never run in fp32" \
        bash -c "[ $rc = 1 ] && [ \$(grep -c . rep-refused.log) = 1 ] && grep -q -- '--precision bf16' rep-refused.log && [ ! -e rep-refused/model.safetensors ]"
fi
refused "eval --device cuda:0 --precision bf16 (the CUDA backend is fp32)" \
    "$L" eval --checkpoint cnn-fp32.safetensors --data "$D" --device cuda:0 --precision bf16
for cmd in "$W --standalone" "$L local --out never" "$L sim" "$L eval --checkpoint cnn-fp32.safetensors"; do
    refused "${cmd##*/} --precision fp16" $cmd --data "$D" --precision fp16
done
check "... local started nothing (no --out made)" test ! -e never

finish
