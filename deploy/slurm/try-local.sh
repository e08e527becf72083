#!/usr/bin/env bash
# deploy/slurm/try-local.sh: run downpour.sbatch on this machine, without
# SLURM, to check the script and the cluster flags it builds. Stand-ins for
# `scontrol show hostnames` and `srun` (which runs a step's tasks here with
# SLURM_PROCID / SLURM_LOCALID set) go first on PATH; the "nodes" are
# loopback addresses 127.0.0.1 .. 127.0.0.N, so every task really talks TCP.
# (tests/integration/test_slurm.sh runs the script under a live SLURM.)
#
#   deploy/slurm/try-local.sh [NODES [OUT]]     (default 2 nodes, OUT a temp dir)
#   DP_WORKER_ARGS="--steps 50" deploy/slurm/try-local.sh 3
#
# Exit status 0 when the run finished and left summary.json; prints a last
# line "N passed, N failed" like the project's tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
nodes=${1:-2}
out=${2:-}
case $nodes in '' | *[!0-9]* | 0) echo "try-local: NODES must be >= 1" >&2; exit 2 ;; esac
build=${DP_BUILD:-$root/build}
for b in downpour-ps downpour-worker; do
    [ -x "$build/$b" ] || { echo "try-local: $build/$b not found: run make first" >&2; exit 2; }
done

fake=$(mktemp -d /tmp/downpour-fake-slurm.XXXXXX)
[ -n "$out" ] || out=$(mktemp -d /tmp/downpour-try-local.XXXXXX)
trap 'rm -rf "$fake"' EXIT

cat >"$fake/scontrol" <<'EOF'
#!/usr/bin/env bash
# stand-in: `scontrol show hostnames LIST` for a comma-separated LIST only
[ "${1:-} ${2:-}" = "show hostnames" ] || { echo "fake scontrol: only 'show hostnames'" >&2; exit 1; }
tr ',' '\n' <<<"$3"
EOF
cat >"$fake/srun" <<'EOF'
#!/usr/bin/env bash
# stand-in: runs the step's --ntasks tasks here; honours --ntasks-per-node
# (for SLURM_LOCALID) and --output with %t; other flags are accepted and ignored.
ntasks=1 per=1 output=
while [ $# -gt 0 ]; do
    case $1 in
    --ntasks=*) ntasks=${1#*=} ;;
    --ntasks-per-node=*) per=${1#*=} ;;
    --output=*) output=${1#*=} ;;
    --*) ;;
    *) break ;;
    esac
    shift
done
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
for ((i = 0; i < ntasks; i++)); do
    if [ -n "$output" ]; then
        SLURM_PROCID=$i SLURM_LOCALID=$((i % per)) "$@" >"${output//%t/$i}" 2>&1 &
    else
        SLURM_PROCID=$i SLURM_LOCALID=$((i % per)) "$@" &
    fi
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit "$rc"
EOF
chmod +x "$fake/scontrol" "$fake/srun"

list=""
for ((i = 1; i <= nodes; i++)); do list+="${list:+,}127.0.0.$i"; done
# Ports away from the defaults, so a real service on 2222 does not collide.
port=$((20000 + RANDOM % 20000))
rc=0
PATH="$fake:$PATH" SLURM_JOB_NODELIST=$list SLURM_JOB_ID=local SLURM_SUBMIT_DIR=$root \
    DP_BUILD=$build DP_OUT=$out DP_DEVICE=${DP_DEVICE:-cpu} \
    DP_PS_PORT=${DP_PS_PORT:-$port} DP_WORKER_PORT=${DP_WORKER_PORT:-$((port + 100))} \
    DP_WORKER_ARGS=${DP_WORKER_ARGS:---steps 20 --threads 1 --eval-limit 500} \
    bash "$here/downpour.sbatch" || rc=$?
if [ "$rc" = 0 ] && [ -s "$out/summary.json" ] && [ -s "$out/model.safetensors" ]; then
    echo "try-local: ok: $nodes node(s); outputs in $out"
    echo "1 passed, 0 failed"
else
    echo "try-local: failed (exit $rc); logs:" >&2
    tail -n 5 "$out"/logs/*.log >&2 || true
    echo "0 passed, 1 failed"
    exit 1
fi
