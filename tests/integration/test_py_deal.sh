#!/usr/bin/env bash
# test_py_deal: PyTorch workers (tests/integration/py_deal.py) train the
# batches shard 0 of an elastic crew (--workers 1:3) deals them, through
# downpour.torch.Worker.sampler over a TensorDataset of 640 samples in
# batches of 32, each logging the indices it pushed:
# - a crew of 1 -> 3 -> 1 (workers 1 and 2 join while the chief waits at its
#   3rd push, push 2 batches each, and leave on SIGTERM): every index of the
#   epoch trained exactly once, by all three workers;
# - a worker SIGKILLed with its 2nd batch in flight: shard 0 puts the batch
#   back when its heartbeats stop (counted as trained once by it), and the
#   chief trains it; every index again exactly once among the pushes;
# - the chief's Client.stats()["epoch_samples"]: 640 trained, and the dead
#   worker's batch counted as repeated and retrained;
# - a worker whose dataset has 600 samples: refused with shard 0's one line
#   (exit 2), the run unharmed.
# Holds and gates are files (py_deal.py --gate, --hold), not sleeps; the
# leases' floor is raised so that only the death returns the held batch.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

use_py_package 16 py_deal
W=tests/integration/py_deal.py
INIT=$TMP/lin.safetensors
check "save_init of the linear model" "$TORCH_PY" "$W" --write-init "$INIT"

# start_ps DIR: an elastic crew's servers in DIR; sets EP and PS.
start_ps() {
    DP_TEST_LEASE_FLOOR=600 bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$1/ready" \
        --init "$INIT" --workers 1:3 --mode async --heartbeat-timeout 2 >"$1/ps.log" 2>&1
    PS=$!
    wait_until test -s "$1/ready"
    EP=$(cat "$1/ready")
}
lines() { [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ]; }
# every_once DIR: the indices of DIR's logs are 0..639, each once.
every_once() {
    cut -d' ' -f2 "$1"/w*.log | tr ',' '\n' | sort -n >"$1/all"
    seq 0 639 | cmp -s - "$1/all"
}

D=$TMP/crew; mkdir -p "$D"
start_ps "$D"
bg "$TORCH_PY" "$W" --ps "$EP" --task 0 --log "$D/w0.log" --gate 3 "$D/go" --stats "$D/stats.json" \
    2>"$D/w0.err"; w0=$!
wait_until lines "$D/w0.log" 3
bg "$TORCH_PY" "$W" --ps "$EP" --task 1 --log "$D/w1.log" --gate 2 "$D/go" 2>"$D/w1.err"; w1=$!
bg "$TORCH_PY" "$W" --ps "$EP" --task 2 --log "$D/w2.log" --gate 2 "$D/go" 2>"$D/w2.err"; w2=$!
wait_until lines "$D/w1.log" 2
wait_until lines "$D/w2.log" 2
kill -TERM $w1 $w2
wait_for $w1 60; r1=$?
wait_for $w2 60; r2=$?
check "crew: workers 1 and 2 leave on SIGTERM (exit $r1 $r2)" test "$r1$r2" = 00
touch "$D/go"
wait_for $w0 120; r0=$?
wait_for $PS 30 >/dev/null
check "crew: the chief trains the rest and ends the run (exit $r0)" test $r0 = 0 || tail -3 "$D/w0.err"
check "crew: every index of the epoch trained exactly once" every_once "$D"
check "crew: all three workers trained batches ($(cat "$D"/w*.log | wc -l) in all)" \
    test "$(wc -l <"$D/w1.log")" = 2 -a "$(wc -l <"$D/w2.log")" = 2 -a "$(cat "$D"/w*.log | wc -l)" = 20
check "crew: shard 0 logged both leaves" test "$(grep -c 'left before its last step' "$D/ps.log")" -ge 2
check "crew: no push of an undealt batch" bash -c "! grep -q 'dealt no batch' '$D/ps.log'"
# epoch_stats FILE: Client.stats()'s epochs as "epoch trained repeated retrained batches" lines
epoch_stats() { "$TORCH_PY" -c 'import json,sys
for e in json.load(open(sys.argv[1])): print(e["epoch"], e["trained"], e["repeated"], e["retrained_after_death"], e["batches"])' "$1" 2>&1; }
s=$(epoch_stats "$D/stats.json" | head -1)
check "crew: the chief's Client.stats() has the epoch's 640 samples trained once, 20 batches ($s)" \
    test "$s" = "0 640 0 0 20"

D=$TMP/kill; mkdir -p "$D"
start_ps "$D"
bg "$TORCH_PY" "$W" --ps "$EP" --task 0 --log "$D/w0.log" --gate 1 "$D/held" --stats "$D/stats.json" \
    2>"$D/w0.err"; w0=$!
bg "$TORCH_PY" "$W" --ps "$EP" --task 1 --log "$D/w1.log" --hold 2 "$D/held" 2>"$D/w1.err"; w1=$!
wait_until test -s "$D/held"
kill -KILL $w1 2>/dev/null
wait_for $w1 30 >/dev/null 2>&1
wait_for $w0 120; r0=$?
wait_for $PS 30 >/dev/null
check "kill: the chief ends the run (exit $r0)" test $r0 = 0 || tail -3 "$D/w0.err"
held=$(cat "$D/held")
check "kill: the killed worker's batch in flight trained by the chief" grep -q " $held\$" "$D/w0.log"
check "kill: every index of the epoch trained exactly once" every_once "$D"
check "kill: shard 0 put the dead worker's batch back, counted" \
    grep -q "worker 1 gone with 1 batch in flight: back to the pool (counted as trained once" "$D/ps.log"
s=$(epoch_stats "$D/stats.json" | head -1)
check "kill: Client.stats() counts the dead worker's batch as repeated and retrained ($s)" test "$s" = "0 640 32 32 20"

D=$TMP/size; mkdir -p "$D"
start_ps "$D"
bg "$TORCH_PY" "$W" --ps "$EP" --task 0 --log "$D/w0.log" --gate 1 "$D/go" 2>"$D/w0.err"; w0=$!
wait_until lines "$D/w0.log" 1
"$TORCH_PY" "$W" --ps "$EP" --task 1 --size 600 --log "$D/w1.log" 2>"$D/w1.err"; r1=$?
check "size: a worker of 600 samples refused (exit $r1)" test $r1 = 2
check "size: in one line naming both sizes: $(grep py_deal "$D/w1.err")" \
    test "$(grep -c 'py_deal: .*from 640 samples.* from 600' "$D/w1.err")" = 1
touch "$D/go"
wait_for $w0 120; r0=$?
check "size: the chief ends the run unharmed (exit $r0)" test $r0 = 0
finish
