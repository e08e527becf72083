#!/usr/bin/env bash
# test_lab_cluster: the lab end to end with the real daemons.
#  - downpour local --record (2 shards, 3 async workers): summary.json has
#    the staleness histogram, which counts every applied update, and each
#    worker's metrics end with its own
#  - downpour replay of that record: model.safetensors bit-identical to the
#    run's, twice; summary.json written; every recorded norm matched
#  - a run with a straggler replays bit for bit too (that its schedule
#    differs is the processes' timing, not asserted)
#  - sync with a backup worker replays bit for bit too, and so does async
#    with --optimizer rmsprop (its --rms-alpha and --eps from the header),
#    and async with each --delay-lr rule and --delay-compensation (the
#    threshold's skips and the compensated pushes decided the same); sync
#    says they have no effect there; --lr-staleness with another rule is
#    refused
#  - async with --local-steps (a short last round) and the outer delayed
#    Nesterov replays bit for bit, every round recomputed; so does
#    --local-steps auto:4 (DyLU), every push naming its round's steps
#  - batch norm and dropout (a residual spec), --augment and --normalize
#    train: an async record (2 shards) and a sync one replay bit for bit,
#    every norm matched (the header carries the data transforms; the replay
#    draws each worker's dropout masks and crops as the daemon did: by data
#    step and the slice's place in the global batch); downpour sim with 1
#    worker is standalone bit for bit, running statistics included
#  - --train-samples N (the first N training samples): standalone is the
#    simulator's 1 worker bit for bit and not the whole set's run; the
#    daemons' record carries N and replays bit for bit; --epochs count N
#  - the record holds the workers' --threads as given, and replays
#  - a replay on other batches (--data-seed) says it differs from the
#    record, how often, and from which event on
#  - a damaged record is refused with one line; no record is left by a
#    shard that was killed (only its .tmp)
#  - a record of shards restored from a checkpoint is refused with one line
#    naming the version they started at (the record of the run from
#    version 0 replays)
#  - downpour sim --json: its last line has the promised fields; the
#    straggler's gradients are the stalest, by far, and without --straggler
#    (the control) no worker's are; run twice it gives the same bits; a bad
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

# Other batches than the recorded workers': the same schedule replays, and
# the replay says that (and where) its gradients differ from the record's.
"$D" replay "$TMP/a.rec" --data-seed 99 --out "$TMP/rd" --json >"$TMP/rd.out" 2>"$TMP/rd.err"
rc=$?
pushes=$(grep -c '"e":"push"' "$TMP/a.rec")
# Events are numbered from 1 after the header line: the first push's number.
first=$(($(grep -n -m1 '"e":"push"' "$TMP/a.rec" | cut -d: -f1) - 1))
check "replay --data-seed 99: runs (status $rc), matches_record false" \
    bash -c "[ $rc = 0 ] && grep -q '\"matches_record\":false' '$TMP/rd.out'"
check "... and warns that all $pushes pushes differ, the first at event $first" \
    grep -q "replay: $pushes push(es) differ from the record in their gradient or update norm, the first at event $first:" "$TMP/rd.err"

# A straggler's schedule (worker 1 sleeping 30 ms a step) replays as
# faithfully. (Whether it differs from the schedule above is the
# processes' timing: under load both can come out serialized alike, so
# that is not asserted.)
"$D" local --workers 3 --ps-shards 2 --mode async --steps 40 "${tiny[@]}" --straggler 1:30 --out "$TMP/b" \
    --record "$TMP/b.rec" >"$TMP/b.log" 2>&1
check "local with a straggler --record exits 0" test $? = 0
"$D" replay "$TMP/b.rec" --out "$TMP/rb" --json >"$TMP/rb.out" 2>"$TMP/rb.err"
check "the straggler's record replays: the same weights, every norm matched" \
    bash -c "cmp -s '$TMP/b/model.safetensors' '$TMP/rb/model.safetensors' && grep -q '\"matches_record\":true' '$TMP/rb.out'"

"$D" local --workers 3 --mode sync --replicas-to-aggregate 2 --steps 30 "${tiny[@]}" --out "$TMP/s" \
    --record "$TMP/s.rec" >"$TMP/s.log" 2>&1
check "local sync (R = 2 of 3) --record exits 0" test $? = 0
"$D" replay "$TMP/s.rec" --out "$TMP/rs" >"$TMP/rs.log" 2>&1
check "sync replay: bit-identical weights" cmp "$TMP/s/model.safetensors" "$TMP/rs/model.safetensors"

# RMSProp on the servers (A3C's eps 0.1, alpha 0.95): the shards' square
# averages come back from the record's header, so the replay is bit for bit.
"$D" local --workers 2 --ps-shards 2 --mode async --steps 20 "${tiny[@]}" --optimizer rmsprop --lr 0.001 \
    --rms-alpha 0.95 --eps 0.1 --out "$TMP/rms" --record "$TMP/rms.rec" >"$TMP/rms.log" 2>&1
check "local async --optimizer rmsprop --record exits 0" test $? = 0
opt=$(json "$TMP/rms/summary.json" optimizer 2>/dev/null)
check "summary.json names the servers' optimizer ($opt)" test "$opt" = rmsprop
"$D" replay "$TMP/rms.rec" --out "$TMP/rrms" >"$TMP/rrms.log" 2>&1
check "rmsprop replay: bit-identical weights" cmp "$TMP/rms/model.safetensors" "$TMP/rrms/model.safetensors"

# Local steps on the real daemons: each push a round of --local-steps 4 of
# the workers' momentum (its state carried, its lr annealed over the run),
# the shards' outer delayed Nesterov; 30 steps make a short last round (2
# steps). The record's header has the rounds, the inner optimizer and the
# steps, so the replay recomputes every round, bit for bit.
"$D" local --workers 2 --ps-shards 2 --mode async --steps 30 "${tiny[@]}" --local-steps 4 \
    --optimizer momentum --lr 0.02 --outer-optimizer delayed-nesterov --delay-ms 5 --out "$TMP/loc" \
    --record "$TMP/loc.rec" >"$TMP/loc.log" 2>&1
check "local async --local-steps 4 --outer-optimizer delayed-nesterov --record exits 0" test $? = 0
every=$(json "$TMP/loc/summary.json" outer_momentum_every 2>/dev/null)
check "summary.json: the outer momentum moves once per 2 pushes ($every)" test "$every" = 2
"$D" replay "$TMP/loc.rec" --out "$TMP/rloc" --json >"$TMP/rloc.out" 2>"$TMP/rloc.err"
check "local-steps replay exits 0" test $? = 0 || cat "$TMP/rloc.err"
check "local-steps replay: bit-identical weights" cmp "$TMP/loc/model.safetensors" "$TMP/rloc/model.safetensors"
check "local-steps replay: every round's norms matched" grep -q '"matches_record":true' "$TMP/rloc.out"

# --local-steps auto:4 (DyLU) on the real daemons: each worker's rounds by
# its measured step time against the crew's fastest (the ACKs'), so the
# H of a round is not known ahead; each push names its round's steps
# ("h" in the record) and the replay trains each round by it, bit for bit.
"$D" local --workers 2 --ps-shards 2 --mode async --steps 30 "${tiny[@]}" --local-steps auto:4 \
    --optimizer momentum --lr 0.02 --outer-optimizer delayed-nesterov --out "$TMP/dylu" \
    --record "$TMP/dylu.rec" >"$TMP/dylu.log" 2>&1
check "local async --local-steps auto:4 --record exits 0" test $? = 0 || tail -5 "$TMP/dylu.log"
auto=$(json "$TMP/dylu/summary.json" local_steps_auto 2>/dev/null)
check "summary.json: local_steps_auto ($auto)" test "$auto" = True -o "$auto" = true
nh=$(grep -c '"e":"push".*"h":[1-4][,}]' "$TMP/dylu.rec")
np=$(grep -c '"e":"push"' "$TMP/dylu.rec")
check "every push of the record names its round's steps, 1..4 ($nh of $np)" test "$nh" = "$np" -a "$np" -gt 0
"$D" replay "$TMP/dylu.rec" --out "$TMP/rdylu" --json >"$TMP/rdylu.out" 2>"$TMP/rdylu.err"
check "auto replay exits 0" test $? = 0 || cat "$TMP/rdylu.err"
check "auto replay: bit-identical weights" cmp "$TMP/dylu/model.safetensors" "$TMP/rdylu/model.safetensors"

# Batch norm (2-D and 1-D) and dropout: the running statistics ride the
# pushes as values, the masks are a hash of (seed, data step, sample), so
# the replay recomputes every gradient bit for bit.
bnspec="conv3x3:4 bn relu maxpool2 res( conv3x3:4 bn relu conv3x3:8:s2 bn ) relu gap fc:16 bn relu dropout:0.3 fc:10 softmax"
bn=(--model "$bnspec" --batch 16 --seed 3 --threads 1 --no-progress --augment --normalize train)
for mode in async sync; do
    "$D" local --workers 2 --ps-shards 2 --mode $mode --steps 20 "${bn[@]}" --out "$TMP/bn-$mode" \
        --record "$TMP/bn-$mode.rec" >"$TMP/bn-$mode.log" 2>&1
    check "bn + dropout: local $mode --record exits 0" test $? = 0
    "$D" replay "$TMP/bn-$mode.rec" --out "$TMP/rbn-$mode" --json >"$TMP/rbn-$mode.out" 2>"$TMP/rbn-$mode.err"
    check "... replay exits 0" test $? = 0
    check "... replay: bit-identical weights and running statistics" \
        cmp "$TMP/bn-$mode/model.safetensors" "$TMP/rbn-$mode/model.safetensors"
    check "... replay: every norm matched" grep -q '"matches_record":true' "$TMP/rbn-$mode.out"
done
check "the record's header has the data transforms" \
    bash -c "head -1 '$TMP/bn-async.rec' | grep -q '\"augment\":true' && head -1 '$TMP/bn-async.rec' | grep -q '\"normalize\":\"train\"'"
sa=(--model "$bnspec" --batch 16 --seed 3 --threads 1 --optimizer momentum --lr 0.05 --lr-schedule constant
    --augment --normalize 0.3/0.35)
"$BIN/downpour-worker" --standalone --steps 12 "${sa[@]}" --no-progress --save "$TMP/bn-sa.safetensors" \
    >"$TMP/bn-sa.log" 2>&1
check "bn + dropout: standalone, 12 steps" test $? = 0
"$D" sim --workers 1 --mode async --updates 12 "${sa[@]}" --out "$TMP/bn-sim" >"$TMP/bn-sim.log" 2>&1
check "... downpour sim --workers 1: exits 0" test $? = 0
check "... and is standalone bit for bit (dropout masks, running statistics)" \
    cmp "$TMP/bn-sa.safetensors" "$TMP/bn-sim/model.safetensors"

# --train-samples N: a training subset, the first N samples, alike in every
# mode. The standalone trainer's 2 epochs of 160 samples (its --normalize
# train statistics the subset's) are the simulator's bit for bit, and not
# the run on the whole set; the daemons' record carries N, so its replay
# draws from the same subset; --epochs count the subset's.
ts=(--model "fc:10 softmax" --batch 16 --seed 3 --threads 1 --optimizer sgd --lr 0.05 --lr-schedule constant
    --normalize train)
"$BIN/downpour-worker" --standalone --epochs 2 --train-samples 160 "${ts[@]}" --no-progress \
    --save "$TMP/ts-sa.safetensors" >"$TMP/ts-sa.log" 2>&1
check "standalone --train-samples 160 --epochs 2 exits 0" test $? = 0
"$D" sim --workers 1 --epochs 2 --train-samples 160 "${ts[@]}" --out "$TMP/ts-sim" --json >"$TMP/ts-sim.out" 2>&1
u=$(tail -1 "$TMP/ts-sim.out" | "$TORCH_PY" -c 'import json,sys; print(json.load(sys.stdin)["updates"])' 2>/dev/null)
check "... sim --workers 1, the same: 2 epochs of 160 at batch 16 are 20 updates ($u)" test "$u" = 20
check "... and is standalone bit for bit" cmp "$TMP/ts-sa.safetensors" "$TMP/ts-sim/model.safetensors"
"$D" sim --workers 1 --updates 20 "${ts[@]}" --out "$TMP/ts-all" >"$TMP/ts-all.out" 2>&1
check "... which the whole set's 20 updates are not" \
    bash -c "! cmp -s '$TMP/ts-sim/model.safetensors' '$TMP/ts-all/model.safetensors'"
"$D" local --workers 2 --ps-shards 2 --mode async --epochs 2 --train-samples 160 "${ts[@]}" --no-progress \
    --out "$TMP/ts-loc" --record "$TMP/ts-loc.rec" >"$TMP/ts-loc.log" 2>&1
check "local --train-samples 160 --epochs 2 --record exits 0" test $? = 0 || tail -3 "$TMP/ts-loc.log"
got=$(json "$TMP/ts-loc/summary.json" steps 2>/dev/null)/$(json "$TMP/ts-loc/summary.json" train_samples 2>/dev/null)
check "... summary: 2 epochs of 160 over 2 workers, 10 steps each, train_samples 160 ($got)" test "$got" = 10/160
check "... the record's header has train_samples" bash -c "head -1 '$TMP/ts-loc.rec' | grep -q '\"train_samples\":160'"
"$D" replay "$TMP/ts-loc.rec" --out "$TMP/rts-loc" --json >"$TMP/rts-loc.out" 2>"$TMP/rts-loc.err"
check "... replay: bit-identical weights" cmp "$TMP/ts-loc/model.safetensors" "$TMP/rts-loc/model.safetensors"
check "... replay: every norm matched" grep -q '"matches_record":true' "$TMP/rts-loc.out"

# The delay rules and DC-ASGD on the real shards: --delay-lr threshold
# skips pushes (dropped, with the reason), --delay-compensation keeps each
# worker's pulled weights and marks every push "dc"; the header carries
# both, so the replay decides and computes the same, bit for bit. Then
# adaptive with a constant lambda. --delay-ms makes the pushes interleave
# (the tiny model's pushes are otherwise all fresh, and the rules have
# nothing to act on); the replay's bits do not depend on how they did.
for spec in "threshold:1 adaptive:0.5 sgd 0.05" "adaptive const:0.5 adam 0.002"; do
    read -r rule dc opt lr <<<"$spec"
    name=dl-${rule%%:*}
    "$D" local --workers 3 --ps-shards 2 --mode async --steps 30 "${tiny[@]}" --optimizer "$opt" --lr "$lr" \
        --delay-ms 10 --delay-lr "$rule" --delay-compensation "$dc" --out "$TMP/$name" \
        --record "$TMP/$name.rec" >"$TMP/$name.log" 2>&1
    check "local async --delay-lr $rule --delay-compensation $dc --record exits 0" test $? = 0
    got=$(json "$TMP/$name/summary.json" delay_lr 2>/dev/null)/$(json "$TMP/$name/summary.json" delay_compensation 2>/dev/null)
    check "... summary.json names both ($got)" test "$got" = "$rule/$dc"
    check "... the record's header has them" bash -c "head -1 '$TMP/$name.rec' | grep -q '\"delay_lr\":\"$rule\"' && head -1 '$TMP/$name.rec' | grep -q '\"dc\":\"$dc\"'"
    comp=$(grep -c '"dc":1' "$TMP/$name.rec")
    check "... the applied pushes were compensated ($comp)" test "$comp" -gt 0
    "$D" replay "$TMP/$name.rec" --out "$TMP/r$name" --json >"$TMP/r$name.out" 2>"$TMP/r$name.err"
    check "... replay exits 0" test $? = 0
    check "... replay: bit-identical weights" cmp "$TMP/$name/model.safetensors" "$TMP/r$name/model.safetensors"
    check "... replay: every norm matched" grep -q '"matches_record":true' "$TMP/r$name.out"
done
stale=$(grep -c '"stale":[1-9]' "$TMP/dl-threshold.rec")
skipped=$(grep -c '"st":"dropped"' "$TMP/dl-threshold.rec")
dropped0=$(json "$TMP/dl-threshold/summary.json" updates_dropped 2>/dev/null)
check "threshold: shard 0's skips are summary.json's updates_dropped ($dropped0)" \
    test "$(grep -c '"e":"push","s":0,.*"st":"dropped"' "$TMP/dl-threshold.rec")" = "$dropped0"
if [ "$stale" -gt 0 ]; then
    check "threshold:1 skipped some of the $stale stale pushes ($skipped)" test "$skipped" -gt 0
else
    skip "threshold skips" "no push was stale in this run (the machine serialised the workers)"
fi
"$D" local --workers 2 --mode sync --steps 5 "${tiny[@]}" --delay-lr adaptive --out "$TMP/dls" >"$TMP/dls.log" 2>&1
check "sync with --delay-lr adaptive runs, saying it has no effect there" \
    bash -c "[ $? = 0 ] && grep -rq 'delay-lr adaptive has no effect in sync mode' '$TMP/dls/logs'"
check "... and its summary says none" test "$(json "$TMP/dls/summary.json" delay_lr 2>/dev/null)" = none
"$D" local --workers 2 --steps 5 "${tiny[@]}" --lr-staleness --delay-lr adaptive --out "$TMP/dlc" >/dev/null 2>"$TMP/dlc.err"
rc=$?
check "--lr-staleness with --delay-lr adaptive is refused (status $rc) with one line" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/dlc.err') = 1 ] && grep -q 'lr-staleness is --delay-lr inverse' '$TMP/dlc.err'"

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

# A record of shards restored from a checkpoint lacks the weights they
# started from: replay refuses it. The run from version 0 first (its record
# replays), then the same run resumed at its checkpoint with a new record.
# start_ps NAME FLAGS...: a shard on a free loopback port; EP its endpoint.
start_ps() {
    local name=$1 t; shift
    rm -f "$TMP/$name.ready"
    bg "$BIN/downpour-ps" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/$name.ready" "$@" 2>"$TMP/$name.log"
    PS_PID=$!
    for ((t = 0; t < 100 * ${DP_TEST_TIMEOUT_SCALE:-1}; t++)); do
        [ -s "$TMP/$name.ready" ] && break; kill -0 "$PS_PID" 2>/dev/null || break; sleep 0.1
    done
    EP=$(cat "$TMP/$name.ready" 2>/dev/null)
}
fc=(--model "fc:10 softmax")
ps_run=(--workers 1 --mode async --seed 3 "${fc[@]}" --checkpoint-dir "$TMP/rck" --checkpoint-every 5)
wk_run=(--task-index 0 --steps 10 "${fc[@]}" --batch 16 --threads 1 --seed 3 --no-progress)
start_ps rec0 "${ps_run[@]}" --record "$TMP/fresh.rec"
"$BIN/downpour-worker" --ps "$EP" "${wk_run[@]}" >"$TMP/w-rec0.log" 2>&1
check "a run from version 0 with --record: the worker finishes" test $? = 0
wait_for "$PS_PID" $((10 * ${DP_TEST_TIMEOUT_SCALE:-1}))
start_ps rec1 "${ps_run[@]}" --resume --record "$TMP/restored.rec"
check "... resumed, the shard warns that its record will not replay" \
    grep -q "restored at version 10; a replay needs a run from version 0 and will refuse this record" "$TMP/rec1.log"
"$BIN/downpour-worker" --ps "$EP" "${wk_run[@]}" >"$TMP/w-rec1.log" 2>&1
check "... and the resumed run's worker finishes" test $? = 0
wait_for "$PS_PID" $((10 * ${DP_TEST_TIMEOUT_SCALE:-1}))
"$D" replay "$TMP/fresh.rec" --out "$TMP/rfresh" >"$TMP/rfresh.log" 2>&1
rc=$?
check "the record from version 0 replays (status $rc)" test $rc = 0
"$D" replay "$TMP/restored.rec" --out "$TMP/rrest" >/dev/null 2>"$TMP/rrest.err"
rc=$?
check "the restored run's record is refused (status $rc) with one line naming the version it started at" \
    bash -c "[ $rc = 1 ] && [ \$(wc -l <'$TMP/rrest.err') = 1 ] && grep -q 'started from a checkpoint (version 10)' '$TMP/rrest.err'"
check "... and no model written" test ! -e "$TMP/rrest/model.safetensors"

simf=(--workers 4 --compute exp:20 --updates 300 --model "fc:10 softmax" --batch 8 --eval-every 100 --eval-limit 500
      --diag-every 50 --json)
"$D" sim "${simf[@]}" --straggler 0:3 --out "$TMP/sim1" >"$TMP/sim1.out" 2>"$TMP/sim.err"
check "sim --json exits 0" test $? = 0
out=$(cat "$TMP/sim1.out")
last=$(echo "$out" | tail -1)
f=$(echo "$last" | "$TORCH_PY" -c 'import sys,json; o=json.load(sys.stdin); print(all(k in o for k in ["fresh_fraction","staleness_mean","staleness_max","test_accuracy","updates","momentum_effective","cosine_stale_fresh_mean"]), o["updates"], len(o["evals"]))')
check "sim: the last line has the fields, 300 updates, 3 evaluations (the last at the end) ($f)" \
    bash -c "[ '$f' = 'True 300 3' ]"
# stalest OUT: in the result (OUT's last line) worker 0's mean staleness is
# over twice every other's. With exponential times a worker 3x slower sees
# ~3x the pushes of the others while it computes; equal workers' means
# differ by a few tens of percent. Prints the means.
stalest() {
    tail -1 "$1" | "$TORCH_PY" -c 'import sys,json; m=json.load(sys.stdin)["staleness_mean_per_worker"]; print(m); sys.exit(0 if m[0] > 2 * max(m[1:]) else 1)'
}
is_stalest() { stalest "$1" >/dev/null; }
not_stalest() { ! stalest "$1" >/dev/null; }
check "sim --straggler 0:3: the straggler's gradients are by far the stalest (per worker: $(stalest "$TMP/sim1.out"))" \
    is_stalest "$TMP/sim1.out"
"$D" sim "${simf[@]}" >"$TMP/sim0.out" 2>"$TMP/sim0.err"
check "sim without --straggler (the control) exits 0" test $? = 0
check "... and there worker 0's are not (per worker: $(stalest "$TMP/sim0.out"))" not_stalest "$TMP/sim0.out"
# The same flags give the same result bit for bit: weights and every line
# (the wall-clock figures aside).
"$D" sim "${simf[@]}" --straggler 0:3 --out "$TMP/sim2" >"$TMP/sim2.out" 2>>"$TMP/sim.err"
check "sim run twice: exit 0 both times" test $? = 0
check "sim run twice: model.safetensors bit for bit the same" cmp "$TMP/sim1/model.safetensors" "$TMP/sim2/model.safetensors"
same=$("$TORCH_PY" - "$TMP/sim1.out" "$TMP/sim2.out" "$TMP/sim1/summary.json" "$TMP/sim2/summary.json" <<'PY' 2>&1
import json, sys
clock = {"wall_s", "train_s", "images_per_s", "images_per_s_per_worker"}
def strip(o):
    return {k: v for k, v in o.items() if k not in clock}
a = [strip(json.loads(l)) for l in open(sys.argv[1])]
b = [strip(json.loads(l)) for l in open(sys.argv[2])]
sa, sb = (strip(json.load(open(p))) for p in sys.argv[3:5])
diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
print("same" if len(a) == len(b) and not diff and sa == sb else
      f"{len(a)} vs {len(b)} lines, differing lines {diff[:5]}, summaries differ in {[k for k in sa if sa[k] != sb.get(k)]}")
PY
)
check "sim run twice: every JSON line and summary.json the same, wall-clock figures aside ($same)" test "$same" = same
check "sim: eval and diag lines before it" bash -c "echo '$out' | grep -q '\"event\":\"eval\"' && echo '$out' | grep -q '\"event\":\"diag\"'"
"$D" sim --workers 4 --compute gamma:3 --updates 10 >/dev/null 2>"$TMP/bad.err"
rc=$?
check "sim --compute gamma:3 is refused (status $rc) with one line" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/bad.err') = 1 ] && grep -q 'gamma:3' '$TMP/bad.err'"
finish
