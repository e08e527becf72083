#!/usr/bin/env bash
# test_sweep: `downpour sweep` runs a tiny grid (2 configurations x 2 seeds,
# a few steps on a 1000-image slice of Fashion-MNIST) on real daemons and
# leaves a report whose table agrees with the runs' own summary.json, with
# the three PNGs; the same on the simulated cluster (`downpour sim`, in every
# build: never skipped); run again it makes nothing (resumed); a bad grid
# file or a flag its runs refuse is one line and status 2. An actor-critic
# sweep (env and the RL flags as axes; no data, so never skipped): each
# run gets its flags, and the report's table has the runs' returns.
source "$(dirname "$0")/lib.sh"

# -- actor-critic axes ----------------------------------------------------------------
"$BIN/downpour" sweep --cluster sim --env cartpole-v1,acrobot-v1 --workers 2 --t-max 4 --gamma 0.95 \
    --env-steps 2000 --seeds 1,2 --no-progress --no-plots --out "$TMP/rl" >"$TMP/rl.out" 2>"$TMP/rl.err"
rc=$?
check "a sweep over env = cartpole-v1, acrobot-v1 exits 0 (status $rc: $(tail -1 "$TMP/rl.err"))" test $rc = 0
"$TORCH_PY" - "$TMP/rl" >"$TMP/rltable.log" 2>&1 <<'EOF'
import json, sys, statistics
out = sys.argv[1]
res = json.load(open(out + "/results.json"))
report = open(out + "/report.md").read()
assert "| config | seeds | return of the last 100 | greedy test return |" in report, "no RL table"
for c, env in zip(res["configs"], ["cartpole-v1", "acrobot-v1"]):
    assert c["axes"]["env"] == env, c["axes"]
    s = [json.load(open(r["dir"] + "/summary.json")) for r in c["runs"]]
    assert len(s) == 2 and all(x["env"] == env and x["t_max"] == 4 and x["gamma"] == 0.95 and
                               x["env_steps"] >= 2000 and x["workers"] == 2 for x in s), s
    ret = [x["return_mean_100"] for x in s]
    tr = [x["test_return"] for x in s]
    assert abs(c["return_mean_100_mean"] - statistics.mean(ret)) < 1e-9, (c, ret)
    assert abs(c["test_return_std"] - statistics.stdev(tr)) < 1e-9, (c, tr)
    row = "| %s env=%s | 2 | %.1f ± %.1f | %.1f ± %.1f |" % (c["id"], env, statistics.mean(ret),
                                                           statistics.stdev(ret), statistics.mean(tr),
                                                           statistics.stdev(tr))
    assert row in report, (row, report)
print("rl table ok")
EOF
check "... each run ran its env with the RL flags; the table's returns are its runs' ($(tail -1 "$TMP/rltable.log"))" \
    grep -q "rl table ok" "$TMP/rltable.log"
# The same sweep's plots (gnuplot is in make deps-test): the return curve
# and the staleness histogram from each run's summary.json, which now
# carries both; report.md links exactly the PNGs drawn (none was there
# for an RL sweep before, and it linked three that did not exist).
"$BIN/downpour" sweep --cluster sim --env cartpole-v1 --workers 2 --env-steps 4000 --seeds 1 --no-progress \
    --out "$TMP/rlplots" >"$TMP/rlplots.out" 2>"$TMP/rlplots.err"
rc=$?
check "an RL sweep with plots exits 0 (status $rc: $(tail -1 "$TMP/rlplots.err"))" test $rc = 0
check "... its summary.json has staleness_histogram and a return_curve ending at its env steps" "$TORCH_PY" -c "
import json, sys
s = json.load(open('$TMP/rlplots/runs/c01-s1/summary.json'))
assert sum(s['staleness_histogram']) == s['updates_applied'], (s['staleness_histogram'], s['updates_applied'])
c = s['return_curve']
assert 2 <= len(c) <= 64 and all(a[0] < b[0] for a, b in zip(c, c[1:])), c
assert c[-1][0] <= s['env_steps'] and abs(c[-1][1] - s['return_mean_100']) < 1e-3, (c[-1], s['return_mean_100'])
"
check "... return_vs_env_steps.png and staleness.png drawn" \
    bash -c "[ -s '$TMP/rlplots/return_vs_env_steps.png' ] && [ -s '$TMP/rlplots/staleness.png' ]"
links=$(grep -o '([a-z_]*\.png)' "$TMP/rlplots/report.md" | tr -d '()' | sort | tr '\n' ' ')
missing=$(for f in $links; do [ -e "$TMP/rlplots/$f" ] || echo "$f"; done)
check "... report.md links the PNGs there ($links) and no other (missing: ${missing:-none})" \
    bash -c "[ -n '$links' ] && [ -z '$missing' ] && grep -q 'return_vs_env_steps.png' '$TMP/rlplots/report.md'"
# A model given as an axis for an actor-critic run: its bare "ac" takes the
# env's actions (the grid's check refused it before the runs could).
"$BIN/downpour" sweep --cluster sim --env cartpole-v1 --model "fc:16 tanh ac" --workers 2 --env-steps 1000 \
    --seeds 1 --no-progress --no-plots --out "$TMP/rlmodel" >"$TMP/rlmodel.out" 2>"$TMP/rlmodel.err"
rc=$?
check "an RL sweep with --model 'fc:16 tanh ac': exit 0 (status $rc: $(tail -1 "$TMP/rlmodel.err")), the run's model" \
    bash -c "[ $rc = 0 ] && grep -q '\"model\":[[:space:]]*\"fc:16 tanh ac:2\"' '$TMP/rlmodel/runs/c01-s1/summary.json'"
# A sparse model's sweep in the simulator (no periodic evaluation there: it
# was refused its flags before): the table's headline is the test AUC, the
# mean of its runs' summaries.
"$BIN/downpour" gen-libsvm --out-train "$TMP/sv.train" --out-test "$TMP/sv.test" --samples 2000 \
    --test-samples 500 --keys 3000 --nnz 8 --seed 2 >/dev/null 2>&1
"$BIN/downpour" sweep --cluster sim --model "embed:8 relu fc:2 softmax" --workers 2 --lr 0.05,0.1 --seeds 1,2 \
    --args "--data libsvm:$TMP/sv.train:$TMP/sv.test --updates 20" --no-progress --no-plots \
    --out "$TMP/sparse" >"$TMP/sparse.out" 2>"$TMP/sparse.err"
rc=$?
check "a sparse sweep in the simulator: exit 0 (status $rc: $(tail -1 "$TMP/sparse.err"))" test $rc = 0
check "... its table's first figure is the test AUC, its runs' mean" "$TORCH_PY" -c "
import json, statistics
res = json.load(open('$TMP/sparse/results.json'))
md = open('$TMP/sparse/report.md').read()
assert '| config | seeds | final test AUC | final test accuracy |' in md, md[:400]
for c in res['configs']:
    aucs = [json.load(open(r['dir'] + '/summary.json'))['test_auc'] for r in c['runs']]
    assert len(aucs) == 2 and abs(statistics.mean(aucs) - c['final_auc_mean']) < 1e-9, (aucs, c['final_auc_mean'])
    assert ('| %.4f ± ' % c['final_auc_mean']) in md, c['final_auc_mean']
"
"$BIN/downpour" sweep --cluster sim --env cartpole-v1,pong --out "$TMP/rlbad" --no-progress >"$TMP/rlbad.out" 2>"$TMP/rlbad.err"
rc=$?
check "env = pong: refused before anything runs (status $rc), one line" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/rlbad.err') = 1 ] && grep -q \"env 'pong'\" '$TMP/rlbad.err' && [ ! -e '$TMP/rlbad/runs' ]"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip sweep "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
S=$BIN/downpour
out=$TMP/sweep

# The first 1000 training images as an IDX pair: runs start and evaluate
# in a moment (idx: data is its own test split).
"$TORCH_PY" - "$TMP" <<'EOF'
import gzip, sys
d = "/usr/share/datasets/fashion-mnist/"
img = gzip.open(d + "train-images-idx3-ubyte.gz").read()
lab = gzip.open(d + "train-labels-idx1-ubyte.gz").read()
n = 1000
open(sys.argv[1] + "/img", "wb").write(img[:4] + n.to_bytes(4, "big") + img[8:16] + img[16:16 + n * 784])
open(sys.argv[1] + "/lab", "wb").write(lab[:4] + n.to_bytes(4, "big") + lab[8:8 + n])
EOF
data="idx:$TMP/img,$TMP/lab"

cat >"$TMP/grid.txt" <<EOF
# two configurations, two seeds each
mode = sync, async
workers = 2
lr = 0.003
seed = 1, 2
args = --steps 16 --batch 32 --data $data
eval-every = 4
eval-limit = 200
targets = 0.4, 0.5
EOF

"$S" sweep --grid "$TMP/grid.txt" --dry-run >"$TMP/dry.out" 2>&1
check "--dry-run prints the 4 runs' commands" test "$(grep -c ' local ' "$TMP/dry.out")" = 4

timeout $((240 * ${DP_TEST_TIMEOUT_SCALE:-1})) "$S" sweep --grid "$TMP/grid.txt" --out "$out" --no-progress \
    >"$TMP/sweep.out" 2>"$TMP/sweep.err"
rc=$?
have_gnuplot=1
command -v gnuplot >/dev/null || have_gnuplot=0
if [ $have_gnuplot = 1 ]; then
    check "the sweep exits 0 (status $rc; $(tail -1 "$TMP/sweep.err"))" test $rc = 0
    for p in accuracy_vs_updates accuracy_vs_seconds staleness; do
        check "$p.png is a PNG" bash -c "head -c 8 '$out/$p.png' | od -An -c | grep -q 'P   N   G'"
    done
else
    check "without gnuplot: status 1 and one line saying so" \
        bash -c "[ $rc = 1 ] && grep -q 'gnuplot not found' '$TMP/sweep.err'"
    skip "PNGs" "gnuplot is not installed (Debian's gnuplot-nox; make deps-test)"
fi
check "4 runs made" grep -q "4 run(s): 4 made, 0 already complete, 0 failed" "$TMP/sweep.out"
for r in c01-s1 c01-s2 c02-s1 c02-s2; do
    check "run $r has its summary" test -s "$out/runs/$r/summary.json"
done

# The table, recomputed from the runs' summary.json.
"$TORCH_PY" - "$out" >"$TMP/table.log" 2>&1 <<'EOF'
import json, re, statistics, sys
out = sys.argv[1]
rows = [l for l in open(out + "/report.md") if re.match(r"\| c0\d ", l)]
assert len(rows) == 2, f"{len(rows)} table rows"
want = {"c01": "mode=sync", "c02": "mode=async"}
for row in rows:
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    cid, label = cells[0].split(" ", 1)
    assert label == want[cid], (cid, label)
    s = [json.load(open(f"{out}/runs/{cid}-s{k}/summary.json")) for k in (1, 2)]
    acc = [x["test_accuracy"] for x in s]
    m, sd = re.match(r"([\d.]+) ± ([\d.]+)", cells[2]).groups()
    assert abs(float(m) - statistics.mean(acc)) < 6e-5, (cid, m, acc)
    assert abs(float(sd) - statistics.stdev(acc)) < 6e-5, (cid, sd, acc)
    assert cells[1] == "2", cells[1]
    sm = statistics.mean(x["staleness_mean"] for x in s)
    assert abs(float(cells[-2]) - sm) < 0.006, (cid, cells[-2], sm)
    assert float(cells[-1]) == max(x["staleness_max"] for x in s), (cid, cells[-1])
    if cid == "c01":
        assert float(cells[-1]) == 0, "sync has staleness"
    # updates to a target never exceed the run's final version
    for c in cells[5:7]:
        if c != "-":
            assert float(c.split()[0]) <= max(x["version"] for x in s), (cid, c)
r = json.load(open(out + "/results.json"))
assert [c["id"] for c in r["configs"]] == ["c01", "c02"]
print("table ok")
EOF
check "the table's accuracy mean ± std and staleness match the runs' summary.json ($(tail -1 "$TMP/table.log"))" \
    grep -q "table ok" "$TMP/table.log"
check "the accuracy curves have a point per evaluation" \
    test "$(grep -c '^[0-9]' "$out/data/c01.curve")" -ge 6

# The simulated cluster: same report, simulated seconds, the servers'
# staleness histogram from the summary. `downpour sim` is part of every
# build: a sim that does not even answer --help is a failure, not a skip.
"$S" sim --help >"$TMP/simhelp.out" 2>&1
rc=$? # before the check's name expands: $(...) there would reset $?
check "downpour sim --help exits 0 (status $rc: $(tail -1 "$TMP/simhelp.out"))" test $rc = 0
"$S" sweep --cluster sim --workers 1,4 --compute exp:10 --seeds 1,2 --eval-every 20 --no-progress \
    --args "--updates 60 --batch 16 --optimizer sgd --lr 0.1 --data $data --model 'fc:32 relu fc:10 softmax'" \
    --targets 0.3 --out "$TMP/sim" >"$TMP/sim.out" 2>"$TMP/sim.err"
rc=$?
check "a simulated sweep exits 0 (status $rc: $(tail -1 "$TMP/sim.err"))" test $rc = 0
"$TORCH_PY" - "$TMP/sim" >"$TMP/simtable.log" 2>&1 <<'EOF2'
import json, re, statistics, sys
out = sys.argv[1]
rows = [l for l in open(out + "/report.md") if re.match(r"\| c0\d ", l)]
assert len(rows) == 2, len(rows)
for row in rows:
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    cid = cells[0].split()[0]
    s = [json.load(open(f"{out}/runs/{cid}-s{k}/summary.json")) for k in (1, 2)]
    m = float(cells[2].split()[0])
    assert abs(m - statistics.mean(x["test_accuracy"] for x in s)) < 6e-5, (cid, m)
    assert float(cells[-1]) == max(x["staleness_max"] for x in s), cid
hist = [l.split() for l in open(out + "/data/c02.stale") if l[0].isdigit()]
total = sum(int(h[1]) for h in hist)
assert total == 2 * 60, f"histogram counts {total} pushes"
curve = [l.split() for l in open(out + "/data/c02.curve") if l[0].isdigit()]
assert len(curve) == 2 * 3 and all(float(c[1]) > 0 for c in curve), curve
print("sim table ok")
EOF2
check "the simulated sweep's table, histogram and curve match its runs ($(tail -1 "$TMP/simtable.log"))" \
    grep -q "sim table ok" "$TMP/simtable.log"

# The optimizer is an axis: each run of the grid line optimizer = sgd,
# rmsprop gets its --optimizer, and its summary.json says which it ran.
"$S" sweep --cluster sim --workers 2 --optimizer sgd,rmsprop --eval-every 0 --no-progress --no-plots \
    --args "--updates 20 --batch 16 --lr 0.01 --data $data --model 'fc:10 softmax'" \
    --out "$TMP/opt" >"$TMP/opt.out" 2>"$TMP/opt.err"
rc=$?
check "a sweep over optimizer = sgd, rmsprop exits 0 (status $rc: $(tail -1 "$TMP/opt.err"))" test $rc = 0
o1=$(json "$TMP/opt/runs/c01-s1/summary.json" optimizer 2>/dev/null)
o2=$(json "$TMP/opt/runs/c02-s1/summary.json" optimizer 2>/dev/null)
check "... its runs ran sgd then rmsprop ($o1, $o2)" test "$o1,$o2" = sgd,rmsprop
check "... and the report labels them" grep -q "optimizer=rmsprop" "$TMP/opt/report.md"

# The delay rule and compensation are axes (grid keys delay-lr /
# delay_lr, delay-compensation): each run gets its flags and its
# summary.json says what it ran.
"$S" sweep --cluster sim --workers 3 --delay-lr none,adaptive --delay-compensation const:0.5 --eval-every 0 \
    --no-progress --no-plots --args "--updates 20 --batch 16 --lr 0.01 --data $data --model 'fc:10 softmax'" \
    --out "$TMP/dl" >"$TMP/dl.out" 2>"$TMP/dl.err"
rc=$?
check "a sweep over delay-lr = none, adaptive exits 0 (status $rc: $(tail -1 "$TMP/dl.err"))" test $rc = 0
d1=$(json "$TMP/dl/runs/c01-s1/summary.json" delay_lr 2>/dev/null)/$(json "$TMP/dl/runs/c01-s1/summary.json" delay_compensation 2>/dev/null)
d2=$(json "$TMP/dl/runs/c02-s1/summary.json" delay_lr 2>/dev/null)
check "... its runs ran none then adaptive, both compensated ($d1, $d2)" test "$d1,$d2" = none/const:0.5,adaptive
check "... and the report labels them" grep -q "delay-lr=adaptive" "$TMP/dl/report.md"

# Local steps are axes too (local-steps, outer-optimizer): each run gets
# them, its summary.json names them, the report labels them.
"$S" sweep --cluster sim --workers 2 --local-steps 1,4 --outer-optimizer nesterov --eval-every 0 \
    --no-progress --no-plots --args "--updates 10 --batch 16 --optimizer sgd --lr 0.01 --data $data --model 'fc:10 softmax'" \
    --out "$TMP/ls" >"$TMP/ls.out" 2>"$TMP/ls.err"
rc=$?
check "a sweep over local-steps = 1, 4 exits 0 (status $rc: $(tail -1 "$TMP/ls.err"))" test $rc = 0 || cat "$TMP/ls.err"
l1=$(json "$TMP/ls/runs/c01-s1/summary.json" local_steps 2>/dev/null)
l2=$(json "$TMP/ls/runs/c02-s1/summary.json" local_steps 2>/dev/null)/$(json "$TMP/ls/runs/c02-s1/summary.json" outer_optimizer 2>/dev/null)
check "... its runs ran H = 1 then 4 with the outer nesterov ($l1, $l2)" test "$l1,$l2" = 1,4/nesterov
check "... and the report labels them" grep -q "local-steps=4" "$TMP/ls/report.md"

# Compression is an axis too (grid keys compress, error-feedback /
# error_feedback): each run's summary says what its workers pushed.
printf 'compress = none, sign\nerror_feedback = off\n' >"$TMP/cz.txt"
"$S" sweep --grid "$TMP/cz.txt" --cluster sim --workers 2 --eval-every 0 \
    --no-progress --no-plots --args "--updates 20 --batch 16 --lr 0.01 --data $data --model 'fc:10 softmax'" \
    --out "$TMP/cz" >"$TMP/cz.out" 2>"$TMP/cz.err"
rc=$?
check "a sweep over compress = none, sign exits 0 (status $rc: $(tail -1 "$TMP/cz.err"))" test $rc = 0
z1=$(json "$TMP/cz/runs/c01-s1/summary.json" compress 2>/dev/null)/$(json "$TMP/cz/runs/c01-s1/summary.json" error_feedback 2>/dev/null)
z2=$(json "$TMP/cz/runs/c02-s1/summary.json" compress 2>/dev/null)/$(json "$TMP/cz/runs/c02-s1/summary.json" error_feedback 2>/dev/null)
check "... its runs pushed none then sign, without error feedback ($z1, $z2)" test "$z1,$z2" = none/off,sign/off
b1=$(json "$TMP/cz/runs/c01-s1/summary.json" bytes_pushed 2>/dev/null)
b2=$(json "$TMP/cz/runs/c02-s1/summary.json" bytes_pushed 2>/dev/null)
check "... sign moved at most 1/32 of the dense bytes, a byte of padding and a scale a push ($b1, $b2)" \
    python3 -c "import sys; d, s = int(sys.argv[1]), int(sys.argv[2]); sys.exit(not (0 < s <= d / 32 + 5 * d / 31400))" "$b1" "$b2"
check "... and the report labels them" grep -q "compress=sign" "$TMP/cz/report.md"

# Resumed: every run is complete, nothing runs again.
"$S" sweep --grid "$TMP/grid.txt" --out "$out" --no-progress --no-plots >"$TMP/again.out" 2>&1
check "run again, the 4 complete runs are skipped" grep -q "4 run(s): 0 made, 4 already complete" "$TMP/again.out"

# Bad input: one line naming the file and line (or the flag), status 2.
bad() { # name expected-substring grid-text [extra flags]
    local name=$1 want=$2 text=$3; shift 3
    printf '%s\n' "$text" >"$TMP/bad.txt"
    "$S" sweep --grid "$TMP/bad.txt" --out "$TMP/bad" --no-progress "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
    local rc=$? lines
    lines=$(wc -l <"$TMP/bad.err")
    if [ $rc != 2 ]; then fail "$name" "status $rc"; return; fi
    if [ "$lines" != 1 ] || ! grep -q -- "$want" "$TMP/bad.err"; then
        fail "$name" "want one line with '$want', got: $(cat "$TMP/bad.err")"; return
    fi
    pass "$name"
}
bad "a bad lr is refused" "bad.txt:2: lr 'fast'" $'mode = async\nlr = 0.1, fast'
bad "an unknown key is refused" "bad.txt:1: unknown key 'speed'" 'speed = 3'
bad "a line without '=' is refused" "bad.txt:1: expected 'key = value" 'mode async'
bad "a key given twice is refused" "bad.txt:2: 'lr' is given twice" $'lr = 0.1\nlr = 0.2'
bad "an empty value is refused" "bad.txt:1: mode: an empty value" 'mode = sync,,async'
bad "a bad mode is refused" "mode 'fast'" 'mode = fast'
bad "an unknown optimizer is refused" "bad.txt:1: unknown optimizer 'lamb'" 'optimizer = adam, lamb'
bad "an unknown delay rule is refused" "bad.txt:1: bad delay rule 'fast'" 'delay_lr = none, fast'
bad "a bad compensation is refused" "bad.txt:1: bad delay compensation 'adaptive'" 'delay-compensation = adaptive'
bad "a bad outer optimizer is refused" "bad.txt:1: --outer-optimizer 'adam': sgd, nesterov or delayed-nesterov" 'outer_optimizer = adam'
bad "a bad local-steps is refused" "bad.txt:1: --local-steps '0': a whole number H in 1..1000000, or auto" 'local-steps = 0'
bad "an unknown compression is refused" "bad.txt:1: --compress 'gzip'" 'compress = none, gzip'
bad "a bad error feedback is refused" "bad.txt:1: --error-feedback 'maybe'" 'error_feedback = maybe'
bad "a bad --workers flag is refused" "--workers 'two'" 'mode = async' --workers two
bad "a run refusing its flags stops the sweep" "refused its flags" \
    "args = --steps 2 --data $data --no-such-flag"
check "... and no run is marked complete" test ! -e "$TMP/bad/runs/c01-s1/complete"
"$S" sweep --grid "$TMP/missing.txt" >"$TMP/miss.out" 2>"$TMP/miss.err"
rc=$?
check "a missing grid file: status 2 ($rc), one line naming it" \
    bash -c "[ $rc = 2 ] && [ \$(wc -l <'$TMP/miss.err') = 1 ] && grep -q 'missing.txt' '$TMP/miss.err'"

finish
