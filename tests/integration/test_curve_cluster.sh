#!/usr/bin/env bash
# test_curve_cluster: who may talk to downpour-ps, with the real daemons on loopback.
#  - CURVE (keys from `downpour keygen`, named after their task): an allowed
#    worker trains; a worker with an unknown key, one given another
#    server's key and a plain worker get no reply (their timeout line names
#    which: the key not admitted, the server's key, CURVE), worker 1's key as --task-index 0 (before
#    the chief) is refused with one line naming whose id it is, and the
#    weights are unchanged (hash of the shard's checkpoint, written at every
#    version); the refusals are counted in the stop log; the chief ends the
#    run
#  - worker 1's key as the chief is refused at a restarted shard too, before
#    the chief joins and ends the run; an allow list that names no chief
#    stops the shard at start with one line
#  - `downpour local --secure` runs to completion on keys it makes
#  - the same --task-index twice and a second chief are refused, with one
#    clear line on both sides, while the first two train on
#  - binding beyond loopback without CURVE warns once; half the CURVE flags
#    is one clear error
#  - SIGHUP, an elastic crew: a key added to the allow list is admitted
#    without a restart; a key removed is refused from the next message of
#    its open connection (its worker stops with one line, the shard counts
#    it no more); an allow list that cannot be read keeps the old one
# (STATS / SHUTDOWN from anyone but the chief, which no daemon sends, are
# tests/unit/test_auth.c's.)
source "$(dirname "$0")/lib.sh"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip curve "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
scale=${DP_TEST_TIMEOUT_SCALE:-1}
L=$BIN/downpour PS=$BIN/downpour-ps WK=$BIN/downpour-worker
K=$TMP/keys
mkdir -p "$K/allow"
for k in srv worker-0 worker-1 evil; do "$L" keygen "$K/$k" >/dev/null; done
cp "$K/worker-0.pub" "$K/worker-1.pub" "$K/allow/"
wk=(--steps 6 --batch 16 --threads 1 --no-progress)

# start_ps NAME FLAGS...: a 2-worker async shard on a free port (or on
# $PS_BIND); sets PS_PID, EP.
start_ps() {
    local name=$1; shift
    bg "$PS" --bind "${PS_BIND:-tcp://127.0.0.1:*}" --ready-file "$TMP/$name.ready" --workers 2 --mode async \
        "$@" >"$TMP/$name.log" 2>&1
    PS_PID=$!
    for _ in $(seq $((100 * scale))); do [ -s "$TMP/$name.ready" ] && break; sleep 0.1; done
    EP=$(cat "$TMP/$name.ready" 2>/dev/null)
}
# wait_log FILE PATTERN: until FILE has PATTERN (bounded).
wait_log() { for _ in $(seq $((200 * scale))); do grep -q "$2" "$1" && return 0; sleep 0.1; done; return 1; }
ck_hash() { sha256sum "$TMP/ck/ps-shard-0-of-1.safetensors" | cut -d' ' -f1; }

# ---- CURVE -----------------------------------------------------------------
start_ps curve --curve-secret "$K/srv" --curve-allow "$K/allow" --checkpoint-dir "$TMP/ck" --checkpoint-every 1
check "CURVE server is up" test -n "$EP"
curve=(--curve-server "$K/srv.pub")
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" --curve-secret "$K/worker-1" "${curve[@]}" >"$TMP/w1.log" 2>&1
check "an allowed worker trains" test $? = 0
check "... and its 6 pushes are applied" grep -q "6 applied, 0 dropped, 0 rejected" "$TMP/w1.log"
before=$(ck_hash)
check "the shard wrote its checkpoint" test -n "$before"

NOT_ADMITTED="the server refused this worker's CURVE key: its public key is not in the server's --curve-allow"
refused_quietly() { # rc log [why]: the worker failed with its timeout line, naming why (default: not admitted)
    local rc=$1 log=$2
    [ "$rc" = 1 ] && grep -qF "no reply in 2 s (${3:-$NOT_ADMITTED}) from ps shard 0 at $EP" "$log" ||
        { echo "rc $rc"; tail -3 "$log"; return 1; }
}
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" --timeout 2 --curve-secret "$K/evil" "${curve[@]}" >"$TMP/evil.log" 2>&1
check "an unknown key gets no reply, and is told its key was not admitted" refused_quietly $? "$TMP/evil.log"
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" --timeout 2 --curve-secret "$K/worker-1" --curve-server "$K/evil.pub" \
    >"$TMP/wrongsrv.log" 2>&1
check "an allowed key given another server's key gets no reply, and is told which key to check" \
    refused_quietly $? "$TMP/wrongsrv.log" "the CURVE handshake failed: is --curve-server this server's public key?"
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" --timeout 2 >"$TMP/plain.log" 2>&1
check "a plain client gets no reply, and is told the server speaks CURVE" refused_quietly $? "$TMP/plain.log" \
    "the handshake failed: the server likely speaks CURVE; give --curve-secret and --curve-server"
not_chief() { # rc log: worker 1's key as the chief exits 1, its last line naming whose id 0 is
    [ "$1" = 1 ] && tail -1 "$2" | grep -q "worker id 0 is taken: it belongs to the CURVE key worker-0.pub in --curve-allow; this key is worker-1.pub's, so it may speak only as worker 1" ||
        { echo "rc $1"; tail -3 "$2"; return 1; }
}
"$WK" --ps "$EP" --task-index 0 "${wk[@]}" --curve-secret "$K/worker-1" "${curve[@]}" >"$TMP/fake0.log" 2>&1
check "worker 1's key as --task-index 0, before the chief: refused" not_chief $? "$TMP/fake0.log"
check "the weights are unchanged (checkpoint hash)" test "$before" = "$(ck_hash)"

"$WK" --ps "$EP" --task-index 0 "${wk[@]}" --curve-secret "$K/worker-0" "${curve[@]}" \
    --summary "$TMP/curve-summary.json" >"$TMP/w0.log" 2>&1
check "the chief (its own key) trains and ends the run" test $? = 0
wait_for "$PS_PID" $((10 * scale))
check "the server stopped on the chief's SHUTDOWN" test $? = 0
check "the summary counts 12 applied updates" test "$(json "$TMP/curve-summary.json" updates_applied)" = 12
check "the refusals are counted in the stop log" grep -qE "by CURVE [2-9]|by CURVE [1-9][0-9]" "$TMP/curve.log"

# ---- the chief's key, at a restarted shard ---------------------------------------
sec=(--curve-secret "$K/srv" --curve-allow "$K/allow" --heartbeat-timeout 1)
start_ps restart "${sec[@]}"
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" --curve-secret "$K/worker-1" "${curve[@]}" >"$TMP/w1b.log" 2>&1
check "worker 1 trains before the restart" test $? = 0
kill -TERM "$PS_PID"
wait_for "$PS_PID" $((10 * scale)) >/dev/null
PS_BIND=$EP start_ps restart2 "${sec[@]}"
check "the shard is back on its port" test -n "$EP"
"$WK" --ps "$EP" --task-index 0 "${wk[@]}" --curve-secret "$K/worker-1" "${curve[@]}" >"$TMP/fake0b.log" 2>&1
check "restarted shard: worker 1's key as --task-index 0 is refused" not_chief $? "$TMP/fake0b.log"
"$WK" --ps "$EP" --task-index 0 "${wk[@]}" --curve-secret "$K/worker-0" "${curve[@]}" >"$TMP/chief-b.log" 2>&1
check "... and the chief then trains and ends the run" test $? = 0
wait_for "$PS_PID" $((10 * scale))
check "... the restarted shard stopped on its SHUTDOWN" test $? = 0
mkdir -p "$K/unnamed" && cp "$K/worker-0.pub" "$K/unnamed/w0.pub" && cp "$K/worker-1.pub" "$K/unnamed/w1.pub"
timeout $((10 * scale)) "$PS" --bind 'tcp://127.0.0.1:*' --curve-secret "$K/srv" --curve-allow "$K/unnamed" >"$TMP/unnamed.log" 2>&1
check "an allow list naming no chief: status 1, one line" test $? = 1 -a "$(grep -c "no key is named for the chief" "$TMP/unnamed.log")" = 1

# ---- SIGHUP: the allow list read again, an elastic crew --------------------------
"$L" keygen "$K/worker-2" >/dev/null
mkdir -p "$K/hup" && cp "$K/worker-0.pub" "$K/worker-1.pub" "$K/hup/"
bg "$PS" --bind 'tcp://127.0.0.1:*' --ready-file "$TMP/hup.ready" --workers 1:3 --mode async \
    --curve-secret "$K/srv" --curve-allow "$K/hup" >"$TMP/hup.log" 2>&1
HUP_PID=$!
for _ in $(seq $((100 * scale))); do [ -s "$TMP/hup.ready" ] && break; sleep 0.1; done
EP=$(cat "$TMP/hup.ready")
long=(--steps 300 --batch 16 --threads 1 --no-progress --delay-ms 20)
bg "$WK" --ps "$EP" --task-index 0 "${long[@]}" --curve-secret "$K/worker-0" "${curve[@]}" >"$TMP/hup-w0.log" 2>&1
H0=$!
wait_log "$TMP/hup.log" "worker 0 joined"
"$WK" --ps "$EP" --task-index 2 "${long[@]}" --timeout 2 --curve-secret "$K/worker-2" "${curve[@]}" \
    >"$TMP/hup-w2a.log" 2>&1
check "SIGHUP: a key not in the allow list yet gets no reply" refused_quietly $? "$TMP/hup-w2a.log"
cp "$K/worker-2.pub" "$K/hup/"
kill -HUP "$HUP_PID"
wait_log "$TMP/hup.log" "allow list read again: 3 keys"
check "SIGHUP: the shard read the allow list again (3 keys), still running" kill -0 "$HUP_PID"
bg "$WK" --ps "$EP" --task-index 2 "${long[@]}" --curve-secret "$K/worker-2" "${curve[@]}" \
    --metrics "$TMP/hup-w2.jsonl" >"$TMP/hup-w2.log" 2>&1
H2=$!
for _ in $(seq $((300 * scale))); do grep -q '"step":3,' "$TMP/hup-w2.jsonl" 2>/dev/null && break; sleep 0.1; done
check "SIGHUP: the key added is admitted without a restart, its worker trains" \
    bash -c "grep -q 'worker 2 joined' '$TMP/hup.log' && grep -q '\"step\":3,' '$TMP/hup-w2.jsonl'"
rm "$K/hup/worker-2.pub"
kill -HUP "$HUP_PID"
wait_for "$H2" $((30 * scale)); rc=$?
check "SIGHUP: the key removed is refused from its next message, its worker stops with one line" \
    bash -c "[ $rc = 1 ] && grep -q \"worker 2's key is no longer allowed\" '$TMP/hup.log' &&
             grep -q 'no longer in the allow list' '$TMP/hup-w2.log'"
echo "not a key" >"$K/hup/broken.pub"
kill -HUP "$HUP_PID"
wait_log "$TMP/hup.log" "SIGHUP: the allow list stays as it was"
check "SIGHUP: an unreadable allow list keeps the old one (one line)" \
    test "$(grep -c 'the allow list stays as it was' "$TMP/hup.log")" = 1
bg "$WK" --ps "$EP" --task-index 1 "${long[@]}" --curve-secret "$K/worker-1" "${curve[@]}" \
    --metrics "$TMP/hup-w1.jsonl" >"$TMP/hup-w1.log" 2>&1
H1=$!
for _ in $(seq $((300 * scale))); do grep -q '"step":3,' "$TMP/hup-w1.jsonl" 2>/dev/null && break; sleep 0.1; done
check "... worker 1's key, in the old list, is still admitted and trains" grep -q '"step":3,' "$TMP/hup-w1.jsonl"
"$WK" --ps "$EP" --task-index 2 "${long[@]}" --timeout 2 --curve-secret "$K/worker-2" "${curve[@]}" \
    >"$TMP/hup-w2b.log" 2>&1
check "... worker 2's removed key still gets no reply" refused_quietly $? "$TMP/hup-w2b.log"
wait_for "$H1" $((120 * scale)); rc1=$?
wait_for "$H0" $((120 * scale)); rc=$?
wait_for "$HUP_PID" $((10 * scale)); ps_rc=$?
check "SIGHUP: the chief and worker 1 trained through every reload and ended the run" \
    test "$rc $rc1 $ps_rc" = "0 0 0"

# ---- downpour local --secure -------------------------------------------------
"$L" local --secure --workers 2 "${wk[@]}" --out "$TMP/sec" >"$TMP/sec.log" 2>&1
check "downpour local --secure runs to completion" test $? = 0
check "... with a key per shard and worker" test -s "$TMP/sec/keys/servers/ps-0.pub" -a -s "$TMP/sec/keys/workers/worker-1.pub"
check "... and the shard on CURVE" grep -q "CURVE: public key" "$TMP/sec/logs/ps-0.log"

# ---- ids: the same index twice, a second chief --------------------------------
start_ps plain
slow=(--steps 30 --batch 16 --threads 1 --no-progress --delay-ms 100)
bg "$WK" --ps "$EP" --task-index 1 "${slow[@]}" >"$TMP/a1.log" 2>&1
A1=$!
bg "$WK" --ps "$EP" --task-index 0 "${slow[@]}" >"$TMP/a0.log" 2>&1
A0=$!
wait_log "$TMP/plain.log" "worker 0 joined" && wait_log "$TMP/plain.log" "worker 1 joined"
check "two workers joined" test $? = 0
taken() { # rc log id: the claimant exits 1 with one line naming the id and the cause
    [ "$1" = 1 ] && tail -1 "$2" | grep -q "worker id $3 is taken: another live connection said HELLO as worker $3 (two workers started without --task-index, or the same --task-index twice?)" ||
        { echo "rc $1"; tail -3 "$2"; return 1; }
}
"$WK" --ps "$EP" --task-index 1 "${wk[@]}" >"$TMP/dup.log" 2>&1
check "the same --task-index twice is refused" taken $? "$TMP/dup.log" 1
"$WK" --ps "$EP" "${wk[@]}" >"$TMP/chief2.log" 2>&1
check "a second chief (no --task-index) is refused" taken $? "$TMP/chief2.log" 0
check "the server logs both refusals" test "$(grep -c "HELLO refused: worker id [01] is taken" "$TMP/plain.log")" = 2
wait_for "$A1" $((60 * scale))
check "the first worker 1 finishes" test $? = 0
wait_for "$A0" $((60 * scale))
check "the first chief finishes" test $? = 0
wait_for "$PS_PID" $((10 * scale))
check "the server stopped on the chief's SHUTDOWN" test $? = 0
check "no CURVE warning on loopback" test "$(grep -c "without CURVE" "$TMP/plain.log")" = 0

# ---- flags -------------------------------------------------------------------------
bg "$PS" --bind 'tcp://0.0.0.0:*' --ready-file "$TMP/open.ready" >"$TMP/open.log" 2>&1
OPEN=$!
for _ in $(seq $((100 * scale))); do [ -s "$TMP/open.ready" ] && break; sleep 0.1; done
check "all interfaces without CURVE: one warning line" test "$(grep -c "without CURVE: anyone who reaches this port can join, push and read the weights (see --curve-secret)" "$TMP/open.log")" = 1
kill -TERM "$OPEN"
wait_for "$OPEN" $((10 * scale)) >/dev/null
"$PS" --curve-secret "$K/srv" >"$TMP/half.log" 2>&1
check "downpour-ps: --curve-secret alone is one clear error" test $? = 2 -a "$(grep -c "go together" "$TMP/half.log")" = 1
"$WK" --ps "$EP" --curve-server "$K/srv.pub" >"$TMP/half.log" 2>&1
check "downpour-worker: --curve-server alone is one clear error" test $? = 2 -a "$(grep -c "go together" "$TMP/half.log")" = 1
finish
