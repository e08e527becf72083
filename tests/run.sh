#!/usr/bin/env bash
# tests/run.sh: runs every unit test program (build/tests/test_*), then every
# integration test (tests/integration/test_*.sh, each in its own process with
# a timeout scaled by DP_TEST_TIMEOUT_SCALE), and sums their closing lines
# "N passed, N failed[, N skipped]" into one. Exit status non-zero on any
# failure. `tests/run.sh NAME...` runs only the programs/scripts named.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scale=${DP_TEST_TIMEOUT_SCALE:-1}
# Test splits scored on their first 1,000 samples (tests/integration/lib.sh
# says why); DP_TEST_TEST_SAMPLES= (empty) scores them whole.
export DP_TEST_TEST_SAMPLES=${DP_TEST_TEST_SAMPLES-1000}
passed=0 failed=0 skipped=0 broken=()
log_dir=$BUILD/test-logs
mkdir -p "$log_dir"

run_one() { # name, limit seconds, command...
    local name=$1 limit=$2; shift 2
    local log=$log_dir/$name.log t0=$SECONDS
    timeout --kill-after=10 "$(( limit * scale ))" "$@" >"$log" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^([A-Za-z_-]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -1 | sed -E 's/^[A-Za-z_-]+: //')
    if [ -z "$line" ]; then
        line="0 passed, 1 failed"
        [ $rc = 124 ] && echo "  $name: timed out after $(( limit * scale ))s"
    fi
    local p f s
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
    if [ $rc != 0 ] && [ "$f" = 0 ]; then f=1; fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    printf '%-28s %s  (%ds)\n' "$name" "$line" $((SECONDS - t0))
    if [ "$f" != 0 ]; then
        broken+=("$name")
        echo "---- $log (last 30 lines)"; tail -30 "$log"; echo "----"
    else
        grep -h '  skip: ' "$log" | sed "s/^/  $name:/" || true
    fi
}

SELECTED=("$@")
# selected NAME: true when no names were given or NAME is one of them.
selected() { [ ${#SELECTED[@]} -eq 0 ] && return 0; local w; for w in "${SELECTED[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
for t in "$BUILD"/tests/test_* "$BUILD"/tests/fuzz_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    case $name in *.log) continue ;; esac
    # test_gpu_* run too: without a device they print why they skip.
    selected "$name" || continue
    run_one "$name" 300 "$t"
done
for t in tests/integration/test_*.sh; do
    [ -f "$t" ] || continue
    name=$(basename "$t" .sh)
    selected "$name" || continue
    # Tests of deployment (SLURM, namespaces, packages) run the same C code
    # the other tests run; under the sanitized build they would only double
    # CI's time, so a script marked "# dp-test: unsanitized" skips there.
    if [ "${DP_SANITIZED:-0}" = 1 ] && grep -q '^# dp-test: unsanitized' "$t"; then
        printf '%-28s skipped under SANITIZE=1\n' "$name"; continue
    fi
    run_one "$name" 600 bash "$t"
done
[ ${#broken[@]} -gt 0 ] && echo "failed: ${broken[*]}"
if [ "$skipped" != 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
