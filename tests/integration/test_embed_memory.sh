#!/usr/bin/env bash
# test_embed_memory: a worker of a sparse model holds its batch's rows, not
# the table. The same worker (embed:16 relu fc:8 relu fc:2 softmax, batch
# 256, 64 keys a sample) trains one epoch against two real shards twice:
# on keys from 1024 possible (about a thousand rows on the servers), and on
# 270,000 samples of keys uniform over 2^30 (over 2^24 = 16.8 million rows,
# 3 GB of the servers' memory: the table of issue 35's memory test). The
# model of the worker's memory: its process, net, readers and one batch's
# keys and rows (worker/exec/sparse_data.h: at most 128 keys a sample on
# average, their rows of D floats and gradients), nothing that grows with
# the table or the file; so its peak RSS (getrusage of the child) may
# differ between the two runs by at most 16 MB, where a copy of the large
# table's weights alone would be 2^24 x 64 bytes (1 GiB).
# dp-test: unsanitized
source "$(dirname "$0")/lib.sh"

cd "$TMP"
SPEC='embed:16 relu fc:8 relu fc:2 softmax'
# run NAME SAMPLES KEYS ZIPF: data, two shards, the worker; its peak RSS (kB) in NAME.rss
run() {
    local name=$1 samples=$2 keys=$3 zipf=$4
    "$BIN/downpour" gen-libsvm --out-train "$name.svm" --out-test "$name-test.svm" --samples "$samples" \
        --test-samples 1000 --keys "$keys" --zipf "$zipf" --nnz 64 --seed 4 >"$name.gen" 2>&1 ||
        { fail "$name: gen-libsvm" "$(tail -1 "$name.gen")"; return; }
    local i
    for i in 0 1; do
        rm -f "$name.ready$i"
        bg "$BIN/downpour-ps" --bind tcp://127.0.0.1:0 --ready-file "$name.ready$i" --shard "$i/2" \
            --workers 1 --mode async --model "$SPEC" --input 1x1x1 --metrics "$name-ps$i.jsonl" \
            >"$name-ps$i.log" 2>&1
    done
    for i in 0 1; do
        local t=0; until [ -s "$name.ready$i" ] || [ $t -ge 100 ]; do sleep 0.1; t=$((t + 1)); done
    done
    "$TORCH_PY" -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$name.rss" "$BIN/downpour-worker" --ps "$(cat "$name.ready0"),$(cat "$name.ready1")" \
        --task-index 0 --model "$SPEC" --data "libsvm:$name.svm:$name-test.svm" --epochs 1 --batch 256 \
        --threads 1 --no-progress --summary "$name.json" >"$name.log" 2>&1
    check "$name: the worker trains an epoch and ends the run (exit 0)" test $? = 0
}
# rows NAME: the rows the servers hold and their bytes (the shards' last metrics lines)
rows() { "$TORCH_PY" -c 'import json, sys
rows = nbytes = 0
for i in (0, 1):
    last = [json.loads(l) for l in open("%s-ps%d.jsonl" % (sys.argv[1], i)) if "\"rows\"" in l][-1]
    rows += last["rows"]; nbytes += last["rows_bytes"]
print(rows, nbytes)' "$1"; }

run small 30000 1024 1.1
run large 270000 1073741824 0
read -r small_rows small_bytes <<<"$(rows small)"
read -r large_rows large_bytes <<<"$(rows large)"
check "the small run's table: at most 1024 rows ($small_rows)" test "${small_rows:-0}" -le 1024
check "the large run's table: over 2^24 rows, over 2.5 GB on the servers ($large_rows rows, $large_bytes bytes)" \
    bash -c "[ ${large_rows:-0} -gt 16777216 ] && [ ${large_bytes:-0} -gt 2500000000 ]"
s=$(cat small.rss 2>/dev/null || echo 0) l=$(cat large.rss 2>/dev/null || echo 0)
check "the worker's peak RSS: $s kB on the small table, $l kB on the large one (at most 16384 kB apart)" \
    bash -c "[ $s -gt 0 ] && [ $((l - s)) -le 16384 ] && [ $((s - l)) -le 16384 ]"
finish
