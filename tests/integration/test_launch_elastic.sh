#!/usr/bin/env bash
# test_launch_elastic: `downpour launch --workers MIN:MAX` and
# --max-restarts, with small Python and sh workers driven by files (each
# step waits on a file a worker or the launcher wrote, never on time):
#  - --workers 1:3: worker 0 alone, WORLD_SIZE 3 and DOWNPOUR_MIN_WORKERS 1;
#    `downpour scale DIR 3` starts tasks 1 and 2 with the same variables,
#    `scale DIR 1` asks them to leave (SIGTERM: the worker's handler
#    leaves, exit 0); the run ends 0 and summary.json lists the joins and
#    the leaves; the servers ran with --workers 1:3
#  - --max-restarts 2: a worker that fails once is started again under its
#    task index (worker-1.2.log), one line and one event, the run ends 0;
#    one that fails three times stops the run naming it with its last line;
#    the chief failing once is restarted and the run goes on, a NumPy Client
#    chief under real servers too (its second HELLO taken, its pushes applied)
#  - refusals, one line and exit 2: MIN above MAX, MAX above 64,
#    --max-restarts -1, --chaos on a fixed crew
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
              and s["workers_min"] == 1 and s["workers_max"] == 3 and s["restart_count"] == 0))' "$out/summary.json"
check "... no process left" left

# (b) restarts: sh workers, task T fails (exit 3) its first F tries
fail_cmd=(sh -c 'f=$1/tries-$RANK; echo x >>"$f"; n=$(wc -l <"$f"); if [ "$RANK" = "$2" ] && [ "$n" -le "$3" ]; then echo "task $RANK fails try $n"; exit 3; fi; echo "task $RANK ok"' sh)
run_restart() { # NAME T F [flags...]
    local name=$1 t=$2 f=$3; shift 3
    mkdir -p "$TMP/$name.d"
    "$L" launch --workers 2 --model "fc:10 softmax" --no-progress --out "$TMP/$name" "$@" -- \
        "${fail_cmd[@]}" "$TMP/$name.d" "$t" "$f" >"$TMP/$name.log" 2>&1
}
run_restart once 1 1 --max-restarts 2
rc=$?
check "--max-restarts 2, worker 1 fails once: the run ends 0 (got $rc)" test $rc = 0
check "... one line for the restart" grep -qx "downpour launch: worker 1 exited with status 3; restart 1 of 2" "$TMP/once.log"
check "... its second life logs to worker-1.2.log and succeeds" grep -qx "task 1 ok" "$TMP/once/logs/worker-1.2.log"
check "... summary.json: one restart event (task 1, status 3), worker_exit [0, 0]" \
    "$TORCH_PY" -c 'import json,sys; s = json.load(open(sys.argv[1]))
sys.exit(not (s["restart_count"] == 1 and [(r["task"], r["status"]) for r in s["restarts"]] == [(1, 3)] and s["worker_exit"] == [0, 0]))' "$TMP/once/summary.json"
run_restart thrice 1 3 --max-restarts 2
rc=$?
check "worker 1 fails three times: past 2 restarts the run stops, status 1 (got $rc)" test $rc = 1
check "... after restarts 1 and 2" bash -c "grep -q 'restart 2 of 2' '$TMP/thrice.log' && ! grep -q 'restart 3' '$TMP/thrice.log'"
check "... naming it with its last line" grep -q "^downpour launch: worker-1 exited with status 3; last log line: task 1 fails try 3" "$TMP/thrice.log"
# two workers failing together (in one pass of the launcher's watch): each
# restarted, none of the failures missed. Tasks 1 and 2 fail their first
# try at the same moment (once the chief says go); the chief ends once both
# have a second try, or after 30 s.
pair_cmd=(sh -c 'd=$1; echo x >>"$d/tries-$RANK"; n=$(wc -l <"$d/tries-$RANK")
if [ "$RANK" = 0 ]; then
    i=0; while [ $i -lt 3000 ] && ! { [ -f "$d/tries-1" ] && [ -f "$d/tries-2" ]; }; do sleep 0.01; i=$((i+1)); done
    touch "$d/go"
    i=0; while [ $i -lt 3000 ] && [ "$(cat "$d/tries-1" "$d/tries-2" 2>/dev/null | wc -l)" -lt 4 ]; do sleep 0.01; i=$((i+1)); done
    exit 0
fi
[ "$n" -gt 1 ] && exit 0
while [ ! -f "$d/go" ]; do sleep 0.002; done; exit 3' sh)
mkdir -p "$TMP/pair.d"
"$L" launch --workers 3 --model "fc:10 softmax" --no-progress --max-restarts 2 --out "$TMP/pair" -- \
    "${pair_cmd[@]}" "$TMP/pair.d" >"$TMP/pair.log" 2>&1
rc=$?
check "workers 1 and 2 fail together: both restarted, the run ends 0 (got $rc)" test $rc = 0
check "... summary.json: two restarts, tasks 1 and 2, worker_exit [0, 0, 0]" "$TORCH_PY" -c 'import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(not (s["restart_count"] == 2 and sorted(r["task"] for r in s["restarts"]) == [1, 2] and s["worker_exit"] == [0, 0, 0]))' "$TMP/pair/summary.json"

run_restart chief 0 1 --max-restarts 1
rc=$?
check "the chief fails once: restarted, the run goes on and ends 0 (got $rc)" test $rc = 0
check "... its restart line" grep -qx "downpour launch: worker 0 exited with status 3; restart 1 of 1" "$TMP/chief.log"
check "... its second life succeeded" grep -qx "task 0 ok" "$TMP/chief/logs/worker-0.2.log"
# the chief restarted under real servers (a NumPy Client): its second life's
# HELLO is taken, its pushes and worker 1's all applied (3 + 3 + 3)
cat >"$TMP/c.py" <<'EOF'
import os, sys, numpy as np, downpour
d, r = sys.argv[1], os.environ["RANK"]
first = not os.path.exists(f"{d}/tried-{r}")
open(f"{d}/tried-{r}", "a").close()
c = downpour.Client.from_spec("fc:10 softmax", input=(1, 28, 28))
for _ in range(3):
    c.pull()
    c.push(np.zeros(c.num_floats, np.float32), loss=1.0, batch=1)
if first and r == "0":
    print("pushed 3, failing", flush=True)
    os._exit(3)
c.finish()
print("life done", flush=True)
c.close()
EOF
mkdir -p "$TMP/hello.d"
PYTHONPATH=$PWD/$BUILD/python "$L" launch --workers 2 --model "fc:10 softmax" --mode async --no-progress \
    --max-restarts 1 --out "$TMP/hello" -- "$TORCH_PY" "$TMP/c.py" "$TMP/hello.d" >"$TMP/hello.log" 2>&1
rc=$?
check "a Client chief that fails after 3 pushes is restarted and the run ends 0 (got $rc)" test $rc = 0
check "... its second life reached the servers and finished" grep -qx "life done" "$TMP/hello/logs/worker-0.2.log"
applied=$(json "$TMP/hello/summary.json" updates_applied 2>/dev/null)
check "... the servers applied all 9 pushes (${applied:-none})" test "${applied:-}" = 9
run_restart none 1 1
rc=$?
check "without --max-restarts the first failure still stops the run (got $rc)" \
    bash -c "[ $rc = 1 ] && ! grep -q restart '$TMP/none.log'"
check "... no process left" left

# (c) refusals
refused() { # WHAT ARGS...: exit 2, one line
    "$L" launch "$@" -- true >"$TMP/bad.log" 2>&1
    local rc=$?
    [ $rc = 2 ] && [ "$(wc -l <"$TMP/bad.log")" = 1 ] && grep -q -- "$WHAT" "$TMP/bad.log"
}
WHAT="MIN 3 is above MAX 1" check "--workers 3:1: exit 2, one line" refused --workers 3:1
WHAT="--workers '1:65'" check "--workers 1:65: exit 2, one line" refused --workers 1:65
WHAT="--max-restarts '-1'" check "--max-restarts -1: exit 2, one line" refused --workers 2 --max-restarts -1
WHAT="--chaos needs an elastic crew" check "--chaos on a fixed crew: exit 2, one line" refused --workers 2 --chaos kill:1
finish
