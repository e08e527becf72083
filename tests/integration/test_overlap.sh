#!/usr/bin/env bash
# test_overlap: the worker that pulls and pushes on a thread of its own while
# it computes (--overlap, worker/client/pipeline.h), through the real binaries.
#  - async, 1 worker, --overlap on (off by default for a CPU worker): every
#    step but the first computes on
#    the weights without its previous gradient (metrics "version" = step - 1),
#    so every push but the first is exactly 1 version stale, none more; every
#    push applied; accuracy close to the same run in turn (--overlap off,
#    staleness 0)
#  - sync ignores it: --overlap on gives the very weights of --overlap off
#  - ssp: off by default, on when asked, and then trains
#  - SIGTERM mid-run: the worker (and its communication thread) stops with
#    status 143 within seconds
# dp-test: unsanitized
# (Under SANITIZE=1 it would add 5 minutes of training to CI for no new
# code: the communication thread itself runs under ASan in test_pipeline.)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip overlap "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
L=$BIN/downpour
S=${DP_TEST_TIMEOUT_SCALE:-1}
common=(--seed 5 --batch 64 --threads 1 --no-progress)

# ---- async, 1 worker: on against off (the default for a CPU worker) -------
"$L" local --workers 1 --mode async --overlap on --steps 150 "${common[@]}" --out "$TMP/on" >"$TMP/on.log" 2>&1
check "async, 1 worker, --overlap on" test $? = 0
check "... the worker says overlap on" grep -q "overlap on: pulls and pushes on a thread" "$TMP/on/logs/worker-0.log"
"$L" local --workers 1 --mode async --steps 150 "${common[@]}" --out "$TMP/off" >"$TMP/off.log" 2>&1
check "async, 1 CPU worker: overlap off by default" test $? = 0
check "... the worker says overlap off" grep -q "overlap off: pull, compute, push in turn" "$TMP/off/logs/worker-0.log"

# pushes FILE: "N STALE1 MAXSTALE VERSION_OK" from the worker's push lines:
# how many, how many 1 stale, the largest staleness, whether every step
# computed on the version its mode promises (on: step - 1, off: step).
pushes() {
    "$TORCH_PY" - "$1" "$2" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"status"' in l]
behind = 1 if sys.argv[2] == "on" else 0
ok = all(l["version"] == max(0, l["step"] - behind) for l in lines)
ok = ok and all(l["status"] == "applied" for l in lines)
print(len(lines), sum(l["staleness_max"] == 1 for l in lines), max(l["staleness_max"] for l in lines), int(ok))
EOF
}
read -r n1 s1 m1 ok1 < <(pushes "$TMP/on/metrics/worker-0.jsonl" on)
read -r n0 s0 m0 ok0 < <(pushes "$TMP/off/metrics/worker-0.jsonl" off)
check "on: 150 pushes, all applied, step k computed on version k - 1 (got $n1 pushes, ok=$ok1)" test "$n1/$ok1" = 150/1
check "on: every push but the first is 1 stale ($s1 of $n1), none more (max $m1)" test "$s1/$m1" = 149/1
check "off: every push fresh (max $m0), step k on version k (ok=$ok0)" test "$m0/$ok0" = 0/1
smax=$(json "$TMP/on/summary.json" staleness_max 2>/dev/null || echo 99)
check "on: the servers count staleness max 1 (got $smax)" test "$smax" = 1
a1=$(json "$TMP/on/summary.json" test_accuracy 2>/dev/null || echo 0)
a0=$(json "$TMP/off/summary.json" test_accuracy 2>/dev/null || echo 0)
check "on trains: test accuracy $a1 >= 0.70" ge "$a1" 0.70
check "on: accuracy $a1 within 8 points of off's $a0" near "$a1" "$a0" 0.08

# ---- sync ignores it --------------------------------------------------------
sync=(--workers 2 --mode sync --steps 8 --batch 32 --seed 5 --no-progress)
"$L" local "${sync[@]}" --overlap on --out "$TMP/sync-on" >"$TMP/sync-on.log" 2>&1
check "sync with --overlap on runs" test $? = 0
"$L" local "${sync[@]}" --overlap off --out "$TMP/sync-off" >"$TMP/sync-off.log" 2>&1
check "sync with --overlap off runs" test $? = 0
check "sync: --overlap on is ignored, and says so" grep -q "ignored in sync mode" "$TMP/sync-on/logs/worker-0.log"
check "sync: the same weights either way, bit for bit" cmp -s "$TMP/sync-on/model.safetensors" "$TMP/sync-off/model.safetensors"

# ---- ssp: off unless asked ----------------------------------------------------
ssp=(--workers 2 --mode ssp --staleness 1 --steps 20 --batch 32 --seed 5 --no-progress)
"$L" local "${ssp[@]}" --out "$TMP/ssp" >"$TMP/ssp.log" 2>&1
check "ssp runs" test $? = 0
check "ssp: overlap off by default" grep -q "overlap off" "$TMP/ssp/logs/worker-1.log"
"$L" local "${ssp[@]}" --overlap on --out "$TMP/ssp-on" >"$TMP/ssp-on.log" 2>&1
check "ssp --overlap on runs" test $? = 0
check "ssp --overlap on: overlapped" grep -q "overlap on" "$TMP/ssp-on/logs/worker-1.log"
applied=$(json "$TMP/ssp-on/summary.json" updates_applied 2>/dev/null || echo 0)
check "ssp --overlap on: all 40 pushes applied (got $applied)" test "$applied" = 40

# ---- a signal mid-run ---------------------------------------------------------
rm -f "$TMP/ps.ready"
bg "$BIN/downpour-ps" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/ps.ready" --workers 1 --mode async \
    >"$TMP/ps.log" 2>&1
for _ in $(seq $(( 100 * S ))); do [ -s "$TMP/ps.ready" ] && break; sleep 0.1; done
bg "$BIN/downpour-worker" --ps "$(cat "$TMP/ps.ready")" --task-index 0 --overlap on --steps 1000000 --batch 16 \
    --threads 1 --no-progress --metrics "$TMP/sig.jsonl" >"$TMP/sig.log" 2>&1
wp=$!
for _ in $(seq $(( 600 * S ))); do grep -q '"status"' "$TMP/sig.jsonl" 2>/dev/null && break; sleep 0.1; done
check "the signalled worker was pushing, overlapped" grep -q "overlap on" "$TMP/sig.log"
kill -TERM "$wp"
wait_for "$wp" $(( 10 * S )); rc=$?
check "SIGTERM stops the overlapped worker with status 143 (got $rc)" test "$rc" = 143
check "... and it says it was stopped" grep -q "stopped by signal 15" "$TMP/sig.log"
finish
