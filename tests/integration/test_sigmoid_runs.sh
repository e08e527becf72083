#!/usr/bin/env bash
# test_sigmoid_runs: the binary head (model spec "sigmoid", common/model.h) where
# a model goes, on planted data from `downpour gen-libsvm` (20000 samples,
# 1000 Zipf keys, 16 a sample):
#  - quality: "embed:1 sigmoid" (logistic regression: a weight a key, the
#    head's bias) at Adagrad lr 0.1, one epoch, batch 32, holds within 0.005
#    test AUC of a per-sample Adagrad logistic regression written below
#    (plain Python: w, b and their squared-gradient sums, one step a sample
#    in file order), standalone and in `downpour local` with 2 async
#    workers over 2 shards (whose shard 0 holds none of the one dense
#    float: the bias is shard 1's)
#  - standalone: summary.json's test_auc, the file's "bias" tensor (F32
#    [1], moved from its 0); `downpour eval` of the file gives the
#    summary's test_accuracy, test_loss and test_auc exactly; PyTorch's
#    nn.EmbeddingBag of the file's rows plus its bias through torch.sigmoid
#    (tests/integration/torch_rows.py) scores eval's AUC; a dense head
#    ("embed:8 relu fc:1 sigmoid") trains too, scored alike
#  - sync over 2 shards within 0.005 of the reference too; the hybrid
#    (--mode sync --rows-mode async) with the dense head trains
#  - the cluster's async run, recorded, and `downpour replay` of its record:
#    every norm matched, the test figures bit for bit and the model file
#    byte for byte
#  - `downpour sim` (2 workers over 2 shards, async) recorded and replayed
#    likewise
#  - `downpour sweep` of it, standalone and async: the report's AUC column
#  - refused, one line, status 2: fc:2 sigmoid, embed:2 sigmoid, sigmoid not
#    last, sigmoid after relu, at downpour-worker, downpour local, downpour
#    sim and downpour-ps; a label outside two classes: one line naming it
source "$(dirname "$0")/lib.sh"

L=$BIN/downpour
W=$BIN/downpour-worker
cd "$TMP"
"$L" gen-libsvm --out-train train.svm --out-test test.svm --samples 20000 --test-samples 5000 \
    --keys 1000 --nnz 16 --seed 3 --truth truth.json >gen.out 2>&1
check "gen-libsvm writes the planted data" test $? = 0
D=libsvm:train.svm:test.svm
lr=(--model 'embed:1 sigmoid' --data "$D" --optimizer adagrad --lr 0.1 --epochs 1 --batch 32
    --seed 5 --threads 1)

# The reference: per-sample Adagrad logistic regression, zeros at start,
# eps 1e-10 (PyTorch's Adagrad); prints its test AUC (ties counted half).
ref=$("$TORCH_PY" - train.svm test.svm <<'EOF'
import math, sys
def read(path):
    out = []
    for line in open(path):
        t = line.split()
        if t:
            out.append((1 if float(t[0]) > 0 else 0, [(int(k), float(v)) for k, v in (f.split(":") for f in t[1:])]))
    return out
train, test = read(sys.argv[1]), read(sys.argv[2])
lr, eps, w, G, b, Gb = 0.1, 1e-10, {}, {}, 0.0, 0.0
for y, f in train:
    z = b + sum(w.get(k, 0.0) * v for k, v in f)
    g = (1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))) - y
    for k, v in f:
        G[k] = G.get(k, 0.0) + (g * v) ** 2
        w[k] = w.get(k, 0.0) - lr * g * v / (math.sqrt(G[k]) + eps)
    Gb += g * g
    b -= lr * g / (math.sqrt(Gb) + eps)
s = sorted((b + sum(w.get(k, 0.0) * v for k, v in f), y) for y, f in test)
rank, pos, i = 0.0, 0, 0
while i < len(s):  # average ranks over ties
    j = i
    while j + 1 < len(s) and s[j + 1][0] == s[i][0]:
        j += 1
    n1 = sum(y for _, y in s[i:j + 1])
    rank += n1 * (i + j + 2) / 2
    pos += n1
    i = j + 1
neg = len(s) - pos
print((rank - pos * (pos + 1) / 2) / (pos * neg))
EOF
)
check "the per-sample reference scores a test AUC ($ref) near the planted model's ($(json truth.json planted_test_auc))" \
    near "$ref" "$(json truth.json planted_test_auc)" 0.05

# Standalone.
"$W" --standalone "${lr[@]}" --no-progress --save lr.safetensors --summary lr.json >lr.log 2>&1
rc=$?  # before the message's $(...) resets it
check "standalone embed:1 sigmoid exits 0 ($(tail -1 lr.log))" test "$rc" = 0
auc=$(json lr.json test_auc 2>/dev/null || echo 0)
check "... its test AUC $auc within 0.005 of the per-sample reference's $ref" near "$auc" "$ref" 0.005
check "... the file's bias: F32 [1], trained away from its 0" "$TORCH_PY" -c '
import json, struct
b = open("lr.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
e = h["bias"]; s, t = e["data_offsets"]; v = struct.unpack("<f", b[8 + n + s:8 + n + t])[0]
assert e["dtype"] == "F32" and e["shape"] == [1] and v != 0, (e, v)
assert h["__metadata__"]["spec"] == "embed:1 sigmoid" and h["__metadata__"]["classes"] == "2"'
# same_eval SUMMARY EVAL_LINE: test_accuracy, test_loss and test_auc equal.
same_eval() { "$TORCH_PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
bad = [(k, s[k], e[k]) for k in ("test_accuracy", "test_loss", "test_auc") if s[k] != e[k]]
assert not bad, bad' "$1" "$2"; }
"$L" eval --checkpoint lr.safetensors --data libsvm:test.svm --threads 1 >ev.json 2>ev.err
rc=$?  # before the message's $(...) resets it
check "downpour eval of the file exits 0 ($(head -c 200 ev.err))" test "$rc" = 0
check "... its test_accuracy, test_loss and test_auc are the summary's exactly ($(head -c 100 ev.json))" \
    same_eval lr.json ev.json
if has_torch; then
    pt=$("$TORCH_PY" "$BIN/../tests/integration/torch_rows.py" lr.safetensors test.svm 2>&1 | tail -1)
    check "... PyTorch's EmbeddingBag of its rows, plus its bias, through torch.sigmoid: eval's AUC ($pt)" \
        near "$pt" "$(json ev.json test_auc)" 1e-6
else
    skip "PyTorch's EmbeddingBag of the file" "python3-torch is not installed under $TORCH_PY"
fi
"$W" --standalone --model 'embed:8 relu fc:1 sigmoid' --data "$D" --row-lr 0.05 --epochs 1 \
    --batch 64 --seed 9 --threads 1 --no-progress --save ctr.safetensors --summary ctr.json >ctr.log 2>&1
rc=$?  # before the message's $(...) resets it
check "a dense head, embed:8 relu fc:1 sigmoid, exits 0 ($(tail -1 ctr.log))" test "$rc" = 0
check "... its test AUC $(json ctr.json test_auc 2>/dev/null) well above 0.5" ge "$(json ctr.json test_auc 2>/dev/null || echo 0)" 0.85
"$L" eval --checkpoint ctr.safetensors --data libsvm:test.svm --threads 1 >cev.json 2>&1
if has_torch; then
    pt=$("$TORCH_PY" "$BIN/../tests/integration/torch_rows.py" ctr.safetensors test.svm 2>&1 | tail -1)
    check "... PyTorch (nn.Linear(8, 1)'s logit through torch.sigmoid) scores eval's AUC ($pt)" \
        near "$pt" "$(json cev.json test_auc 2>/dev/null || echo 0)" 1e-6
else
    skip "PyTorch of the dense head" "python3-torch is not installed under $TORCH_PY"
fi

# The cluster: 2 async workers over 2 shards, recorded, and its replay.
"$L" local --workers 2 --ps-shards 2 --mode async "${lr[@]}" --record async.rec --out a >a.log 2>&1
rc=$?  # before the message's $(...) resets it
check "downpour local, 2 async workers over 2 shards, exits 0 ($(grep done: a.log))" test "$rc" = 0
auc=$(json a/summary.json test_auc 2>/dev/null || echo 0)
check "... its test AUC $auc within 0.005 of the per-sample reference's $ref" near "$auc" "$ref" 0.005
# same_figures(RUN_DIR REPLAY_DIR): the chief's test figures, bit for bit
same_figures() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
a, b = (json.load(open(d + "/summary.json")) for d in sys.argv[1:])
for k in ("test_loss", "test_auc", "test_accuracy", "steps", "rows"):
    assert a[k] == b[k], (k, a[k], b[k])
EOF
}
"$L" replay async.rec --out r-a >r-a.log 2>&1
check "replay of its record: every recorded norm matched ($(tail -1 r-a.log))" \
    grep -q 'every recorded norm matched' r-a.log
check "... its test figures: the run's summary.json's, bit for bit" same_figures a r-a
check "... its model.safetensors: the run's, byte for byte" cmp a/model.safetensors r-a/model.safetensors

# Sync over real servers too, and the hybrid (--rows-mode async) with a dense head.
"$L" local --workers 2 --ps-shards 2 --mode sync "${lr[@]}" --out sy >sy.log 2>&1
rc=$?  # before the message's $(...) resets it
check "downpour local --mode sync, 2 workers over 2 shards, exits 0 ($(grep done: sy.log))" test "$rc" = 0
auc=$(json sy/summary.json test_auc 2>/dev/null || echo 0)
check "... its test AUC $auc within 0.005 of the per-sample reference's $ref" near "$auc" "$ref" 0.005
"$L" local --workers 2 --ps-shards 2 --mode sync --rows-mode async --model 'embed:8 relu fc:1 sigmoid' \
    --data "$D" --optimizer adagrad --lr 0.1 --epochs 1 --batch 32 --seed 5 --threads 1 --out hy >hy.log 2>&1
rc=$?  # before the message's $(...) resets it
check "--mode sync --rows-mode async, embed:8 relu fc:1 sigmoid, exits 0 ($(grep done: hy.log))" test "$rc" = 0
check "... its test AUC well above 0.5" ge "$(json hy/summary.json test_auc 2>/dev/null || echo 0)" 0.85

# The simulator, recorded and replayed.
"$L" sim --workers 2 --ps-shards 2 --compute exp:10 --updates 301 --model 'embed:1 sigmoid' --data "$D" \
    --optimizer adagrad --lr 0.1 --batch 32 --seed 5 --threads 1 --record sim.rec --out sim >sim.log 2>&1
rc=$?  # before the message's $(...) resets it
check "downpour sim of embed:1 sigmoid, 2 workers over 2 shards, exits 0 ($(tail -1 sim.log))" test "$rc" = 0
check "... its test AUC $(json sim/summary.json test_auc 2>/dev/null) well above 0.5" \
    ge "$(json sim/summary.json test_auc 2>/dev/null || echo 0)" 0.85
"$L" replay sim.rec --out r-sim >r-sim.log 2>&1
check "... replayed: every recorded norm matched ($(tail -1 r-sim.log))" grep -q 'every recorded norm matched' r-sim.log
check "... the replay's test figures: the sim's, bit for bit" same_figures sim r-sim
check "... its model.safetensors: the sim's, byte for byte" cmp sim/model.safetensors r-sim/model.safetensors

# A sweep of it: the report has the runs' AUC.
"$L" sweep --mode standalone,async --workers 2 --lr 0.1 --model 'embed:1 sigmoid' \
    --args "--data $D --optimizer adagrad --batch 32 --epochs 1 --seed 5 --threads 1" --out sw >sw.log 2>&1
rc=$?  # before the message's $(...) resets it
check "downpour sweep of embed:1 sigmoid, standalone and async, exits 0 ($(tail -1 sw.log))" test "$rc" = 0
check "... its results: both runs' test AUC within 0.005 of the reference's" "$TORCH_PY" -c "
import json
r = json.load(open('sw/results.json'))
aucs = [run['test_auc'] for c in r['configs'] for run in c['runs']]
assert len(aucs) == 2 and all(abs(a - $ref) <= 0.005 for a in aucs), aucs"

# Refused: one line, status 2, at every binary.
# refused2 NAME WANT COMMAND...: exit status 2, output one line containing WANT.
refused2() {
    local name=$1 want=$2; shift 2
    "$@" >bad.out 2>&1
    local rc=$?
    if [ $rc != 2 ]; then fail "$name" "exit status $rc: $(head -3 bad.out)"; return; fi
    if [ "$(grep -c . bad.out)" != 1 ] || ! grep -qF -- "$want" bad.out; then
        fail "$name" "not one line with '$want': $(head -3 bad.out)"; return
    fi
    pass "$name"
}
for spec in 'embed:8 fc:2 sigmoid/sigmoid reads one logit but fc1 gives 2 (write fc:1 sigmoid, or softmax for 2 classes)' \
            'embed:2 sigmoid/sigmoid reads one logit but the embedding gives 2' \
            "embed:1 sigmoid relu/'relu' after sigmoid (it must be last)" \
            'embed:4 fc:1 relu sigmoid/sigmoid must follow fc:1 or embed:1'; do
    s=${spec%%/*} want=${spec#*/}
    refused2 "downpour-worker --model '$s': refused" "model spec: $want" \
        "$W" --standalone --model "$s" --data "$D" --no-progress
    refused2 "downpour local --model '$s': refused" "model spec: $want" \
        "$L" local --workers 2 --model "$s" --data "$D" --out never
    refused2 "downpour sim --model '$s': refused" "model spec: $want" \
        "$L" sim --workers 2 --model "$s" --data "$D" --updates 5
    refused2 "downpour-ps --model '$s': refused" "model spec: $want" \
        "$BIN/downpour-ps" --model "$s" --bind tcp://127.0.0.1:0
done
refused2 "downpour-ps --model 'fc:2 sigmoid' on an image input: refused" \
    "model spec: sigmoid reads one logit but fc1 gives 2" \
    "$BIN/downpour-ps" --model 'fc:2 sigmoid' --input 1x28x28 --bind tcp://127.0.0.1:0
check "nothing started or created on a refused spec" test ! -e never
{ head -5 train.svm; echo "2 5:1 7:1"; head -3 train.svm; } >three.svm
"$W" --standalone --model 'embed:1 sigmoid' --data libsvm:three.svm --no-progress >bad.out 2>&1
rc=$?
check "a label outside two classes: refused (status $rc), one line naming it" \
    bash -c "[ $rc = 1 ] && [ \$(grep -c . bad.out) = 1 ] && grep -q 'three.svm:6: label \"2\" is not 0/1 or -1/+1' bad.out"
finish
