#!/usr/bin/env bash
# test_embed_cluster: a model with an embedding (embed:D) trained against
# real downpour-ps shards on loopback, its row table on the servers
# (server/core/ps_rows.h), through `downpour local --data libsvm:`:
#  - 2 async workers over 2 shards train the planted logistic model of
#    `downpour gen-libsvm` to its test AUC within 0.02; summary.json has
#    rows with one number per shard (each shard's metrics say the same), the
#    servers' row optimizer and rows mode, bytes_pulled; the two workers'
#    steps are the epoch's batches, once; downpour local's done: line
#    gives its headline (test AUC, rows, samples/s), not images/s
#  - the bytes a step pulls are the dense weights plus the rows of the
#    batch's distinct keys, exactly (4 (dense + keys x D) from one metrics
#    line to the next): proportional to the rows touched, not the table
#  - one worker in sync over 2 shards gives the standalone trainer's result
#    bit for bit (the same test loss and AUC), Adam dense, Adagrad rows
#  - hybrid (--mode sync --rows-mode async) and sync with 2 workers train
#    the CTR model; sync's staleness is 0
#  - --resume from the shards' checkpoints (rows included) continues a
#    sync run to the uninterrupted run's bits
#  - over CURVE (downpour local --secure) the same training
#  - the chief's --save (OUT/model.safetensors) holds every shard's rows:
#    embed.keys ascending, as many as summary.json's rows add up to, and
#    `downpour eval --data libsvm:TEST` of it gives the summary's
#    test_accuracy, test_loss and test_auc exactly (logistic regression
#    over 2 async workers, the CTR model of one sync worker, hybrid, sync
#    rows, over CURVE, and a short run
#    on a wide key space whose test keys mostly have no row: they read as
#    the servers' start, which the file's metadata names)
#  - an elastic crew (1 -> 3 -> 1) on libsvm data: shard 0 deals the
#    file's batches, the leavers leave after a whole step, every batch of
#    every epoch is trained once
source "$(dirname "$0")/lib.sh"

L=$BIN/downpour
cd "$TMP"
"$L" gen-libsvm --out-train train.svm --out-test test.svm.gz --samples 100000 \
    --test-samples 10000 --keys 1000 --nnz 16 --seed 3 --truth truth.json >gen.out 2>&1
check "gen-libsvm writes the planted data set" test $? = 0
planted=$(json truth.json planted_test_auc)
D="libsvm:train.svm:test.svm.gz"
CTR='embed:16 relu fc:32 relu fc:2 softmax'
# the CTR model's dense floats: fc 16 -> 32 and fc 32 -> 2, weights and biases
CTR_DENSE=$((16 * 32 + 32 + 32 * 2 + 2))

# Logistic regression, 2 async workers, 2 shards, 2 epochs.
"$L" local --workers 2 --ps-shards 2 --mode async --model 'embed:2 softmax' --data "$D" --lr 0.1 \
    --epochs 2 --batch 128 --seed 5 --threads 1 --out lr >lr.log 2>&1
rc=$?
check "2 async workers over 2 shards exit 0 ($(tail -1 lr.log))" test $rc = 0
auc=$(json lr/summary.json test_auc 2>/dev/null || echo 0)
check "their test AUC $auc is within 0.02 of the planted model's $planted" near "$auc" "$planted" 0.02
check "downpour local's done: line gives a sparse run's headline: its test AUC, rows, samples/s" \
    grep -qE "^done: async, 2 worker\(s\), 2 shard\(s\): test AUC $(printf %.4f "$auc") \(accuracy 0\.[0-9]+, loss [0-9.]+\), rows \[[0-9]+, [0-9]+\], [0-9]+ samples/s" lr.log
check "rows: one number per shard, together the keys seen (at most 1000)" "$TORCH_PY" -c '
import json; s = json.load(open("lr/summary.json")); r = s["rows"]
assert isinstance(r, list) and len(r) == 2 and min(r) > 0 and 500 < sum(r) <= 1000, r'
check "each shard's last metrics line holds its rows, as summary.json does" "$TORCH_PY" -c '
import json; s = json.load(open("lr/summary.json"))
for k in (0, 1):
    last = [json.loads(l) for l in open("lr/metrics/ps-%d.jsonl" % k) if "\"rows\"" in l][-1]
    assert last["rows"] == s["rows"][k] and last["rows_bytes"] > 0, (k, last, s["rows"])'
check "summary.json: the servers' row optimizer, lr and rows mode; bytes_pulled" "$TORCH_PY" -c '
import json; s = json.load(open("lr/summary.json"))
assert (s["row_optimizer"], s["row_lr"], s["rows_mode"]) == ("adagrad", 0.1, "async"), s
assert s["bytes_pulled"] > 0 and s["bytes_pushed"] > 0, s'
# chief_file RUN [TEST]: the chief's file holds sum(rows) rows, keys
# ascending, and downpour eval of it on TEST (test.svm.gz) gives the
# summary's numbers, bit for bit.
chief_file() {
    "$BIN/downpour" eval --checkpoint "$1/model.safetensors" --data "libsvm:${2:-test.svm.gz}" --threads 1 \
        >"$1-ev.json" 2>"$1-ev.err"
    rc=$?
    check "downpour eval of $1's chief file exits 0 ($(head -c 200 "$1-ev.err"))" test $rc = 0
    check "... the file holds every shard's rows (embed.keys ascending, sum(rows) of them) and eval \
gives the summary's test_accuracy, test_loss and test_auc exactly ($(head -c 160 "$1-ev.json"))" \
        "$TORCH_PY" -c '
import json, struct, sys
import numpy as np
s = json.load(open(sys.argv[1] + "/summary.json")); e = json.load(open(sys.argv[1] + "-ev.json"))
b = open(sys.argv[1] + "/model.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); k0, k1 = h["embed.keys"]["data_offsets"]
k = np.frombuffer(b[8 + n + k0:8 + n + k1], dtype="<u8")
assert h["embed.keys"]["dtype"] == "U64" and len(k) == sum(s["rows"]) and (np.diff(k) > 0).all(), (len(k), s["rows"])
assert h["embed.weight"]["shape"][0] == len(k), h["embed.weight"]
bad = [(x, s[x], e[x]) for x in ("test_accuracy", "test_loss", "test_auc") if s[x] != e[x]]
assert not bad and e["rows"] == sum(s["rows"]), (bad, e["rows"], s["rows"])' "$1"
}
chief_file lr
spe=$(grep -c '' train.svm) spe=$(((spe + 127) / 128))
check "the two workers trained the 2 epochs' $((2 * spe)) batches, each once" "$TORCH_PY" -c '
import json, sys
lines = [json.loads(l) for i in (0, 1) for l in open("lr/metrics/worker-%d.jsonl" % i)]
batches = sorted(m["batch"] for m in lines if "keys" in m)
assert batches == list(range(2 * int(sys.argv[1]))), (len(batches), batches[:8])' "$spe"

# One worker, sync, 2 shards against the standalone trainer: the same bits.
common=(--model "$CTR" --data "$D" --optimizer adam --lr 0.01 --lr-schedule constant
        --row-optimizer adagrad --row-lr 0.05 --epochs 1 --batch 128 --seed 5 --threads 1)
"$BIN/downpour-worker" --standalone "${common[@]}" --no-progress --summary sa.json >sa.log 2>&1
check "the standalone CTR run exits 0" test $? = 0
"$L" local --workers 1 --ps-shards 2 --mode sync "${common[@]}" --out one >one.log 2>&1
rc=$?
check "one sync worker over 2 shards exits 0 ($(tail -1 one.log))" test $rc = 0
check "... with the standalone trainer's test loss and AUC, bit for bit" "$TORCH_PY" -c '
import json; a = json.load(open("sa.json")); b = json.load(open("one/summary.json"))
for k in ("test_loss", "test_auc", "test_accuracy", "steps"): assert a[k] == b[k], (k, a[k], b[k])
assert sum(b["rows"]) == a["rows"][0], (a["rows"], b["rows"])'
chief_file one
"$L" gen-libsvm --out-train wtrain.svm --out-test wtest.svm --samples 2000 --test-samples 2000 \
    --keys 200000 --nnz 8 --seed 4 >/dev/null 2>&1
"$L" local --workers 1 --ps-shards 2 --mode async --model 'embed:4 relu fc:2 softmax' \
    --data libsvm:wtrain.svm:wtest.svm --steps 3 --batch 64 --seed 12 --threads 1 --out wide >wide.log 2>&1
rc=$?
check "a short run on 200000 keys over 2 shards exits 0 ($(tail -1 wide.log))" test $rc = 0
chief_file wide wtest.svm
check "each step pulled the dense weights and its keys' rows, no more: 4 ($CTR_DENSE + keys x 16) bytes" \
    "$TORCH_PY" -c '
import json, sys
dense = int(sys.argv[1]); prev = 0; n = 0; most = 0
for l in open("one/metrics/worker-0.jsonl"):
    m = json.loads(l)
    if "keys" not in m: continue
    want = 4 * (dense + m["keys"] * 16)
    assert m["bytes_pulled"] - prev == want, (m["step"], m["bytes_pulled"] - prev, want)
    prev = m["bytes_pulled"]; n += 1; most = max(most, m["keys"])
assert n > 700 and 0 < most < 1000, (n, most)' "$CTR_DENSE"

# Hybrid and sync, 2 workers.
for arm in "sync async" "sync sync"; do
    set -- $arm
    "$L" local --workers 2 --ps-shards 2 --mode "$1" --rows-mode "$2" --model "$CTR" --data "$D" \
        --lr 0.01 --row-lr 0.05 --epochs 1 --batch 128 --seed 7 --threads 1 --out "h-$2" >"h-$2.log" 2>&1
    rc=$?
    check "--mode $1 --rows-mode $2: 2 workers exit 0 ($(tail -1 "h-$2.log"))" test $rc = 0
    check "... the rows mode in summary.json, staleness 0, test AUC above 0.85" "$TORCH_PY" -c '
import json, sys; s = json.load(open("h-%s/summary.json" % sys.argv[1]))
assert s["rows_mode"] == sys.argv[1] and s["mode"] == "sync" and s["staleness_max"] == 0, s
assert s["test_auc"] > 0.85, s["test_auc"]' "$2"
    chief_file "h-$2"
done

# --resume: one sync worker's run stopped after epoch 1 (its shards'
# checkpoints, rows included) and resumed to epoch 2 ends on the bits of
# the uninterrupted 2 epochs (constant lr: the schedule does not depend on
# the run's length).
F=(--workers 1 --ps-shards 2 --mode sync --model 'embed:4 relu fc:4 relu fc:2 softmax' --data "$D"
   --lr 0.01 --lr-schedule constant --row-lr 0.05 --batch 128 --seed 5 --threads 1)
"$L" local "${F[@]}" --epochs 2 --out rs-full >rs-full.log 2>&1 &&
    "$L" local "${F[@]}" --epochs 1 --checkpoint-dir rs-ck --out rs-1 >rs-1.log 2>&1 &&
    "$L" local "${F[@]}" --epochs 2 --checkpoint-dir rs-ck --resume --out rs-2 >rs-2.log 2>&1
check "--resume of a sparse run: 2 epochs in two launches end on the one launch's bits ($(tail -1 rs-2.log))" "$TORCH_PY" -c '
import json
a, b = (json.load(open(d + "/summary.json")) for d in ("rs-full", "rs-2"))
assert [a[k] for k in ("test_loss", "test_auc", "rows", "steps")] == [b[k] for k in ("test_loss", "test_auc", "rows", "steps")], (a, b)'

# Over CURVE (keys downpour local makes): the rows' requests are sealed as
# the dense ones are.
"$L" local --workers 2 --ps-shards 2 --mode async --secure --model 'embed:2 softmax' --data "$D" \
    --lr 0.1 --epochs 1 --batch 128 --seed 5 --threads 1 --out sec >sec.log 2>&1
rc=$?
check "--secure: 2 workers over 2 CURVE shards exit 0 ($(tail -1 sec.log))" test $rc = 0
check "... and train (test AUC above 0.85, rows on both shards)" "$TORCH_PY" -c '
import json; s = json.load(open("sec/summary.json"))
assert s["test_auc"] > 0.85 and len(s["rows"]) == 2 and min(s["rows"]) > 0, s'
chief_file sec

# An elastic crew (--workers 1:3): shard 0 deals the file's batches. The
# chief is held (SIGSTOP) while two workers join, they are held once each
# pushed 5 steps, the crew is scaled back to 1 (their SIGTERM waits for
# SIGCONT: each leaves after a whole step), then everyone goes on: the run
# ends when the deal does, every batch of both epochs trained once.
E=$TMP/el
bg "$L" local --workers 1:3 --ps-shards 2 --mode async --model 'embed:2 softmax' --data "$D" --lr 0.1 \
    --epochs 2 --batch 128 --seed 5 --threads 1 --heartbeat-timeout 60 --out "$E" >el.out 2>el.err
LOCAL=$!
# at_step W S: wait (at most 60 s) for step S in worker W's metrics
at_step() { for _ in $(seq 600); do grep -q "\"step\":$2," "$E/metrics/worker-$1.jsonl" 2>/dev/null && return; sleep 0.1; done; }
pid_of() { pgrep -f -- "--metrics $E/metrics/worker-$1.jsonl" | head -1; }
at_step 0 20
C=$(pid_of 0)
kill -STOP $C
"$L" scale "$E" 3 >/dev/null
at_step 1 5; at_step 2 5
HELD="$(pid_of 1) $(pid_of 2)"
kill -STOP $HELD
"$L" scale "$E" 1 >/dev/null
for _ in $(seq 600); do [ "$(grep -c 'asked to leave' el.err)" = 2 ] && break; sleep 0.1; done
kill -CONT $HELD $C
wait_for $LOCAL 300; rc=$?
check "elastic 1 -> 3 -> 1 on libsvm data: exit 0, workers 1 and 2 left after a whole step ($(tail -1 el.out))" \
    bash -c "[ $rc = 0 ] && grep -q 'worker 1: left after step' '$E/logs/worker-1.log' &&
             grep -q 'worker 2: left after step' '$E/logs/worker-2.log'"
check "... every batch of both epochs trained once, by whoever was dealt it" "$TORCH_PY" -c '
import glob, json, sys
seen = sorted(json.loads(l)["batch"] for f in glob.glob(sys.argv[1] + "/metrics/worker-*.jsonl")
              for l in open(f) if "\"keys\"" in l)
want = list(range(2 * int(sys.argv[2])))
assert seen == want, (len(seen), len(want), [b for b in seen if seen.count(b) > 1][:5])
assert len({f for f in glob.glob(sys.argv[1] + "/metrics/worker-*.jsonl")}) == 3' "$E" "$spe"
check "... summary.json: 3 joins, live 1 to 3, test AUC within 0.02 of the planted model's" "$TORCH_PY" -c '
import json, sys; s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["live_min"] == 1 and s["live_max"] == 3, s
assert sum(1 for e in s["membership"] if e["event"] == "join") >= 3, s["membership"]
assert abs(s["test_auc"] - float(sys.argv[2])) <= 0.02, (s["test_auc"], sys.argv[2])' "$E" "$planted"
finish
