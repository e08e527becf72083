#!/usr/bin/env bash
# test_sim_trace: `downpour sim --compute trace:DIR`, the simulator driven by
# the step times of a real `downpour local` run.
#  - every push line of the real run's worker metrics has step_ms and
#    clock_s, and (the plain loop, the actor-critic's) pull_ms and push_ms
#  - the statistic: a sim replaying a run's own times (the same M) has the
#    run's staleness histogram within total variation distance 0.1 (the
#    run: 3 async workers of an elastic crew 3:3, so all of them train to
#    the data's end, each slowed by --straggler: 4 ms, 12 ms exp, 4 ms;
#    the sim is compared with that very run, whatever its timing was)
#  - the sim on a trace is a function of the flags and the trace: twice the
#    same histogram
#  - 5 simulated workers on 3 traced ones, run past the trace's end: the
#    straggler's series is replayed by workers 1 and 4, the stalest two
#  - an --env run's segments trace and replay too, and so do the steps of
#    a model with embed:D
#  - bad traces: a DIR that is missing, one without metrics, a worker file
#    without steps, with a line cut short (the last, one in the middle), a
#    line of JSON that is no object, a step_ms that is not a number or
#    negative, a negative pull_ms, steps without step_ms (an older run):
#    each one line on stderr and exit status 2, nothing run
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip trace "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
D=$BIN/downpour
tiny=(--model "conv3x3:4 relu maxpool2 fc:10 softmax" --batch 16 --seed 3 --no-progress --train-samples 3072)

"$D" local --workers 3:3 --mode async --epochs 1 "${tiny[@]}" --straggler 0:4 --straggler 1:12:exp \
    --straggler 2:4 --out "$TMP/a" >"$TMP/a.log" 2>&1
check "local 3:3 async with three stragglers exits 0" test $? = 0
fields=$("$TORCH_PY" - "$TMP/a" <<'EOF'
import json, sys
ok = True
for w in range(3):
    for line in open(f"{sys.argv[1]}/metrics/worker-{w}.jsonl"):
        o = json.loads(line)
        if "event" in o: continue
        ok &= all(k in o and o[k] >= 0 for k in ("step_ms", "clock_s", "pull_ms", "push_ms"))
        ok &= o["pull_ms"] + o["push_ms"] <= o["step_ms"] + 1e-3
print(ok)
EOF
)
check "every push line has step_ms, clock_s, pull_ms, push_ms ($fields)" test "$fields" = True

# tv A B: the total variation distance between two summaries' histograms.
tv() {
    "$TORCH_PY" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p))["staleness_histogram"] for p in sys.argv[1:3])
n = max(len(a), len(b))
a, b = a + [0] * (n - len(a)), b + [0] * (n - len(b))
print("%.4f" % (0.5 * sum(abs(x / sum(a) - y / sum(b)) for x, y in zip(a, b))))
EOF
}
U=$(json "$TMP/a/summary.json" updates_applied 2>/dev/null || echo 0)
for i in 1 2; do
    "$D" sim --workers 3:3 --compute trace:"$TMP/a" --updates "$U" "${tiny[@]}" --out "$TMP/s$i" \
        >"$TMP/s$i.log" 2>&1
    check "sim --compute trace:DIR ($U updates) run $i exits 0" test $? = 0
done
d=$(tv "$TMP/a/summary.json" "$TMP/s1/summary.json" 2>/dev/null || echo 1)
check "the sim's staleness histogram is the run's: TV distance $d < 0.1" awk -v d="$d" 'BEGIN { exit !(d < 0.1) }'
"$TORCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["staleness_histogram"])' "$TMP/a/summary.json"
"$TORCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["staleness_histogram"])' "$TMP/s1/summary.json"
d2=$(tv "$TMP/s1/summary.json" "$TMP/s2/summary.json" 2>/dev/null || echo 1)
check "twice the same histogram ($d2)" test "$d2" = 0.0000

# More simulated workers than traced ones, longer than the trace: worker w
# replays traced worker w mod 3, wrapping; 1 and 4 replay the straggler.
"$D" sim --workers 5 --compute trace:"$TMP/a" --updates 1500 "${tiny[@]}" --json >"$TMP/m5.out" 2>"$TMP/m5.err"
check "sim --workers 5 on a trace of 3, 1500 updates (past its end) exits 0" test $? = 0
top=$(tail -1 "$TMP/m5.out" | "$TORCH_PY" -c 'import json,sys
m = json.load(sys.stdin)["staleness_mean_per_worker"]
print(sorted(sorted(range(5), key=lambda w: -m[w])[:2]))' 2>/dev/null)
check "... the stalest two are 1 and 4, the straggler's replayers ($top)" test "$top" = "[1, 4]"

# An actor-critic run's segments are its steps.
"$D" local --env cartpole-v1 --workers 2 --mode async --env-steps 4000 --seed 2 --straggler 1:3 \
    --out "$TMP/rl" --no-progress >"$TMP/rl.log" 2>&1
check "local --env cartpole-v1 (2 async workers) exits 0" test $? = 0
check "... its segments' lines have step_ms, pull_ms" grep -q '"step_ms":.*"pull_ms":' "$TMP/rl/metrics/worker-0.jsonl"
"$D" sim --env cartpole-v1 --workers 2 --compute trace:"$TMP/rl" --env-steps 4000 --seed 2 --json \
    >"$TMP/rl-sim.out" 2>"$TMP/rl-sim.err"
check "sim --env on that trace exits 0" test $? = 0
check "... and reaches the budget" bash -c "tail -1 '$TMP/rl-sim.out' | grep -q '\"env_steps\":40[0-9][0-9]'"

# A model with embed:D on libsvm data: its steps trace (step_ms; its loop
# does not split out the pull and push) and replay in the sparse sim.
( cd "$TMP" && "$D" gen-libsvm --out-train train.svm --out-test test.svm --samples 4000 --test-samples 500 \
    --keys 200 --nnz 8 --seed 3 >gen.out 2>&1 )
sp=(--model 'embed:2 softmax' --data "libsvm:$TMP/train.svm:$TMP/test.svm" --lr 0.1 --batch 64 --seed 5)
"$D" local --workers 2 --mode async "${sp[@]}" --epochs 1 --out "$TMP/sp" --no-progress >"$TMP/sp.log" 2>&1
check "local, a model with embed:D, 2 async workers exits 0" test $? = 0
check "... its push lines have step_ms" grep -q '"keys":.*"step_ms":' "$TMP/sp/metrics/worker-1.jsonl"
"$D" sim --workers 2 --compute trace:"$TMP/sp" --updates 60 "${sp[@]}" --json >"$TMP/sp-sim.out" 2>"$TMP/sp-sim.err"
check "sim of that model on that trace exits 0 with a test AUC" grep -q '"test_auc":0\.[0-9]' "$TMP/sp-sim.out"

# Bad traces: one line, exit status 2, no run (no --out written).
# refused NAME DIR PATTERN: sim on trace:DIR is refused with PATTERN.
refused() {
    local name=$1 dir=$2 pattern=$3
    rm -rf "$TMP/bad-out"
    "$D" sim --workers 3 --compute trace:"$dir" --updates 10 "${tiny[@]}" --out "$TMP/bad-out" \
        >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$?
    if [ $rc = 2 ] && [ "$(wc -l <"$TMP/bad.err")" = 1 ] && grep -q -- "$pattern" "$TMP/bad.err" &&
        [ ! -e "$TMP/bad-out" ]; then
        pass "$name: exit 2, one line: $(cat "$TMP/bad.err")"
    else
        fail "$name" "status $rc, stderr: $(head -c 400 "$TMP/bad.err"), out dir: $(ls "$TMP/bad-out" 2>&1 | head -1)"
    fi
}
# mk NAME: a copy of the run's metrics to damage.
mk() { rm -rf "$TMP/$1"; mkdir -p "$TMP/$1"; cp -r "$TMP/a/metrics" "$TMP/$1/"; echo "$TMP/$1/metrics/worker-1.jsonl"; }
refused "a missing DIR" "$TMP/nowhere" "No such file or directory"
mkdir -p "$TMP/empty"
refused "a DIR without metrics/" "$TMP/empty" "no .*/metrics"
mkdir -p "$TMP/nowork/metrics"; cp "$TMP/a/metrics/ps-0.jsonl" "$TMP/nowork/metrics/"
refused "metrics/ without worker files" "$TMP/nowork" "no worker metrics"
f=$(mk nosteps); grep '"event"' "$TMP/a/metrics/worker-1.jsonl" >"$f"
refused "a worker file without steps" "$TMP/nosteps" "worker-1.jsonl has no step"
f=$(mk cut); n=$(wc -l <"$f"); head -n $((n - 1)) "$TMP/a/metrics/worker-1.jsonl" >"$f"
tail -1 "$TMP/a/metrics/worker-1.jsonl" | head -c 60 >>"$f"
refused "the last line cut in half" "$TMP/cut" "worker-1.jsonl:$n is cut short"
f=$(mk mid); sed -i '5s/.\{40\}$//' "$f"
refused "a line in the middle cut in half" "$TMP/mid" "worker-1.jsonl:5 is not a JSON object"
f=$(mk arr); sed -i '6s/.*/[1,2]/' "$f"
refused "a line of JSON that is no object" "$TMP/arr" "worker-1.jsonl:6 is not a JSON object"
f=$(mk nan); sed -i '3s/"step_ms":[0-9.e+-]*/"step_ms":"slow"/' "$f"
refused "a step_ms that is not a number" "$TMP/nan" 'worker-1.jsonl:3: "step_ms" "slow" is not a time'
f=$(mk neg); sed -i '4s/"step_ms":\([0-9.e+-]*\)/"step_ms":-\1/' "$f"
refused "a negative step_ms" "$TMP/neg" 'worker-1.jsonl:4: "step_ms" -[0-9.]* is not a time'
f=$(mk negpull); sed -i '4s/"pull_ms":\([0-9.e+-]*\)/"pull_ms":-\1/' "$f"
refused "a negative pull_ms" "$TMP/negpull" 'worker-1.jsonl:4: "pull_ms" -[0-9.]* is not a time'
f=$(mk old); sed -i 's/,"step_ms":[0-9.e+-]*//' "$f"
refused "steps without step_ms (a run from before it)" "$TMP/old" 'worker-1.jsonl:2: a step without "step_ms"'

finish
