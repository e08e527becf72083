#!/usr/bin/env bash
# test_a3c_lab: the lab with an actor-critic run (--env; deploy/lab/rl.h) —
#  - `downpour sim --env ... --workers 1` is `downpour-worker --standalone
#    --env ...` bit for bit: the weights, and summary.json's env account and
#    greedy test return (the RL flags given to both reach both);
#  - the simulator's flags that do not go with --env are refused with one
#    line.
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
rl=(--envs 2 --t-max 4 --entropy 0.02 --gamma 0.95 --clip-norm 1 --env-steps 4000 --seed 5 --threads 1)
"$BIN/downpour-worker" --standalone --env acrobot-v1 "${rl[@]}" --no-progress --summary "$out/sa.json" \
    --save "$out/sa.safetensors" >"$out/sa.log" 2>&1
check "standalone --env acrobot-v1 exits 0" test $? = 0
"$D" sim --env acrobot-v1 --workers 1 "${rl[@]}" --out "$out/sim1" --json >"$out/sim1.out" 2>&1
check "downpour sim --env acrobot-v1 --workers 1 exits 0" test $? = 0
check "... its weights are standalone's bit for bit" cmp "$out/sa.safetensors" "$out/sim1/model.safetensors"
s=$(same_account "$out/sa.json" "$out/sim1/summary.json")
check "... and so are its env steps, episodes, returns and test return ($s)" test "$s" = same
r=$(tail -1 "$out/sim1.out" | "$TORCH_PY" -c 'import json,sys; o=json.load(sys.stdin); print(o["env"], o["env_steps"], o["t_max"], "solved_at_env_steps" in o)' 2>&1)
check "... its result line has the env account and the RL flags ($r)" test "$r" = "acrobot-v1 4000 4 True"

# -- bad flags ------------------------------------------------------------------------
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
