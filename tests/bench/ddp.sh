#!/usr/bin/env bash
# ddp.sh: a 2-worker cluster on one machine against what a user would pick
# instead, PyTorch's DistributedDataParallel over gloo. Side by side in one
# run, round by round (load from other users falls on every column alike):
#   ddp     tests/bench/torch_ddp.py: 2 processes, all-reduce under backward
#           (NCHW and channels_last each round, the faster counts)
#   sync    downpour local --workers 2 --mode sync  (1 shard)
#   async   downpour local --workers 2 --mode async (1 shard)
#   sync, async frames: the same over ZeroMQ frames (--transport zmq), where
#           the pull comes in parts too (through shared memory, the
#           default, it is read whole)
# the same network (the default spec), batch 64 per worker, 1 thread per
# process, Adam lr 0.001, the same steps per worker. Figures: images/s of
# the whole cluster (summary.json's images_per_s: the training loop only;
# DDP's timed steps after its warm-up), medians over the rounds and the
# median of the per-round ratios to DDP; the sync workers' median compute_ms
# and wait_ms per step (where a sync step's time goes). OpenBLAS gets
# OPENBLAS_CORETYPE=SkylakeX on an AVX-512 x86 as in overlap.sh, PyTorch the
# environment tests/bench/run.sh gives it (OPENBLAS_NUM_THREADS=1, glibc's
# malloc thresholds raised).
#
# Knobs (environment): BUILD (build), BENCH_OUT ($BUILD/bench),
# BENCH_DDP_ROUNDS (3), BENCH_DDP_STEPS (200), PY (/usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

. tests/bench/lib.sh
BENCH_NAME=ddp.sh

BUILD=${BUILD:-build}
OUT=${BENCH_OUT:-$BUILD/bench}/ddp
ROUNDS=${BENCH_DDP_ROUNDS:-3}
STEPS=${BENCH_DDP_STEPS:-200}
PY=${PY:-/usr/bin/python3}
bench_require "'make' first" "$BUILD/downpour"
"$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
    { echo "ddp.sh: $PY has no torch.distributed with gloo (python3-torch): skipped"; exit 0; }
bench_openblas
TORCH_ENV=(OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432
           MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456)
rm -rf "$OUT"
bench_samples "$OUT"
common=(--workers 2 --steps "$STEPS" --batch 64 --threads 1 --optimizer adam --lr 0.001
        --no-progress)
s_split() { # metrics dir -> "compute_ms wait_ms" medians over both workers' pushes
    "$PY" - "$1" <<'PYEOF'
import glob, json, statistics as st, sys
c, w = [], []
for f in glob.glob(sys.argv[1] + "/worker-*.jsonl"):
    for line in open(f):
        o = json.loads(line)
        if "compute_ms" in o: c.append(o["compute_ms"]); w.append(o["wait_ms"])
print("%.1f %.1f" % (st.median(c), st.median(w)) if c else "- -")
PYEOF
}
s_cluster() { # NAME MODE [FLAGS...]
    local name=$1 mode=$2 dir=$OUT/$1-$r; shift 2
    bench_run "$name" "$dir.log" "$BUILD/downpour" local --mode "$mode" "${common[@]}" "$@" --out "$dir"
    local ips
    ips=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["images_per_s"])' "$dir/summary.json")
    echo "$name $ips $(s_split "$dir/metrics")" >>"$RAW"
}

bench_start ddp
echo "commands (each round, in this order):"
echo "  env ${TORCH_ENV[*]} $PY tests/bench/torch_ddp.py --workers 2 --batch 64 --threads 1 --steps $STEPS --optimizer adam --lr 0.001 --layout nchw|nhwc"
echo "  $BUILD/downpour local --mode sync ${common[*]} --out DIR"
echo "  $BUILD/downpour local --mode async ${common[*]} --out DIR"
echo "  $BUILD/downpour local --mode sync ${common[*]} --transport zmq --out DIR"
echo "  $BUILD/downpour local --mode async ${common[*]} --transport zmq --out DIR"
for r in $(seq "$ROUNDS"); do
    best=0
    for layout in nchw nhwc; do # the faster memory format counts, as in run.sh's PyTorch rows
        f=$OUT/ddp-$layout-$r
        env "${TORCH_ENV[@]}" "$PY" tests/bench/torch_ddp.py --workers 2 --batch 64 --threads 1 \
            --steps "$STEPS" --optimizer adam --lr 0.001 --layout "$layout" >"$f.json" 2>"$f.err" ||
            { echo "ddp.sh: torch_ddp.py failed:" >&2; tail -5 "$f.err" >&2; exit 1; }
        best=$("$PY" -c 'import json, sys; print(max(float(sys.argv[2]), json.load(open(sys.argv[1]))["images_per_s"]))' "$f.json" "$best")
    done
    echo "ddp $best - -" >>"$RAW"
    s_cluster sync sync
    s_cluster async async
    s_cluster syncframes sync --transport zmq
    s_cluster asyncframes async --transport zmq
    bench_round 5
done
bench_table -v steps="$STEPS" '
    { c[k, n[k]] = $3; w[k, n[k]] = $4 }
    function row(k,   j, cm, wm) {
        for (j = 1; j <= n[k]; j++) { cc[j] = c[k, j]; ww[j] = w[k, j] }
        cm = k == "ddp" ? "-" : sprintf("%.1f", median(cc, n[k])); wm = k == "ddp" ? "-" : sprintf("%.1f", median(ww, n[k]))
        printf "%-40s %10.0f %7.0f-%-7.0f %8.2fx %11s %9s\n", label[k], median(a, n[k]), lo, hi, median(rr, n[k]), cm, wm
    }
    END {
        printf "\n%-40s %10s %15s %9s %11s %9s\n", "2 workers, 1 thread, batch 64, " steps " steps", "images/s", "(min-max)", "vs DDP", "compute_ms", "wait_ms"
        label["ddp"] = "PyTorch DDP, gloo, 2 processes"
        label["sync"] = "downpour local --mode sync"
        label["async"] = "downpour local --mode async"
        label["syncframes"] = "... --mode sync --transport zmq"
        label["asyncframes"] = "... --mode async --transport zmq"
        rows("ddp sync async syncframes asyncframes", "ddp")
        footer("vs DDP", "ddp", "DDP")
    }'
