#!/usr/bin/env bash
# test_k8s: deploy/k8s without a cluster.
#  - every manifest parses and has what Kubernetes and the training operator
#    need (tests/integration/k8s_pods.py check), and a broken copy is caught;
#  - the pods run as written: each pod's container command, env and volume
#    mounts from the manifest (k8s_pods.py run), the real binaries and
#    downpour-pod, in one network namespace of their own whose /etc/hosts
#    (a private mount) gives the pods' DNS names: the TFJob's PS and Worker
#    pods with TF_CONFIG byte for byte as the operator writes it, on CURVE
#    keys from the "Secret"; the same with a Chief replica spec in clear; the
#    StatefulSets with the cluster built from each pod's ordinal, on CURVE.
#    Each run: every daemon logs the task it took itself for (role, index,
#    endpoint), the chief's summary counts every worker's pushes, all exit 0;
#  - the StatefulSets elastic (DP_WORKER_REPLICAS=1:4), the worker set
#    scaled 2 -> 4 -> 1 while it trains as the controller does it: the new
#    ordinals join, each removed pod leaves on its SIGTERM (exit 0, no
#    idling), worker 0 ends the run with each sample trained once;
#  - SIGTERM during training (the StatefulSets' pods, both workers pushing)
#    reaches each daemon through downpour-pod: exit 143; the ps's checkpoint
#    holds every version the workers saw, unfinished; no summary or model;
#  - downpour-pod: a missing Secret, key or ordinal is one line and exit
#    status 2.
# The image (deploy/k8s/Dockerfile) is not built here: no Docker.
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

PY=$TORCH_PY
K8S=$PWD/deploy/k8s
PODS=$PWD/tests/integration/k8s_pods.py
# The checks of each half: the manifests (here), the pods (in a namespace
# of their own); a skip counts them (section_end keeps the figures true).
N_MANIFESTS=7 N_PODS=41
if ! "$PY" -c 'import yaml' 2>/dev/null; then
    skip_checks $((N_MANIFESTS + N_PODS)) k8s "Debian's python3-yaml is not installed (make deps-test)"
    finish; exit
fi

# ---- the manifests (before the re-run in a namespace, below) -------------------
if [ -z "${DP_K8S_INSIDE:-}" ]; then
    section_begin
    "$PY" "$PODS" check "$K8S" >"$TMP/check.log" 2>&1
    check "every manifest parses and has the fields it needs" test $? = 0
    cat "$TMP/check.log"
    mkdir -p "$TMP/bad"
    cp "$K8S"/*.yaml "$TMP/bad/"
    # The worker StatefulSet grows, its DP_WORKER_REPLICAS does not; the TFJob's
    # worker container loses its name.
    sed -i '0,/replicas: 2 /s//replicas: 3 /' "$TMP/bad/statefulset.yaml"
    sed -i 's/- name: tensorflow/- name: tf/' "$TMP/bad/tfjob.yaml"
    "$PY" "$PODS" check "$TMP/bad" >"$TMP/bad.log" 2>&1
    check "a broken copy is caught" grep -q "DP_WORKER_REPLICAS is not downpour-worker's replicas (3)" "$TMP/bad.log"
    check "... naming the field" grep -q "container must be named tensorflow" "$TMP/bad.log"

    # ---- downpour-pod's refusals (no daemon starts) --------------------------------------
    pod_fails() { # want, env..., then after --: downpour-pod args
        local want=$1; shift
        local envs=()
        while [ "$1" != -- ]; do envs+=("$1"); shift; done
        shift
        env "${envs[@]}" "$K8S/downpour-pod" "$@" >"$TMP/refuse.log" 2>&1
        local rc=$?
        [ $rc = 2 ] && grep -q "$want" "$TMP/refuse.log" && [ "$(wc -l <"$TMP/refuse.log")" = 1 ] ||
            { echo "rc $rc"; cat "$TMP/refuse.log"; return 1; }
    }
    mkdir -p "$TMP/empty" "$TMP/partial"
    "$BIN/downpour" keygen "$TMP/partial/ps-0" >/dev/null
    check "downpour-pod: no Secret is one line" pod_fails "CURVE: $TMP/empty is empty" \
        POD_NAME=downpour-worker-0 DP_CURVE_DIR="$TMP/empty" -- worker
    check "downpour-pod: no key for the pod is one line" pod_fails "no key pair worker-1 in" \
        POD_NAME=downpour-worker-1 DP_CURVE_DIR="$TMP/partial" -- worker
    check "downpour-pod: no ordinal is one line" pod_fails 'pod name "web" does not end in -<ordinal>' \
        POD_NAME=web DP_PS_REPLICAS=1 DP_WORKER_REPLICAS=1 -- ps
    check "downpour-pod: a bad role is one line" pod_fails "usage: downpour-pod ps|worker" POD_NAME=x-0 -- chief
    section_end manifests $N_MANIFESTS
fi

# ---- the pods, in a network namespace and /etc/hosts of their own ---------------------
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    skip_checks $N_PODS pods "Debian's dataset-fashion-mnist is not installed (make deps)"
    finish; exit
fi
# Re-run the rest of this script inside `unshare --mount --net`: loopback
# only, so the pods' port 2222 is theirs, and /etc/hosts bind-mounted
# privately. Both vanish with the process.
if [ -z "${DP_K8S_INSIDE:-}" ]; then
    if ! out=$(unshare --mount --net true 2>&1); then
        skip_checks $N_PODS pods "\`unshare --mount --net true\` failed: ${out:-no output} (it needs root, or CAP_SYS_ADMIN)"
        finish; exit
    fi
    trap - EXIT
    rm -rf "$TMP"
    res=$(printf '%s\n' "$T_PASSED" "$T_FAILED" "$T_SKIPPED")
    exec env DP_K8S_INSIDE="$res" unshare --mount --net bash "$0"
fi
{ read -r T_PASSED; read -r T_FAILED; read -r T_SKIPPED; } <<<"$DP_K8S_INSIDE"
section_begin
if ! out=$(ip link set lo up 2>&1); then
    skip_checks $N_PODS pods "\`ip link set lo up\` in the new network namespace failed: ${out:-no output}"
    finish; exit
fi
# Whatever happens, no daemon outlives the test in this namespace (the pods'
# shells pass SIGTERM on, but a timeout sends SIGKILL).
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; kill -KILL "$c" 2>/dev/null; done; }
trap 't_cleanup; kill_tree $$' EXIT
printf '127.0.0.1 localhost\n' >"$TMP/hosts"
if ! out=$(mount --bind "$TMP/hosts" /etc/hosts 2>&1); then
    skip_checks $N_PODS pods "\`mount --bind $TMP/hosts /etc/hosts\` in the new mount namespace failed: ${out:-no output}"
    finish; exit
fi

scale=${DP_TEST_TIMEOUT_SCALE:-1}
# The image's /usr/local/bin: the daemons and downpour-pod side by side.
mkdir -p "$TMP/bin"
ln -s "$BIN/downpour-ps" "$BIN/downpour-worker" "$BIN/downpour" "$K8S/downpour-pod" "$TMP/bin/"
SHORT="--steps 4 --batch 32 --threads 1"

# keys NAME...: a key pair each in the "Secret" (0440, as the manifests mount it).
keys() {
    local d=$1/secret/downpour-curve k; shift
    mkdir -p "$d"
    for k in "$@"; do "$BIN/downpour" keygen "$d/$k" >/dev/null; done
    chmod 0440 "$d"/*
}
# pod ROOT FILE WORKLOAD NAME ARGS...: one pod in the background (its log: ROOT/NAME.log).
pod() {
    local root=$1 file=$2 workload=$3 name=$4; shift 4
    local host
    # Its DNS names: the operator's <job>-<type>-<i>.default.svc, the
    # StatefulSet's <set>-<i>.<set>.
    host="$name.default.svc $name.${name%-*}"
    grep -q " $name\." "$TMP/hosts" || echo "127.0.0.1 $host" >>"$TMP/hosts"
    # POD_APPEND (may be empty) replaces the short run's flags.
    local short=${POD_APPEND-$SHORT}
    case $workload in PS | downpour-ps) short="" ;; esac
    bg "$PY" "$PODS" run "$K8S/$file" "$workload" "$name" --root "$root" \
        --map /usr/local/bin="$TMP/bin" --env DEVICE=cpu --append "$short" "$@" >"$root/$name.log" 2>&1
}
# settle ROOT NAME...: every pod exited 0 (bounded).
settle() {
    local root=$1 name ok=0; shift
    for name in "$@"; do
        wait_for "${PIDS[$name]}" $((120 * scale))
        local rc=$?
        [ $rc = 0 ] || { echo "$name: exit $rc"; tail -5 "$root/$name.log"; ok=1; }
    done
    return $ok
}
declare -A PIDS
cluster_line() { grep -q "cluster: $2" "$1" || { echo "want \"cluster: $2\" in $1:"; grep 'cluster:' "$1"; return 1; }; }

# ---- TFJob: PS x1, Worker x2, CURVE keys from the Secret --------------------------------
R=$TMP/tfjob && mkdir -p "$R"
keys "$R" ps-0 worker-0 worker-1
J=downpour-fmnist
pod "$R" tfjob.yaml PS $J-ps-0 --tf-config; PIDS[$J-ps-0]=$!
pod "$R" tfjob.yaml Worker $J-worker-1 --tf-config; PIDS[$J-worker-1]=$!
pod "$R" tfjob.yaml Worker $J-worker-0 --tf-config; PIDS[$J-worker-0]=$!
check "TFJob: the chief, the worker and the ps end with exit 0" settle "$R" $J-worker-0 $J-worker-1 $J-ps-0
check "TFJob: TF_CONFIG is the operator's" grep -qF \
    'TF_CONFIG={"cluster":{"ps":["downpour-fmnist-ps-0.default.svc:2222"],"worker":["downpour-fmnist-worker-0.default.svc:2222","downpour-fmnist-worker-1.default.svc:2222"]},"task":{"type":"worker","index":1},"environment":"cloud"}' \
    "$R/$J-worker-1.log"
check "TFJob: the ps pod is ps task 0" cluster_line "$R/$J-ps-0.log" "ps task 0 ($J-ps-0.default.svc:2222); 1 ps, 2 workers"
check "TFJob: worker pod 1 is worker task 1" cluster_line "$R/$J-worker-1.log" "worker task 1 ($J-worker-1.default.svc:2222); 1 ps, 2 workers"
check "TFJob: worker pod 0 is worker task 0" cluster_line "$R/$J-worker-0.log" "worker task 0 ($J-worker-0.default.svc:2222)"
check "TFJob: the ps is on CURVE with the Secret's key" grep -q "CURVE: public key" "$R/$J-ps-0.log"
S=$R/pvc/downpour-runs/$J
check "TFJob: the chief's summary counts 2 x 4 pushes" test "$(json "$S/summary.json" updates_applied 2>/dev/null)" = 8
check "TFJob: the model and every pod's metrics are on the volume" \
    test -s "$S/model.safetensors" -a -s "$S/metrics/$J-ps-0.jsonl" -a -s "$S/metrics/$J-worker-1.jsonl"

# ---- TFJob with a Chief replica spec (PS x1, Chief x1, Worker x1), in clear -------------------
R=$TMP/chief && mkdir -p "$R"
for p in $J-ps-0:PS $J-chief-0:Chief $J-worker-0:Worker; do
    pod "$R" tfjob.yaml "${p#*:}" "${p%:*}" --tf-config --chief --replicas Worker=1 --unset DP_CURVE_DIR
    PIDS[${p%:*}]=$!
done
check "Chief: every pod ends with exit 0" settle "$R" $J-chief-0 $J-worker-0 $J-ps-0
check "Chief: TF_CONFIG is the operator's" grep -qF \
    'TF_CONFIG={"cluster":{"chief":["downpour-fmnist-chief-0.default.svc:2222"],"ps":["downpour-fmnist-ps-0.default.svc:2222"],"worker":["downpour-fmnist-worker-0.default.svc:2222"]},"task":{"type":"chief","index":0},"environment":"cloud"}' \
    "$R/$J-chief-0.log"
check "Chief: the chief pod is worker task 0" cluster_line "$R/$J-chief-0.log" "worker task 0 ($J-chief-0.default.svc:2222); 1 ps, 2 workers"
check "Chief: Worker pod 0 is worker task 1" cluster_line "$R/$J-worker-0.log" "worker task 1 ($J-worker-0.default.svc:2222); 1 ps, 2 workers"
check "Chief: no CURVE" grep -q "without CURVE" "$R/$J-ps-0.log"
check "Chief: the summary counts 2 x 4 pushes" test "$(json "$R/pvc/downpour-runs/$J/summary.json" updates_applied 2>/dev/null)" = 8

# ---- StatefulSets: the cluster from the ordinal, CURVE, idle after the end ----------------------
R=$TMP/sts && mkdir -p "$R"
keys "$R" ps-0 worker-0 worker-1
for p in downpour-ps-0:downpour-ps downpour-worker-0:downpour-worker downpour-worker-1:downpour-worker; do
    pod "$R" statefulset.yaml "${p#*:}" "${p%:*}"
    PIDS[${p%:*}]=$!
done
idle_all() {
    local name
    for name in downpour-ps-0 downpour-worker-0 downpour-worker-1; do
        for _ in $(seq $((600 * scale))); do grep -q "idle until" "$R/$name.log" && break; sleep 0.1; done
        grep -q "finished (exit 0); idle until the StatefulSet is deleted" "$R/$name.log" ||
            { echo "$name:"; tail -5 "$R/$name.log"; return 1; }
    done
}
check "StatefulSets: every daemon finishes and its pod idles" idle_all
check "StatefulSets: the flags come from the ordinal" grep -q \
    "downpour-worker-1: downpour-worker --job-name worker --task-index 1 --ps-hosts downpour-ps-0.downpour-ps:2222 --worker-hosts downpour-worker-0.downpour-worker:2222,downpour-worker-1.downpour-worker:2222" \
    "$R/downpour-worker-1.log"
check "StatefulSets: ps pod 0 is ps task 0" cluster_line "$R/downpour-ps-0.log" "ps task 0 (downpour-ps-0.downpour-ps:2222); 1 ps, 2 workers"
check "StatefulSets: worker pod 1 is worker task 1" cluster_line "$R/downpour-worker-1.log" "worker task 1 (downpour-worker-1.downpour-worker:2222); 1 ps, 2 workers"
check "StatefulSets: on CURVE" grep -q "CURVE: public key" "$R/downpour-ps-0.log"
check "StatefulSets: worker 0's volume has the summary (2 x 4 pushes)" \
    test "$(json "$R/pod/downpour-worker-0/out/summary.json" updates_applied 2>/dev/null)" = 8
check "StatefulSets: the ps's volume has its checkpoint" test -s "$R/pod/downpour-ps-0/out/checkpoints/ps-shard-0-of-1.safetensors"
for name in downpour-ps-0 downpour-worker-0 downpour-worker-1; do kill -TERM "${PIDS[$name]}"; done
check "StatefulSets: an idle pod stops on SIGTERM with exit 0" settle "$R" downpour-ps-0 downpour-worker-0 downpour-worker-1

# ---- StatefulSets, elastic: the worker set scaled 2 -> 4 -> 1 while it trains ----------------
# DP_WORKER_REPLICAS=1:4 in both sets (the manifest's comment says how);
# `kubectl scale` is played as the StatefulSet controller plays it: a new
# ordinal's pod starts, and a scale-down SIGTERMs the highest ordinal and
# waits for it to end before the next. Every step is driven by the pushes
# the pods' metrics show, never by time.
R=$TMP/elastic && mkdir -p "$R"
keys "$R" ps-0 worker-0 worker-1 worker-2 worker-3
EL="--epochs 1 --train-samples 12800 --batch 32 --threads 1 --delay-ms 25"
epush() { grep -c '"status":"applied"' "$R/pod/downpour-worker-$1/out/metrics/downpour-worker-$1.jsonl" 2>/dev/null; }
# until_pushes N K...: each worker pod K has N pushes applied (bounded).
until_pushes() {
    local n=$1 k; shift
    for k in "$@"; do
        for _ in $(seq $((600 * scale))); do [ "$(epush "$k")" -ge "$n" ] 2>/dev/null && break; sleep 0.1; done
        [ "$(epush "$k")" -ge "$n" ] 2>/dev/null || { echo "worker pod $k: $(epush "$k") pushes applied"; return 1; }
    done
}
epod() { POD_APPEND=$EL pod "$R" statefulset.yaml "$1" "$2" --env DP_WORKER_REPLICAS=1:4; PIDS[$2]=$!; }
epod downpour-ps downpour-ps-0
epod downpour-worker downpour-worker-0
epod downpour-worker downpour-worker-1
check "elastic StatefulSets: 2 workers training" until_pushes 2 0 1
epod downpour-worker downpour-worker-2
epod downpour-worker downpour-worker-3
check "elastic: scaled to 4, the new ordinals 2 and 3 join and train" until_pushes 2 2 3
# scaled to 1: ordinals 3, 2, 1 in turn, each gone before the next
leave_pod() {
    kill -TERM "${PIDS[downpour-worker-$1]}"
    wait_for "${PIDS[downpour-worker-$1]}" $((30 * scale)); local rc=$?
    [ $rc = 0 ] && grep -q "worker $1: left after step" "$R/downpour-worker-$1.log" &&
        ! grep -q "idle until" "$R/downpour-worker-$1.log" ||
        { echo "worker pod $1: exit $rc"; tail -3 "$R/downpour-worker-$1.log"; return 1; }
}
for k in 3 2 1; do check "elastic: scaled down, worker pod $k leaves on its SIGTERM (exit 0, no idling)" leave_pod $k; done
idle_pod() {
    for _ in $(seq $((1200 * scale))); do grep -q "idle until" "$R/$1.log" && break; sleep 0.1; done
    grep -q "finished (exit 0); idle until" "$R/$1.log" || { echo "$1:"; tail -5 "$R/$1.log"; return 1; }
}
check "elastic: worker 0 trains what is left and its pod idles" idle_pod downpour-worker-0
check "elastic: so does the ps pod" idle_pod downpour-ps-0
check "elastic: the ps took the range (--workers 1:4, 4 worker hosts)" grep -q \
    -- "--worker-hosts downpour-worker-0.downpour-worker:2222,.*downpour-worker-3.downpour-worker:2222 --workers 1:4" \
    "$R/downpour-ps-0.log"
# summary.json: each sample once, and the crew as it changed.
crew=$("$PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
ev = ["%s%d" % (e["event"][0], e["task"]) for e in s["membership"]]
ev = sorted(ev[:2]) + sorted(ev[2:4]) + ev[4:]  # the pods of one scale-up start together
es = s["epoch_samples"][0]
print(" ".join(ev), "|", es["trained"], es["repeated"], s["live_max"])' "$R/pod/downpour-worker-0/out/summary.json" 2>&1)
check "elastic: summary.json: joins and leaves in order (worker 0's at the end), 12800 samples once, 4 live at most ($crew)" \
    test "$crew" = "j0 j1 j2 j3 l3 l2 l1 l0 | 12800 0 4"
for name in downpour-ps-0 downpour-worker-0; do kill -TERM "${PIDS[$name]}"; done
check "elastic: the idle pods stop on SIGTERM" settle "$R" downpour-ps-0 downpour-worker-0

# ---- SIGTERM during training reaches the daemons ------------------------------------------
# The StatefulSets' three pods, the workers given more steps than they will
# take: SIGTERM comes while both push. The ps pod first (exit 143, the
# daemon's; its checkpoint holds at least every version the workers were
# told of, unfinished), then each worker pod (143; the servers keep the
# weights, so no summary or model, even from the chief).
R=$TMP/term && mkdir -p "$R"
keys "$R" ps-0 worker-0 worker-1
for p in downpour-ps-0:downpour-ps downpour-worker-0:downpour-worker downpour-worker-1:downpour-worker; do
    POD_APPEND="--steps 1000000 --batch 32 --threads 1" pod "$R" statefulset.yaml "${p#*:}" "${p%:*}"
    PIDS[${p%:*}]=$!
done
# pushes K: worker pod K's applied pushes so far.
pushes() { grep -c '"status":"applied"' "$R/pod/downpour-worker-$1/out/metrics/downpour-worker-$1.jsonl" 2>/dev/null; }
for _ in $(seq $((600 * scale))); do
    [ "$(pushes 0)" -ge 3 ] 2>/dev/null && [ "$(pushes 1)" -ge 3 ] 2>/dev/null && break
    sleep 0.1
done
check "SIGTERM: both workers are training (pushes applied: $(pushes 0), $(pushes 1))" \
    bash -c "[ '$(pushes 0)' -ge 3 ] && [ '$(pushes 1)' -ge 3 ]"
# The highest version a worker was told of before the signal.
seen=$(cat "$R"/pod/downpour-worker-*/out/metrics/downpour-worker-*.jsonl |
    "$PY" -c 'import sys, json; print(max(int(json.loads(l).get("version", 0)) for l in sys.stdin if "\"status\"" in l))')
kill -TERM "${PIDS[downpour-ps-0]}"
wait_for "${PIDS[downpour-ps-0]}" $((20 * scale))
check "SIGTERM during training: the ps pod exits 143, the daemon's status" test $? = 143
check "SIGTERM: the ps says it stopped on the signal and wrote its checkpoint" \
    grep -q "stopped by signal 15; checkpoint written" "$R/downpour-ps-0.log"
ckpt=$R/pod/downpour-ps-0/out/checkpoints/ps-shard-0-of-1.safetensors
meta=$("$PY" - "$ckpt" <<'PY' 2>&1
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    m = json.loads(f.read(n))["__metadata__"]
print(m["version"], m["finished"])
PY
)
check "SIGTERM: the checkpoint holds version >= $seen, the last the workers saw, unfinished (version, finished: $meta)" \
    bash -c "read -r v f <<<'$meta'; [ \"\$v\" -ge '$seen' ] && [ \"\$f\" = 0 ]"
for k in 1 0; do
    kill -TERM "${PIDS[downpour-worker-$k]}"
    wait_for "${PIDS[downpour-worker-$k]}" $((20 * scale))
    check "SIGTERM during training: worker pod $k exits 143" test $? = 143
    check "... saying nothing is saved there (the servers keep the weights)" \
        grep -q "stopped by signal 15; nothing saved here" "$R/downpour-worker-$k.log"
done
check "SIGTERM: the chief wrote no summary and no model (the run did not finish)" \
    test ! -e "$R/pod/downpour-worker-0/out/summary.json" -a ! -e "$R/pod/downpour-worker-0/out/model.safetensors"

section_end pods $N_PODS
finish
