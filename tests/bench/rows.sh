#!/usr/bin/env bash
# rows.sh: sparse rows on the servers (issue 35), round by round on this
# machine:
#   pull-D, push-D, memcpy-D   `downpour bench rows --dim D` (D = 16, 64):
#               rows per second pulled and pushed by key through one real
#               shard holding 262144 rows, 4096 distinct random keys a
#               request, beside a memcpy of the same rows' bytes (medians
#               of its 50 rounds); and the bytes a request moves against a
#               dense pull of the same table
#   ctr         the planted CTR model (embed:16 relu fc:32 relu fc:2
#               softmax) on `downpour gen-libsvm` data, 2 async workers over
#               2 shards through downpour local: samples per second (the
#               chief's rate times the workers) over E epochs of a file whose
#               samples touch K keys each, so that E x samples x K keys are
#               touched over the run; and the servers' bytes per row held
#               (their rows_bytes over rows, from each shard's last
#               metrics line)
# Knobs: BENCH_ROWS_ROUNDS (3), BENCH_ROWS_SAMPLES (100000 a file),
# BENCH_ROWS_NNZ (100 keys a sample), BENCH_ROWS_KEYS (10000000 possible
# keys), BENCH_ROWS_EPOCHS (10: with the defaults 10^8 keys touched).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=rows.sh
ROUNDS=${BENCH_ROWS_ROUNDS:-3}
SAMPLES=${BENCH_ROWS_SAMPLES:-100000}
NNZ=${BENCH_ROWS_NNZ:-100}
KEYS=${BENCH_ROWS_KEYS:-10000000}
EPOCHS=${BENCH_ROWS_EPOCHS:-10}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
bench_require make "$BUILD/downpour" "$BUILD/downpour-ps" "$BUILD/downpour-worker"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bench_samples "$out"
bench_start "sparse rows: by key per shard against memcpy; the planted CTR model, 2 async workers"
"$BUILD/downpour" gen-libsvm --out-train "$out/train.svm" --samples "$SAMPLES" --test-samples 10000 \
    --out-test "$out/test.svm" --keys "$KEYS" --nnz "$NNZ" --seed 3 >"$out/gen.log" 2>&1
touched=$((EPOCHS * SAMPLES * NNZ))
json() { "$PY" -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }
for ((r = 1; r <= ROUNDS; r++)); do
    for d in 16 64; do
        bench_run "rows-$d" "$out/rows$d.log" "$BUILD/downpour" bench rows --dim $d --json
        for k in pull push memcpy; do
            echo "$k-$d $(json "$out/rows$d.log" ${k}_rows_per_s)" >>"$RAW"
        done
        echo "bytes-$d $(json "$out/rows$d.log" pull_bytes) $(json "$out/rows$d.log" dense_bytes)" \
            >"$out/bytes-$d"
    done
    rm -rf "$out/ctr"
    bench_run ctr "$out/ctr.log" "$BUILD/downpour" local --workers 2 --ps-shards 2 --mode async \
        --model 'embed:16 relu fc:32 relu fc:2 softmax' --data "libsvm:$out/train.svm:$out/test.svm" \
        --lr 0.01 --row-lr 0.05 --epochs "$EPOCHS" --batch 128 --threads 1 --no-progress --out "$out/ctr"
    "$PY" - "$out/ctr" >>"$RAW" <<'EOF'
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
print("ctr %.0f" % s["images_per_s"])
rows = nbytes = 0
for k in range(2):
    last = [json.loads(l) for l in open("%s/metrics/ps-%d.jsonl" % (d, k)) if '"rows"' in l][-1]
    rows += last["rows"]
    nbytes += last["rows_bytes"]
print("bytes-per-row %.1f" % (nbytes / rows))
print("rows-held %d" % rows)
print("test-auc %.4f" % s["test_auc"])
EOF
    bench_round 10
done
for d in 16 64; do
    read -r _ pb db <"$out/bytes-$d"
    echo "D = $d: a pull of 4096 rows moves $pb bytes; a dense pull of the 262144-row table $db ($(awk -v a="$db" -v b="$pb" 'BEGIN { printf "%.0f", a / b }')x)"
done
echo "ctr: $SAMPLES samples x $NNZ keys x $EPOCHS epochs = $touched keys touched over the run (possible keys: $KEYS)"
bench_table '
    function note(k) {
        if (k ~ /^(pull|push)-/) { split(k, p, "-"); return sprintf("  = 1/%.0f of memcpy", med["memcpy-" p[2]] / med[k]) }
        return ""
    }
    function row(k,   f) { med[k] = median(a, n[k]); f = k == "test-auc" ? "%.4f" : "%.1f"
                      printf "%-14s median %12s  (%s-%s)%s\n", k, sprintf(f, med[k]), sprintf(f, lo),
                             sprintf(f, hi), note(k) }
    END { rows("memcpy-16 pull-16 push-16 memcpy-64 pull-64 push-64 ctr bytes-per-row rows-held test-auc", "memcpy-16")
          printf "(rows/s for pull, push and memcpy; samples/s for ctr)\n"
          printf "load average (1, 5, 15 min) before: %s; after: %s\n", load0, load1 }'
