#!/usr/bin/env bash
# test_a3c_lab: the lab with an actor-critic run (--env; deploy/lab/rl.h) —
#  - `downpour sim --env ... --workers 1` is `downpour-worker --standalone
#    --env ...` bit for bit: the weights, and summary.json's env account and
#    greedy test return (the RL flags given to both reach both);
#  - `downpour local --env ... --record` (A3C: async, 3 workers, 2 shards;
#    and A2C: sync) replays bit for bit: every recorded norm and every
#    push's account (env steps, episodes, their returns) matched, the same
#    weights, the same env account and test return in summary.json;
#    `downpour sim --env --record` replays too;
#  - a record whose account was changed is said to differ (and where); one
#    whose worker's segments come out of order is refused with one line,
#    as are the simulator's flags that do not go with --env;
#  - --obs-norm on: the model starts with obsnorm, whose statistics the
#    servers keep; a record of it replays bit for bit, and downpour eval
#    --env scores its file as the run did (the statistics are in it);
#  - an actor-critic run's default lr (Adam 0.0007, not the image
#    trainer's 0.0015) is the one every program runs with: standalone, the
#    servers of downpour local and its summary.json, the simulator; a given
#    --lr wins.
source "$(dirname "$0")/lib.sh"

D=$BIN/downpour
out=$TMP/a3c-lab
mkdir -p "$out"

# The figures of two summary.json files that must agree ("same" or the two lists).
same_account() {
    "$TORCH_PY" - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
keys = ["env", "env_steps", "episodes", "return_mean_100", "solved_at_env_steps", "test_return"]
print("same" if all(k in a and a[k] == b.get(k) for k in keys) else f"{[a.get(k) for k in keys]} vs {[b.get(k) for k in keys]}")
EOF
}

# -- sim --workers 1 is standalone -----------------------------------------------
rl=(--envs 2 --t-max 4 --entropy 0.02 --gamma 0.95 --reward-scale 0.5 --obs-norm on --clip-norm 1 --env-steps 4000 --seed 5 --threads 1)
"$BIN/downpour-worker" --standalone --env acrobot-v1 "${rl[@]}" --no-progress --summary "$out/sa.json" \
    --save "$out/sa.safetensors" >"$out/sa.log" 2>&1
check "standalone --env acrobot-v1 exits 0" test $? = 0
"$D" sim --env acrobot-v1 --workers 1 "${rl[@]}" --out "$out/sim1" --json >"$out/sim1.out" 2>&1
check "downpour sim --env acrobot-v1 --workers 1 exits 0" test $? = 0
check "... its weights are standalone's bit for bit" cmp "$out/sa.safetensors" "$out/sim1/model.safetensors"
s=$(same_account "$out/sa.json" "$out/sim1/summary.json")
check "... and so are its env steps, episodes, returns and test return ($s)" test "$s" = same
r=$(tail -1 "$out/sim1.out" | "$TORCH_PY" -c 'import json,sys; o=json.load(sys.stdin); print(o["env"], o["env_steps"], o["t_max"], o["reward_scale"], "solved_at_env_steps" in o)' 2>&1)
check "... its result line has the env account and the RL flags ($r)" test "$r" = "acrobot-v1 4000 4 0.5 True"
r=$("$TORCH_PY" -c 'import json,sys; o=json.load(open(sys.argv[1])); print(o.get("reward_scale", o.get("rl", {}).get("reward_scale")))' "$out/sa.json" 2>&1)
check "... standalone's summary.json has the reward scale ($r)" test "$r" = 0.5

# -- record and replay: A3C and A2C through downpour local -------------------------------
for mode in async sync; do
    "$D" local --env cartpole-v1 --workers 3 --ps-shards 2 --mode $mode --envs 2 --t-max 4 --env-steps 6000 \
        --seed 4 --out "$out/$mode" --record "$out/$mode.rec" --no-progress >"$out/$mode.log" 2>&1
    check "local --env cartpole-v1 --mode $mode --record exits 0" test $? = 0 || tail -3 "$out/$mode.log"
    check "... each push in the record carries its segment's account" \
        bash -c "! grep '\"e\":\"push\"' '$out/$mode.rec' | grep -vq '\"es\":8,'"
    "$D" replay "$out/$mode.rec" --out "$out/r-$mode" --json >"$out/r-$mode.out" 2>"$out/r-$mode.err"
    check "... replay exits 0" test $? = 0 || tail -2 "$out/r-$mode.err"
    check "... replay: bit-identical weights" cmp "$out/$mode/model.safetensors" "$out/r-$mode/model.safetensors"
    check "... replay: every norm and account matched" \
        bash -c "grep -q '\"matches_record\":true' '$out/r-$mode.out' && grep -q '\"account_mismatches\":0' '$out/r-$mode.out'"
    s=$(same_account "$out/$mode/summary.json" "$out/r-$mode/summary.json")
    check "... replay: the run's env account and test return ($s)" test "$s" = same
done

"$D" sim --env cartpole-v1 --workers 4 --compute exp:10 --env-steps 3000 --seed 6 --reward-scale 0.25 --out "$out/sim4" \
    --record "$out/sim4.rec" --progress >"$out/sim4.log" 2>"$out/sim4.err"
check "sim --env --workers 4 --record exits 0" test $? = 0
# --progress off a terminal: a plain line now and then, and the last one at the end.
check "... its last progress line is at the budget: '$(grep '^sim  ' "$out/sim4.err" | tail -n 1)'" \
    bash -c "grep '^sim  ' '$out/sim4.err' | tail -n 1 | grep -qE '^sim  env steps 30[0-9][0-9]/3000  episodes [1-9]'"
"$D" replay "$out/sim4.rec" --out "$out/r-sim4" --json --progress >"$out/r-sim4.out" 2>"$out/r-sim4.err"
n=$(grep -c . "$out/sim4.rec" 2>/dev/null)
check "... its replay's progress line ends with every event replayed: '$(tail -n 1 "$out/r-sim4.err")'" \
    bash -c "tail -n 1 '$out/r-sim4.err' | grep -qE '^replay  events ([0-9]+)/\\1  pushes that differ 0$'"
check "... its replay is bit for bit, every norm and account matched" \
    bash -c "cmp '$out/sim4/model.safetensors' '$out/r-sim4/model.safetensors' && grep -q '\"matches_record\":true' '$out/r-sim4.out'"
s=$(same_account "$out/sim4/summary.json" "$out/r-sim4/summary.json")
check "... and its summary's env account ($s)" test "$s" = same

# -- --obs-norm on: kept by the servers, replayed, scored alike ---------------------------
"$D" local --env acrobot-v1 --obs-norm on --workers 2 --ps-shards 2 --mode async --env-steps 3000 --seed 7 \
    --out "$out/on" --record "$out/on.rec" --no-progress >"$out/on.log" 2>&1
check "local --env --obs-norm on --record exits 0" test $? = 0 || tail -3 "$out/on.log"
st=$(PYTHONPATH=$PWD/$BUILD/python "$TORCH_PY" -c 'import sys, downpour.safetensors as s
t = dict(s.read(sys.argv[1])[0]); c = int(t["obsnorm.count"])
print("count", c > 0 and c <= 3000, "var", bool((t["obsnorm.running_var"] != 1).all()))' "$out/on/model.safetensors" 2>&1)
check "... the model file has the statistics the crew gathered ($st)" test "$st" = "count True var True"
"$D" replay "$out/on.rec" --out "$out/r-on" --json >"$out/r-on.out" 2>"$out/r-on.err"
check "... its replay is bit for bit" \
    bash -c "cmp '$out/on/model.safetensors' '$out/r-on/model.safetensors' && grep -q '\"matches_record\":true' '$out/r-on.out'"
"$D" eval --checkpoint "$out/on/model.safetensors" --env acrobot-v1 --seed 7 >"$out/on-eval.json" 2>&1
got=$(json "$out/on-eval.json" test_return 2>/dev/null) want=$(json "$out/on/summary.json" test_return 2>/dev/null)
check "... downpour eval --env scores its file as the run did ($got, the run's $want)" test "${got:-x}" = "$want"
"$BIN/downpour-ps" --obs-norm on --bind tcp://127.0.0.1:0 >"$out/on-ps.log" 2>&1
check "downpour-ps --obs-norm without --env: exit 2, one line" \
    bash -c "[ $? = 2 ] && grep -q 'give --env NAME too' '$out/on-ps.log' && [ \$(grep -c . '$out/on-ps.log') = 1 ]"

# -- the actor-critic default lr, everywhere ---------------------------------------------
"$BIN/downpour-worker" --standalone --env cartpole-v1 --env-steps 200 --no-progress >"$out/lr-sa.log" 2>&1
check "standalone --env: adam lr 0.0007 by default: $(grep -o 'adam lr [0-9.]*' "$out/lr-sa.log")" \
    grep -q 'adam lr 0.0007$' "$out/lr-sa.log"
"$D" local --env cartpole-v1 --workers 2 --env-steps 400 --out "$out/lr-local" --no-progress >"$out/lr-local.log" 2>&1
check "local --env: its servers step with adam lr 0.0007: $(grep -o 'adam lr [0-9.]*' "$out/lr-local/logs/ps-0.log")" \
    grep -q 'adam lr 0.0007,' "$out/lr-local/logs/ps-0.log"
check "... and its summary.json says lr 0.0007: $(json "$out/lr-local/summary.json" lr)" \
    test "$(json "$out/lr-local/summary.json" lr)" = 0.0007
"$D" sim --env cartpole-v1 --workers 2 --env-steps 400 --out "$out/lr-sim" >"$out/lr-sim.log" 2>&1
check "sim --env: summary.json lr 0.0007: $(json "$out/lr-sim/summary.json" lr)" \
    test "$(json "$out/lr-sim/summary.json" lr)" = 0.0007
"$D" local --env cartpole-v1 --workers 2 --env-steps 400 --lr 0.002 --out "$out/lr-given" --no-progress \
    >"$out/lr-given.log" 2>&1
check "local --env --lr 0.002: the given lr wins" grep -q 'adam lr 0.002,' "$out/lr-given/logs/ps-0.log"

# -- records changed, bad flags ------------------------------------------------------
# rewrite(IN OUT PYTHON-EXPR-ON-EVENT-LINES): the events changed, the footer's hash made right again
rewrite() {
    "$TORCH_PY" - "$@" <<'EOF'
import json, sys
src, dst, what = sys.argv[1:]
lines = open(src, "rb").read().split(b"\n")[:-2]
def fnv(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
pushes = [i for i, l in enumerate(lines) if b'"e":"push"' in l]
if what == "account":  # the fifth push says it ended one more episode
    o = json.loads(lines[pushes[4]]); o["ne"] += 1; lines[pushes[4]] = json.dumps(o, separators=(",", ":")).encode()
else:  # two of a worker's segments swapped on shard 0
    w = [i for i in pushes if b'"s":0,' in lines[i] and b'"w":1,' in lines[i]]
    lines[w[0]], lines[w[1]] = lines[w[1]], lines[w[0]]
body = b"".join(l + b"\n" for l in lines)
foot = json.dumps({"end": "downpour_record", "events": len(lines) - 1, "fnv1a": "%016x" % fnv(body)}, separators=(",", ":"))
open(dst, "wb").write(body + foot.encode() + b"\n")
EOF
}
rewrite "$out/async.rec" "$out/acct.rec" account
"$D" replay "$out/acct.rec" --out "$out/r-acct" --json >"$out/r-acct.out" 2>"$out/r-acct.err"
check "a record whose push claims another account: replayed, said to differ" \
    bash -c "grep -q '\"matches_record\":false' '$out/r-acct.out' && grep -q '\"account_mismatches\":1,' '$out/r-acct.out' && grep -q 'another segment.s account' '$out/r-acct.err'"
rewrite "$out/async.rec" "$out/order.rec" order
"$D" replay "$out/order.rec" --out "$out/r-order" >"$out/r-order.log" 2>&1
rc=$?
check "a record with a worker's segments out of order: refused (status $rc) with one line" \
    bash -c "[ $rc = 1 ] && grep -q 'rollouts cannot be recomputed' '$out/r-order.log' && [ \$(grep -c . '$out/r-order.log') = 1 ]"
check "... and nothing written" test ! -e "$out/r-order/model.safetensors"

bad() { # what, expected text, args...
    local what=$1 want=$2
    shift 2
    "$D" sim "$@" >"$out/bad.log" 2>&1
    local rc=$?
    check "$what: refused (status $rc) with one line naming it" \
        bash -c "[ $rc != 0 ] && grep -q -- \"$want\" '$out/bad.log' && [ \$(grep -c . '$out/bad.log') = 1 ]"
}
bad "sim --env with --updates" "--updates: not with --env" --env cartpole-v1 --updates 10
bad "sim --envs without --env" "--envs is an actor-critic flag" --envs 2 --updates 10
bad "sim --env with an elastic crew" "an --env run has a fixed crew" --env cartpole-v1 --workers 2:4
bad "sim --env pong" "no such environment" --env pong
finish
