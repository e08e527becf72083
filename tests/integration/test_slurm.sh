#!/usr/bin/env bash
# test_slurm: deploy/slurm/downpour.sbatch, the script users submit, run by a
# live SLURM (Debian's slurmctld, slurmd, munge; tests/slurm/lib.sh starts
# them as root in a directory of the test's own, no systemd, nothing in /etc).
#  - one node: `sbatch --wait` runs a server and two workers; the job
#    completes, the chief's summary.json, model and metrics are there, and
#    the servers stopped on the chief's SHUTDOWN; `srun downpour launch`
#    (a job step) runs the PyTorch example as 2 workers of its own shard;
#    an elastic job (DP_WORKERS=1:4, sync) of workers 0 and 1:
#    deploy/slurm/join.sh adds 2 and 3 as steps of the running job, then
#    3 (`scancel --signal=TERM` of its step), 2 and 1 (deploy/slurm/leave.sh;
#    1 is a task of the job's own step) leave after a whole step (exit 0),
#    and the job completes with each sample of the epoch trained once;
#    join.sh refuses a fixed crew's job, leave.sh a worker not running
#  - three nodes, each slurmd in a network namespace of its own (a host with
#    its own address, tests/netns/lib.sh): with DP_PS_NODES=1 the server runs
#    on the first host and a worker on each of the others, in sync mode, so
#    every gradient crosses the bridge; each slurmd launched its own step;
#    the PyTorch example as each worker task (DP_COMMAND, TF_CONFIG set
#    there), the server started from its --init file
#  - nothing is left behind: no daemon, step daemon or task, no namespace
# Every sbatch is bounded by `timeout`, by --time, and by the tasks'
# --kill-on-bad-exit (SLURM_KILL_BAD_EXIT); the daemons are stopped by their
# pid files whatever happens.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
source tests/slurm/lib.sh
source tests/netns/lib.sh

trap 'sl_stop; nn_down; t_cleanup' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# The checks of each half; a skip counts them (section_end keeps the
# figures true where they run).
ONE=17 THREE=11
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks $((ONE + THREE)) slurm "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
scale=${DP_TEST_TIMEOUT_SCALE:-1}
steps=20
# A small network: the test is about the deployment, not the arithmetic.
export DP_MODEL="fc:64 relu fc:10 softmax"
export DP_WORKER_ARGS="--steps $steps --threads 1 --timeout $((30 * scale))"
export DP_BUILD=$BIN DP_DEVICE=cpu DP_READY_TIMEOUT=$((30 * scale))
export SLURM_KILL_BAD_EXIT=1

# submit NETNS NAME SBATCH-FLAGS...: `sbatch --wait` of the script in the
# background (a TERM to the test is handled at once, not after sbatch), its
# output in $TMP/NAME.out, results in $TMP/NAME/; sets JOB_RC.
submit() {
    local ns=$1 name=$2; shift 2
    local port=$((20000 + RANDOM % 20000)) t0=$SECONDS
    DP_OUT=$TMP/$name DP_PS_PORT=$port DP_WORKER_PORT=$((port + 100)) \
        sl_run "$ns" timeout -k 5 $((90 * scale)) sbatch --wait --parsable --time=$((2 * scale)) \
        --output="$TMP/$name.out" "$@" deploy/slurm/downpour.sbatch >"$TMP/$name.id" 2>"$TMP/$name.err" &
    local pid=$!
    T_PIDS+=("$pid")
    wait "$pid"
    JOB_RC=$?
    echo "  $name: sbatch --wait returned $JOB_RC after $((SECONDS - t0)) s"
    [ "$JOB_RC" = 0 ] || { echo "sbatch exit $JOB_RC:"; cat "$TMP/$name.err" "$TMP/$name.out" 2>/dev/null; tail -n 3 "$TMP/$name"/logs/*.log 2>/dev/null; }
}

# summary_ok DIR WORKERS MODE: the chief's summary of a finished run.
summary_ok() {
    local d=$1 s=$1/summary.json
    [ -s "$s" ] && [ -s "$d/model.safetensors" ] || { echo "no summary.json / model.safetensors in $d"; return 1; }
    [ "$(json "$s" workers)" = "$2" ] && [ "$(json "$s" mode)" = "$3" ] && [ "$(json "$s" steps)" = "$steps" ] ||
        { echo "summary: workers $(json "$s" workers), mode $(json "$s" mode), steps $(json "$s" steps)"; return 1; }
    # Every push of every worker is applied once: none dropped (R = all
    # workers in sync, no bound in async), none rejected, none lost.
    local a dr rj; a=$(json "$s" updates_applied) dr=$(json "$s" updates_dropped) rj=$(json "$s" updates_rejected)
    [ "$a" = $(($2 * steps)) ] && [ "$dr" = 0 ] && [ "$rj" = 0 ] ||
        { echo "applied $a, dropped $dr, rejected $rj: want $2 x $steps = $(($2 * steps)) applied, none dropped or rejected"; return 1; }
    ge "$(json "$s" test_accuracy)" 0.4 || { echo "test accuracy $(json "$s" test_accuracy) < 0.4"; return 1; }
    local i
    for ((i = 0; i < $2; i++)); do [ -s "$d/metrics/worker-$i.jsonl" ] || { echo "no metrics of worker $i"; return 1; }; done
}

# job_state NETNS ID: "STATE EXITCODE" as slurmctld remembers the job.
job_state() {
    sl_run "$1" timeout 10 scontrol show job -o "$2" 2>/dev/null |
        grep -oE '(JobState|ExitCode)=[^ ]+' | cut -d= -f2 | tr '\n' ' ' | sed 's/ $//'
}

# ---- one node --------------------------------------------------------------
# munged runs as the munge user: it must reach its socket under $TMP.
chmod 0755 "$TMP"
section_begin
sl_init "$TMP/slurm1"
case $? in
0) ;;
2) skip_checks $((ONE + THREE)) slurm "$SL_WHY"; finish; exit ;;
*) fail "slurm set-up" "$SL_WHY"; finish; exit ;;
esac
sl_node n1 127.0.0.1
sl_conf 127.0.0.1
if sl_start; then
    pass "munged, slurmctld and slurmd up; node n1 idle"
    submit "" one --nodes=1 --export=ALL,DP_WORKERS_PER_NODE=2,DP_MODE=async
    check "sbatch --wait downpour.sbatch on one node: exit 0" test "$JOB_RC" = 0
    check "one node: summary of 2 async workers, $steps steps each, 2 x $steps updates applied" summary_ok "$TMP/one" 2 async
    st=$(job_state "" "$(cat "$TMP/one.id")")
    check "one node: slurmctld says the job COMPLETED 0:0 (got '$st')" test "$st" = "COMPLETED 0:0"
    check "one node: the server stopped on the chief's SHUTDOWN" grep -q 'SHUTDOWN from worker 0' "$TMP/one/logs/ps-0.log"
    # downpour launch as a job step (one launch per node: its own shards and
    # workers), the PyTorch example as the command.
    if has_torch; then
        export PYTHONPATH=$PWD/$BUILD/python
        "$TORCH_PY" examples/torch_fashion_mnist.py --write-init "$TMP/fm.safetensors" >/dev/null 2>&1
        sl_run "" timeout -k 5 $((120 * scale)) srun --nodes=1 --ntasks=1 --time=$((2 * scale)) \
            "$BIN/downpour" launch --workers 2 --init "$TMP/fm.safetensors" --mode async --no-progress \
            --out "$TMP/slaunch" -- "$TORCH_PY" examples/torch_fashion_mnist.py --steps 20 \
            >"$TMP/slaunch.log" 2>&1
        rc=$?
        check "srun downpour launch -- python3 (a job step): exit 0 (got $rc)" test $rc = 0
        check "... its chief scored the run" grep -q '^test accuracy' "$TMP/slaunch/logs/worker-0.log"
    else
        skip_checks 2 "slurm launch" "python3-torch is not installed under $TORCH_PY (make deps-test)"
    fi
    # An elastic job (DP_WORKERS=1:4, sync) started with workers 0 and 1:
    # deploy/slurm/join.sh adds 2 and 3 while it trains, then three leave:
    # 3 by `scancel --signal=TERM` of its step, 2 and 1 (a task of the job's
    # own step) by deploy/slurm/leave.sh. Each change waits for the pushes
    # the metrics show.
    "$PWD/deploy/slurm/join.sh" "$TMP/one" >"$TMP/join-fixed.log" 2>&1; rc=$?
    check "join.sh on a fixed crew's job: refused, one line (exit $rc)" \
        bash -c "[ $rc = 2 ] && grep -q 'has a fixed crew' '$TMP/join-fixed.log'"
    E=$TMP/elastic port=$((20000 + RANDOM % 20000))
    sl_run "" env DP_OUT="$E" DP_PS_PORT=$port DP_WORKER_PORT=$((port + 100)) \
        DP_WORKER_ARGS="--train-samples 19200 --threads 1 --delay-ms 40 --timeout $((30 * scale))" \
        sbatch --parsable --time=$((3 * scale)) --nodes=1 --output="$TMP/elastic.out" \
        --export=ALL,DP_WORKERS=1:4,DP_WORKERS_PER_NODE=2,DP_MODE=sync,DP_BATCH=32 \
        deploy/slurm/downpour.sbatch >"$TMP/elastic.id" 2>&1
    EJ=$(cat "$TMP/elastic.id")
    applied() { grep -c '"status":"applied"' "$E/metrics/worker-$1.jsonl" 2>/dev/null; }
    until_applied() { # N I: bounded
        for _ in $(seq $((900 * scale))); do [ "$(applied "$2")" -ge "$1" ] 2>/dev/null && return 0; sleep 0.1; done
        echo "worker $2: $(applied "$2") pushes applied"; tail -3 "$TMP/elastic.out" 2>/dev/null; return 1
    }
    joined() { # I JOIN-LOG: join.sh took index I and that worker trains
        until_applied 3 "$1" && grep -q "job $EJ: worker $1 joins" "$2"
    }
    until_applied 3 0 >/dev/null
    bg sl_run "" timeout -k 5 $((150 * scale)) "$PWD/deploy/slurm/join.sh" "$E" >"$TMP/join2.log" 2>&1
    JOIN2=$!
    check "elastic job $EJ: join.sh takes the lowest free index, 2, whose step trains" joined 2 "$TMP/join2.log"
    bg sl_run "" timeout -k 5 $((150 * scale)) "$PWD/deploy/slurm/join.sh" "$E" >"$TMP/join3.log" 2>&1
    JOIN3=$!
    check "... a second join.sh takes 3" joined 3 "$TMP/join3.log"
    step=$(sl_run "" squeue -h -s -j "$EJ" -o '%i %j' | awk '$2 == "worker-3" { print $1 }')
    sl_run "" scancel --signal=TERM "${step:-$EJ.none}"
    wait_for $JOIN3 $((60 * scale)); rc=$?
    check "scancel --signal=TERM $step: worker 3 leaves after a whole step, its srun exits 0 (got $rc)" \
        bash -c "[ $rc = 0 ] && grep -q 'worker 3: left after step' $E/logs/worker-3.*.log"
    sl_run "" "$PWD/deploy/slurm/leave.sh" "$E" 2 >"$TMP/leave2.log" 2>&1; rc=$?
    wait_for $JOIN2 $((60 * scale)); rc2=$?
    check "leave.sh 2: worker 2 leaves after a whole step, its srun exits 0 ($rc, $rc2)" \
        bash -c "[ $rc = 0 ] && [ $rc2 = 0 ] && grep -q 'worker 2: left after step' $E/logs/worker-2.*.log"
    sl_run "" "$PWD/deploy/slurm/leave.sh" "$E" 1 >"$TMP/leave1.log" 2>&1; rc=$?
    left1() { for _ in $(seq $((300 * scale))); do grep -q 'worker 1: left after step' "$E/logs/worker-1.log" && return 0; sleep 0.1; done; return 1; }
    check "leave.sh 1: worker 1, a task of the job's own step, leaves alone (exit $rc)" \
        bash -c "[ $rc = 0 ] && $(declare -f left1); E=$E scale=$scale; left1"
    sl_run "" "$PWD/deploy/slurm/leave.sh" "$E" 3 >"$TMP/leave3.log" 2>&1; rc=$?
    check "leave.sh 3 when no worker 3 runs: exit 1, one line" \
        bash -c "[ $rc = 1 ] && grep -q 'no worker 3 is running' '$TMP/leave3.log'"
    for _ in $(seq $((1200 * scale))); do [ -z "$(sl_run "" squeue -h -j "$EJ" 2>/dev/null)" ] && break; sleep 0.1; done
    st=$(job_state "" "$EJ")
    check "elastic: the job COMPLETED 0:0 (got '$st')" test "$st" = "COMPLETED 0:0"
    crew=$("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
ev = ["%s%d" % (e["event"][0], e["task"]) for e in s["membership"]]
es = s["epoch_samples"][0]
print(" ".join(sorted(ev[:2]) + ev[2:]), "|", es["trained"], es["repeated"], s["live_max"])' "$E/summary.json" 2>&1)
    check "elastic: summary.json: 0 and 1 start, 2 and 3 join, 3, 2, 1 leave, 19200 samples once ($crew)" \
        test "$crew" = "j0 j1 j2 j3 l3 l2 l1 l0 | 19200 0 4"
elif ! getent hosts "$(hostname -s)" >/dev/null 2>&1; then
    # Nothing of the cluster needs the name (tests/slurm/lib.sh), and it came
    # up here without it; should a host's SLURM still fail where the name
    # does not resolve, that is the host's lack, said in one line, not a
    # failure of the project.
    skip_checks $((ONE - 1)) "slurm one node" "SLURM did not come up and this host's name '$(hostname -s)' does not resolve (no /etc/hosts line): $SL_WHY"
else
    fail "start the one-node cluster" "$SL_WHY"
fi
sl_stop
left=$(sl_leftovers)
check "one node: no daemon or task left after the stop (left: ${left:-none})" test -z "$left"
section_end "one node" $ONE

# ---- three hosts ------------------------------------------------------------
section_begin
nn_up 10.200.1 3
case $? in
0)
    sl_init "$TMP/slurm3"
    for i in 0 1 2; do sl_node "n$((i + 1))" "$(nn_addr "$i")" "$(nn_netns "$i")"; done
    sl_conf "$(nn_addr 0)"
    if sl_start "$(nn_netns 0)"; then
        pass "3 hosts: slurmctld and a slurmd per network namespace up; n1..n3 idle"
        submit "$(nn_netns 0)" three --nodes=3 --export=ALL,DP_PS_NODES=1,DP_WORKERS_PER_NODE=1,DP_MODE=sync
        check "sbatch --wait downpour.sbatch on 3 hosts: exit 0" test "$JOB_RC" = 0
        check "3 hosts: summary of 2 sync workers, 2 x $steps updates applied" summary_ok "$TMP/three" 2 sync
        check "3 hosts: the server at host 1's address, workers at hosts 2 and 3" \
            grep -q -- "--ps-hosts $(nn_addr 0):.*--worker-hosts $(nn_addr 1):[0-9]*,$(nn_addr 2):" \
            <(tr '\n' ' ' <"$TMP/three.out")
        id=$(cat "$TMP/three.id")
        launched() { grep -q "launch task StepId=$id\.$2 " "$TMP/slurm3/log/slurmd-$1.log"; }
        check "3 hosts: n1's slurmd started the server step, not the workers'" \
            bash -c "$(declare -f launched); id=$id TMP=$TMP; launched n1 0 && ! launched n1 1" 
        check "3 hosts: n2's and n3's slurmds each started the workers' step" \
            bash -c "$(declare -f launched); id=$id TMP=$TMP; launched n2 1 && launched n3 1 && ! launched n2 0"
        st=$(job_state "$(nn_netns 0)" "$id")
        check "3 hosts: the job COMPLETED 0:0 (got '$st')" test "$st" = "COMPLETED 0:0"
        # The PyTorch example as each worker task (DP_COMMAND), the server
        # on host 1 started from its --init file, a worker on hosts 2 and 3.
        if has_torch; then
            export PYTHONPATH=$PWD/$BUILD/python
            [ -s "$TMP/fm.safetensors" ] ||
                "$TORCH_PY" examples/torch_fashion_mnist.py --write-init "$TMP/fm.safetensors" >/dev/null 2>&1
            submit "$(nn_netns 0)" torch3 --nodes=3 \
                --export="ALL,DP_PS_NODES=1,DP_WORKERS_PER_NODE=1,DP_MODE=async,DP_MODEL=,DP_PS_ARGS=--init $TMP/fm.safetensors,DP_COMMAND=$TORCH_PY examples/torch_fashion_mnist.py --steps 20"
            check "3 hosts, DP_COMMAND: 2 PyTorch workers across the bridge, exit 0" test "$JOB_RC" = 0
            check "... the chief (host 2) scored the run: 2 x 20 pushes applied" \
                grep -q '^test accuracy .*the servers applied 40 pushes' "$TMP/torch3/logs/worker-0.log"
        else
            skip_checks 2 "slurm DP_COMMAND" "python3-torch is not installed under $TORCH_PY (make deps-test)"
        fi
    elif ! getent hosts "$(hostname -s)" >/dev/null 2>&1; then
        skip_checks $((THREE - 2)) "slurm on 3 hosts" "SLURM did not come up and this host's name '$(hostname -s)' does not resolve (no /etc/hosts line): $SL_WHY"
    else
        fail "start the 3-host cluster" "$SL_WHY"
    fi
    sl_stop
    left=$(sl_leftovers)
    nn_down
    check "3 hosts: no daemon or task left (left: ${left:-none})" test -z "$left"
    left=$(nn_leftovers)
    check "3 hosts: no namespace or route left (left: ${left:-none})" test -z "$left"
    ;;
2) skip_checks $THREE "slurm on 3 hosts in network namespaces" "$NN_WHY" ;;
*) fail "3 hosts (network namespaces)" "$NN_WHY" ;;
esac
section_end "3 hosts" $THREE
finish
