#!/usr/bin/env bash
# test_load: 32 worker processes against one async shard for about 30 s,
# on a tiny model and a tiny generated dataset (cheap enough for 2 cores):
#  - no deadlock: every worker exits 0 within its deadline, and so does the
#    shard (the chief's SHUTDOWN)
#  - every push is accounted for: pushes sent (the workers' metrics lines)
#    = applied + dropped + rejected (the servers' counters in summary.json)
#  - the shard's memory is flat. The model: once every worker has pushed
#    WARM times, nothing in the shard grows with the number of pushes (its
#    buffers are sized by the model and the peers, ZeroMQ's queues by
#    RCVHWM); what may still move is allocator and page noise, allowed
#    SLACK_KB. Warm-up is that long because ZeroMQ's per-connection buffers
#    (64 connections: each worker's request and heartbeat sockets) are
#    touched page by page as bursts arrive: measured on 2 cores, VmRSS rose
#    ~1.3 MB over the first ~200 pushes per worker (sampled after 175
#    pushes, 232-316 kB of it was still to come; after 200, 84-148 kB).
#    VmRSS is sampled once the workers' metrics show the warm-up (a state,
#    not a sleep), then until the shard stops; the pushes P applied in
#    between come from the shard's metrics lines (timestamped). A leak of
#    one 64-byte allocation per push (80 bytes with malloc's header) adds
#    P x 80 bytes (~10,700 pushes: ~840 kB): the test requires that to be at
#    least 2.5 x SLACK_KB (the run is long enough to see it), then the
#    growth to stay under SLACK_KB. (Tried: a malloc(64) per push in
#    s_on_push grew it 896 and 920 kB for a model of 836.)
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
WARM=200           # pushes per worker before the first sample (see the model above)
SLACK_KB=300       # allocator and page noise allowed after warm-up
LEAK_B=80          # one 64-byte malloc per push, with its 16-byte header

# ASan keeps freed memory in a quarantine (256 MB by default): not a leak,
# but it would read as growth. A 1 MB quarantine still catches use-after-free.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=1"

bg "$PS" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/ready" --workers $N --mode async \
    --model "fc:10 softmax" --input 1x4x4 --lr 0.01 --metrics "$TMP/ps.jsonl" --metrics-every 0.2 \
    2>"$TMP/ps.log"
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

# warmed_up: every worker has pushed WARM times (its metrics lines, flushed
# each second: they lag, so the warm-up is if anything longer).
warmed_up() {
    [ "$(cat "$TMP"/w*.jsonl 2>/dev/null | grep -c '"status"')" -ge $((N * WARM)) ] || return 1
    awk -v n=$N -v w=$WARM '/"status"/ { c[FILENAME]++ } END { k = 0; for (f in c) if (c[f] >= w) k++; exit !(k == n) }' "$TMP"/w*.jsonl
}
until warmed_up || ! kill -0 "$ps_pid" 2>/dev/null || [ $((SECONDS - t0)) -ge $(( 60 * S )) ]; do sleep 0.1; done
t_warm=$(date +%s.%N)
rss_warm=$(rss "$ps_pid")
check "warm-up: each of the $N workers pushed $WARM times" warmed_up
# The last sample while the shard still runs, and when it was taken.
rss_end=$rss_warm t_end=$t_warm
while kill -0 "$ps_pid" 2>/dev/null && [ $((SECONDS - t0)) -lt $(( 120 * S )) ]; do
    r=$(rss "$ps_pid"); [ -n "$r" ] && rss_end=$r t_end=$(date +%s.%N)
    sleep 0.2
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

# P: the pushes the shard applied between the two samples (its metrics
# lines, complete now, each with its wall time "t").
applied_at() { "$TORCH_PY" -c '
import json, sys
a = 0
for l in open(sys.argv[1]):
    o = json.loads(l)
    if "applied" in o and o["t"] <= float(sys.argv[2]):
        a = o["applied"]
print(a)' "$TMP/ps.jsonl" "$1"; }
P=$(( $(applied_at "$t_end") - $(applied_at "$t_warm") ))
leak_kb=$(( P * LEAK_B / 1024 ))
grow=$(( ${rss_end:-0} - ${rss_warm:-0} ))
echo "shard VmRSS: ${rss_warm:-?} kB after warm-up, ${rss_end:-?} kB at the end ($grow kB), $P pushes in between"
check "the run can see a leak: $P pushes x $LEAK_B B = $leak_kb kB >= 2.5 x the $SLACK_KB kB slack" \
    test "$leak_kb" -ge $((5 * SLACK_KB / 2))
# Under SANITIZE=1 VmRSS is no model of the heap: ASan's allocator keeps
# freed blocks in its quarantine and per-thread caches (measured: +496 kB
# here with no leak). There LeakSanitizer reports, at the shard's exit, any
# allocation it lost, which fails the SHUTDOWN check above (seen with a
# malloc(64) per push: "LeakSanitizer: detected memory leaks", status 1);
# the plain build holds the RSS model, which also sees memory still held.
if [ "${DP_SANITIZED:-0}" = 1 ]; then
    skip_checks 1 "the shard's memory is flat" "VmRSS under ASan counts its quarantine; LeakSanitizer checks the shard's exit instead"
else
    check "the shard's memory is flat after warm-up (${rss_warm:-?} -> ${rss_end:-?} kB: $grow kB, slack $SLACK_KB kB; one 64 B leak per push: +$leak_kb kB)" \
        test "${rss_warm:-0}" -gt 0 -a "$grow" -le $SLACK_KB
fi

finish
