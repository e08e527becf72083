#!/usr/bin/env bash
# test_local_steps: --local-steps H (local SGD, DiLoCo) through the real
# daemons started by `downpour local`.
#  - 1 worker, H = 4, outer SGD at lr 1: each round moves the servers'
#    weights to those the worker reached, so the run equals the standalone
#    trainer with the worker's (inner) optimizer and schedule, to float
#    rounding (w0 - (w0 - wH) is wH within an ulp of w0): SGD and Adam
#  - the push is one per round: H = 4 over 20 steps makes 5 versions,
#    its metrics line names each round's last data step
#  - async, 2 workers, outer delayed-nesterov (its default lr 0.5, momentum
#    0.9, one momentum move per 2 pushes): trains, staleness counted
#    in outer versions, summary.json names local_steps and the outer
#    optimizer
#  - a worker and servers that disagree on H (or on auto): one clear line,
#    no run; an outer optimizer of another name, a bad --local-steps
#    (auto:1, automatic), --outer-momentum-every with plain nesterov or 0:
#    exit 2 with one line; delayed-nesterov without local steps: a line
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip local_steps "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
compare() { "$TORCH_PY" tests/integration/compare_st.py "$@" >"$TMP/compare.log" 2>&1 || { cat "$TMP/compare.log"; return 1; }; }

# ---- one worker, outer averaging: the standalone trainer ------------------
sgd=(--optimizer sgd --lr 0.05 --lr-schedule constant)
# 20 steps, 5 rounds, --threads 1 on both sides: the outer step's
# w0 - (w0 - wH) misses wH by an ulp now and then, and a ReLU or a max-pool
# tie that such an ulp flips makes that jump: on this seed the runs agree
# to 1e-7 after 20 steps on every ISA path and differ by 1e-4 to 1e-3 after
# 40 (a flip between). A GEMM split over another thread count would add
# its own rounding.
"$BIN/downpour-worker" --standalone --steps 20 --batch 32 --seed 5 "${sgd[@]}" --threads 1 --no-progress \
    --save "$TMP/sa.safetensors" >"$TMP/sa.log" 2>&1
check "standalone SGD, 20 steps" test $? = 0
"$L" local --workers 1 --mode async --local-steps 4 --batch 32 --steps 20 --seed 5 "${sgd[@]}" \
    --threads 1 --no-progress --out "$TMP/h4" >"$TMP/h4.log" 2>&1
check "local, 1 worker, --local-steps 4" test $? = 0 || cat "$TMP/h4.log"
check "H=4 with outer SGD lr 1 == standalone SGD (to rounding)" \
    compare "$TMP/h4/model.safetensors" "$TMP/sa.safetensors" --rtol 1e-4 --atol 1e-6
v=$(json "$TMP/h4/summary.json" version 2>/dev/null || echo -1)
check "20 steps in rounds of 4: 5 versions (got $v)" test "$v" = 5
h=$(json "$TMP/h4/summary.json" local_steps 2>/dev/null || echo -1)
o=$(json "$TMP/h4/summary.json" outer_optimizer 2>/dev/null || echo none)
olr=$(json "$TMP/h4/summary.json" outer_lr 2>/dev/null || echo -1)
check "summary: local_steps 4, outer sgd at lr 1 (got $h, $o, $olr)" test "$h/$o/$olr" = 4/sgd/1
steps=$("$TORCH_PY" -c '
import json, sys
print(",".join(str(l["step"]) for l in map(json.loads, open(sys.argv[1])) if "status" in l))' \
    "$TMP/h4/metrics/worker-0.jsonl")
check "a push per round, after data steps 3, 7, ..., 19 (got $steps)" test "$steps" = 3,7,11,15,19
check "the worker says it runs local steps" grep -q "local steps: a push of the pseudo-gradient" "$TMP/h4/logs/worker-0.log"

# The same with Adam, its state kept from round to round as standalone keeps
# it. Adam divides by the root of its second moment, so the ulps by which
# w0 - (w0 - wH) misses wH grow to a few 1e-6 over 24 steps: atol 1e-5.
"$BIN/downpour-worker" --standalone --steps 24 --batch 32 --seed 5 --optimizer adam --lr-schedule constant --threads 1 \
    --no-progress --save "$TMP/sa_adam.safetensors" >"$TMP/sa_adam.log" 2>&1
"$L" local --workers 1 --mode async --local-steps 8 --batch 32 --steps 24 --seed 5 --optimizer adam \
    --lr-schedule constant --threads 1 --no-progress --out "$TMP/h8adam" >"$TMP/h8adam.log" 2>&1
check "local, 1 worker, --local-steps 8, Adam inside" test $? = 0
check "H=8 Adam with outer SGD lr 1 == standalone Adam (to rounding)" \
    compare "$TMP/h8adam/model.safetensors" "$TMP/sa_adam.safetensors" --rtol 1e-4 --atol 1e-5

# ---- async, 2 workers, DiLoCo's outer Nesterov ----------------------------
"$L" local --workers 2 --mode async --local-steps 4 --outer-optimizer delayed-nesterov --batch 32 --steps 200 \
    --seed 5 --optimizer sgd --lr 0.05 --threads 1 --no-progress --out "$TMP/nes" >"$TMP/nes.log" 2>&1
check "async, 2 workers, --local-steps 4 --outer-optimizer delayed-nesterov" test $? = 0 || cat "$TMP/nes.log"
acc=$(json "$TMP/nes/summary.json" test_accuracy 2>/dev/null || echo 0)
check "it trains: test accuracy $acc >= 0.65" ge "$acc" 0.65
read -r o olr om every v < <("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(s.get("outer_optimizer"), s.get("outer_lr"), s.get("outer_momentum"), s.get("outer_momentum_every"),
      s.get("version"))' "$TMP/nes/summary.json")
check "summary: outer delayed-nesterov, lr 0.5, momentum 0.9 (got $o $olr $om)" \
    test "$o/$olr/$om" = delayed-nesterov/0.5/0.9
check "async: the delayed Nesterov, its momentum once per 2 pushes (got $every)" test "$every" = 2
check "100 rounds of 2 workers: 100 versions (got $v)" test "$v" = 100
smax=$(json "$TMP/nes/summary.json" staleness_max 2>/dev/null || echo 99)
check "staleness counted in outer versions: at most a few (max $smax)" ge 3 "$smax"

# ---- disagreement -----------------------------------------------------------
bg "$BIN/downpour-ps" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/ep" --workers 1 --mode async \
    --local-steps 4 >"$TMP/ps.log" 2>&1
for _ in $(seq 200); do [ -s "$TMP/ep" ] && break; sleep 0.05; done # the server's ready file
"$BIN/downpour-worker" --ps "$(cat "$TMP/ep")" --task-index 0 --steps 8 --no-progress --timeout 5 \
    >"$TMP/w.log" 2>&1
rc=$?
check "a worker without --local-steps against servers with 4 fails (rc $rc)" test $rc != 0
check "... saying so" grep -q "the servers run --local-steps 4, this worker 1" "$TMP/w.log"
# a worker of a fixed H against servers of --local-steps auto:4: one line
bg "$BIN/downpour-ps" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/ep2" --workers 1 --mode async \
    --local-steps auto:4 >"$TMP/ps2.log" 2>&1
for _ in $(seq 200); do [ -s "$TMP/ep2" ] && break; sleep 0.05; done
"$BIN/downpour-worker" --ps "$(cat "$TMP/ep2")" --task-index 0 --steps 8 --local-steps 4 --no-progress \
    --timeout 5 >"$TMP/w2.log" 2>&1
rc=$?
check "a worker of --local-steps 4 against servers of auto:4 fails (rc $rc)" test $rc != 0
check "... saying so" grep -q "the servers run --local-steps auto:4, this worker 4" "$TMP/w2.log"

# bad values: exit 2 and one line each, from downpour-ps and downpour sim
refuse() { # what expected-line program flags...
    local what=$1 line=$2 prog=$3; shift 3
    "$prog" "$@" >"$TMP/bad.log" 2>&1
    local rc=$? n
    n=$(wc -l <"$TMP/bad.log")
    check "$what: exit 2 (got $rc), one line ($n)" test "$rc/$n" = 2/1
    check "... saying: $line" grep -qF -- "$line" "$TMP/bad.log" || cat "$TMP/bad.log"
}
refuse "--outer-optimizer adam" "outer-optimizer 'adam': sgd, nesterov or delayed-nesterov" \
    "$BIN/downpour-ps" --outer-optimizer adam --local-steps 2
refuse "--local-steps auto:1" "--local-steps 'auto:1': a whole number H in 1..1000000, or auto" \
    "$BIN/downpour-ps" --local-steps auto:1
refuse "--local-steps automatic" "--local-steps 'automatic'" "$BIN/downpour-ps" --local-steps automatic
refuse "downpour-worker --local-steps auto:0" "--local-steps 'auto:0'" \
    "$BIN/downpour-worker" --local-steps auto:0
refuse "--outer-momentum-every with nesterov" \
    "--outer-momentum-every is the period of --outer-optimizer delayed-nesterov (not of nesterov)" \
    "$BIN/downpour-ps" --local-steps 4 --outer-optimizer nesterov --outer-momentum-every 3
refuse "--outer-momentum-every 0" "--outer-momentum-every" \
    "$BIN/downpour-ps" --local-steps 4 --outer-optimizer delayed-nesterov --outer-momentum-every 0
refuse "sim --local-steps auto:x" "--local-steps 'auto:x'" \
    "$BIN/downpour" sim --workers 2 --compute const:1 --updates 4 --local-steps auto:x
# delayed-nesterov without local steps: a line, not a refusal (a sweep crosses it with H = 1)
"$BIN/downpour" sim --workers 2 --compute const:1 --updates 4 --model "fc:10 softmax" --batch 4 \
    --outer-optimizer delayed-nesterov --no-progress >"$TMP/h1.log" 2>&1
check "sim --outer-optimizer delayed-nesterov without --local-steps runs (status $?)" test $? = 0
check "... saying it has no effect" grep -q "have no effect without --local-steps H" "$TMP/h1.log"

finish
