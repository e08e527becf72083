#!/usr/bin/env bash
# test_lab_cluster: the lab end to end with the real daemons.
#  - downpour local --record (2 shards, 3 async workers): summary.json has
#    the staleness histogram, which counts every applied update, and each
#    worker's metrics end with its own
#  - downpour replay of that record: model.safetensors bit-identical to the
#    run's, twice; summary.json written; every recorded norm matched
#  - a run under another schedule (a straggler) records another schedule and
#    ends with other weights
#  - sync with a backup worker replays bit for bit too
#  - the record holds the workers' --threads as given, and replays
#  - a damaged record is refused with one line; no record is left by a
#    shard that was killed (only its .tmp)
#  - downpour sim --json: its last line has the promised fields; a bad
#    --compute is one line and exit status 2
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip lab "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
D=$BIN/downpour
tiny=(--model "conv3x3:4 relu maxpool2 fc:10 softmax" --batch 16 --seed 3 --no-progress)

"$D" local --workers 3 --ps-shards 2 --mode async --steps 40 "${tiny[@]}" --out "$TMP/a" \
    --record "$TMP/a.rec" >"$TMP/a.log" 2>&1
check "local async --record exits 0" test $? = 0
check "the record is written whole (no .tmp left)" bash -c "[ -s '$TMP/a.rec' ] && ! ls '$TMP'/a.rec.tmp* >/dev/null 2>&1"
h=$("$TORCH_PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(sum(s["staleness_histogram"]), s["updates_applied"], 0 < s["staleness_geometric_p"] <= 1)' "$TMP/a/summary.json" 2>&1)
check "summary.json: the histogram counts every applied update, p in (0, 1] ($h)" bash -c "[ '$h' = '120 120 True' ]"
check "each worker's metrics carry its own histogram" \
    bash -c "for i in 0 1 2; do grep -q '\"event\":\"staleness\".*staleness_histogram' '$TMP/a/metrics/worker-'\$i'.jsonl' || exit 1; done"

for i in 1 2; do
    "$D" replay "$TMP/a.rec" --out "$TMP/r$i" --json >"$TMP/r$i.out" 2>"$TMP/r$i.err"
    check "replay $i exits 0" test $? = 0
done
check "replay: weights bit-identical to the recorded run's" cmp "$TMP/a/model.safetensors" "$TMP/r1/model.safetensors"
check "two replays agree bit for bit" cmp "$TMP/r1/model.safetensors" "$TMP/r2/model.safetensors"
check "replay: every recorded gradient and update norm matched" grep -q '"matches_record":true' "$TMP/r1.out"
acc_run=$(json "$TMP/a/summary.json" test_accuracy); acc_rep=$(json "$TMP/r1/summary.json" test_accuracy 2>/dev/null || echo -1)
check "replay's summary.json has the run's accuracy ($acc_rep vs $acc_run)" near "$acc_rep" "$acc_run" 0
check "replay's summary.json has the histogram" grep -q staleness_histogram "$TMP/r1/summary.json"

"$D" local --workers 3 --ps-shards 2 --mode async --steps 40 "${tiny[@]}" --straggler 1:30 --out "$TMP/b" \
    --record "$TMP/b.rec" >"$TMP/b.log" 2>&1
check "local with a straggler --record exits 0" test $? = 0
sched() { grep '"e":"push","s":0' "$1" | "$TORCH_PY" -c 'import sys,json; print([(e["w"],e["v"]) for e in map(json.loads,sys.stdin)])'; }
check "another schedule is recorded" bash -c "[ \"\$1\" != \"\$2\" ]" _ "$(sched "$TMP/a.rec")" "$(sched "$TMP/b.rec")"
check "... and ends with other weights" bash -c "! cmp -s '$TMP/a/model.safetensors' '$TMP/b/model.safetensors'"

"$D" local --workers 3 --mode sync --replicas-to-aggregate 2 --steps 30 "${tiny[@]}" --out "$TMP/s" \
    --record "$TMP/s.rec" >"$TMP/s.log" 2>&1
check "local sync (R = 2 of 3) --record exits 0" test $? = 0
"$D" replay "$TMP/s.rec" --out "$TMP/rs" >"$TMP/rs.log" 2>&1
check "sync replay: bit-identical weights" cmp "$TMP/s/model.safetensors" "$TMP/rs/model.safetensors"

# The record holds the workers' --threads as given (it once held the
# launcher's default, cores / workers, whatever was given).
"$D" local --workers 1 --threads 1 --steps 6 "${tiny[@]}" --out "$TMP/t1" --record "$TMP/t1.rec" >"$TMP/t1.log" 2>&1
check "local --workers 1 --threads 1 --record exits 0" test $? = 0
check "... the record says 1 thread" grep -q '"threads":1[,}]' "$TMP/t1.rec"
"$D" replay "$TMP/t1.rec" --out "$TMP/rt1" >"$TMP/rt1.log" 2>&1
check "... and replays bit for bit" cmp "$TMP/t1/model.safetensors" "$TMP/rt1/model.safetensors"

# Damaged records: one line each, nothing written.
head -c -40 "$TMP/a.rec" >"$TMP/cut.rec"
"$D" replay "$TMP/cut.rec" --out "$TMP/rc" >/dev/null 2>"$TMP/rc.err"
rc=$?
check "a truncated record is refused (status $rc) with one line" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <'$TMP/rc.err') = 1 ] && grep -q 'cut.rec: truncated' '$TMP/rc.err'"
check "... and no model written" test ! -e "$TMP/rc/model.safetensors"
sed '0,/"w":0/s//"w":1/' "$TMP/a.rec" >"$TMP/edit.rec"
"$D" replay "$TMP/edit.rec" --out "$TMP/re" >/dev/null 2>"$TMP/re.err"
rc=$?
check "an edited record is refused (status $rc) with one line" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <'$TMP/re.err') = 1 ] && grep -q 'edit.rec: truncated or corrupt' '$TMP/re.err'"

# A shard killed mid-run leaves its .tmp, never a half record.
bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:*" --workers 1 --record "$TMP/k.rec" --model "fc:10 softmax"
pid=$!
sleep 1
kill -KILL $pid; wait $pid 2>/dev/null
check "a killed shard leaves no record at the path" bash -c "[ ! -e '$TMP/k.rec' ] && ls '$TMP'/k.rec.tmp.?????? >/dev/null 2>&1"

out=$("$D" sim --workers 4 --compute exp:20 --straggler 0:3 --updates 300 --model "fc:10 softmax" --batch 8 \
      --eval-every 100 --eval-limit 500 --diag-every 50 --json 2>"$TMP/sim.err")
check "sim --json exits 0" test $? = 0
last=$(echo "$out" | tail -1)
f=$(echo "$last" | "$TORCH_PY" -c 'import sys,json; o=json.load(sys.stdin); print(all(k in o for k in ["fresh_fraction","staleness_mean","staleness_max","test_accuracy","updates","momentum_effective","cosine_stale_fresh_mean"]), o["updates"], len(o["evals"]), o["staleness_mean_per_worker"][0] < o["staleness_mean_per_worker"][1])')
check "sim: the last line has the fields, 300 updates, 3 evaluations (the last at the end), the straggler's gradients stalest ($f)" \
    bash -c "[ '$f' = 'True 300 3 False' ]"
check "sim: eval and diag lines before it" bash -c "echo '$out' | grep -q '\"event\":\"eval\"' && echo '$out' | grep -q '\"event\":\"diag\"'"
"$D" sim --workers 4 --compute gamma:3 --updates 10 >/dev/null 2>"$TMP/bad.err"
rc=$?
check "sim --compute gamma:3 is refused (status $rc) with one line" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/bad.err') = 1 ] && grep -q 'gamma:3' '$TMP/bad.err'"
finish
