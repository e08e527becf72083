#!/usr/bin/env bash
# test_a3c: the actor-critic worker (--env, worker/exec/a3c.h) end to end —
#  - standalone on CartPole-v1: summary.json's RL fields; the same seed twice
#    gives the same run (rollouts a pure function of the seeds and weights);
#  - bad models and environments: one clear line each;
#  - `downpour local --env cartpole-v1 --workers 2 --mode async` (A3C): the
#    servers count every worker's env steps, so the run stops at the budget
#    (a segment past it at most per worker) and its episodes are the two
#    workers' together; it learns (the mean return of the last 100 episodes
#    far above a random policy's ~22: the full solve, 475 within 500 k, is
#    the experiment's, docs/EXPERIMENTS.md); the model file loads into a
#    PyTorch module strictly, its policy and value heads as fc layers;
#  - sync (A2C): the same accounting, no staleness;
#  - by hand: servers told another segment (--envs, --t-max) or no --env
#    stop the worker at its first push with one line; told its own, it runs;
#  - `downpour local --env` with a --model given, before or after --env:
#    the daemons train that model, not the classifier's default.
source "$(dirname "$0")/lib.sh"

W=$BIN/downpour-worker
out=$TMP/a3c
mkdir -p "$out"

# -- standalone, twice ---------------------------------------------------------
for k in 1 2; do
    "$W" --standalone --env cartpole-v1 --env-steps 20000 --seed 3 --no-progress \
        --summary "$out/s$k.json" --metrics "$out/m$k.jsonl" --save "$out/s$k.safetensors" \
        >"$out/s$k.log" 2>&1
    check "standalone run $k exits 0" test $? = 0
done
for f in env env_steps episodes return_mean_100 solved_at_env_steps test_return; do
    "$TORCH_PY" -c 'import json,sys; assert sys.argv[2] in json.load(open(sys.argv[1]))' \
        "$out/s1.json" "$f" 2>/dev/null || fail "summary has $f" "missing"
done
pass "summary.json has env, env_steps, episodes, return_mean_100, solved_at_env_steps, test_return"
e=$(json "$out/s1.json" env 2>/dev/null); n=$(json "$out/s1.json" env_steps 2>/dev/null)
check "standalone: env $e, $n env steps (cartpole-v1, 20000)" test "$e $n" = "cartpole-v1 20000"
same=$("$TORCH_PY" - "$out/s1.json" "$out/s2.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
keys = ["episodes", "return_mean_100", "solved_at_env_steps", "test_return"]
print("same" if all(a[k] == b[k] for k in keys) else f"{[a[k] for k in keys]} vs {[b[k] for k in keys]}")
EOF
)
check "the same seed twice: the same episodes, returns and test return ($same)" test "$same" = same
check "... and the same weights" cmp -s "$out/s1.safetensors" "$out/s2.safetensors"
check "metrics lines carry env_steps, episodes and return_mean_100" \
    bash -c "tail -n 1 '$out/m1.jsonl' | grep -q '\"env_steps\":20000' && grep -q return_mean_100 '$out/m1.jsonl'"

# -- downpour eval --env: the saved policy's greedy return ------------------------
# The same 100 fresh episodes (seed 3, worker 0) as the run's own test_return.
"$BIN/downpour" eval --checkpoint "$out/s1.safetensors" --env cartpole-v1 --seed 3 >"$out/eval.json" 2>"$out/eval.err"
check "downpour eval --env cartpole-v1 exits 0" test $? = 0
got=$(json "$out/eval.json" test_return 2>/dev/null) want=$(json "$out/s1.json" test_return 2>/dev/null)
check "... its test_return is the run's ($got, the run's $want) over $(json "$out/eval.json" episodes 2>/dev/null) episodes" \
    test "${got:-x}" = "$want"
"$BIN/downpour" eval --checkpoint "$out/s1.safetensors" --env cartpole-v1 --seed 3 --episodes 5 >"$out/eval5.json" 2>&1
check "... --episodes 5 plays 5" test "$(json "$out/eval5.json" episodes 2>/dev/null)" = 5
evalbad() { # what, expected text, args...
    local what=$1 want=$2
    shift 2
    "$BIN/downpour" eval "$@" >"$out/evalbad.log" 2>&1
    local rc=$?
    check "eval: $what: exit 2, one line naming the file's kind" \
        bash -c "[ $rc = 2 ] && grep -q \"$want\" '$out/evalbad.log' && [ \$(grep -c . '$out/evalbad.log') = 1 ]"
}
evalbad "a policy without --env" "a policy (an actor-critic head): score it with --env NAME" --checkpoint "$out/s1.safetensors"
evalbad "a policy on libsvm data" "a policy (an actor-critic head)" --checkpoint "$out/s1.safetensors" --data libsvm:/dev/null
"$W" --standalone --model "fc:16 relu fc:10 softmax" --steps 2 --train-samples 256 --no-progress \
    --save "$out/dense.safetensors" >"$out/dense.log" 2>&1
evalbad "a classifier with --env" "a dense model: score it on its image data" --checkpoint "$out/dense.safetensors" --env cartpole-v1

# -- one line for what is wrong --------------------------------------------------
bad() { # what, expected text, args...
    local what=$1 want=$2
    shift 2
    "$W" --standalone --no-progress "$@" >"$out/bad.log" 2>&1
    local rc=$?
    check "$what: refused (status $rc) with one line naming it" \
        bash -c "[ $rc != 0 ] && grep -q \"$want\" '$out/bad.log' && [ \$(grep -c . '$out/bad.log') -le 2 ]"
}
bad "an unknown environment" "no such environment (there are: cartpole-v1, acrobot-v1)" --env pong
bad "a classifier's model" "no actor-critic head" --env cartpole-v1 --model "fc:8 softmax"
bad "a head of other actions" "'ac:3' but the environment has 2 actions" --env cartpole-v1 --model "fc:8 ac:3"
bad "batch norm" "has batch norm" --env cartpole-v1 --model "fc:8 bn tanh ac"

# -- A3C: 2 async workers through downpour local ---------------------------------
# Under the sanitizers (some 5x slower) the same run, a tenth as long,
# without the learning check.
budget=200000
[ "${DP_SANITIZED:-0}" = 1 ] && budget=20000
"$BIN/downpour" local --env cartpole-v1 --workers 2 --mode async --env-steps $budget --seed 2 \
    --out "$out/async" --no-progress >"$out/async.log" 2>&1
check "downpour local --env cartpole-v1 --workers 2 --mode async exits 0" test $? = 0
S=$out/async/summary.json
steps=$(json "$S" env_steps 2>/dev/null || echo 0)
check "the run stops at its budget: $steps env steps in [$budget, $budget + 10)" \
    bash -c "[ $steps -ge $budget ] && [ $steps -lt $((budget + 10)) ]"
mine=$(sed -n 's/.*worker [01]: \([0-9]*\) of the run.s.*/\1/p' "$out"/async/logs/worker-*.log |
    awk '{ s += $1 } END { print s + 0 }')
check "... the two workers' own env steps add up to it ($mine)" test "${mine:-0}" = "$steps"
ret=$(json "$S" return_mean_100 2>/dev/null || echo 0)
eps=$(json "$S" episodes 2>/dev/null || echo 0)
if [ $budget = 200000 ]; then
    check "A3C learns: return of the last 100 episodes $ret >= 150 (random: ~22), $eps episodes" \
        bash -c "awk -v r=$ret 'BEGIN { exit !(r >= 150) }' && [ $eps -ge 100 ]"
else
    skip learning "a run of $budget env steps under the sanitizers"
fi
check "async: the pushes were stale (staleness mean $(json "$S" staleness_mean))" \
    ge "$(json "$S" staleness_mean)" 0.01
if has_torch; then
    t=$(PYTHONPATH=$PWD/python "$TORCH_PY" - "$out/async/model.safetensors" <<'EOF' 2>&1
import sys, torch
from downpour import safetensors
class AC(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.fc1, s.fc2 = torch.nn.Linear(4, 64), torch.nn.Linear(64, 64)
        s.policy, s.value = torch.nn.Linear(64, 2), torch.nn.Linear(64, 1)
    def forward(s, x):
        h = torch.tanh(s.fc2(torch.tanh(s.fc1(x))))
        return torch.softmax(s.policy(h), -1), s.value(h)
m = AC()
tensors, _ = safetensors.read(sys.argv[1])
m.load_state_dict({k: torch.from_numpy(a) for k, a in tensors}, strict=True)
p, v = m(torch.zeros(1, 4))
print("ok" if abs(float(p.sum()) - 1) < 1e-5 and v.shape == (1, 1) else "bad")
EOF
)
    check "model.safetensors loads strictly into fc1, fc2, policy, value ($t)" test "$t" = ok
else
    skip torch "python3-torch is not installed"
fi

# -- A2C: sync ----------------------------------------------------------------------
"$BIN/downpour" local --env cartpole-v1 --workers 2 --mode sync --env-steps 30000 \
    --out "$out/sync" --no-progress >"$out/sync.log" 2>&1
check "downpour local --env ... --mode sync exits 0" test $? = 0
S=$out/sync/summary.json
steps=$(json "$S" env_steps 2>/dev/null || echo 0)
smax=$(json "$S" staleness_max 2>/dev/null || echo -1)
check "sync: $steps env steps in [30000, 30010), staleness max $smax (0)" \
    bash -c "[ $steps -ge 30000 ] && [ $steps -lt 30010 ] && [ '$smax' = 0 ]"
grep -q '^done: cartpole-v1, sync' "$out/sync.log"
check "downpour local's last line names the environment and the return" test $? = 0

# -- by hand: the servers bound each push's account by their own flags ---------------
# (--env, --envs, --t-max; server/core/account.h): servers told a smaller segment
# than the worker's, or no environment, stop the worker at its first push
# with one line naming the flags (not a run that never counts a step); told
# the worker's, the run goes as under downpour local.
AC="fc:64 tanh fc:64 tanh ac:2"
by_hand() { # name, expected status (0: exits 0; 1: not 0), text its log has, ps flags...
    local name=$1 want_rc=$2 want=$3
    shift 3
    rm -f "$out/ready"
    bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:*" --ready-file "$out/ready" --workers 1 \
        --mode async --model "$AC" --input 4x1x1 "$@" >"$out/hand-ps.log" 2>&1
    local ps_pid=$! t=0
    while [ ! -s "$out/ready" ] && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    "$W" --ps "$(cat "$out/ready")" --task-index 0 --env cartpole-v1 --model "$AC" --envs 2 \
        --t-max 5 --env-steps 2000 --no-progress --timeout 10 >"$out/hand.log" 2>&1
    local rc=$?
    kill "$ps_pid" 2>/dev/null
    wait "$ps_pid" 2>/dev/null
    check "by hand, $name: the worker's status $rc, its log says '$want'" \
        bash -c "[ \$(( $rc != 0 )) = $want_rc ] && grep -q \"$want\" '$out/hand.log'"
}
by_hand "servers told --envs 1 --t-max 5" 1 "over the shard's --envs x --t-max = 5" --env cartpole-v1
by_hand "servers told no --env" 1 "not told the environment" 
by_hand "servers told the worker's --envs 2 --t-max 5" 0 "of the run's" --env cartpole-v1 --envs 2 --t-max 5

# -- a model given to downpour local --env ------------------------------------------
# The launcher's --model lands in downpour-ps's slot (its table comes first):
# the spec given must reach the daemons, not the classifier's default, in
# either flag order, with the head written out (ac) or given (ac:2).
given() { # name, environment, expected model in summary.json, args...
    local name=$1 env=$2 want=$3
    shift 3
    "$BIN/downpour" local --workers 2 --env-steps 2000 --out "$out/$name" --no-progress "$@" \
        >"$out/$name.log" 2>&1
    local rc=$? got
    got=$(json "$out/$name/summary.json" model 2>/dev/null)
    check "local $* exits 0 (status $rc), model '$got'" test "$rc $got" = "0 $want"
    check "... its done: line names $env" grep -q "^done: $env, " "$out/$name.log"
}
given model-first acrobot-v1 "fc:32 tanh ac:3" --model "fc:32 tanh ac" --env acrobot-v1
given model-last cartpole-v1 "fc:32 tanh ac:2" --env cartpole-v1 --model "fc:32 tanh ac:2"

# -- the PyTorch example, through downpour launch ------------------------------------
# A short run: that the module is the spec's (its tensors the servers'), that
# both copies push and the chief ends the run.
if has_torch; then
    PYTHONPATH=$PWD/$BUILD/python "$BIN/downpour" launch --workers 2 --mode async \
        --model "fc:64 tanh fc:64 tanh ac:2" --input 4x1x1 --out "$out/torch" \
        -- "$TORCH_PY" examples/torch_a3c.py --env-steps 4000 >"$out/torch.log" 2>&1
    rc=$?
    check "examples/torch_a3c.py under downpour launch exits 0 (status $rc)" test $rc = 0
    applied=$(sed -n 's/.*the servers applied \([0-9]*\) pushes.*/\1/p' "$out"/torch/logs/worker-0.log)
    check "... both workers' segments reached the servers (${applied:-none} pushes of 800)" \
        test "${applied:-0}" = 800
    PYTHONPATH=$PWD/$BUILD/python "$BIN/downpour" launch --workers 2 --mode async \
        --model "obsnorm fc:64 tanh fc:64 tanh ac:2" --input 4x1x1 --checkpoint-dir "$out/torch-on-ckpt" \
        --out "$out/torch-on" \
        -- "$TORCH_PY" examples/torch_a3c.py --env-steps 4000 --obs-norm >"$out/torch-on.log" 2>&1
    rc=$?
    check "examples/torch_a3c.py --obs-norm under downpour launch exits 0 (status $rc)" test $rc = 0
    st=$(PYTHONPATH=$PWD/$BUILD/python "$TORCH_PY" -c 'import sys, downpour.safetensors as s
p = dict(s.read(sys.argv[1])[0])["params"]  # the flat vector: obsnorm mean [0, 4), var [4, 8), count 8
print(0 < p[8] <= 4000, bool((p[4:8] != 1).all()))' \
        "$out/torch-on-ckpt/ps-shard-0-of-1.safetensors" 2>&1)
    check "... the servers kept the statistics its pushes carried ($st)" test "$st" = "True True"
else
    skip torch-example "python3-torch is not installed"
fi
finish
