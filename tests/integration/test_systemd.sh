#!/usr/bin/env bash
# test_systemd: deploy/systemd's units as `make install` installs them.
#  - `systemd-analyze verify` passes both units (Debian's systemd package
#    runs it without systemd as PID 1) and fails a broken copy;
#  - each unit's ExecStart, expanded as systemd does (specifiers, Environment=,
#    EnvironmentFile= /etc/downpour/cluster.env -- cluster.env.example with
#    only the host lists changed to loopback -- and worker-N.env;
#    tests/integration/systemd_exec.py), starts daemons that serve: ps@0 and
#    worker@0..2 train, the chief's summary and model land in the state
#    directory, the metrics in the logs directory, all exit 0;
#  - CURVE by the drop-ins (curve-*.conf.example): verify passes the
#    instances with them; the secret keys reach the daemons as systemd
#    credentials (LoadCredential=, %d), and ps@0 serves worker@0..2 on CURVE;
#  - elastic (DOWNPOUR_PS_ARGS=--workers 1:4, 4 worker hosts): worker@2 and
#    @3 started while ps@0, worker@0 and @1 train join; @3, @2 and @1
#    stopped, each leaves
#    after a whole step with exit 0 (no restart); the epoch's samples are
#    trained once and summary.json's membership says who came and went;
#  - a ps stopped by SIGTERM exits with a status SuccessExitStatus= lists,
#    after its checkpoint; a bad cluster.env is exit status 2, which
#    RestartPreventExitStatus= keeps from restarting.
# The daemons run as this user here, not as the units' DynamicUser.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

if ! command -v systemd-analyze >/dev/null || ! command -v help2man >/dev/null; then
    skip systemd "Debian's systemd or help2man is not installed (make deps-test)"
    finish; exit
fi
scale=${DP_TEST_TIMEOUT_SCALE:-1}
EXEC=$PWD/tests/integration/systemd_exec.py
# The same build as the tests': CPU-only unless it made the CUDA module.
cuda=CUDA=0
[ -e "$BUILD/lib/downpour-cuda.so" ] && cuda=

# ---- make install and systemd-analyze verify -----------------------------------
P=$TMP/prefix
make --no-print-directory BUILD="$BUILD" $cuda install PREFIX="$P" >"$TMP/install.log" 2>&1
check "make install PREFIX=..." test $? = 0
U=$P/lib/systemd/system
check "the units point at the installed binaries" grep -q "^ExecStart=$P/bin/downpour-ps " "$U/downpour-ps@.service"
(cd "$TMP" && systemd-analyze verify "$U/downpour-ps@.service" "$U/downpour-worker@.service") >"$TMP/verify.log" 2>&1
rc=$?
check "systemd-analyze verify: both units pass, nothing to say" test $rc = 0 -a ! -s "$TMP/verify.log"
cat "$TMP/verify.log"
mkdir -p "$TMP/broken"
sed -e 's/^Restart=on-failure/Restart=sometimes/' -e "s|$P/bin/downpour-ps|$P/bin/downpour-pss|" \
    "$U/downpour-ps@.service" >"$TMP/broken/downpour-ps@.service"
(cd "$TMP" && systemd-analyze verify "$TMP/broken/downpour-ps@.service") >"$TMP/broken.log" 2>&1
check "systemd-analyze verify: a broken copy fails" test $? != 0
check "... naming what is wrong" grep -q "downpour-pss is not executable" "$TMP/broken.log"

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip daemons "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi

# ---- the units' command lines, from cluster.env.example ---------------------------
port=$("$TORCH_PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
ETC=$TMP/etc
mkdir -p "$ETC/downpour"
# What a user edits: the host lists (and, for a short run, the extra flags).
sed -e "s|^DOWNPOUR_PS_HOSTS=.*|DOWNPOUR_PS_HOSTS=127.0.0.1:$port|" \
    -e "s|^DOWNPOUR_WORKER_HOSTS=.*|DOWNPOUR_WORKER_HOSTS=127.0.0.1:$((port + 1)),127.0.0.2:$((port + 1)),127.0.0.2:$((port + 2))|" \
    -e "s|^DOWNPOUR_BATCH=.*|DOWNPOUR_BATCH=32|" \
    -e "s|^# DOWNPOUR_WORKER_ARGS=.*|DOWNPOUR_WORKER_ARGS=--steps 4 --threads 1|" \
    deploy/systemd/cluster.env.example >"$ETC/downpour/cluster.env"
check "cluster.env: only the lines meant to change changed" \
    test "$(diff deploy/systemd/cluster.env.example "$ETC/downpour/cluster.env" | grep -c '^>')" = 4
echo "DOWNPOUR_DEVICE=cpu" >"$ETC/downpour/worker-2.env"
ST=$TMP/state LG=$TMP/logs
unit() { # NAME INSTANCE: the unit's command, started in the background; its log NAME-INSTANCE.log
    bg "$TORCH_PY" "$EXEC" "$U/$1@.service" "$2" --state "$ST" --logs "$LG" --etc "$ETC" \
        --creds "$TMP/creds/$1-$2" >"$TMP/$1-$2.log" 2>&1
}
unit downpour-ps 0; ps_pid=$!
for _ in $(seq $((100 * scale))); do grep -q "shard 0/1 on" "$TMP/downpour-ps-0.log" && break; sleep 0.1; done
check "ps@0 starts as ps task 0 of its cluster.env" grep -q "cluster: ps task 0 (127.0.0.1:$port); 1 ps, 3 workers" "$TMP/downpour-ps-0.log"
check "... with \$DOWNPOUR_PS_ARGS (empty) as no argument" grep -q "\[--metrics\] \[$LG/downpour/ps-0.jsonl\]$" "$TMP/downpour-ps-0.log"
pids=()
for i in 0 1 2; do unit downpour-worker $i; pids+=($!); done
served() { # PID...: worker@0's, worker@1's, ... and then ps@0 exit 0
    local i=0 pid rc ok=0
    for pid in "$@"; do
        wait_for "$pid" $((120 * scale)); rc=$?
        [ $rc = 0 ] || { echo "worker@$i: exit $rc"; tail -3 "$TMP/downpour-worker-$i.log"; ok=1; }
        i=$((i + 1))
    done
    wait_for "$ps_pid" $((30 * scale)); rc=$?
    [ $rc = 0 ] || { echo "ps@0: exit $rc"; tail -3 "$TMP/downpour-ps-0.log"; ok=1; }
    return $ok
}
check "ps@0 serves worker@0..2; all exit 0" served "${pids[@]}"
check "worker@2 is worker task 2, on its worker-2.env device" \
    grep -q "worker 2/3: async mode, 1 shard(s), batch 32, 4 steps on cpu" "$TMP/downpour-worker-2.log"
check "\$DOWNPOUR_WORKER_ARGS split into words" grep -q "\[--steps\] \[4\] \[--threads\] \[1\]" "$TMP/downpour-worker-1.log"
check "the chief's summary in its state directory counts 3 x 4 pushes" \
    test "$(json "$ST/downpour/worker-0/summary.json" updates_applied 2>/dev/null)" = 12
check "... its model too" test -s "$ST/downpour/worker-0/model.safetensors"
check "the ps's checkpoint in its state directory" test -s "$ST/downpour/ps-0/ps-shard-0-of-1.safetensors"
check "the metrics in the logs directory" test -s "$LG/downpour/ps-0.jsonl" -a -s "$LG/downpour/worker-2.jsonl"

# ---- CURVE: the drop-ins, the keys as root's, LoadCredential= --------------------------
for u in ps worker; do
    mkdir -p "$U/downpour-$u@.service.d"
    cp "deploy/systemd/curve-$u.conf.example" "$U/downpour-$u@.service.d/curve.conf"
done
(cd "$TMP" && SYSTEMD_UNIT_PATH="$U:" systemd-analyze verify downpour-ps@0.service downpour-worker@1.service) \
    >"$TMP/verify-curve.log" 2>&1
rc=$?
check "systemd-analyze verify: the instances with the CURVE drop-ins pass" test $rc = 0 -a ! -s "$TMP/verify-curve.log"
cat "$TMP/verify-curve.log"
K=$ETC/downpour/keys
mkdir -p "$K/workers"
"$BIN/downpour" keygen "$K/ps-0" >/dev/null
for i in 0 1 2; do "$BIN/downpour" keygen "$K/worker-$i" >/dev/null; mv "$K/worker-$i.pub" "$K/workers/"; done
ST=$TMP/state-curve
unit downpour-ps 0; ps_pid=$!
for _ in $(seq $((100 * scale))); do grep -q "shard 0/1 on" "$TMP/downpour-ps-0.log" && break; sleep 0.1; done
check "CURVE: ps@0 runs on its credential, allowing the 3 workers' keys" \
    grep -q "CURVE: public key .*, 3 client keys allowed" "$TMP/downpour-ps-0.log"
pids=()
for i in 0 1 2; do unit downpour-worker $i; pids+=($!); done
check "CURVE: ps@0 serves worker@0..2; all exit 0" served "${pids[@]}"
check "CURVE: the summary counts 3 x 4 pushes" \
    test "$(json "$ST/downpour/worker-0/summary.json" updates_applied 2>/dev/null)" = 12
rm -r "$U/downpour-ps@.service.d" "$U/downpour-worker@.service.d"

# ---- elastic: worker@2 and @3 started and stopped while the run trains ---------------
# cluster.env as its comment says: 4 worker hosts, the servers' range 1:4.
# `systemctl start` is the unit's command started, `systemctl stop` its
# SIGTERM; each change waits for the pushes the metrics show, never a time.
ST=$TMP/state-el LG=$TMP/logs-el
sed -e "s|^DOWNPOUR_PS_HOSTS=.*|DOWNPOUR_PS_HOSTS=127.0.0.1:$port|" \
    -e "s|^DOWNPOUR_WORKER_HOSTS=.*|DOWNPOUR_WORKER_HOSTS=127.0.0.1:$((port + 1)),127.0.0.2:$((port + 1)),127.0.0.2:$((port + 2)),127.0.0.3:$((port + 1))|" \
    -e "s|^DOWNPOUR_BATCH=.*|DOWNPOUR_BATCH=32|" -e "s|^DOWNPOUR_EPOCHS=.*|DOWNPOUR_EPOCHS=1|" \
    -e "s|^# DOWNPOUR_PS_ARGS=--workers|DOWNPOUR_PS_ARGS=--workers|" \
    -e "s|^# DOWNPOUR_WORKER_ARGS=.*|DOWNPOUR_WORKER_ARGS=--train-samples 9600 --threads 1 --delay-ms 25|" \
    deploy/systemd/cluster.env.example >"$ETC/downpour/cluster.env"
applied() { grep -c '"status":"applied"' "$LG/downpour/worker-$1.jsonl" 2>/dev/null; }
until_applied() { # N I...: each worker@I has N pushes applied (bounded)
    local n=$1 i; shift
    for i in "$@"; do
        for _ in $(seq $((600 * scale))); do [ "$(applied "$i")" -ge "$n" ] 2>/dev/null && break; sleep 0.1; done
        [ "$(applied "$i")" -ge "$n" ] 2>/dev/null || { echo "worker@$i: $(applied "$i") pushes applied"; return 1; }
    done
}
unit downpour-ps 0; ps_pid=$!
for _ in $(seq $((100 * scale))); do grep -q "shard 0/1 on" "$TMP/downpour-ps-0.log" && break; sleep 0.1; done
declare -A wpid
for i in 0 1; do unit downpour-worker $i; wpid[$i]=$!; done
check "elastic: ps@0 with --workers 1:4 serves worker@0 and @1" until_applied 2 0 1
for i in 2 3; do unit downpour-worker $i; wpid[$i]=$!; done
check "elastic: systemctl start worker@2 worker@3: they join and train" until_applied 2 2 3
stopped() { # I: worker@I's SIGTERM is a leave, exit 0 (Restart=on-failure leaves it stopped)
    kill -TERM "${wpid[$1]}"
    wait_for "${wpid[$1]}" $((30 * scale)); local rc=$?
    [ $rc = 0 ] && grep -q "worker $1: left after step" "$TMP/downpour-worker-$1.log" ||
        { echo "worker@$1: exit $rc"; tail -3 "$TMP/downpour-worker-$1.log"; return 1; }
}
for i in 3 2 1; do check "elastic: systemctl stop worker@$i: it leaves after a whole step, exit 0" stopped $i; done
check "elastic: worker@0 trains what is left, the ps stops on the chief's SHUTDOWN; both exit 0" served "${wpid[0]}"
crew=$("$TORCH_PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
ev = ["%s%d" % (e["event"][0], e["task"]) for e in s["membership"]]
ev = sorted(ev[:2]) + sorted(ev[2:4]) + ev[4:]  # the pairs started together
es = s["epoch_samples"][0]
print(" ".join(ev), "|", es["trained"], es["repeated"], s["live_max"])' "$ST/downpour/worker-0/summary.json" 2>&1)
check "elastic: summary.json: the crew as it changed, 9600 samples once ($crew)" \
    test "$crew" = "j0 j1 j2 j3 l3 l2 l1 l0 | 9600 0 4"

# ---- stop and refuse as the unit expects ------------------------------------------
ST=$TMP/state2
unit downpour-ps 0; ps_pid=$!
for _ in $(seq $((100 * scale))); do grep -q "shard 0/1 on" "$TMP/downpour-ps-0.log" && break; sleep 0.1; done
kill -TERM "$ps_pid"
wait_for "$ps_pid" $((20 * scale)); rc=$?
ok_status=$("$TORCH_PY" "$EXEC" "$U/downpour-ps@.service" 0 --state "$ST" --logs "$LG" --etc "$ETC" --creds "$TMP/creds" --show SuccessExitStatus)
check "SIGTERM: exit $rc, one of SuccessExitStatus=$ok_status" grep -qw "$rc" <<<"$ok_status"
check "SIGTERM: the checkpoint was written first" test -s "$ST/downpour/ps-0/ps-shard-0-of-1.safetensors"
sed -i "s|^DOWNPOUR_PS_HOSTS=.*|DOWNPOUR_PS_HOSTS=127.0.0.1|" "$ETC/downpour/cluster.env"
"$TORCH_PY" "$EXEC" "$U/downpour-ps@.service" 0 --state "$ST" --logs "$LG" --etc "$ETC" --creds "$TMP/creds" \
    >"$TMP/bad.log" 2>&1
rc=$?
no_restart=$("$TORCH_PY" "$EXEC" "$U/downpour-ps@.service" 0 --state "$ST" --logs "$LG" --etc "$ETC" --creds "$TMP/creds" --show RestartPreventExitStatus)
check "a bad cluster.env: exit $rc, which RestartPreventExitStatus=$no_restart keeps from restarting" \
    test "$rc" = "$no_restart"
check "... and one line naming the flag" grep -q -- '--ps-hosts entry 0 "127.0.0.1" is not host:port' "$TMP/bad.log"

finish
