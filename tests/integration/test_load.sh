#!/usr/bin/env bash
# test_load: 32 worker processes against one async shard for about 30 s,
# on a tiny model and a tiny generated dataset (cheap enough for 2 cores):
#  - no deadlock: every worker exits 0 within its deadline, and so does the
#    shard (the chief's SHUTDOWN)
#  - every push is accounted for: pushes sent (the workers' metrics lines)
#    = applied + dropped + rejected (the servers' counters in summary.json)
#  - the shard's memory is flat: VmRSS at the end is within 10 % of VmRSS at
#    10 s (everyone connected by then)
# The run's length comes from --delay-ms (each push waits 50 ms), not from
# the machine's speed; only the deadlines scale with DP_TEST_TIMEOUT_SCALE.
source "$(dirname "$0")/lib.sh"

S=${DP_TEST_TIMEOUT_SCALE:-1}
N=32
STEPS=550          # x 50 ms of --delay-ms: about 30 s
W=$BIN/downpour-worker
PS=$BIN/downpour-ps

# A dataset of 4x4 images in the IDX format (the Fashion-MNIST reader's).
data=$TMP/data
mkdir -p "$data"
"$TORCH_PY" - "$data" <<'EOF'
import struct, sys, random
random.seed(1)
def write(prefix, n):
    labels = [random.randrange(10) for _ in range(n)]
    with open(f"{sys.argv[1]}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 4, 4))
        for y in labels:  # the label shows in one pixel: learnable
            px = [random.randrange(64) for _ in range(16)]
            px[y] = 255
            f.write(bytes(px))
    with open(f"{sys.argv[1]}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n))
        f.write(bytes(labels))
write("train", 4096)
write("t10k", 256)
EOF
check "tiny IDX dataset generated" test -s "$data/train-images-idx3-ubyte"

# RSS of a process in kB.
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

# ASan keeps freed memory in a quarantine (256 MB by default): not a leak,
# but it would read as growth. A 1 MB quarantine still catches use-after-free.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=1"

bg "$PS" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/ready" --workers $N --mode async \
    --model "fc:10 softmax" --input 1x4x4 --lr 0.01 --metrics "$TMP/ps.jsonl" 2>"$TMP/ps.log"
ps_pid=$!
for _ in $(seq $(( 100 * S ))); do [ -s "$TMP/ready" ] && break; sleep 0.1; done
ep=$(cat "$TMP/ready")
check "the shard is listening" test -n "$ep"

t0=$SECONDS
pids=()
for i in $(seq 0 $((N - 1))); do
    extra=()
    [ "$i" = 0 ] && extra=(--summary "$TMP/summary.json")
    bg "$W" --ps "$ep" --task-index "$i" --data "fashion-mnist:$data" --model "fc:10 softmax" \
        --batch 8 --threads 1 --steps $STEPS --delay-ms 50 --lr 0.01 --no-progress \
        --metrics "$TMP/w$i.jsonl" "${extra[@]}" >"$TMP/w$i.log" 2>&1
    pids+=($!)
done

# VmRSS at 10 s, then the last sample while the shard still runs.
sleep 10
rss10=$(rss "$ps_pid")
rss_end=$rss10
while kill -0 "$ps_pid" 2>/dev/null && [ $((SECONDS - t0)) -lt $(( 120 * S )) ]; do
    r=$(rss "$ps_pid"); [ -n "$r" ] && rss_end=$r
    sleep 1
done

bad=0
for i in "${!pids[@]}"; do
    wait_for "${pids[$i]}" $(( 30 * S )); rc=$?
    [ $rc = 0 ] || { bad=$((bad + 1)); echo "worker $i: status $rc: $(tail -1 "$TMP/w$i.log")"; }
done
elapsed=$((SECONDS - t0))
check "all $N workers exit 0 in time (failed: $bad; ${elapsed} s)" test $bad = 0
wait_for "$ps_pid" $(( 15 * S )); rc=$?
check "the shard stops on the chief's SHUTDOWN (status $rc)" test $rc = 0
check "the run lasted about 30 s (${elapsed} s)" test "$elapsed" -ge 25

sent=$(cat "$TMP"/w*.jsonl | grep -c '"status"')
a=$(json "$TMP/summary.json" updates_applied 2>/dev/null || echo -1)
d=$(json "$TMP/summary.json" updates_dropped 2>/dev/null || echo -1)
r=$(json "$TMP/summary.json" updates_rejected 2>/dev/null || echo -1)
check "pushes sent $sent = $N x $STEPS" test "$sent" = $((N * STEPS))
check "pushes sent $sent = applied $a + dropped $d + rejected $r" test "$sent" = $((a + d + r))

echo "shard VmRSS: ${rss10:-?} kB at 10 s, ${rss_end:-?} kB at the end"
check "the shard's memory is flat (${rss10:-?} -> ${rss_end:-?} kB, bound +10 %)" \
    test "$(( ${rss_end:-0} * 100 ))" -le "$(( ${rss10:-0} * 110 ))" -a "${rss10:-0}" -gt 0

finish
