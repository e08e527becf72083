#!/usr/bin/env bash
# make bench: Downpour's CPU training throughput (forward + backward + momentum
# SGD, images/s) on the default network at batch 32, 64, 128 with 1 and 2
# threads, side by side with PyTorch on the same network and batch when
# Debian's python3-torch imports under /usr/bin/python3; then end-to-end rows
# from the real binaries (standalone worker, and 1 PS + 2 async workers).
#
# Measures: tests/bench/bench_train (the worker's training step over worker/net
# on a fixed synthetic batch) and tests/bench/torch_train.py. Every figure is a
# median of several samples, and the processes are interleaved round by round
# (Downpour, PyTorch, Downpour, ...) so that load from other users of a shared
# machine falls on both sides of each ratio alike. Every sample lands in
# $OUT/samples.txt first and the table is printed from that file alone, so
# `BENCH_REPORT=FILE tests/bench/run.sh` prints a kept run's table again.
#
# Downpour's rows run twice: with the environment's OpenBLAS variables
# (OPENBLAS_CORETYPE=Haswell here pins OpenBLAS to AVX2 kernels and halves
# sgemm) and with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset for that command
# alone; PyTorch (whose fully connected layers also call OpenBLAS) runs under
# the same variables as the Downpour row it is compared with, and as it is
# fastest here: torch.set_num_threads(N), OPENBLAS_NUM_THREADS=1, glibc's malloc
# thresholds raised, channels_last.
#
# Knobs (environment): BUILD (build), BENCH_OUT ($BUILD/bench), BENCH_ROUNDS (3),
# BENCH_SAMPLES (2 per round), BENCH_SECONDS (0.5 per sample), BENCH_BATCHES
# (32,64,128), BENCH_THREADS ("1 2"), BENCH_PEAK_GFLOPS (415: OpenBLAS sgemm on
# 2 cores with the variables unset; the ceiling scales it by threads / 2),
# BENCH_E2E_STEPS (200 per worker; 0 leaves the end-to-end rows out),
# BENCH_TORCH=0 to leave PyTorch out, BENCH_REPORT=FILE to only print a table.
set -euo pipefail
cd "$(dirname "$0")/../.."

BUILD=${BUILD:-build}
OUT=${BENCH_OUT:-$BUILD/bench}
ROUNDS=${BENCH_ROUNDS:-3}
SAMPLES=${BENCH_SAMPLES:-2}
SECS=${BENCH_SECONDS:-0.5}
BATCHES=${BENCH_BATCHES:-32,64,128}
THREADS=${BENCH_THREADS:-1 2}
PEAK=${BENCH_PEAK_GFLOPS:-415}
E2E_STEPS=${BENCH_E2E_STEPS:-200}
PY=/usr/bin/python3   # Debian's: the python3 first on PATH may be one without torch
UNSET=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
TORCH_ENV=(env OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432
           MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456)
BENCH=$BUILD/tests/bench_train

# ---- the report: everything from one samples file -------------------------
# Lines: "meta KEY VALUE...", "VARIANT sample IMPL THREADS BATCH IMAGES_PER_S LOSS",
# "VARIANT sgemm THREADS GFLOPS", "VARIANT e2e NAME IMAGES_PER_S".
s_report() {
    awk -v peak="$PEAK" '
    function median(key,   n, i, j, t, a) {
        n = cnt[key]
        for (i = 1; i <= n; i++) a[i] = val[key, i]
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        lo[key] = a[1]; hi[key] = a[n]
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function spread(key,   m, s) {   # the median, noting (max-min)/median
        m = median(key); s = (hi[key] - lo[key]) / m; spreads[++nspread] = s
        if (s >= worst) { worst = s; wcell = key }
        return m
    }
    function add(list, x) { if (!((list, x) in have)) { have[list, x] = 1; order[list, ++norder[list]] = x } }
    $1 == "meta"   { k = $2; $1 = ""; $2 = ""; sub(/^ +/, ""); meta[k] = $0; next }
    $2 == "sample" { k = $1 SUBSEP $3 SUBSEP $4 SUBSEP $5; val[k, ++cnt[k]] = $6
                     add("v", $1); add("t", $4); add("b", $5); if ($3 == "torch") torch = 1 }
    $2 == "sgemm"  { k = $1 SUBSEP "sgemm" SUBSEP $3; val[k, ++cnt[k]] = $4; add("sg", $1 SUBSEP $3) }
    $2 == "e2e"    { e2e[$3] = $4 }
    END {
        mflop = meta["mflop"] + 0 > 0 ? meta["mflop"] + 0 : 73.6
        printf "Training throughput, images/s: forward + backward + momentum SGD, synthetic batch\n"
        printf "(tests/bench/bench_train over worker/net vs tests/bench/torch_train.py; medians)\n\n"
        printf "%7s %5s  %-38s %9s %9s %7s %8s   %s\n", "threads", "batch", "OpenBLAS variables",
               "Downpour", "PyTorch", "ratio", "ceiling", "best: Downpour PyTorch ratio"
        worst = 0
        for (ti = 1; ti <= norder["t"]; ti++) for (bi = 1; bi <= norder["b"]; bi++) for (vi = 1; vi <= norder["v"]; vi++) {
            T = order["t", ti]; B = order["b", bi]; v = order["v", vi]
            kd = v SUBSEP "downpour" SUBSEP T SUBSEP B; kt = v SUBSEP "torch" SUBSEP T SUBSEP B
            if (!cnt[kd]) continue
            d = spread(kd); n = cnt[kd]; bd = hi[kd]
            ceil = peak * 1e9 * T / 2 / (mflop * 1e6)
            label = v == "unset" ? "unset (env -u ...)" : meta["envlabel"]
            if (cnt[kt] > 0) {
                t = spread(kt); bt = hi[kt]
                printf "%7d %5d  %-38s %9.0f %9.0f %6.2fx %7.0f%%   %14.0f %7.0f %5.2fx\n", T, B, label,
                       d, t, d / t, 100 * d / ceil, bd, bt, bd / bt
            } else
                printf "%7d %5d  %-38s %9.0f %9s %7s %7.0f%%   %14.0f %7s %6s\n", T, B, label, d, "-", "-",
                       100 * d / ceil, bd, "-", "-"
        }
        if (torch) printf "\nratio = Downpour / PyTorch, same threads, batch and OpenBLAS variables (>1: Downpour faster).\n"
        else printf "\nPyTorch: left out (%s).\n", meta["torch"]
        printf "best = the fastest sample of each cell (what a quiet machine approaches when others use the CPU).\n"
        printf "ceiling = Downpour median / (%g GFLOP/s x threads/2 / %.1f MFLOP per image), where %g GFLOP/s is\n", peak, mflop, peak
        printf "  OpenBLAS sgemm on 2 cores, variables unset: %.0f images/s on 2 threads, %.0f on 1.\n",
               peak * 1e9 / (mflop * 1e6), peak * 1e9 / 2 / (mflop * 1e6)
        for (i = 2; i <= nspread; i++) { x = spreads[i]; for (j = i - 1; j >= 1 && spreads[j] > x; j--) spreads[j + 1] = spreads[j]; spreads[j + 1] = x }
        split(wcell, f, SUBSEP)
        printf "%d samples per cell; spread (max-min)/median: typically %.0f%%, widest %.0f%% (%s, %s threads, batch %s, %s).\n",
               n, 100 * spreads[int((nspread + 1) / 2)], 100 * worst, f[2], f[3], f[4], f[1]
        if (norder["sg"]) {
            printf "sgemm now, 1024^3 per thread (GFLOP/s, median):"
            for (i = 1; i <= norder["sg"]; i++) { split(order["sg", i], f, SUBSEP)
                printf "  %s %st %.0f", f[1], f[2], median(f[1] SUBSEP "sgemm" SUBSEP f[2]) }
            printf "\n"
        }
        if (("standalone" in e2e) || ("local" in e2e)) {
            printf "\nEnd to end through the binaries (Fashion-MNIST, data on a prefetch thread; OpenBLAS variables unset):\n"
            printf "  %-70s %6.0f images/s\n", "downpour-worker --standalone, batch 64, 2 threads (training loop only)", e2e["standalone"]
            printf "  %-70s %6.0f images/s\n", "downpour local --workers 2 --mode async, batch 64 (1 PS + 2 x 1 thread)", e2e["local"]
        }
        printf "\n%s: other load %s cores busy before, %s after (of %s); bench took %s s.\n",
               meta["date"], meta["busy0"], meta["busy1"], meta["cores"], meta["took"]
        if (meta["busy0"] + 0 > 0.3 || meta["busy1"] + 0 > 0.3)
            printf "NOTE: other processes were using the CPU: these numbers are low and noisy; rerun on a quiet machine.\n"
    }' "$1"
}

if [ -n "${BENCH_REPORT:-}" ]; then
    s_report "$BENCH_REPORT"
    exit 0
fi

# ---- measuring ------------------------------------------------------------
for f in "$BENCH" "$BUILD/downpour-worker" "$BUILD/downpour"; do
    if [ ! -x "$f" ]; then
        echo "bench: $f is missing; run 'make bench' (it builds everything first)" >&2
        exit 1
    fi
done
mkdir -p "$OUT"
RAW=$OUT/samples.txt
: >"$RAW"
: >"$OUT/torch.log"

# Busy cores over one second, from /proc/stat (everything but idle and iowait).
s_busy() {
    local a b
    read -r -a a </proc/stat; sleep 1; read -r -a b </proc/stat
    awk -v a="${a[*]:1:8}" -v b="${b[*]:1:8}" -v cores="$(nproc)" 'BEGIN {
        split(a, x, " "); split(b, y, " "); busy = 0; idle = 0
        for (i = 1; i <= 8; i++) { d = y[i] - x[i]; if (i == 4 || i == 5) idle += d; else busy += d }
        printf "%.2f", (busy + idle > 0 ? cores * busy / (busy + idle) : 0) }'
}

# Which OpenBLAS settings Downpour runs under: the environment's, and unset.
if [ -n "${OPENBLAS_CORETYPE:-}${OPENBLAS_L2_SIZE:-}" ]; then
    VARIANTS="env unset"
    ENV_LABEL="as set (CORETYPE=${OPENBLAS_CORETYPE:-unset} L2_SIZE=${OPENBLAS_L2_SIZE:-unset})"
else
    VARIANTS="unset"
    ENV_LABEL="(not set)"
fi
s_run() {   # s_run VARIANT CMD...: CMD under that variant's OpenBLAS variables
    local v=$1; shift
    if [ "$v" = unset ]; then "${UNSET[@]}" "$@"; else "$@"; fi
}

HAVE_TORCH=0
TORCH_WHY="BENCH_TORCH=0"
if [ "${BENCH_TORCH:-1}" != 0 ]; then
    if [ -x "$PY" ] && TV=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
        HAVE_TORCH=1
    else
        TORCH_WHY="torch does not import under $PY; apt-get install python3-torch"
    fi
fi

CORES=$(nproc)
echo "== make bench: $(date '+%Y-%m-%d %H:%M %Z'), $(lscpu | sed -n 's/^Model name: *//p' | head -1)," \
     "$CORES cores, $(free -g | awk '/^Mem:/ {print $2}') GiB"
BUSY0=$(s_busy)
echo "other load before starting: $BUSY0 of $CORES cores busy (load average $(cut -d' ' -f1-3 /proc/loadavg))"
if [ "$HAVE_TORCH" = 1 ]; then echo "PyTorch $TV ($PY)"; else echo "PyTorch: left out: $TORCH_WHY"; fi
{
    echo "meta date $(date '+%Y-%m-%d %H:%M %Z')"
    echo "meta cores $CORES"
    echo "meta busy0 $BUSY0"
    echo "meta envlabel $ENV_LABEL"
    echo "meta torch $([ "$HAVE_TORCH" = 1 ] && echo "$TV" || echo "$TORCH_WHY")"
} >>"$RAW"
echo "commands, each round, for T in $THREADS, as the environment has it and prefixed with '${UNSET[*]}':"
echo "  $BENCH -t T -b $BATCHES -s $SECS -r $SAMPLES"
[ "$HAVE_TORCH" = 1 ] && echo "  ${TORCH_ENV[*]} $PY tests/bench/torch_train.py --threads T --batches $BATCHES --seconds $SECS --samples $SAMPLES"

t_start=$(date +%s)
for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS ..."
    for T in $THREADS; do
        for v in $VARIANTS; do
            s_run "$v" "$BENCH" -t "$T" -b "$BATCHES" -s "$SECS" -r "$SAMPLES" >"$OUT/last.txt"
            sed "s/^/$v /" "$OUT/last.txt" >>"$RAW"
            if [ "$HAVE_TORCH" = 1 ]; then
                # a PyTorch failure costs its cells, not the run (its stderr: torch.log)
                s_run "$v" "${TORCH_ENV[@]}" "$PY" tests/bench/torch_train.py --threads "$T" \
                    --batches "$BATCHES" --seconds "$SECS" --samples "$SAMPLES" 2>>"$OUT/torch.log" \
                    | sed "s/^/$v /" >>"$RAW" \
                    || echo "bench: torch_train.py failed ($T threads, variables $v); see $OUT/torch.log" >&2
            fi
        done
    done
done
echo "meta mflop $(sed -n 's/.*; \([0-9.]*\) MFLOP per training image/\1/p' "$OUT/last.txt" | head -1)" >>"$RAW"
echo "sgemm ..."
for v in $VARIANTS; do
    for T in $THREADS; do
        s_run "$v" "$BENCH" -g -t "$T" -s "$SECS" -r 3 | sed "s/^/$v /" >>"$RAW"
    done
done

# End to end, through the real binaries on Fashion-MNIST (OpenBLAS variables unset).
if [ "$E2E_STEPS" -gt 0 ]; then
    s_ips() { awk -F: '/"images_per_s"/ { gsub(/[ \t,]/, "", $2); print $2 + 0 }' "$1"; }
    E2E_CMD=("$BUILD/downpour-worker" --standalone --steps "$E2E_STEPS" --batch 64 --threads 2
             --no-progress --summary "$OUT/standalone.json")
    DIST_CMD=("$BUILD/downpour" local --workers 2 --mode async --steps "$E2E_STEPS" --batch 64
              --threads 1 --no-progress --out "$OUT/local")
    echo "end to end: ${UNSET[*]} ${E2E_CMD[*]}"
    "${UNSET[@]}" "${E2E_CMD[@]}" >"$OUT/standalone.log" 2>&1 \
        || { echo "bench: downpour-worker --standalone failed:" >&2; tail -5 "$OUT/standalone.log" >&2; exit 1; }
    echo "unset e2e standalone $(s_ips "$OUT/standalone.json")" >>"$RAW"
    rm -rf "$OUT/local"
    echo "end to end: ${UNSET[*]} ${DIST_CMD[*]}"
    "${UNSET[@]}" "${DIST_CMD[@]}" >"$OUT/local.log" 2>&1 \
        || { echo "bench: downpour local failed:" >&2; tail -5 "$OUT/local.log" >&2; exit 1; }
    echo "unset e2e local $(s_ips "$OUT/local/summary.json")" >>"$RAW"
fi
{
    echo "meta busy1 $(s_busy)"
    echo "meta took $(( $(date +%s) - t_start ))"
} >>"$RAW"

echo
s_report "$RAW"
echo "(raw samples: $RAW; BENCH_REPORT=$RAW $0 prints this table again)"
