# docs/experiments/lib.sh: what the `downpour sim` experiments
# (dcasgd_resnet.sh, resnet_bn.sh) share, sourced after their cd to the
# repository root: their runs, JOBS at a time, each resumable, and the
# reading of the runs' summaries for their table. A run is named
# CONFIGURATION-sSEED; it leaves $OUT/NAME.out, NAME.err, its metrics in
# $OUT/NAME/ and its summary (the last line of its output) in NAME.json.

# exp_sim NAME FLAG...: one run, `build/downpour sim FLAG... --out $OUT/NAME`;
# nothing when NAME.json is there already (done before).
exp_sim() {
    local name=$1
    shift
    [ -s "$OUT/$name.json" ] && return 0
    build/downpour sim "$@" --out "$OUT/$name" >"$OUT/$name.out" 2>"$OUT/$name.err"
    tail -1 "$OUT/$name.out" >"$OUT/$name.json"
}

# exp_parallel FUNC ITEM...: FUNC ITEM for each ITEM in the background,
# JOBS at a time; returns when all are done.
exp_parallel() {
    local f=$1 item running=0
    shift
    for item in "$@"; do
        "$f" "$item" &
        running=$((running + 1))
        if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    done
    wait
}

# exp_table <<'PY' ... PY: the table, by the Python on stdin with out,
# model and samples ($OUT, $MODEL, $SAMPLES) and rows set: a configuration
# (a run's name less its -sSEED) -> its runs' summaries, in the order of
# their names; the first line (what ran) already printed.
EXP_PY='
import glob, json, os, statistics, sys
out, model, samples = sys.argv[1:4]
rows = {}
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    rows.setdefault(os.path.basename(p)[:-5].rsplit("-", 1)[0], []).append(json.load(open(p)))
print(f"{model} on Fashion-MNIST, {samples} training samples per run (downpour sim)")
'
exp_table() {
    /usr/bin/python3 -c "$EXP_PY$(cat)" "$OUT" "$MODEL" "$SAMPLES"
}
