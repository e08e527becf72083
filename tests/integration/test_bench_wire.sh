#!/usr/bin/env bash
# test_bench_wire: `downpour bench wire` starts real shards and a raw ZeroMQ
# echo, ends with one JSON line holding the documented fields (positive
# medians of the rounds asked for), over tcp, ipc and shared memory, with 1
# and 2 shards, and with a bfloat16 wire;
# bad flags are refused with one line and status 2; nothing is left behind.
# Timing is not asserted: benchmarks are not tests.
source "$(dirname "$0")/lib.sh"
L=$BIN/downpour

fields_ok() { # file: the last line is JSON with every field, medians > 0
    tail -n 1 "$1" | "$TORCH_PY" -c '
import json, sys
o = json.loads(sys.stdin.read())
need = ["bytes", "shards", "pull_ms", "push_ms", "roundtrip_ms", "raw_zmq_roundtrip_ms", "ratio",
        "pull_copy_ms", "ratio_copy"]
missing = [k for k in need if k not in o]
assert not missing, "missing %s" % missing
assert all(o[k] > 0 for k in need), o
assert o["rounds"] == int(sys.argv[1]), o
print(o)' "$2"
}

"$L" bench wire --bytes 200000 --rounds 4 --warmup 1 --json >"$TMP/tcp.log" 2>&1
check "bench wire over tcp exits 0" test $? = 0
check "... its last line is the JSON object" fields_ok "$TMP/tcp.log" 4
"$L" bench wire --bytes 200000 --shards 2 --transport ipc --optimizer adam --rounds 3 --json >"$TMP/ipc.log" 2>&1
check "bench wire, 2 shards over ipc, adam, exits 0" test $? = 0
check "... its last line is the JSON object" fields_ok "$TMP/ipc.log" 3
check "... with 2 shards" grep -q '"shards":2' "$TMP/ipc.log"

"$L" bench wire --bytes 200000 --wire bf16 --crc on --rounds 3 --json >"$TMP/bf16.log" 2>&1
check "bench wire --wire bf16 --crc on exits 0" test $? = 0
check "... its last line is the JSON object, saying bf16" \
    bash -c "tail -n 1 '$TMP/bf16.log' | grep -q '\"wire\":\"bf16\"'"

touch "$TMP/start-mark"
"$L" bench wire --bytes 200000 --shards 2 --transport shm --optimizer adam --rounds 3 --json >"$TMP/shm.log" 2>&1
check "bench wire, 2 shards through shared memory, exits 0" test $? = 0
check "... its last line is the JSON object" fields_ok "$TMP/shm.log" 3
check "... says shm and the ratio to two memcpys" grep -q '"transport":"shm".*"memcpy_ratio":' "$TMP/shm.log"
check "no shared-memory segment left behind" \
    bash -c "! find /dev/shm -maxdepth 1 -name 'downpour-*' -newer '$TMP/start-mark' | grep -q ."

"$L" bench wire --shards 0 >"$TMP/bad.log" 2>&1
rc=$?
check "--shards 0 refused with status 2 (got $rc)" test $rc = 2
check "... in one line" test "$(wc -l <"$TMP/bad.log")" = 1
"$L" bench wire --optimizer sgdd >"$TMP/bad2.log" 2>&1
check "an unknown optimizer is refused (status 2)" test $? = 2
# downpour bench rows: rows by key through 2 real shards; the bytes are the
# keys' and rows' (500 keys of width 16: 500 x (8 + 64) each way)
"$L" bench rows --dim 16 --keys 500 --table 5000 --shards 2 --rounds 3 --warmup 1 --json \
    >"$TMP/rows.log" 2>&1
rc=$?  # before the message's $(...) resets it
check "bench rows, 2 shards, exits 0 ($(tail -1 "$TMP/rows.log" | cut -c1-120))" test "$rc" = 0
check "... its JSON: rows/s for pull, push and memcpy; a request's bytes exactly the keys' and rows'" \
    "$TORCH_PY" -c 'import json, sys; o = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert o["pull_rows_per_s"] > 0 and o["push_rows_per_s"] > 0 and o["memcpy_rows_per_s"] > 0, o
assert o["pull_bytes"] == o["push_bytes"] == 500 * 72 and o["dense_bytes"] == 5000 * 64, o' "$TMP/rows.log"
"$L" bench rows --keys 6000 --table 5000 >"$TMP/bad3.log" 2>&1
rc=$?
check "bench rows: more keys than the table's rows refused (status $rc), one line" \
    bash -c "test $rc = 2 && [ \$(wc -l <'$TMP/bad3.log') = 1 ]"
check "no bench rows scratch directory left behind" bash -c "! ls -d /tmp/downpour-bench-rows-* 2>/dev/null | grep -q ."
# (the bench's shards are the ones with a ready file in its scratch directory;
# other clusters may run on a shared machine)
check "no downpour-ps left behind" bash -c "! pgrep -f 'downpour-p[s] --bind .* --ready-file /tmp/downpour-bench-wir[e]-' >/dev/null"
check "no scratch directory left behind" bash -c "! ls -d /tmp/downpour-bench-wire-* 2>/dev/null | grep -q ."
finish
