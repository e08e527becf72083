# tests/netns/train.sh: sourced after tests/netns/lib.sh. One training run
# across the namespace hosts, started the way a person starts one by hand
# (the TensorFlow-style cluster flags): the parameter server on host 0 and
# worker K on host K+1, each reaching the others only over the bridge.
#
#   nt_run DIR MODE WORKERS STEPS [downpour-ps flags...]
#
# With NT_FIRST=K worker K starts first and the others once the server
# has seen it join, so that a slow worker's run spans the fast ones' (it
# would otherwise still be connecting when they are done).
#
# DIR gets summary.json (the chief's), metrics/{ps-0,worker-K}.jsonl and
# logs/. Returns 0 when every worker exited 0 and the server stopped on the
# chief's SHUTDOWN; 124 when the run passed NT_LIMIT seconds (everything is
# killed); else 1. NT_WHY says what went wrong.
# shellcheck shell=bash

NT_BIN=${NT_BIN:-${BIN:-$PWD/build}}
NT_MODEL=${NT_MODEL:-fc:64 relu fc:10 softmax}
NT_BATCH=${NT_BATCH:-64}
NT_LIMIT=${NT_LIMIT:-120}   # seconds for one run
NT_WORKER_ARGS=()           # more downpour-worker flags
NT_FIRST=""                 # a worker index: started first, the others once the server saw it join
NT_WHY=""
NT_PS_PORT=2222 NT_WORKER_PORT=2300

# s_nt_wait PID... : until all have exited or NT_LIMIT passes; 124 then.
s_nt_wait() {
    local t p alive
    for ((t = 0; t < NT_LIMIT * 10; t++)); do
        alive=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && return 0
        sleep 0.1
    done
    return 124
}

nt_run() {
    local dir=$1 mode=$2 n=$3 steps=$4; shift 4
    local ps_hosts wk_hosts="" k ps_pid wpids=() rc=0 chief
    mkdir -p "$dir/metrics" "$dir/logs"
    ps_hosts=$(nn_addr 0):$NT_PS_PORT
    for ((k = 0; k < n; k++)); do wk_hosts+="${wk_hosts:+,}$(nn_addr $((k + 1))):$NT_WORKER_PORT"; done
    local cluster=(--ps-hosts "$ps_hosts" --worker-hosts "$wk_hosts" --model "$NT_MODEL")
    nn_bg 0 "$NT_BIN/downpour-ps" --job-name ps --task-index 0 "${cluster[@]}" --mode "$mode" \
        --metrics "$dir/metrics/ps-0.jsonl" --metrics-every 1 --ready-file "$dir/logs/ps-0.ready" "$@" \
        >"$dir/logs/ps-0.log" 2>&1
    ps_pid=$NN_LAST_PID
    for ((k = 0; k < 100; k++)); do
        [ -s "$dir/logs/ps-0.ready" ] || ! kill -0 "$ps_pid" 2>/dev/null && break
        sleep 0.1
    done
    [ -s "$dir/logs/ps-0.ready" ] || { NT_WHY="the server did not start: $(tail -n 1 "$dir/logs/ps-0.log")"; kill "$ps_pid" 2>/dev/null; return 1; }
    local order=() i
    [ -n "$NT_FIRST" ] && order=("$NT_FIRST")
    for ((k = 0; k < n; k++)); do [ "$k" = "$NT_FIRST" ] || order+=("$k"); done
    for k in "${order[@]}"; do
        chief=()
        [ $k = 0 ] && chief=(--summary "$dir/summary.json")
        nn_bg $((k + 1)) "$NT_BIN/downpour-worker" --job-name worker --task-index "$k" "${cluster[@]}" \
            --steps "$steps" --batch "$NT_BATCH" --threads 1 --no-progress \
            --metrics "$dir/metrics/worker-$k.jsonl" "${chief[@]}" "${NT_WORKER_ARGS[@]}" \
            >"$dir/logs/worker-$k.log" 2>&1
        wpids[k]=$NN_LAST_PID
        [ "$k" = "$NT_FIRST" ] || continue
        for ((i = 0; i < 100; i++)); do
            grep -q "worker $k joined" "$dir/logs/ps-0.log" || ! kill -0 "$NN_LAST_PID" 2>/dev/null && break
            sleep 0.1
        done
    done
    if ! s_nt_wait "${wpids[@]}"; then
        kill -KILL "${wpids[@]}" "$ps_pid" 2>/dev/null
        NT_WHY="$mode run not done after ${NT_LIMIT}s"
        return 124
    fi
    for k in "${!wpids[@]}"; do
        wait "${wpids[k]}" || { rc=1; NT_WHY="worker $k failed: $(tail -n 1 "$dir/logs/worker-$k.log")"; }
    done
    # The chief's SHUTDOWN stops the server; a server still up is an error.
    NT_LIMIT=10 s_nt_wait "$ps_pid" || { kill -KILL "$ps_pid"; rc=1; NT_WHY="the server did not stop on SHUTDOWN"; }
    wait "$ps_pid" 2>/dev/null
    return $rc
}
