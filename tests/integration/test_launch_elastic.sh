#!/usr/bin/env bash
# test_launch_elastic: `downpour launch --workers MIN:MAX`, with small
# Python and sh workers driven by files (each step waits on a file a worker or the launcher wrote, never on time):
#  - --workers 1:3: worker 0 alone, WORLD_SIZE 3 and DOWNPOUR_MIN_WORKERS 1;
#    `downpour scale DIR 3` starts tasks 1 and 2 with the same variables,
#    `scale DIR 1` asks them to leave (SIGTERM: the worker's handler
#    leaves, exit 0); the run ends 0 and summary.json lists the joins and
#    the leaves; the servers ran with --workers 1:3
#  - refusals, one line and exit 2: MIN above MAX, MAX above 64,
#    --chaos on a fixed crew
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"
L=$BIN/downpour
left() { ! pgrep -f "$TMP/" >/dev/null; }

# (a) joins and leaves
cat >"$TMP/w.py" <<'EOF'
import os, signal, sys, time
d, r = sys.argv[1], os.environ["RANK"]
def leave(*_):
    open(f"{d}/left-{r}", "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
with open(f"{d}/up-{r}", "w") as f:
    f.write(f'{os.environ["WORLD_SIZE"]} {os.environ["DOWNPOUR_MIN_WORKERS"]} {os.environ["DOWNPOUR_MAX_WORKERS"]}\n')
while not os.path.exists(f"{d}/stop"):
    time.sleep(0.05)
EOF
out=$TMP/el
"$L" launch --workers 1:3 --model "fc:10 softmax" --no-progress --out "$out" -- \
    "$TORCH_PY" "$TMP/w.py" "$TMP" >"$TMP/el.log" 2>&1 &
lpid=$!
check "1:3: worker 0 starts" wait_until test -e "$TMP/up-0"
check "... alone (no worker 1 before a scale)" test ! -e "$TMP/up-1"
check "... with WORLD_SIZE 3 (MAX), DOWNPOUR_MIN_WORKERS 1, DOWNPOUR_MAX_WORKERS 3" grep -qx "3 1 3" "$TMP/up-0"
check "downpour scale DIR 3 is taken" "$L" scale "$out" 3
check "... workers 1 and 2 join" wait_until test -e "$TMP/up-1" -a -e "$TMP/up-2"
check "... with the same variables" grep -qx "3 1 3" "$TMP/up-2"
check "downpour scale DIR 1 is taken" "$L" scale "$out" 1
check "... workers 2 and 1 leave (their SIGTERM handlers ran)" wait_until test -e "$TMP/left-1" -a -e "$TMP/left-2"
check "... and the launcher noted both ends" wait_until grep -q "worker 1 asked to leave" "$TMP/el.log"
touch "$TMP/stop"
wait $lpid
rc=$?
check "the run ends 0 (got $rc)" test $rc = 0
check "the launcher started 1:3 worker(s), the servers with --workers 1:3 (3 task indexes)" \
    bash -c "grep -q ' 1:3 worker(s) of ' '$TMP/el.log' && grep -q ', 3 workers, ' '$out/logs/ps-0.log'"
check "summary.json: joins are tasks 1 and 2, leaves tasks 2 and 1 (exit 0), range 1:3" \
    "$TORCH_PY" -c 'import json,sys; s = json.load(open(sys.argv[1]))
sys.exit(not (sorted(j["task"] for j in s["joins"]) == [1, 2] and sorted((l["task"], l["status"]) for l in s["leaves"]) == [(1, 0), (2, 0)]
              and s["workers_min"] == 1 and s["workers_max"] == 3))' "$out/summary.json"
check "... no process left" left

# (c) refusals
refused() { # WHAT ARGS...: exit 2, one line
    "$L" launch "$@" -- true >"$TMP/bad.log" 2>&1
    local rc=$?
    [ $rc = 2 ] && [ "$(wc -l <"$TMP/bad.log")" = 1 ] && grep -q -- "$WHAT" "$TMP/bad.log"
}
WHAT="MIN 3 is above MAX 1" check "--workers 3:1: exit 2, one line" refused --workers 3:1
WHAT="--workers '1:65'" check "--workers 1:65: exit 2, one line" refused --workers 1:65
WHAT="--chaos needs an elastic crew" check "--chaos on a fixed crew: exit 2, one line" refused --workers 2 --chaos kill:1
finish
