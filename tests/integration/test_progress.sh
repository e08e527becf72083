#!/usr/bin/env bash
# test_progress: `downpour local`'s live line (--progress: "\r" lines even
# off a terminal) ends on where the run got to — the workers' last steps,
# read from their metrics' last record, not from the events a run's files
# end in (staleness, eval, leave), which read as "step 0" / "env steps 0":
#  - a classifier run of 30 steps: its last line "epoch 1/1  step 30/30"
#  - an --env run of 3000 env steps: its last line at or past 3000
source "$(dirname "$0")/lib.sh"

# last_line LOG: the last progress line shown before the run's "done:" line
# (the last "\r" segment of the line that "\r" lines make).
last_line() { grep -a $'\r' "$1" | tail -1 | tr '\r' '\n' | tail -1 | sed 's/^\x1b\[K//'; }

"$BIN/downpour" local --workers 2 --model "fc:10 softmax" --batch 16 --steps 30 --progress \
    --out "$TMP/dense" >/dev/null 2>"$TMP/dense.err"
rc=$? line=$(last_line "$TMP/dense.err")
check "a 30-step run (exit $rc) ends its live line on step 30/30: '$line'" \
    bash -c "[ $rc = 0 ] && [[ '$line' == 'epoch 1/1  step 30/30  '*' loss '* ]]"
check "... the metrics it read end in events (what the line passes over)" \
    bash -c "tail -1 '$TMP/dense/metrics/worker-0.jsonl' | grep -q '\"event\"'"

"$BIN/downpour" local --env cartpole-v1 --workers 2 --env-steps 3000 --progress \
    --out "$TMP/env" >/dev/null 2>"$TMP/env.err"
rc=$? line=$(last_line "$TMP/env.err")
steps=$(echo "$line" | sed -n 's/.*env steps \([0-9]*\)\/3000 .*/\1/p')
check "an --env run of 3000 env steps (exit $rc) ends its live line at ${steps:-no count} >= 3000: '$line'" \
    bash -c "[ $rc = 0 ] && [ '${steps:-0}' -ge 3000 ]"
finish
