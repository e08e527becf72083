#!/usr/bin/env bash
# heads.sh: is a slower 1 PS + 1 worker the machine or a change? The same
# check at two builds side by side, round by round: for each build, the
# standalone trainer and `downpour local --workers 1 --mode async` (and, for
# the second, --mode sync), 1 thread, batch 64, the default network on
# Fashion-MNIST; each run's summary images_per_s. Prints every sample and,
# per build, the median of the per-round ratios to that build's standalone.
#
#   git worktree add /tmp/old 869e79d && make -C /tmp/old CUDA=0 all
#   tests/bench/heads.sh /tmp/old .
#
# Knobs: BENCH_HEADS_ROUNDS (3), BENCH_HEADS_STEPS (300).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=heads.sh
[ $# = 2 ] || { echo "usage: tests/bench/heads.sh OLD_TREE NEW_TREE (each built)" >&2; exit 2; }
ROUNDS=${BENCH_HEADS_ROUNDS:-3}
STEPS=${BENCH_HEADS_STEPS:-300}
for t in "$1" "$2"; do bench_require "make in $t" "$t/build/downpour-worker" "$t/build/downpour"; done
bench_openblas
out=$(mktemp -d)
bench_samples "$out"
bench_start "1 PS + 1 worker against standalone at $1 and $2"

# one TAG TREE sa|MODE: a run; "TAG IMAGES_PER_S" into $RAW.
one() {
    local tag=$1 tree=$2 how=$3 d=$out/$1-$r
    if [ "$how" = sa ]; then
        bench_run "$tag" "$d.log" "$tree/build/downpour-worker" --standalone --steps "$STEPS" --batch 64 \
            --threads 1 --no-progress --summary "$d.json"
    else
        bench_run "$tag" "$d.log" "$tree/build/downpour" local --workers 1 --mode "$how" --steps "$STEPS" \
            --batch 64 --threads 1 --no-progress --out "$d"
        cp "$d/summary.json" "$d.json"
    fi
    /usr/bin/python3 -c 'import json, sys; print(sys.argv[2], round(json.load(open(sys.argv[1]))["images_per_s"]))' \
        "$d.json" "$tag" >>"$RAW"
}
for ((r = 1; r <= ROUNDS; r++)); do
    one a-standalone "$1" sa
    one a-async "$1" async
    one b-standalone "$2" sa
    one b-async "$2" async
    one b-sync "$2" sync
    bench_round 5
done
bench_table '
    function row(k) { printf "%-14s median %5.0f  (%.0f-%.0f)  vs its standalone %.3fx\n", k, median(a, n[k]), lo, hi,
                             median(rr, n[k]) }
    END { rows("a-standalone a-async", "a-standalone"); rows("b-standalone b-async b-sync", "b-standalone")
          footer("vs its standalone", "a-standalone", "standalone of the same build") }'
