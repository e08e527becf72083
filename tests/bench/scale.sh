#!/usr/bin/env bash
# tests/bench/scale.sh (`make bench-scale`): how far the parameter server
# scales on this machine, through `downpour bench scale` (real downpour-ps
# shards, worker processes pushing a precomputed gradient as fast as it is
# acknowledged, async, no compute):
#   - pushes/s as the workers grow (1 2 4 8 16 32 64 processes) with 1, 2 and
#     4 shards, on the default model (6.65 MB per push);
#   - pushes/s and MB/s as the model grows (1 M to 100 M parameters, 4 to
#     400 MB per push), with 1 and 2 workers on 1 shard;
#   - a worker's whole exchange, a pull before every push (--pull), with 1
#     and 2 workers on 1 shard, default model;
# and, in the same run, the server's apply alone (tests/bench/bench_optim)
# and a plain ZeroMQ round trip of the default model (downpour bench wire),
# which the prediction for a larger cluster needs.
#
# Every point runs once per round and the rounds are interleaved, so that
# other load on a shared machine falls on all points alike; a figure is the
# median over the rounds of each run's own median over its windows, with
# the rounds' min and max as its error bar. Each run's JSON line lands in
# $OUT/samples.txt first and everything after is made from that file, so
# `SCALE_REPORT=FILE tests/bench/scale.sh` remakes the tables and plots.
#
# A point whose gradients, pulls and server copies would not fit in half of
# the memory available is skipped and said so. With more processes than
# cores (64 workers on 2 cores) the figure is what this machine's CPU
# sustains for servers and workers together, not the servers' own limit.
#
# Out: $OUT/samples.txt, workers.dat, params.dat, report.md and, when
# gnuplot is installed (Debian's gnuplot-nox: `make bench-scale` installs
# it), scale-workers.png and scale-params.png in $SCALE_PNG_DIR.
#
# Knobs (environment): BUILD (build), SCALE_OUT ($BUILD/bench/scale),
# SCALE_PNG_DIR ($SCALE_OUT), SCALE_ROUNDS (3), SCALE_WORKERS ("1 2 4 8 16
# 32 64"), SCALE_SHARDS ("1 2 4"), SCALE_PARAMS ("1000000 3000000 6000000 10000000
# 30000000 100000000"), SCALE_PARAMS_WORKERS ("1 2"), SCALE_SECONDS (3: the
# measured span of a point; 2x from 30 M parameters), SCALE_REPORT=FILE.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=bench-scale

BUILD=${BUILD:-build}
OUT=${SCALE_OUT:-$BUILD/bench/scale}
PNG=${SCALE_PNG_DIR:-$OUT}
ROUNDS=${SCALE_ROUNDS:-3}
WORKERS=${SCALE_WORKERS:-1 2 4 8 16 32 64}
SHARDS=${SCALE_SHARDS:-1 2 4}
PARAMS=${SCALE_PARAMS:-1000000 3000000 6000000 10000000 30000000 100000000}
PWORKERS=${SCALE_PARAMS_WORKERS:-1 2}
SECS=${SCALE_SECONDS:-3}
PY=/usr/bin/python3
DP=$BUILD/downpour

s_finish() { # samples file: the tables, the data files, the plots
    mkdir -p "$OUT" "$PNG"
    "$PY" tests/bench/scale_report.py "$1" "$OUT" | tee "$OUT/report.md"
    if command -v gnuplot >/dev/null; then
        local note
        note=$(awk '$1 == "meta" { k = $2; $1 = $2 = ""; sub(/^ +/, ""); m[k] = $0 }
            END { printf "%s, %s, %s cores; load average %s before, %s after; %s rounds, median and min-max",
                  m["date"], m["cpu"], m["cores"], m["load0"], m["load1"], m["rounds"] }' "$1")
        gnuplot -e "dir='$OUT'; png='$PNG'; note='$note'" tests/bench/scale.gp
        echo "plots: $PNG/scale-workers.png $PNG/scale-params.png"
    else
        echo "plots: left out: gnuplot is not installed (apt-get install gnuplot-nox)"
    fi
}

if [ -n "${SCALE_REPORT:-}" ]; then
    s_finish "$SCALE_REPORT"
    exit 0
fi

bench_require "'make bench-scale' (it builds everything first)" "$DP" "$BUILD/downpour-ps" "$BUILD/tests/bench_optim"
bench_samples "$OUT"

s_avail_mb() { awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo; }

# s_point KIND ROUND WORKERS SHARDS PARAMS|- : one run, its JSON line into
# $RAW as "KIND ROUND JSON" (or "KIND ROUND skip|fail WHY"); KIND pull: a
# pull before every push.
s_point() {
    local kind=$1 r=$2 w=$3 k=$4 p=$5 secs=$SECS warm=1 win=10 args=()
    if [ "$kind" = pull ]; then args=(--pull); fi
    if [ "$p" = - ]; then
        p=1663370
    else
        args+=(--params "$p")
        if [ "$p" -ge 30000000 ]; then secs=$((2 * SECS)) warm=2 win=4; fi
    fi
    # each worker: its gradient and the first pull's vector; the server: the
    # parameters, a pull snapshot and one message per worker in flight
    local need=$(( p * 4 * (2 * w + 2 + w) / 1048576 )) avail
    avail=$(s_avail_mb)
    if [ "$need" -gt $((avail / 2)) ]; then
        echo "$kind $r skip $w workers, $k shards, $p params: needs ~$need MB, $avail MB available"
        echo "$kind $r skip workers=$w shards=$k params=$p need_mb=$need avail_mb=$avail" >>"$RAW"
        return 0
    fi
    local line
    if line=$("$DP" bench scale --workers "$w" --shards "$k" "${args[@]}" --seconds "$secs" \
        --warmup "$warm" --windows "$win" --json 2>"$OUT/last.err" | tail -n 1) &&
        [ "${line:0:1}" = "{" ]; then
        echo "$kind $r $line" >>"$RAW"
        local rate=${line#*\"pushes_per_s\":}
        printf '  %-7s %2d workers %d shards %10d params: %s pushes/s\n' "$kind" "$w" "$k" "$p" \
            "${rate%%,*}"
    else
        echo "$kind $r fail workers=$w shards=$k params=$p $(tail -n 1 "$OUT/last.err")" | tee -a "$RAW"
    fi
}

CORES=$(nproc)
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
    echo "meta date $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "meta cpu $CPU"
    echo "meta cores $CORES"
    echo "meta mem_gib $(free -g | awk '/^Mem:/ {print $2}')"
    echo "meta commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "meta load0 $(bench_load)"
    echo "meta rounds $ROUNDS"
    echo "meta seconds $SECS"
} >>"$RAW"
echo "== bench-scale: $(date -u '+%Y-%m-%d %H:%M UTC'), $CPU, $CORES cores; load average $(bench_load)"
echo "each point: $DP bench scale --workers W --shards K [--params P] --seconds S --warmup 1 --windows 10 --json"

# The server's parts, measured in the same run: apply alone (in cache and
# out of it) and the plain ZeroMQ round trip of the default model's bytes.
"$BUILD/tests/bench_optim" -r 20 | sed 's/^/optim /' >>"$RAW" || echo "optim fail" >>"$RAW"
"$BUILD/tests/bench_optim" -n 25000000 -r 8 | sed 's/^/optim100 /' >>"$RAW" || echo "optim100 fail" >>"$RAW"
"$DP" bench wire --rounds 10 --json | tail -n 1 | sed 's/^/wire 0 /' >>"$RAW" || echo "wire 0 fail" >>"$RAW"

t0=$(date +%s)
for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS (load average $(bench_load))"
    for w in $WORKERS; do
        for k in $SHARDS; do s_point workers "$r" "$w" "$k" -; done
    done
    for p in $PARAMS; do
        for w in $PWORKERS; do s_point params "$r" "$w" 1 "$p"; done
    done
    for w in $PWORKERS; do s_point pull "$r" "$w" 1 -; done
done
{
    echo "meta load1 $(bench_load)"
    echo "meta took $(( $(date +%s) - t0 ))"
} >>"$RAW"
echo
s_finish "$RAW"
echo "(raw samples: $RAW; SCALE_REPORT=$RAW $0 remakes the tables and plots)"
