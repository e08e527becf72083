#!/usr/bin/env bash
# dp-test: unsanitized
# test_local_cluster: real downpour-ps and downpour-worker daemons on loopback,
# started by `downpour local` or by hand.
#  - sync with 2 workers at batch b == standalone at batch 2b (same samples,
#    same order): the weights agree to float tolerance
#  - sync with 2 shards == sync with 1 shard
#  - the shards' optimizer threads: the daemon's rule on cores / K (up to 4,
#    1 for a small model), or --ps-threads (--threads is the workers')
#  - async with 1 worker == standalone, bit for bit (shared memory and frames)
#  - async and ssp train; every push is applied, dropped or rejected
#  - ssp --staleness 2 bounds staleness to (N-1)(2S+1) = 5 versions with a
#    straggler, where async with the same straggler exceeds it
#  - ssp --staleness 0 runs in lockstep
#  - a straggler (--straggler) pushes the stalest gradients
#  - a worker with another model is refused with a clear error
#  - the launcher leaves no process behind (success, a failed child, SIGINT)
# Not under the sanitizers (the longest of their pass): the same daemons'
# sync, async and ssp paths run under them in test_elastic, test_lab_cluster,
# test_compress_cluster and test_recovery_cluster.
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip cluster "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
common=(--seed 5 --optimizer momentum --lr 0.01 --momentum 0.9 --no-progress)
compare() { "$TORCH_PY" tests/integration/compare_st.py "$@" >"$TMP/compare.log" 2>&1 || { cat "$TMP/compare.log"; return 1; }; }

# Sync equivalence: the strongest check that aggregation is right.
"$BIN/downpour-worker" --standalone --steps 12 --batch 64 --seed 5 --optimizer momentum --lr 0.01 --momentum 0.9 \
    --no-progress --save "$TMP/sa.safetensors" >"$TMP/sa.log" 2>&1
check "standalone at batch 64" test $? = 0
"$L" local --workers 2 --mode sync --batch 32 --steps 12 --threads 1 "${common[@]}" --out "$TMP/sync1" >"$TMP/sync1.log" 2>&1
check "local sync, 2 workers, batch 32" test $? = 0
check "sync(2 x 32) weights == standalone(64) weights" compare "$TMP/sync1/model.safetensors" "$TMP/sa.safetensors" --rtol 2e-3 --atol 2e-5

# Async with one worker, in turn (--overlap off), has nobody to be stale
# against: bit-identical to standalone (the server's momentum is the
# standalone trainer's). Overlapped, it computes on weights one step older
# (test_overlap).
"$BIN/downpour-worker" --standalone --steps 12 --batch 32 --seed 5 --optimizer momentum --lr 0.01 --momentum 0.9 \
    --no-progress --save "$TMP/sa32.safetensors" >"$TMP/sa32.log" 2>&1
"$L" local --workers 1 --mode async --overlap off --batch 32 --steps 12 "${common[@]}" --out "$TMP/async1" >"$TMP/async1.log" 2>&1
check "local async, 1 worker" test $? = 0
check "async(1 worker) weights == standalone weights, bit for bit" compare "$TMP/async1/model.safetensors" "$TMP/sa32.safetensors" --rtol 0 --atol 0
# ... with the tensors in ZeroMQ frames rather than shared memory (auto's
# choice on loopback): the pull writes the network's parameters and the
# push sends from the network's gradient, no buffer between.
"$L" local --workers 1 --mode async --overlap off --transport zmq --batch 32 --steps 12 "${common[@]}" \
    --out "$TMP/async1zmq" >"$TMP/async1zmq.log" 2>&1
check "async(1 worker) over ZeroMQ frames == standalone, bit for bit" compare "$TMP/async1zmq/model.safetensors" "$TMP/sa32.safetensors" --rtol 0 --atol 0
# The same with the default optimizer (Adam) and schedule (cosine over the run).
"$BIN/downpour-worker" --standalone --steps 12 --batch 32 --seed 5 --no-progress \
    --save "$TMP/sa32adam.safetensors" >"$TMP/sa32adam.log" 2>&1
"$L" local --workers 1 --mode async --overlap off --batch 32 --steps 12 --seed 5 --no-progress --out "$TMP/async1adam" >"$TMP/async1adam.log" 2>&1
check "async(1 worker) == standalone with the defaults (adam, cosine), bit for bit" compare "$TMP/async1adam/model.safetensors" "$TMP/sa32adam.safetensors" --rtol 0 --atol 0

"$L" local --workers 2 --ps-shards 2 --mode sync --batch 32 --steps 12 --threads 1 --ps-threads 1 \
    "${common[@]}" --out "$TMP/sync2" >"$TMP/sync2.log" 2>&1
check "local sync, 2 shards" test $? = 0
check "sync with 2 shards == sync with 1 shard" compare "$TMP/sync2/model.safetensors" "$TMP/sync1/model.safetensors" --rtol 1e-5 --atol 1e-7
# The shards' optimizer threads: the host's cores / K (at most 4) by default,
# --ps-threads when given; --threads is the workers' alone.
ps_cores=$(( $(nproc) < 4 ? $(nproc) : 4 ))
check "a lone shard gets every core, up to 4, for its sweep (--threads 1 is the workers')" \
    grep -q ", $ps_cores optimizer thread" "$TMP/sync1/logs/ps-0.log"
check "--ps-threads 1 reaches both shards" \
    bash -c "grep -q ', 1 optimizer thread,' '$TMP/sync2/logs/ps-0.log' && grep -q ', 1 optimizer thread,' '$TMP/sync2/logs/ps-1.log'"
# ... and the daemon's own rule on that share: one thread for a shard under
# 256 K floats, as `downpour-ps` alone would take (7,850 floats here).
"$L" local --workers 1 --model "fc:10 softmax" --batch 16 --steps 2 --no-progress \
    --out "$TMP/small" >"$TMP/small.log" 2>&1
check "a small model's shard sweeps on 1 thread, as downpour-ps alone does" \
    grep -q ', 1 optimizer thread,' "$TMP/small/logs/ps-0.log"

# Every push is accounted for.
pushes() { cat "$1"/metrics/worker-*.jsonl | grep -c '"status"'; }
accounted() { # dir
    local a d r p
    a=$(json "$1/summary.json" updates_applied) d=$(json "$1/summary.json" updates_dropped)
    r=$(json "$1/summary.json" updates_rejected) p=$(pushes "$1")
    [ $((a + d + r)) = "$p" ] || { echo "applied $a + dropped $d + rejected $r != pushes $p"; return 1; }
}
check "sync: pushes == applied + dropped + rejected" accounted "$TMP/sync1"

# The policies themselves, each worker in turn (the overlapped worker's
# staleness and accuracy: test_overlap).
for mode in async ssp; do
    extra=(); [ $mode = ssp ] && extra=(--staleness 2)
    "$L" local --workers 2 --mode $mode "${extra[@]}" --overlap off --batch 32 --steps 150 "${common[@]}" --out "$TMP/$mode" >"$TMP/$mode.log" 2>&1
    check "local $mode run" test $? = 0
    acc=$(json "$TMP/$mode/summary.json" test_accuracy 2>/dev/null || echo 0)
    check "$mode, 2 workers x 150 steps: test accuracy >= 0.70 (got $acc)" ge "$acc" 0.70
    check "$mode: pushes == applied + dropped + rejected" accounted "$TMP/$mode"
done

# ssp bounds staleness where async does not. Two equal workers stay under
# any small bound by themselves, so worker 1 is a straggler (--delay-ms
# 200 ms before each push) and worker 0 goes as fast as it can, started
# once the straggler has joined (its 40 steps then fall within the
# straggler's 30 x 200 ms). In async each straggler push lands many of
# worker 0's pushes late: the control must exceed the bound. ssp
# --staleness S lets a worker pull only while at most S pushes ahead of the
# slowest: while one worker computes on what it pulled at clock c, each
# other can go from clock c - S (no further behind, or that pull would have
# waited) to c + S + 1 (its last pull allowed at c + S), so a push is at
# most (N - 1)(2S + 1) versions stale: 5 here (the straggler, ahead before
# worker 0 starts, can see 4 or 5 at the start; 1 once paced).
strag_ms=$((200 * ${DP_TEST_TIMEOUT_SCALE:-1}))
strag_run() { # NAME MODE FLAGS...: a shard and the two workers in $TMP/NAME
    local d=$TMP/$1 mode=$2 i; shift 2
    mkdir -p "$d"
    local m=(--model "fc:128 relu fc:10 softmax" --seed 5)
    bg "$BIN/downpour-ps" --bind 'tcp://127.0.0.1:*' --ready-file "$d/ready" --workers 2 --mode "$mode" "$@" \
        "${m[@]}" >"$d/ps.log" 2>&1
    local ps_pid=$!
    for i in $(seq 100); do [ -s "$d/ready" ] && break; sleep 0.1; done
    bg "$BIN/downpour-worker" --ps "$(cat "$d/ready")" --task-index 1 --steps 30 --delay-ms "$strag_ms" \
        --batch 32 --threads 1 --no-progress "${m[@]}" >"$d/w1.log" 2>&1
    local w1=$!
    for i in $(seq 300); do grep -q "worker 1 joined" "$d/ps.log" && break; sleep 0.1; done
    "$BIN/downpour-worker" --ps "$(cat "$d/ready")" --task-index 0 --steps 40 --batch 32 --threads 1 \
        --no-progress "${m[@]}" --summary "$d/summary.json" >"$d/w0.log" 2>&1
    echo $? >"$d/rc0"
    wait_for $w1 60; echo $? >"$d/rc1"
    wait_for $ps_pid 10
}
strag_run strag-async async
strag_run strag-ssp ssp --staleness 2
for r in strag-async strag-ssp; do
    check "$r: both workers finish (exit $(cat "$TMP/$r/rc0") $(cat "$TMP/$r/rc1"))" \
        test "$(cat "$TMP/$r/rc0")$(cat "$TMP/$r/rc1")" = 00
done
amax=$(json "$TMP/strag-async/summary.json" staleness_max 2>/dev/null || echo -1)
smax=$(json "$TMP/strag-ssp/summary.json" staleness_max 2>/dev/null || echo 99)
check "async with a ${strag_ms} ms straggler (the control): staleness_max $amax exceeds ssp's bound 5" test "$amax" -gt 5
check "ssp --staleness 2 with the same straggler keeps staleness <= (N-1)(2S+1) = 5 versions (got $smax)" test "$smax" -le 5

"$L" local --workers 2 --mode ssp --staleness 0 --batch 32 --steps 30 "${common[@]}" --out "$TMP/ssp0" >"$TMP/ssp0.log" 2>&1
check "local ssp --staleness 0" test $? = 0
smax=$(json "$TMP/ssp0/summary.json" staleness_max 2>/dev/null || echo 99)
check "ssp 0 runs in lockstep: staleness <= 1 (got $smax)" ge 1 "$smax"

# One straggler: its gradients arrive after the other worker's, so they are
# the stale ones.
# The delay scales with the tests' slowdown (a sanitized build computes a
# step several times slower), so the straggler stays the slow one.
strag_ms=$((40 * ${DP_TEST_TIMEOUT_SCALE:-1}))
"$L" local --workers 2 --mode async --batch 32 --steps 40 --straggler "1:$strag_ms" "${common[@]}" --out "$TMP/strag" >"$TMP/strag.log" 2>&1
check "local async with --straggler 1:$strag_ms" test $? = 0
stale_of() { grep '"status"' "$TMP/strag/metrics/worker-$1.jsonl" | "$TORCH_PY" -c 'import sys, json; l = [json.loads(x)["staleness"] for x in sys.stdin]; print(sum(l) / len(l))'; }
s0=$(stale_of 0) s1=$(stale_of 1)
check "the straggler's pushes are staler (worker 1 $s1 > worker 0 $s0 + 0.2)" ge "$s1" "$(awk -v a="$s0" 'BEGIN { print a + 0.2 }')"

# A worker whose model differs is refused (its own model named; the server's only in its log).
port=$((20000 + RANDOM % 20000))
bg "$BIN/downpour-ps" --bind "tcp://127.0.0.1:$port" --workers 1 --mode async >"$TMP/ps.log" 2>&1
timeout 30 "$BIN/downpour-worker" --ps "tcp://127.0.0.1:$port" --task-index 0 --steps 5 --no-progress \
    --model "conv5x5:16 relu maxpool2 fc:10 softmax" --timeout 10 >"$TMP/mm.log" 2>&1
rc=$?
check "mismatched worker exits non-zero" test $rc != 0 -a $rc != 124
check "mismatched worker says 'model mismatch'" grep -q "model mismatch" "$TMP/mm.log"

# Bad launcher flags: one line, status 2, nothing started.
"$L" local --bogus 1 --out "$TMP/bogus" >"$TMP/bogus.log" 2>&1
rc=$?
check "unknown launcher flag: status 2 (got $rc)" test $rc = 2
check "... names the flag in one line" bash -c "[ \$(wc -l <'$TMP/bogus.log') = 1 ] && grep -q \"unknown flag '--bogus'\" '$TMP/bogus.log'"
"$L" local --workers 0 --out "$TMP/bogus" >"$TMP/bogus.log" 2>&1
check "--workers 0 refused" grep -qF -- "--workers '0': expected an integer in [1, 64]" "$TMP/bogus.log"

# The launcher leaves nothing behind.
leftovers() { pgrep -f "$1" >/dev/null && { echo "left behind:"; pgrep -af "$1"; return 1; }; return 0; }
check "no process left after successful runs" leftovers "$TMP/(sync|async|ssp)"

bg "$L" local --workers 2 --mode async --batch 32 --steps 100000 "${common[@]}" --out "$TMP/killed" >"$TMP/killed.log" 2>&1
lp=$!
for _ in $(seq 100); do [ -s "$TMP/killed/metrics/worker-1.jsonl" ] && break; sleep 0.1; done
pkill -KILL -f "task-index 1 .*$TMP/killed"
wait_for $lp 60
rc=$?
check "a failed worker fails the launcher (status $rc)" test $rc != 0
check "the launcher names the failed worker" grep -q "worker-1 killed by signal 9" "$TMP/killed.log"
check "no process left after a child failed" leftovers "$TMP/killed"

bg "$L" local --workers 2 --mode async --batch 32 --steps 100000 "${common[@]}" --out "$TMP/int" >"$TMP/int.log" 2>&1
lp=$!
for _ in $(seq 100); do [ -s "$TMP/int/metrics/worker-1.jsonl" ] && break; sleep 0.1; done
kill -INT $lp
wait_for $lp 60
rc=$?
check "SIGINT stops the launcher with status 130 (got $rc)" test $rc = 130
check "no process left after SIGINT" leftovers "$TMP/int"
finish
