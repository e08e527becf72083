#!/usr/bin/env bash
# test_netns: training across real network hops. Four hosts on this machine
# (network namespaces on a bridge, tests/netns/lib.sh): the parameter server
# on host 0, a worker on each of hosts 1-3, and host 3 behind a slow, lossy
# link (what reaches it is held 100-110 ms by tests/netns/nfq_delay and 1%
# dropped by iptables).
#  - the test subnet is unreachable from this namespace (blackhole route) and
#    the slow link is slow: a connection to host 3 takes at least the delay
#  - sync (every worker each step): completes; the server waited for the
#    slow worker: every one of its pushes applied, 3 per version
#  - async: completes; the slow worker's gradients are the stalest
#  - sync with a backup worker (--replicas-to-aggregate 2): completes, and
#    the server stops waiting for the slow worker: while the two fast ones
#    take their steps it takes fewer than half as many, and its late
#    gradients are dropped
#  - each run's numbers (images/s, staleness) are printed; the lossy link
#    did drop packets; nothing is left behind (namespaces, route, helpers)
# No speed is asserted: the figures are for tests/netns/slowlink.sh.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
source tests/netns/lib.sh
source tests/netns/train.sh

trap 'nn_down; t_cleanup' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# Every check below; a skip of the whole test counts them (section_end
# keeps the figure true where they run).
CHECKS=16
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks $CHECKS netns "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
section_begin
scale=${DP_TEST_TIMEOUT_SCALE:-1}
# The slow worker's 30 steps take ~8 s: long enough to span the fast workers'
# start-up (a second or three on a loaded machine) and their steps.
DELAY=100 JITTER=10 LOSS=0.01
NT_FIRST=2 # the slow worker starts first: its run spans the fast ones'
# 10 ms of "compute" per step (the model is tiny): the fast workers' runs
# span several of the slow one's round trips, whatever the load.
NT_WORKER_ARGS=(--delay-ms 10)
steps=30
NT_LIMIT=$((60 * scale))

nn_up 10.200.0 4
case $? in
0) ;;
2) skip_checks $CHECKS "4 hosts in network namespaces" "$NN_WHY"; finish; exit ;;
*) fail "4 hosts on a bridge" "$NN_WHY"; finish; exit ;;
esac
nn_delay 3 "$DELAY" "$JITTER" && nn_loss 3 "$LOSS"
case $? in
0) ;;
2) skip_checks $CHECKS "host 3's slow, lossy link" "$NN_WHY"; finish; exit ;;
*) fail "slow link" "$NN_WHY"; finish; exit ;;
esac
pass "4 hosts up; host 3's link: +${DELAY}..$((DELAY + JITTER)) ms in, $LOSS lost"

# From this namespace the test addresses lead nowhere (not out of eth0).
out=$(timeout 5 bash -c "exec 3<>/dev/tcp/$(nn_addr 0)/9" 2>&1)
rc=$?
check "$(nn_addr 0) is unreachable from the main namespace (got: ${out##*: })" \
    bash -c "[ $rc != 0 ] && [ $rc != 124 ] && ! grep -q refused <<<'$out'"

# connect_ms I J: milliseconds for host I to open a TCP connection to host J
# (refused on port 9: one round trip).
connect_ms() {
    nn_exec "$1" python3 -c '
import socket, sys, time
t = time.monotonic()
try:
    socket.create_connection((sys.argv[1], 9), timeout=10)
except ConnectionRefusedError:
    pass
print(int((time.monotonic() - t) * 1000))' "$(nn_addr "$2")"
}
fast=$(connect_ms 1 2) slow=$(connect_ms 1 3)
check "the slow link holds packets: host 1 -> 3 takes ${slow} ms >= $DELAY (host 1 -> 2: ${fast} ms)" \
    test "${slow:-0}" -ge "$DELAY"

stats() { "$TORCH_PY" tests/netns/runstats.py "$1"; }
# field JSON EXPR: a value from a runstats line (EXPR in Python, d the dict).
field() { "$TORCH_PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2"; }
# holds JSON EXPR: EXPR (Python, d the dict) is true.
holds() { "$TORCH_PY" -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2"; }
report() { # NAME STATS
    echo "  $1: $(field "$2" '"%.0f images/s (fast workers %s, slow %s), staleness mean %.2f max %s, dropped %s, accuracy %.3f" % (d["images_per_s"], d["per_worker"][0]["images_per_s"], d["per_worker"][2]["images_per_s"], d["staleness_mean"], d["staleness_max"], d["updates_dropped"], d["test_accuracy"])')"
}
# overlap DIR: the fast workers (0, 1) took steps while the slow one (2) was
# still taking its own (else the machine was too slow to compare them).
overlap() {
    "$TORCH_PY" - "$1" <<'PY'
import json, sys
def times(k):
    return [json.loads(l)["t"] for l in open(f"{sys.argv[1]}/metrics/worker-{k}.jsonl") if '"status"' in l]
sys.exit(0 if min(times(k)[0] for k in (0, 1)) < times(2)[-1] else 1)
PY
}
# slow_steps_while_fast DIR: steps the slow worker (2) took between the fast
# workers' first step and their last.
slow_steps_while_fast() {
    "$TORCH_PY" - "$1" <<'PY'
import json, sys
def times(k):
    return [json.loads(l)["t"] for l in open(f"{sys.argv[1]}/metrics/worker-{k}.jsonl") if '"status"' in l]
t0 = min(times(k)[0] for k in (0, 1))
t1 = max(times(k)[-1] for k in (0, 1))
print(sum(1 for t in times(2) if t0 <= t <= t1))
PY
}

# run NAME MODE [ps flags]: 3 workers, $steps steps each; sets S (runstats).
run() {
    local name=$1 mode=$2; shift 2
    S=""
    nt_run "$TMP/$name" "$mode" 3 "$steps" "$@"
    local rc=$?
    check "$name: 3 workers across the hops complete${NT_WHY:+ ($NT_WHY)}" test $rc = 0
    [ $rc = 0 ] || { tail -n 3 "$TMP/$name"/logs/*.log; return 1; }
    S=$(stats "$TMP/$name") || { fail "$name: stats" "runstats failed"; S=""; return 1; }
    report "$name" "$S"
    check "$name: the summary gives images/s and staleness" \
        holds "$S" 'd["images_per_s"] > 0 and d["staleness_max"] >= 0 and d["workers"] == 3'
}

overlap_or_skip() { # NAME CHECKS: the checks of NAME that need the overlap
    overlap "$TMP/$1" && return 0
    skip_checks "$2" "$1: the slow worker's steps against the fast ones'" "the fast workers started after it had finished (machine too loaded)"
    return 1
}

if run sync sync; then
    check "sync: the server waited for the slow worker (all $steps of its pushes applied)" \
        test "$(field "$S" 'd["per_worker"][2]["applied"]')" = "$steps"
    check "sync: 3 gradients per version, none dropped" \
        holds "$S" 'd["updates_applied"] == 3 * '$steps' and d["updates_dropped"] == 0'
fi

if run async async && overlap_or_skip async 1; then
    check "async: the slow worker's gradients are the stalest" \
        holds "$S" 'd["per_worker"][2]["staleness_max"] > max(w["staleness_max"] for w in d["per_worker"][:2])'
fi

if run backup sync --replicas-to-aggregate 2 && overlap_or_skip backup 2; then
    n=$(slow_steps_while_fast "$TMP/backup")
    check "backup worker: while the fast ones take their $steps steps, the slow one takes $n < $((steps / 2))" \
        test "${n:-$steps}" -lt $((steps / 2))
    check "backup worker: the slow worker's late gradients are dropped" \
        holds "$S" 'd["per_worker"][2]["dropped"] > 0'
fi

dropped=$(nn_exec 3 "$NN_IPT" -L INPUT -v -x -n 2>/dev/null | awk '$3 == "DROP" { print $1 }')
check "the lossy link dropped packets (${dropped:-0})" test "${dropped:-0}" -gt 0

nn_down
left=$(nn_leftovers)
check "nothing left behind: namespaces, blackhole route, helpers (left: ${left:-none})" test -z "$left"
section_end netns $CHECKS
finish
