#!/usr/bin/env bash
# test_embed_standalone: a model with an embedding (embed:D) trained by
# downpour-worker --standalone on libsvm data from `downpour gen-libsvm`:
#  - logistic regression (embed:2 softmax) reaches the planted model's test
#    AUC within 0.02; summary.json has test_auc, rows (one number: the rows
#    held), the row optimizer and the usual fields; the progress line shows
#    the rows; labels -1/+1 train as 0/1 do
#  - a small CTR model (embed:16 relu fc:32 relu fc:2 softmax) trains too
#    (test AUC well above 0.5), and the same seed twice gives the same
#    summary (but its clock) and the same model file, whose metadata holds
#    the rows' digest; the file holds the rows (embed.keys, embed.weight)
#    (read by downpour.safetensors too, the keys as uint64) and
#    `downpour eval --data libsvm:TEST` of it gives the summary's
#    test_accuracy, test_loss and test_auc exactly, also where test keys
#    have no row (their initial value, named in the metadata); a crafted
#    file with its keys out of order is one error line; PyTorch's
#    nn.EmbeddingBag from the file's keys and rows (tests/integration/
#    torch_rows.py) with its fc layers scores the same test AUC
#  - a bad libsvm line is one error line with its file and line number;
#    an embedding without libsvm data, libsvm data without an embedding,
#    three classes, CUDA, a cluster worker's own row flags and downpour
#    eval of its file on image data are one line each
source "$(dirname "$0")/lib.sh"

W=$BIN/downpour-worker
cd "$TMP"
"$BIN/downpour" gen-libsvm --out-train train.svm --out-test test.svm.gz --samples 100000 \
    --test-samples 10000 --keys 1000 --nnz 16 --seed 3 --truth truth.json >gen.out 2>&1
check "gen-libsvm writes the planted data set" test $? = 0
planted=$(json truth.json planted_test_auc)
D="libsvm:train.svm:test.svm.gz"

# Logistic regression: adagrad rows at lr 0.1, 2 epochs.
"$W" --standalone --model 'embed:2 softmax' --data "$D" --row-lr 0.1 --epochs 2 --batch 128 \
    --seed 5 --summary lr.json --metrics lr.jsonl --progress >lr.log 2>&1
rc=$?  # before the message's $(...) resets it
check "logistic regression exits 0 ($(tail -1 lr.log | tr '\r' ' ' | tail -c 200))" test "$rc" = 0
auc=$(json lr.json test_auc 2>/dev/null || echo 0)
check "its test AUC $auc is within 0.02 of the planted model's $planted" near "$auc" "$planted" 0.02
check "... and the eval line's AUC is the summary's" \
    "$TORCH_PY" -c 'import json, sys; e = [json.loads(l) for l in open("lr.jsonl") if "eval" in l][-1]
s = json.load(open("lr.json")); assert abs(e["test_auc"] - s["test_auc"]) < 1e-6, (e, s["test_auc"])'
check "summary.json: rows is one number, the rows held (at most the 1000 keys)" \
    "$TORCH_PY" -c 'import json; s = json.load(open("lr.json")); r = s["rows"]
assert isinstance(r, list) and len(r) == 1 and 500 < r[0] <= 1000, r'
for k in mode workers ps_shards epochs steps test_accuracy test_loss test_auc train_loss images_per_s \
         wall_s updates_applied rows rows_digest row_optimizer row_lr row_init model data batch seed; do
    json lr.json "$k" >/dev/null 2>&1 || fail "summary has $k" "missing"
done
pass "summary.json has the usual fields and the embedding's"
check "... the rows' optimizer is adagrad at lr 0.1 ($(json lr.json row_optimizer) $(json lr.json row_lr))" \
    test "$(json lr.json row_optimizer)/$(json lr.json row_lr)/$(json lr.json model)" = "adagrad/0.1/embed:2 softmax"
rows=$("$TORCH_PY" -c 'import json; print(json.load(open("lr.json"))["rows"][0])')
check "the progress line shows the rows ($rows)" bash -c "tr '\r' '\n' <lr.log | grep -q 'step 1564/1564 .* rows $rows\$'"

# The CTR model, twice with one seed.
ctr() { "$W" --standalone --model 'embed:16 relu fc:32 relu fc:2 softmax' --data "$D" --row-lr 0.05 \
        --epochs 1 --batch 128 --seed 9 --threads 1 --no-progress --save "$1.safetensors" \
        --summary "$1.json" >"$1.log" 2>&1; }
ctr a
rc=$?  # before the message's $(...) resets it
check "the CTR model exits 0 ($(tail -1 a.log))" test "$rc" = 0
auc=$(json a.json test_auc 2>/dev/null || echo 0)
check "its test AUC $auc is well above 0.5" ge "$auc" 0.8
ctr b
clockless() { "$TORCH_PY" -c 'import json, sys; s = json.load(open(sys.argv[1]))
for k in ("wall_s", "train_s", "images_per_s"): s.pop(k)
print(json.dumps(s, sort_keys=True))' "$1"; }
check "the same seed twice: the same summary but its clock" cmp -s <(clockless a.json) <(clockless b.json)
check "... and the same model file" cmp -s a.safetensors b.safetensors
check "... whose metadata holds the rows' digest" \
    grep -qa "\"embed_rows_digest\":\"$(json a.json rows_digest)\"" a.safetensors

# downpour eval of the file: the summary's numbers, bit for bit, at the run's --threads (the
# dense layers' sums follow the thread count on some CPUs: AVX2 Zen 3 here).
# same_eval SUMMARY EVAL_LINE: test_accuracy, test_loss and test_auc equal.
same_eval() { "$TORCH_PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
bad = [(k, s[k], e[k]) for k in ("test_accuracy", "test_loss", "test_auc") if s[k] != e[k]]
assert not bad and e["rows"] == s["rows"][0], (bad, e["rows"], s["rows"])' "$1" "$2"; }
"$BIN/downpour" eval --checkpoint a.safetensors --data libsvm:test.svm.gz --threads 1 >ev.json 2>ev.err
rc=$?  # before the message's $(...) resets it
check "downpour eval of the CTR model's file exits 0 ($(head -c 200 ev.err))" test "$rc" = 0
check "... its test_accuracy, test_loss and test_auc are the summary's exactly ($(head -c 120 ev.json))" \
    same_eval a.json ev.json
# st_tensor FILE NAME: the tensor's dtype, shape and bytes, read as the
# format says (8-byte header length, JSON header, data) with no library
st_py='import json, struct, sys
def tensor(path, name):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    e = h[name]; s, t = e["data_offsets"]; return e["dtype"], e["shape"], b[8 + n + s:8 + n + t], b, 8 + n + s
'
check "... the file holds the rows: embed.keys U64 [n] ascending, embed.weight F32 [n, 16], n = the rows" \
    "$TORCH_PY" -c "$st_py"'
import numpy as np; s = json.load(open("a.json"))
kd, ks, kb, _, _ = tensor("a.safetensors", "embed.keys"); wd, ws, _, _, _ = tensor("a.safetensors", "embed.weight")
k = np.frombuffer(kb, dtype="<u8")
assert kd == "U64" and wd == "F32" and ks == [s["rows"][0]] and ws == [s["rows"][0], 16], (kd, ks, wd, ws)
assert (np.diff(k) > 0).all()'
check "... and the package's own reader (downpour.safetensors.read) reads it: keys as uint64" \
    env PYTHONPATH="$BIN/python" "$TORCH_PY" -c "$st_py"'
import numpy as np
from downpour import safetensors
t = dict(safetensors.read("a.safetensors")[0])
k = np.frombuffer(tensor("a.safetensors", "embed.keys")[2], dtype="<u8")
assert t["embed.keys"].dtype == np.uint64 and (t["embed.keys"] == k).all(), t["embed.keys"][:4]
assert t["embed.weight"].dtype == np.float32 and t["embed.weight"].shape == (k.size, 16)'
pt=$("$TORCH_PY" "$BIN/../tests/integration/torch_rows.py" a.safetensors test.svm.gz 2>&1 | tail -1)
check "... PyTorch's nn.EmbeddingBag of its keys and rows and its fc layers: eval's test AUC ($pt)" \
    near "$pt" "$(json ev.json test_auc)" 1e-6
# a short run on a wide key space: test keys without a row read as their start
"$BIN/downpour" gen-libsvm --out-train wtrain.svm --out-test wtest.svm --samples 2000 \
    --test-samples 2000 --keys 200000 --nnz 8 --seed 4 >/dev/null 2>&1
"$W" --standalone --model 'embed:4 relu fc:2 softmax' --data libsvm:wtrain.svm:wtest.svm --steps 3 \
    --batch 64 --seed 12 --no-progress --save w.safetensors --summary w.json >w.log 2>&1
rc=$?  # before the message's $(...) resets it
check "a short run on 200000 keys saves ($(tail -1 w.log))" test "$rc" = 0
"$BIN/downpour" eval --checkpoint w.safetensors --data libsvm:wtest.svm >wev.json 2>wev.err
check "... eval, most test keys without a row, gives its summary's numbers exactly" same_eval w.json wev.json
"$TORCH_PY" -c "$st_py"'
_, _, kb, b, at = tensor("a.safetensors", "embed.keys")  # keys 3 and 4 swapped
b = bytearray(b); b[at + 24:at + 40] = kb[32:40] + kb[24:32]; open("unsorted.safetensors", "wb").write(b)'
"$BIN/downpour" eval --checkpoint unsorted.safetensors --data libsvm:test.svm.gz >/dev/null 2>bad.err
rc=$?
check "a crafted file, its keys out of order: refused (status $rc), one line" \
    bash -c "test $rc = 1 && [ \$(wc -l <bad.err) = 1 ] && grep -q 'unsorted.safetensors: embed.keys not in ascending order' bad.err"
"$W" --standalone --model 'embed:16 relu fc:32 relu fc:2 softmax' --data "$D" --row-lr 0.05 \
    --steps 50 --batch 128 --seed 10 --threads 1 --no-progress --summary c.json >c.log 2>&1
check "another seed, other rows" test "$(json a.json rows_digest)" != "$(json c.json rows_digest)"

# Labels -1/+1 are 0/1 to the reader: the same run, the same table.
sed -E 's/^0 /-1 /; s/^1 /+1 /' train.svm >pm.svm
pm() { "$W" --standalone --model 'embed:2 softmax' --data "libsvm:$1" --row-lr 0.1 --steps 200 \
       --batch 128 --seed 5 --no-progress --summary "$2" >/dev/null 2>&1; }
pm train.svm zo.json && pm pm.svm pm.json
check "labels -1/+1 train as 0/1 do: the same rows ($(json pm.json rows_digest 2>/dev/null))" \
    test "$(json zo.json rows_digest)" = "$(json pm.json rows_digest)"

# refused NAME WANT ARGS...: exit status 1, stderr one line containing WANT.
refused() {
    local name=$1 want=$2; shift 2
    "$W" "$@" --no-progress >bad.out 2>bad.err
    local rc=$?
    if [ $rc != 1 ]; then fail "$name" "exit status $rc"; return; fi
    if [ "$(wc -l <bad.err)" != 1 ] || ! grep -qF -- "$want" bad.err; then
        fail "$name" "not one line with '$want': $(head -3 bad.err)"; return
    fi
    pass "$name"
}
{ head -7 train.svm; echo "1 5:1 7:oops"; head -3 train.svm; } >bad.svm
refused "a bad libsvm line: one line with its file and line number" \
    'bad.svm:8: value "oops" of key 7 is not a number' \
    --standalone --model 'embed:2 softmax' --data libsvm:bad.svm
refused "... in the test file too" 'bad.svm:8: value "oops"' \
    --standalone --model 'embed:2 softmax' --data libsvm:train.svm:bad.svm
refused "libsvm data without an embedding" "needs a model that starts with embed:D" \
    --standalone --model 'fc:2 softmax' --data "$D"
refused "three classes on 0/1 labels" "ends in 3 classes but libsvm labels are 0 and 1" \
    --standalone --model 'embed:4 fc:3 softmax' --data "$D"
refused "an embedding on CUDA" "trains on the CPU only for now" \
    --standalone --model 'embed:2 softmax' --data "$D" --device cuda:0
refused "a cluster worker's own row flags (the servers' there)" "are the servers' in a cluster" \
    --ps tcp://127.0.0.1:1 --model 'embed:2 softmax' --data "$D" --row-lr 0.1
refused "ftrl rows with a random start" "ftrl rows start at zero" \
    --standalone --model 'embed:2 softmax' --data "$D" --row-optimizer ftrl --row-init 0.1
refused "a missing file" "nope.svm: cannot open" \
    --standalone --model 'embed:2 softmax' --data libsvm:nope.svm
if [ -d /usr/share/datasets/fashion-mnist ]; then
    refused "an embedding on image data" "starts with an embedding: it trains on sparse data" \
        --standalone --model 'embed:2 softmax' --steps 1
else
    skip "an embedding on image data" "Debian's dataset-fashion-mnist is not installed"
fi
if [ -d /usr/share/datasets/fashion-mnist ]; then # eval reads its --data first
    "$BIN/downpour" eval --checkpoint a.safetensors >eval.out 2>eval.err
    rc=$?
    check "downpour eval of an embedding's file on image data: refused (status $rc), one line" \
        bash -c "test $rc != 0 && [ \$(wc -l <eval.err) = 1 ] && grep -q 'score it on libsvm data' eval.err"
else
    skip "downpour eval of an embedding's file" "Debian's dataset-fashion-mnist is not installed"
fi
check "--help names the row flags" bash -c "'$W' --help | grep -q -- '--row-optimizer NAME' && '$W' --help | grep -q 'libsvm:TRAIN'"
finish
