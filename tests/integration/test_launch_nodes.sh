#!/usr/bin/env bash
# test_launch_nodes: `downpour launch --nnodes 2 --node-rank R --master
# HOST:PORT`, one launch per machine, the machines two hosts in network
# namespaces on a bridge (tests/netns/lib.sh), node 0 on host 0:
#  - a run of tests/integration/py_nodes.py (a PyTorch module through
#    downpour.torch.Worker() with no ps=), 2 workers a node, 2 shards on
#    node 0 at PORT and PORT+1, no --init (node 0's chief writes the model):
#    both launches exit 0; the four workers saw global, distinct ranks
#    (RANK = node * 2 + LOCAL_RANK, WORLD_SIZE 4, GROUP_RANK the node,
#    MASTER_ADDR host 0, MASTER_PORT PORT+2, TF_CONFIG's task the rank,
#    DOWNPOUR_PS both shards at host 0); the chief waited for all four and
#    scored (its result line, summary.json's chief_result and 4 x 5 pushes
#    applied); each launch's last line; nothing left
#  - the chief's end without node 1's worker (which sleeps on): node 0
#    ends 0, node 1 sees the servers gone for --master-timeout 2 s, stops
#    its worker, exits 1 with one line
#  - Ctrl-C on node 1 mid-run: it exits 130, its worker gone, node 0 runs
#    on (its chief then ends it, 0)
#  - --max-restarts on node 1: its worker fails once, is started again
#    under its global rank, and node 1 ends 0 with the restart counted
#  - node 1 alone: the master never answers within --master-timeout 1:
#    one line, exit 2, no worker started
#  - bad input, one line and exit 2 before anything starts: node rank out
#    of range, --nnodes 0, HOST:PORT malformed or a port out of range,
#    --nnodes 2 without --master, an elastic crew over nodes
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
source tests/netns/lib.sh

trap 'nn_down; t_cleanup' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

NET_CHECKS=30 # the section on network namespaces
use_py_package $((NET_CHECKS + 7)) launch-nodes
L=$BIN/downpour
cp tests/integration/py_nodes.py "$TMP/py_nodes.py"
left() { ! pgrep -f "$TMP/" >/dev/null; }

# Bad input: one line, exit 2, nothing started.
for bad in "--nnodes 2 --node-rank 2 --master 10.0.0.1:29500|--node-rank 2 is out of range: --nnodes 2 has ranks 0..1" \
           "--nnodes 0|--nnodes '0': expected an integer in \[1, 1024\]" \
           "--nnodes 2 --node-rank 1 --master 10.0.0.1|--master: '10.0.0.1' is not HOST:PORT" \
           "--nnodes 2 --node-rank 1 --master 10.0.0.1:70000|--master's PORT '70000'" \
           "--nnodes 2 --node-rank 1|--nnodes 2 needs --master HOST:PORT" \
           "--nnodes 2 --node-rank 1 --master 10.0.0.1:29500 --workers 1:2|an elastic crew is one machine's"; do
    args=${bad%%|*} want=${bad#*|}
    case $args in *--workers*) ;; *) args="$args --workers 1" ;; esac
    "$L" launch $args --out "$TMP/bad" -- true >"$TMP/bad.log" 2>&1
    rc=$?
    check "refused: launch $args (status $rc: $(head -c 120 "$TMP/bad.log"))" \
        bash -c "[ $rc = 2 ] && grep -q -- \"$want\" '$TMP/bad.log' && [ \$(wc -l <'$TMP/bad.log') = 1 ]"
done

section_begin
nn_up 10.200.3 2
case $? in
0) ;;
2) skip_checks $NET_CHECKS "2 hosts in network namespaces" "$NN_WHY"; finish; exit ;;
*) fail "2 hosts on a bridge" "$NN_WHY"; finish; exit ;;
esac
M=$(nn_addr 0) PORT=29500
# node I's launch in host I, in the background: its pid in NODE_PID[I]
declare -a NODE_PID
node() {
    local i=$1; shift
    nn_bg "$i" "$L" launch --nnodes 2 --node-rank "$i" --master "$M:$PORT" --no-progress "$@"
    NODE_PID[$i]=$NN_LAST_PID
}

# A run: node 1 first (it waits for the master), then node 0. The
# servers count a worker that has not said HELLO within --heartbeat-timeout
# of their start gone (default 5 s), and four PyTorch imports on a loaded
# machine can take longer: the chief would then score alone.
node 1 --workers 2 --ps-shards 2 --out "$TMP/n1" -- "$TORCH_PY" "$TMP/py_nodes.py" 5 >"$TMP/n1.log" 2>&1
node 0 --workers 2 --ps-shards 2 --heartbeat-timeout 300 --out "$TMP/n0" -- \
    "$TORCH_PY" "$TMP/py_nodes.py" 5 >"$TMP/n0.log" 2>&1
wait_for "${NODE_PID[0]}" 300
rc0=$?
wait_for "${NODE_PID[1]}" 60
rc1=$?
check "node 0 exits 0 (got $rc0: $(tail -1 "$TMP/n0.log"))" test $rc0 = 0
check "node 1 exits 0 (got $rc1: $(tail -1 "$TMP/n1.log"))" test $rc1 = 0
for r in 0 1 2 3; do
    n=$((r / 2))
    if [ $r = 0 ]; then task="- DOWNPOUR_PS=-" # started before the servers, to write the model
    else task="$r DOWNPOUR_PS=tcp://$M:$PORT,tcp://$M:$((PORT + 1))"; fi
    want="env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 GROUP_RANK=$n MASTER_ADDR=$M MASTER_PORT=$((PORT + 2)) TASK=$task"
    got=$(grep -m1 '^env ' "$TMP/n$n/logs/worker-$r.log" 2>/dev/null)
    check "rank $r (node $n): ${got:-no env line}" test "$got" = "$want"
done
ranks=$(cat "$TMP"/n0/logs/worker-*.log "$TMP"/n1/logs/worker-*.log 2>/dev/null | sed -n 's/^env RANK=\([0-9]*\) .*/\1/p' | sort | xargs)
check "the ranks are global and distinct over both nodes (${ranks:-none})" test "$ranks" = "0 1 2 3"
check "the shards on node 0 saw 4 workers join" \
    bash -c "[ \$(cat '$TMP'/n0/logs/ps-0.log | grep -c 'joined') = 4 ]"
check "the chief scored after every worker: applied 20 pushes" \
    grep -q '^result: applied 20 pushes' "$TMP/n0/logs/worker-0.log"
result=$(json "$TMP/n0/summary.json" chief_result 2>/dev/null)
check "... summary.json's chief_result says it (${result:-none})" grep -q '^result: applied 20 pushes' <<<"$result"
applied=$(json "$TMP/n0/summary.json" updates_applied 2>/dev/null)
check "... and summary.json counts 20 pushes applied (${applied:-none})" test "${applied:-}" = 20
nodes=$(for k in nnodes node_rank world_size; do json "$TMP/n0/summary.json" $k 2>/dev/null; done | xargs)
check "node 0's summary.json: nnodes 2, node_rank 0, world_size 4 (${nodes:-none})" test "$nodes" = "2 0 4"
check "node 0's done line: 4 workers, 2 shards, 20 pushes, the chief's result" \
    grep -q "^downpour launch: done: sync, 4 worker(s), 2 shard(s): 20 pushes applied .*the chief exited with status 0: result: applied 20" "$TMP/n0.log"
exits=$(json "$TMP/n1/summary.json" worker_exit 2>/dev/null)
check "node 1's done line: its ranks 2..3 of 4, both ended 0 (${exits:-none})" \
    bash -c "grep -q '^downpour launch: done: node 1 of 2, 2 worker(s) (ranks 2..3 of 4)' '$TMP/n1.log' && [ '$exits' = '[0, 0]' ]"
check "no process of the run is left" left

# The chief ends without node 1's worker: node 1 sees the servers gone.
cat >"$TMP/gone.sh" <<SH
if [ "\$RANK" = 0 ]; then
    until [ -e "$TMP/n1-started" ]; do sleep 0.1; done
else
    touch "$TMP/n1-started"
    sleep 300
fi
SH
node 1 --workers 1 --master-timeout 2 --grace 2 --out "$TMP/g1" -- sh "$TMP/gone.sh" >"$TMP/g1.log" 2>&1
node 0 --workers 1 --model "fc:10 softmax" --out "$TMP/g0" -- sh "$TMP/gone.sh" >"$TMP/g0.log" 2>&1
wait_for "${NODE_PID[0]}" 120
rc0=$?
wait_for "${NODE_PID[1]}" 120
rc1=$?
check "the chief ended: node 0 exits 0 (got $rc0)" test $rc0 = 0
check "node 1: its worker was running when the servers went" test -e "$TMP/n1-started"
check "node 1 stops its worker and exits 1 (got $rc1, not the worker's 300 s)" test $rc1 = 1
check "... in one line naming the master and the timeout" \
    grep -q "^downpour launch: node 1: the master's servers at $M:$PORT stopped answering 2 s ago while 1 worker(s) here ran; stopped them" "$TMP/g1.log"
check "... nothing left" left

# Ctrl-C on node 1 (the default SIGINT disposition: a background job's is
# ignored) once its worker runs; node 0 runs on until its chief is told.
cat >"$TMP/int.sh" <<SH
if [ "\$RANK" = 0 ]; then
    until [ -e "$TMP/i-stopped" ]; do sleep 0.1; done
else
    touch "$TMP/i-started"
    sleep 300
fi
SH
nn_bg 1 env --default-signal=INT "$L" launch --nnodes 2 --node-rank 1 --master "$M:$PORT" --no-progress \
    --workers 1 --grace 2 --out "$TMP/i1" -- sh "$TMP/int.sh" >"$TMP/i1.log" 2>&1
NODE_PID[1]=$NN_LAST_PID
node 0 --workers 1 --model "fc:10 softmax" --out "$TMP/i0" -- sh "$TMP/int.sh" >"$TMP/i0.log" 2>&1
wait_until test -e "$TMP/i-started"
kill -INT "${NODE_PID[1]}"
wait_for "${NODE_PID[1]}" 60
rc1=$?
check "Ctrl-C on node 1: it exits 130 (got $rc1)" test $rc1 = 130
check "... every process of node 1 ended" grep -q 'stopped by signal 2; every process ended' "$TMP/i1.log"
check "... node 0 runs on" kill -0 "${NODE_PID[0]}"
touch "$TMP/i-stopped"
wait_for "${NODE_PID[0]}" 60
rc0=$?
left && gone=yes || gone=no
check "... until its chief ends the run (exit 0, got $rc0); nothing left ($gone)" test "$rc0-$gone" = 0-yes

# --max-restarts on node 1: its worker (rank 1) fails once, then succeeds.
cat >"$TMP/restart.sh" <<SH
if [ "\$RANK" = 0 ]; then
    until [ -e "$TMP/r-second" ]; do sleep 0.1; done
elif [ -e "$TMP/r-first" ]; then
    touch "$TMP/r-second"
else
    touch "$TMP/r-first"
    exit 3
fi
SH
node 1 --workers 1 --max-restarts 1 --out "$TMP/r1" -- sh "$TMP/restart.sh" >"$TMP/r1.log" 2>&1
node 0 --workers 1 --model "fc:10 softmax" --out "$TMP/r0" -- sh "$TMP/restart.sh" >"$TMP/r0.log" 2>&1
wait_for "${NODE_PID[0]}" 120
rc0=$?
wait_for "${NODE_PID[1]}" 60
rc1=$?
check "--max-restarts 1 on node 1: both nodes exit 0 (got $rc0, $rc1)" bash -c "[ $rc0 = 0 ] && [ $rc1 = 0 ]"
check "... node 1 restarted its worker under rank 1" \
    grep -q '^downpour launch: worker 1 exited with status 3; restart 1 of 1' "$TMP/r1.log"
count=$(json "$TMP/r1/summary.json" restart_count 2>/dev/null)
check "... its summary.json counts it (${count:-none}), the second life in worker-1.2.log" \
    bash -c "[ '$count' = 1 ] && [ -e '$TMP/r1/logs/worker-1.2.log' ]"

# Node 1 alone: the master never answers.
node 1 --workers 1 --master-timeout 1 --out "$TMP/lone" -- sh -c 'touch "$0"' "$TMP/lone-started" >"$TMP/lone.log" 2>&1
wait_for "${NODE_PID[1]}" 60
rc=$?
check "no master within --master-timeout 1: exit 2 (got $rc)" test $rc = 2
check "... one line naming it ($(head -c 160 "$TMP/lone.log"))" \
    bash -c "grep -q \"^downpour launch: node 1: the master's servers at $M:$PORT did not answer within 1 s\" '$TMP/lone.log' && [ \$(wc -l <'$TMP/lone.log') = 1 ]"
check "... and no worker started" test ! -e "$TMP/lone-started"
section_end "2 hosts in network namespaces" $NET_CHECKS
nn_down
check "nothing left of the namespaces: $(nn_leftovers | xargs)" test -z "$(nn_leftovers)"
finish
