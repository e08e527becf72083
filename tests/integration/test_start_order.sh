#!/usr/bin/env bash
# test_start_order: "Start order is free" (docs/OPERATIONS.md, "Many machines"). A
# worker started before its server keeps its HELLO queued and ZeroMQ
# redials: once the server is up on that port the worker joins and trains
# to the end, in sync mode too (the server starts after both workers).
#  - the workers are up and waiting first: each logged (DP_LOG=debug) that
#    its HELLO is sent, and nothing listens on the port yet; each says once
#    (without DP_LOG) that it waits for the server at that address
#  - then the server: both workers finish with exit 0, every push applied
#    (2 x steps), the server joined both and stopped on the chief's SHUTDOWN
# The port is one the kernel had free a moment before (the workers must
# know it before the server exists); taken meanwhile, the round is retried.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip start_order "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
S=${DP_TEST_TIMEOUT_SCALE:-1}
steps=6
fc=(--model "fc:10 softmax")
wk=(--steps "$steps" "${fc[@]}" --batch 16 --threads 1 --no-progress --timeout $((15 * S)))

# wait_file FILE PATTERN SECONDS: until FILE holds PATTERN.
wait_file() {
    local i
    for i in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
free_port() { "$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
listening() { "$TORCH_PY" -c 'import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(("127.0.0.1", int(sys.argv[1]))) != 0)' "$1"; }

for round in 1 2 3; do
    port=$(free_port)
    ep=tcp://127.0.0.1:$port
    rm -f "$TMP"/w*.log "$TMP/ps.log" "$TMP/summary.json"
    DP_LOG=debug "$BIN/downpour-worker" --ps "$ep" --task-index 0 "${wk[@]}" --summary "$TMP/summary.json" \
        >"$TMP/w0.log" 2>&1 &
    w0=$!; T_PIDS+=("$w0")
    DP_LOG=debug "$BIN/downpour-worker" --ps "$ep" --task-index 1 "${wk[@]}" >"$TMP/w1.log" 2>&1 &
    w1=$!; T_PIDS+=("$w1")
    waiting=1
    for k in 0 1; do wait_file "$TMP/w$k.log" "worker $k: HELLO sent to 1 shard(s)" $((30 * S)) || waiting=0; done
    told=1
    for k in 0 1; do
        wait_file "$TMP/w$k.log" "worker $k: waiting for ps shard 0 at $ep: nothing listens there yet" $((30 * S)) || told=0
    done
    listening "$port" && waiting=0
    "$BIN/downpour-ps" --bind "$ep" --workers 2 --mode sync "${fc[@]}" 2>"$TMP/ps.log" &
    ps=$!; T_PIDS+=("$ps")
    wait_for "$w0" $((60 * S)); rc0=$?
    wait_for "$w1" $((60 * S)); rc1=$?
    wait_for "$ps" $((20 * S)); rcps=$?
    grep -q "Address already in use" "$TMP/ps.log" || break
    echo "  round $round: port $port was taken meanwhile; again on another"
done
check "both workers were up and waiting before the server started (HELLO sent, port $port not listening)" \
    test "$waiting" = 1
check "each said once, before the server started, that it waits for it at $ep" \
    bash -c "[ $told = 1 ] && [ \$(grep -c 'waiting for ps shard 0 at' '$TMP/w0.log') = 1 ] && [ \$(grep -c 'waiting for ps shard 0 at' '$TMP/w1.log') = 1 ]"
check "the server started after them exits 0 on the chief's SHUTDOWN (status $rcps)" \
    bash -c "[ $rcps = 0 ] && grep -q 'SHUTDOWN from worker 0' '$TMP/ps.log'"
check "... having joined both workers" bash -c "grep -q 'worker 0 joined' '$TMP/ps.log' && grep -q 'worker 1 joined' '$TMP/ps.log'"
check "both workers finish with exit 0 (status $rc0, $rc1)" bash -c "[ $rc0 = 0 ] && [ $rc1 = 0 ]"
a=$(json "$TMP/summary.json" updates_applied 2>/dev/null)
check "the chief's summary: every push applied, 2 x $steps (got ${a:-none})" test "${a:-0}" = $((2 * steps))
finish
