# lib.sh: sourced by the integration tests. Each test runs in its own temp
# dir (removed at exit), starts its helper processes through `bg` so they
# are always killed, and ends with `finish`, which prints the closing line
# "N passed, N failed" and sets the exit status.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD=${BUILD:-build}
BIN=$PWD/$BUILD
TORCH_PY=/usr/bin/python3   # Debian's, with python3-torch and numpy
# Every program that loads a test split scores its first 1,000 samples
# (common/dataset.c's hook): most of a short run's time was its final
# evaluation. The suite's accuracy bars are judged on those 1,000;
# DP_TEST_TEST_SAMPLES= (empty) scores a split whole.
export DP_TEST_TEST_SAMPLES=${DP_TEST_TEST_SAMPLES-1000}
T_PASSED=0 T_FAILED=0 T_SKIPPED=0
T_PIDS=()
TMP=$(mktemp -d /tmp/downpour-test.XXXXXX)

t_cleanup() {
    local p
    for p in "${T_PIDS[@]+"${T_PIDS[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
    sleep 0.2
    for p in "${T_PIDS[@]+"${T_PIDS[@]}"}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap t_cleanup EXIT

# pass NAME / fail NAME WHY / skip NAME WHY (one check skipped)
pass() { T_PASSED=$((T_PASSED + 1)); echo "ok   $1"; }
fail() { T_FAILED=$((T_FAILED + 1)); echo "FAIL $1: $2"; }
skip() { T_SKIPPED=$((T_SKIPPED + 1)); echo "  skip: $1: $2"; }
# skip_checks N NAME WHY: a whole section of N checks this machine cannot
# run, counted as N skipped (tests/run.sh sums them).
skip_checks() { T_SKIPPED=$((T_SKIPPED + $1)); echo "  skip: $2 ($1 checks): $3"; }
# section_begin / section_end NAME N: around a section that skip_checks N
# would leave out. Where it runs without a failure, its checks (passed and
# skipped) must number N, or one more check fails: N stays true.
section_begin() { T_SECTION=$((T_PASSED + T_FAILED + T_SKIPPED)) T_SECTION_FAILED=$T_FAILED; }
section_end() {
    local ran=$((T_PASSED + T_FAILED + T_SKIPPED - T_SECTION))
    [ "$T_FAILED" != "$T_SECTION_FAILED" ] || [ "$ran" = "$2" ] ||
        fail "$1: the count its skip gives" "it ran $ran checks, its skip would count $2: update the count"
}

# check NAME COMMAND...: passes when the command succeeds.
check() {
    local name=$1; shift
    if "$@"; then pass "$name"; else fail "$name" "command failed: $*"; fi
}

# wait_until CMD...: wait (at most 120 s, scaled by DP_TEST_TIMEOUT_SCALE)
# until CMD succeeds; 1 if never. A test that defines its own replaces it.
wait_until() {
    local t=0
    until "$@"; do
        t=$((t + 1)); [ $t -ge $((2400 * ${DP_TEST_TIMEOUT_SCALE:-1})) ] && return 1
        sleep 0.05
    done
}

# bg COMMAND...: start a helper process that is killed when the test ends.
bg() { "$@" & T_PIDS+=($!); }

# wait_for PID SECONDS: wait for a child started with bg, at most SECONDS;
# its exit status, or 124 (after killing it) when it took too long.
wait_for() {
    local pid=$1 limit=$2 t=0
    while kill -0 "$pid" 2>/dev/null; do
        sleep 0.1
        t=$((t + 1))
        if [ $t -ge $((limit * 10)) ]; then
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
    done
    wait "$pid"
}

# json FILE KEY: a top-level value of a JSON file.
json() { "$TORCH_PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# ge A B: A >= B as floats.
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
# near A B TOL: |A - B| <= TOL.
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }

has_torch() { "$TORCH_PY" -c 'import torch' 2>/dev/null; }

# use_py_package COUNT NAME [data]: the Python package of this build for
# the rest of the script (PYTHONPATH, no DOWNPOUR_LIB from outside); or,
# when python3-torch (with "data": or Debian's Fashion-MNIST) is missing,
# COUNT checks skipped and the script ended.
use_py_package() {
    local why=""
    has_torch || why="python3-torch is not installed under $TORCH_PY"
    if [ -z "$why" ] && [ "${3:-}" = data ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
        why="dataset-fashion-mnist is not installed"
    fi
    if [ -n "$why" ]; then
        skip_checks "$1" "$2" "$why (make deps-test)"
        finish; exit
    fi
    export PYTHONPATH=$PWD/$BUILD/python
    unset DOWNPOUR_LIB
}

# run_counted NAME CMD...: a program that prints its own "ok ..." / "FAIL ..."
# lines and a closing "N passed, N failed" (the Python test drivers): its
# lines shown, its count folded into this script's, its output in
# $TMP/NAME.out; no count, or a failing exit with none failed, is a failure.
run_counted() {
    local name=$1; shift
    "$@" >"$TMP/$name.out" 2>&1
    local rc=$? line
    sed -n 's/^\(ok  \|FAIL\)/\1/p' "$TMP/$name.out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$TMP/$name.out" | tail -1)
    if [ -z "$line" ]; then
        fail "$name" "ended without its count (exit $rc): $(tail -3 "$TMP/$name.out")"
        return
    fi
    T_PASSED=$((T_PASSED + ${line%% passed*}))
    local f=${line#* passed, }; T_FAILED=$((T_FAILED + ${f%% failed}))
    [ "$rc" = 0 ] || [ "${f%% failed}" != 0 ] || fail "$name" "exit status $rc"
}

finish() {
    if [ "$T_SKIPPED" != 0 ]; then
        echo "$T_PASSED passed, $T_FAILED failed, $T_SKIPPED skipped"
    else
        echo "$T_PASSED passed, $T_FAILED failed"
    fi
    [ "$T_FAILED" = 0 ]
}

# stepped DIR: a `downpour local` run's steps its shards made early, as a
# push's parts came (server/core/shard_early.h), and all its shards' steps,
# from each shard's last metrics line
stepped() {
    "$TORCH_PY" - "$1" <<'EOF'
import glob, json, sys
last = [json.loads([l for l in open(f) if '"steps_early"' in l][-1])
        for f in glob.glob(sys.argv[1] + "/metrics/ps-*.jsonl")]
print(sum(l["steps_early"] for l in last), sum(l["version"] for l in last))
EOF
}
