#!/usr/bin/env bash
# test_bench_scale: `downpour bench scale` starts real shards and worker
# processes that push, ends with one JSON line whose fields agree with each
# other and with what was asked (workers, shards, parameters, bytes per
# push, every worker pushed, nothing refused), over tcp with 1 shard and
# over ipc with 2 shards and a pull per push; bad flags are refused with one
# line and status 2; a run stopped by SIGTERM says so; nothing is left
# behind.
# Timing is not asserted: benchmarks are not tests.
source "$(dirname "$0")/lib.sh"
L=$BIN/downpour
S=${DP_TEST_TIMEOUT_SCALE:-1}

fields_ok() { # file workers shards pull: the last line is JSON and plausible
    tail -n 1 "$1" | "$TORCH_PY" -c '
import json, sys
o = json.loads(sys.stdin.read())
workers, shards, pull = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
need = ["workers", "shards", "params", "bytes_per_push", "pushes", "pushes_per_s",
        "pushes_per_s_min", "pushes_per_s_max", "mb_per_s", "push_ms", "push_ms_p99",
        "worker_pushes_per_s_min", "worker_pushes_per_s_max", "applied", "cores", "loadavg"]
missing = [k for k in need if k not in o]
assert not missing, "missing %s" % missing
assert o["workers"] == workers and o["shards"] == shards and o["pull"] == pull, o
assert 45000 <= o["params"] <= 55000 and o["bytes_per_push"] == 4 * o["params"], o
assert o["pushes"] > 0 and o["push_ms"] > 0 and o["push_ms_p99"] >= o["push_ms"], o
assert 0 < o["pushes_per_s_min"] <= o["pushes_per_s"] <= o["pushes_per_s_max"], o
assert abs(o["mb_per_s"] - o["pushes_per_s"] * o["bytes_per_push"] / 1e6) <= 0.01 * o["mb_per_s"] + 0.01, o
assert o["worker_pushes_per_s_min"] > 0, "a worker never pushed: %s" % o
# every push of the run (warm-up too) was applied by every shard
assert o["applied"] >= shards * o["pushes"], o
assert ("pull_ms" in o) == pull and (not pull or o["pull_ms"] > 0), o
# CPU over the measured span, when both samples were taken: the shards worked
if "shards_cpu" in o:
    assert o["shards_cpu"] > 0 and o["workers_cpu"] >= 0 and o["shard_cpu_ms_per_push"] > 0, o
    assert o["shards_cpu"] <= 1.1 * shards * o["cores"], o
print(o)' "$2" "$3" "$4"
}

"$L" bench scale --workers 2 --shards 1 --params 50000 --seconds 1 --warmup 0.3 --windows 4 \
    --timeout $((20 * S)) --json >"$TMP/tcp.log" 2>&1
check "bench scale, 2 workers, 1 shard, exits 0" test $? = 0
check "... its last line is the JSON object" fields_ok "$TMP/tcp.log" 2 1 0
"$L" bench scale --workers 2 --shards 2 --params 50000 --seconds 0.6 --warmup 0.2 --windows 3 \
    --transport ipc --pull --optimizer momentum --timeout $((20 * S)) --json >"$TMP/ipc.log" 2>&1
check "bench scale, 2 shards over ipc, a pull per push, exits 0" test $? = 0
check "... its last line is the JSON object" fields_ok "$TMP/ipc.log" 2 2 1

bad() { # expected refusal: status 2, one line, naming the command
    local name=$1; shift
    "$L" bench scale "$@" >"$TMP/bad.log" 2>&1
    local rc=$?
    check "$name refused with status 2 (got $rc)" test $rc = 2
    check "... in one line" test "$(wc -l <"$TMP/bad.log")" = 1
    check "... naming the command" grep -q '^downpour bench scale: ' "$TMP/bad.log"
}
bad "--workers 0" --workers 0
bad "--params 5" --params 5
bad "--seconds abc" --seconds abc
bad "--params with --model" --params 1000 --model 'fc:10 softmax'
bad "a bad --model" --model 'fc:10 bogus'
bad "an unknown optimizer" --optimizer sgdd
bad "an unknown flag" --wokers 2
"$L" bench scale --help >"$TMP/help.log" 2>&1
check "--help exits 0 and names --workers" grep -q -- '--workers' "$TMP/help.log"

# Stopped halfway (SIGTERM, as a Ctrl-C or a job scheduler would): one line,
# status 1, and the cleanup below still finds nothing left.
bg "$L" bench scale --workers 3 --params 50000 --seconds 60 >"$TMP/stop.log" 2>&1
pid=$!
sleep 1.5
kill -TERM $pid
wait_for $pid $((20 * S))
rc=$?
check "stopped by SIGTERM: status 1 (got $rc)" test $rc = 1
check "... saying so" grep -q '^downpour bench scale: interrupted' "$TMP/stop.log"

check "no downpour-ps left behind" bash -c "! pgrep -f '[r]eady-file /tmp/downpour-bench-scale-' >/dev/null"
check "no worker process left behind" bash -c "! pgrep -f 'downpour [b]ench scale' >/dev/null"
check "no scratch directory left behind" bash -c "! ls -d /tmp/downpour-bench-scale-* 2>/dev/null | grep -q ."
finish
