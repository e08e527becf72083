#!/usr/bin/env bash
# make bench: Downpour's CPU training throughput (forward + backward + momentum
# SGD, images/s) on the default network at batch 32, 64, 128 with 1 and 2
# threads, side by side with PyTorch on the same network and batch when
# Debian's python3-torch imports under /usr/bin/python3, once per CPU kernel
# path this machine supports (kernels/cpu/isa.h: avx512, avx2, generic); then
# end-to-end rows from the real binaries (standalone worker, and 1 PS + 2
# async workers) on the default path. Then resnet20 and resnet56 (He et
# al.'s CIFAR ResNets, batch norm in training mode) at batch 128 on 1x28x28
# and 3x32x32 inputs, 1 and 2 threads, each path, beside PyTorch's
# CifarResNet (tests/torch_net.py) under the same limits and the faster of
# its layouts, interleaved the same way; and where resnet20's step's time
# goes, by layer kind (bench_train -l: the executor's per-layer clock, 2
# threads, first path).
#
# Measures: tests/bench/bench_train (the worker's training step over worker/exec/net
# on a fixed synthetic batch) and tests/bench/torch_train.py. Every figure is a
# median of several samples, and the processes are interleaved round by round
# (Downpour, PyTorch, Downpour, ...) so that load from other users of a shared
# machine falls on both sides of each ratio alike. Every sample lands in
# $OUT/samples.txt first and the table is printed from that file alone, so
# `BENCH_REPORT=FILE tests/bench/run.sh` prints a kept run's table again.
#
# Like with like: each row is one instruction-set level, and both sides are
# held to it, as if on a machine that has nothing more:
#   path     Downpour            PyTorch                                 OpenBLAS (both)
#   avx512   DP_CPU_ISA=avx512   ATEN_CPU_CAPABILITY=avx512, oneDNN free  OPENBLAS_CORETYPE=SkylakeX
#   avx2     DP_CPU_ISA=avx2     ATEN_CPU_CAPABILITY=avx2,                OPENBLAS_CORETYPE=Haswell
#                                ONEDNN_MAX_CPU_ISA=AVX2
#   generic  DP_CPU_ISA=generic  ATEN_CPU_CAPABILITY=default,             OPENBLAS_CORETYPE=Prescott
#                                ONEDNN_MAX_CPU_ISA=SSE41
# Downpour pins those cores itself (kernels/cpu/blas.h); for PyTorch's side
# OPENBLAS_CORETYPE is set per row on x86 (overriding the environment's, and
# left as the environment has it elsewhere) because OpenBLAS 0.3.21 misdetects
# some CPUs (it takes a Sapphire Rapids VM for a Prescott: sgemm at a fifth of
# its speed) and both sides' fully connected layers call it. A short
# ONEDNN_VERBOSE=1 run per row records which ISA oneDNN and ATen then use.
# PyTorch runs as it is fastest: torch.set_num_threads(N),
# OPENBLAS_NUM_THREADS=1, glibc's malloc thresholds raised, and the faster
# of channels_last and NCHW per cell (torch_train.py measures both in turn).
# The ceiling column is Downpour's median against OpenBLAS sgemm (1024^3 per
# thread) measured in the same rounds on the same row's settings and threads.
#
# Knobs (environment): BUILD (build), BENCH_OUT ($BUILD/bench), BENCH_ROUNDS (3),
# BENCH_SAMPLES (2 per round), BENCH_SECONDS (0.5 per sample), BENCH_BATCHES
# (32,64,128), BENCH_THREADS ("1 2"), BENCH_PATHS (every supported path, best
# first), BENCH_E2E_STEPS (200 per worker; 0 leaves the end-to-end rows out),
# BENCH_TORCH=0 to leave PyTorch out, BENCH_REPORT=FILE to only print a table,
# BENCH_SERVER=0 to leave out the server rows (bench_optim, downpour bench wire),
# BENCH_PYCLIENT=0 to leave out tests/bench/py_client.py (pull + push of the
# default model from Python, downpour.torch and NumPy, against the C client),
# BENCH_DDP=0 to leave out tests/bench/ddp.sh (2 workers, sync and async,
# against PyTorch DDP over gloo; its knobs are in that file),
# BENCH_TORCH_LOCAL=0 to leave out tests/bench/torch_local.sh (2 PyTorch
# workers with --local-steps 8 against the loop alone, launch's start-up),
# BENCH_A3C=0 to leave out tests/bench/a3c.sh (A3C's env steps per second,
# the C worker against the PyTorch example, 1 and 2 workers),
# BENCH_ROWS=0 to leave out tests/bench/rows.sh (rows by key per shard
# against memcpy, D = 16 and 64; the planted CTR model, 2 async workers),
# BENCH_ELASTIC=0 to leave out tests/bench/elastic.sh (--chaos kills against
# none, async and sync),
# BENCH_OVERLAP=0 to leave out tests/bench/overlap.sh (1 PS + 1 worker against
# standalone, --overlap on and off; its own knobs are in that file),
# BENCH_RESNET=0 to leave out the ResNet rows, BENCH_RESNET_MODELS
# ("resnet20 resnet56": any presets; the per-layer clock is the first's),
# BENCH_RESNET_SHAPES ("1x28x28 3x32x32"), BENCH_RESNET_PATHS (the paths above).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=bench

BUILD=${BUILD:-build}
OUT=${BENCH_OUT:-$BUILD/bench}
ROUNDS=${BENCH_ROUNDS:-3}
SAMPLES=${BENCH_SAMPLES:-2}
SECS=${BENCH_SECONDS:-0.5}
BATCHES=${BENCH_BATCHES:-32,64,128}
THREADS=${BENCH_THREADS:-1 2}
E2E_STEPS=${BENCH_E2E_STEPS:-200}
PY=/usr/bin/python3   # Debian's: the python3 first on PATH may be one without torch
TORCH_ENV=(OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=33554432
           MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456)
BENCH=$BUILD/tests/bench_train

# ---- the report: everything from one samples file -------------------------
# Lines: "meta KEY VALUE...", "PATH sample IMPL THREADS BATCH IMAGES_PER_S LOSS"
# (IMPL downpour, torch-nhwc, torch-nchw), "PATH sgemm THREADS GFLOPS",
# "PATH e2e NAME IMAGES_PER_S".
s_report() {
    awk '
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
                     add("v", $1); add("t", $4); add("b", $5); if ($3 ~ /^torch/) torch = 1 }
    $2 == "sgemm"  { k = $1 SUBSEP "sgemm" SUBSEP $3; val[k, ++cnt[k]] = $4; add("sg", $1 SUBSEP $3) }
    $2 == "e2e"    { e2e[$3] = $4; e2epath = $1 }
    $2 == "rsample" { k = $1 SUBSEP $3 SUBSEP $4 SUBSEP $5; val[k, ++cnt[k]] = $7
                      add("rv", $1); add("rs", $3); add("rt", $5); rbatch = $6 }
    $2 == "rkind"  { rk[$3, $5] = $6 " " $7 " " $8; add("rks", $3); add("rk", $5); rkpath = $1; rkt = $4 }
    END {
        mflop = meta["mflop"] + 0 > 0 ? meta["mflop"] + 0 : 73.6
        printf "Training throughput, images/s: forward + backward + momentum SGD, synthetic batch\n"
        printf "(tests/bench/bench_train over worker/exec/net vs tests/bench/torch_train.py; medians)\n"
        printf "CPU: %s; features: %s\n\n", meta["cpu"], meta["features"]
        printf "%-7s %7s %5s %9s %9s %-6s %7s %8s   %s\n", "path", "threads", "batch",
               "Downpour", "PyTorch", "layout", "ratio", "ceiling", "best: Downpour PyTorch ratio"
        worst = 0
        for (vi = 1; vi <= norder["v"]; vi++) for (ti = 1; ti <= norder["t"]; ti++) for (bi = 1; bi <= norder["b"]; bi++) {
            v = order["v", vi]; T = order["t", ti]; B = order["b", bi]
            kd = v SUBSEP "downpour" SUBSEP T SUBSEP B
            if (!cnt[kd]) continue
            d = spread(kd); n = cnt[kd]; bd = hi[kd]
            ks = v SUBSEP "sgemm" SUBSEP T
            ceil = cnt[ks] ? sprintf("%7.0f%%", 100 * d / (median(ks) * 1e9 / (mflop * 1e6))) : sprintf("%8s", "-")
            # PyTorch: the layout with the higher median in this cell
            t = 0; lay = "-"
            for (li = 1; li <= 2; li++) {
                L = li == 1 ? "nhwc" : "nchw"; kt = v SUBSEP "torch-" L SUBSEP T SUBSEP B
                if (cnt[kt] && median(kt) > t) { t = median(kt); lay = L; kbest = kt }
            }
            if (t > 0) {
                t = spread(kbest); bt = hi[kbest]
                printf "%-7s %7d %5d %9.0f %9.0f %-6s %6.2fx %s   %14.0f %7.0f %5.2fx\n", v, T, B,
                       d, t, lay, d / t, ceil, bd, bt, bd / bt
            } else
                printf "%-7s %7d %5d %9.0f %9s %-6s %7s %s   %14.0f %7s %6s\n", v, T, B, d, "-", "-", "-",
                       ceil, bd, "-", "-"
        }
        printf "\n"
        for (vi = 1; vi <= norder["v"]; vi++) { v = order["v", vi]
            printf "%s: Downpour DP_CPU_ISA=%s; OpenBLAS %s", v, v, meta["openblas_" v]
            if (torch) printf "; PyTorch %s", meta["torch_" v]
            printf "\n"
        }
        if (torch) printf "ratio = Downpour / PyTorch, same path, threads and batch (>1: Downpour faster); layout = PyTorch'"'"'s faster memory format there.\n"
        else printf "PyTorch: left out (%s).\n", meta["torch"]
        printf "best = the fastest sample of each cell (what a quiet machine approaches when others use the CPU).\n"
        printf "ceiling = Downpour median / (sgemm GFLOP/s of that row and thread count / %.1f MFLOP per image).\n", mflop
        for (i = 2; i <= nspread; i++) { x = spreads[i]; for (j = i - 1; j >= 1 && spreads[j] > x; j--) spreads[j + 1] = spreads[j]; spreads[j + 1] = x }
        split(wcell, f, SUBSEP)
        printf "%d samples per cell; spread (max-min)/median: typically %.0f%%, widest %.0f%% (%s, %s threads, batch %s, %s).\n",
               n, 100 * spreads[int((nspread + 1) / 2)], 100 * worst, f[2], f[3], f[4], f[1]
        if (norder["sg"]) {
            printf "sgemm, 1024^3 per thread, OpenBLAS as in each row (GFLOP/s, median):"
            for (i = 1; i <= norder["sg"]; i++) { split(order["sg", i], f, SUBSEP)
                printf "  %s %st %.0f", f[1], f[2], median(f[1] SUBSEP "sgemm" SUBSEP f[2]) }
            printf "\n"
        }
        if (("standalone" in e2e) || ("local" in e2e)) {
            printf "\nEnd to end through the binaries (Fashion-MNIST, data on a prefetch thread; %s path and its OpenBLAS):\n", e2epath
            printf "  %-70s %6.0f images/s\n", "downpour-worker --standalone, batch 64, 2 threads (training loop only)", e2e["standalone"]
            printf "  %-70s %6.0f images/s\n", "downpour local --workers 2 --mode async, batch 64 (1 PS + 2 x 1 thread)", e2e["local"]
        }
        if (norder["rv"]) {
            printf "\nResNet training throughput, images/s, batch %d (bench_train -m NET -i SHAPE vs torch_train.py --model NET --input SHAPE; medians)\n", rbatch
            printf "%-7s %-17s %7s %9s %9s %-6s %7s\n", "path", "network/input", "threads", "Downpour", "PyTorch", "layout", "ratio"
            for (vi = 1; vi <= norder["rv"]; vi++) for (si = 1; si <= norder["rs"]; si++) for (ti = 1; ti <= norder["rt"]; ti++) {
                v = order["rv", vi]; S = order["rs", si]; T = order["rt", ti]
                kd = v SUBSEP S SUBSEP "downpour" SUBSEP T
                if (!cnt[kd]) continue
                d = median(kd); t = 0; lay = "-"
                for (li = 1; li <= 2; li++) {
                    L = li == 1 ? "nhwc" : "nchw"; kt = v SUBSEP S SUBSEP "torch-" L SUBSEP T
                    if (cnt[kt] && median(kt) > t) { t = median(kt); lay = L }
                }
                if (t > 0) printf "%-7s %-17s %7d %9.0f %9.0f %-6s %6.2fx\n", v, S, T, d, t, lay, d / t
                else printf "%-7s %-17s %7d %9.0f %9s %-6s %7s\n", v, S, T, d, "-", "-", "-"
            }
            printf "%d samples per cell; ratio = Downpour / PyTorch (>1: Downpour faster).\n", cnt[kd]
        }
        if (norder["rk"]) {
            printf "\n%s: where Downpour'"'"'s step goes (ms per step, batch %d, %s threads, %s path; bench_train -l)\n", meta["rknet"], rbatch, rkt, rkpath
            printf "%-12s", "kind"
            for (si = 1; si <= norder["rks"]; si++) printf " %24s", order["rks", si] " fwd/bwd/share"
            printf "\n"
            for (ki = 1; ki <= norder["rk"]; ki++) { K = order["rk", ki]; printf "%-12s", K
                for (si = 1; si <= norder["rks"]; si++) { split(rk[order["rks", si], K], f, " ")
                    printf " %24s", sprintf("%.1f / %.1f / %.0f%%", f[1], f[2], f[3]) }
                printf "\n" }
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
bench_require "'make bench' (it builds everything first)" "$BENCH" "$BUILD/downpour-worker" "$BUILD/downpour"
bench_samples "$OUT"
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

# s_env PATH: the environment (NAME=VALUE words) both sides of that row run
# under: OpenBLAS's kernels for that level (x86 only); s_torch_env PATH adds
# PyTorch's own limits.
X86=0
case $(uname -m) in x86_64 | i?86) X86=1 ;; esac
s_env() {
    local ct
    case $1 in avx512) ct=SkylakeX ;; avx2) ct=Haswell ;; *) ct=Prescott ;; esac
    echo "DP_CPU_ISA=$1"
    if [ "$X86" = 1 ]; then echo "OPENBLAS_CORETYPE=$ct"; fi
}
s_torch_env() {
    case $1 in
        avx512) echo "ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=ALL" ;;
        avx2) echo "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
        *) echo "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41" ;;
    esac
}
s_run() {   # s_run PATH downpour|torch CMD...: CMD under that row's settings
    local p=$1 side=$2; shift 2
    # shellcheck disable=SC2046  # the settings are NAME=VALUE words
    if [ "$side" = torch ]; then
        env $(s_env "$p" | grep -v DP_CPU_ISA) $(s_torch_env "$p") "${TORCH_ENV[@]}" "$@"
    else
        env $(s_env "$p") "$@"
    fi
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
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
PATHS=${BENCH_PATHS:-$("$BENCH" -p | sed -n 's/^paths //p')}
FEATURES=$("$BENCH" -p | sed -n 's/^features //p')
echo "== make bench: $(date '+%Y-%m-%d %H:%M %Z'), $CPU, $CORES cores, $(free -g | awk '/^Mem:/ {print $2}') GiB"
echo "CPU features: $FEATURES; kernel paths measured: $PATHS"
BUSY0=$(s_busy)
echo "other load before starting: $BUSY0 of $CORES cores busy (load average $(cut -d' ' -f1-3 /proc/loadavg))"
if [ "$HAVE_TORCH" = 1 ]; then echo "PyTorch $TV ($PY)"; else echo "PyTorch: left out: $TORCH_WHY"; fi
{
    echo "meta date $(date '+%Y-%m-%d %H:%M %Z')"
    echo "meta cores $CORES"
    echo "meta cpu $CPU"
    echo "meta features $FEATURES"
    echo "meta busy0 $BUSY0"
    echo "meta torch $([ "$HAVE_TORCH" = 1 ] && echo "$TV" || echo "$TORCH_WHY")"
} >>"$RAW"

# What each row's limits do on PyTorch's side: the ATen capability it
# reports and the ISA / convolution kernels oneDNN says it runs.
for p in $PATHS; do
    ob=$(s_env "$p" | sed -n 's/^OPENBLAS_CORETYPE=//p')
    if [ -n "$ob" ]; then ob="OPENBLAS_CORETYPE=$ob"; else ob="as the environment has it"; fi
    echo "meta openblas_$p $ob" >>"$RAW"
    [ "$HAVE_TORCH" = 1 ] || continue
    s_run "$p" torch env ONEDNN_VERBOSE=1 "$PY" tests/bench/torch_train.py --threads 1 --batches 8 \
        --seconds 0.01 --samples 1 --warmup 1 --layout nhwc >"$OUT/onednn-$p.log" 2>&1 || true
    aten=$(sed -n 's/^# torch: ATen CPU capability //p' "$OUT/onednn-$p.log" | head -1)
    isa=$(sed -n 's/^onednn_verbose,info,cpu,isa://p' "$OUT/onednn-$p.log" | head -1)
    convs=$(awk -F, '$1 == "onednn_verbose" && $2 == "exec" && $4 == "convolution" { print $5 }' \
        "$OUT/onednn-$p.log" | sort -u | tr '\n' ' ' | sed 's/ $//')
    echo "meta torch_$p $(s_torch_env "$p"): ATen ${aten:-?}; oneDNN isa ${isa:-?}, convolutions ${convs:-?}" >>"$RAW"
done
sed -n 's/^meta torch_\([a-z0-9]*\) /PyTorch on the \1 row: /p' "$RAW"

echo "commands, each round, for T in $THREADS and each path P (settings above the table):"
echo "  env DP_CPU_ISA=P OPENBLAS_CORETYPE=... $BENCH -t T -b $BATCHES -s $SECS -r $SAMPLES"
echo "  env OPENBLAS_CORETYPE=... $BENCH -g -t T -s $SECS -r 1     (sgemm, for the ceiling)"
[ "$HAVE_TORCH" = 1 ] && echo "  env OPENBLAS_CORETYPE=... ATEN_CPU_CAPABILITY=... ONEDNN_MAX_CPU_ISA=... ${TORCH_ENV[*]} $PY tests/bench/torch_train.py --threads T --batches $BATCHES --seconds $SECS --samples $SAMPLES"

t_start=$(date +%s)
for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS ..."
    for T in $THREADS; do
        for p in $PATHS; do
            s_run "$p" downpour "$BENCH" -t "$T" -b "$BATCHES" -s "$SECS" -r "$SAMPLES" >"$OUT/last.txt"
            sed "s/^/$p /" "$OUT/last.txt" >>"$RAW"
            # the ceiling's sgemm in every round too, so that it sees the same load
            s_run "$p" downpour "$BENCH" -g -t "$T" -s "$SECS" -r 1 | sed "s/^/$p /" >>"$RAW"
            if [ "$HAVE_TORCH" = 1 ]; then
                # a PyTorch failure costs its cells, not the run (its stderr: torch.log)
                s_run "$p" torch "$PY" tests/bench/torch_train.py --threads "$T" \
                    --batches "$BATCHES" --seconds "$SECS" --samples "$SAMPLES" 2>>"$OUT/torch.log" \
                    | sed "s/^/$p /" >>"$RAW" \
                    || echo "bench: torch_train.py failed ($T threads, path $p); see $OUT/torch.log" >&2
            fi
        done
    done
done
echo "meta mflop $(sed -n 's/.*; \([0-9.]*\) MFLOP per training image/\1/p' "$OUT/last.txt" | head -1)" >>"$RAW"

# End to end, through the real binaries on Fashion-MNIST, on the first path.
if [ "$E2E_STEPS" -gt 0 ]; then
    p=${PATHS%% *}
    s_ips() { awk -F: '/"images_per_s"/ { gsub(/[ \t,]/, "", $2); print $2 + 0 }' "$1"; }
    E2E_CMD=("$BUILD/downpour-worker" --standalone --steps "$E2E_STEPS" --batch 64 --threads 2
             --no-progress --summary "$OUT/standalone.json")
    DIST_CMD=("$BUILD/downpour" local --workers 2 --mode async --steps "$E2E_STEPS" --batch 64
              --threads 1 --no-progress --out "$OUT/local")
    echo "end to end: env $(s_env "$p" | tr '\n' ' ')${E2E_CMD[*]}"
    bench_run "downpour-worker --standalone" "$OUT/standalone.log" s_run "$p" downpour "${E2E_CMD[@]}"
    echo "$p e2e standalone $(s_ips "$OUT/standalone.json")" >>"$RAW"
    rm -rf "$OUT/local"
    echo "end to end: env $(s_env "$p" | tr '\n' ' ')${DIST_CMD[*]}"
    bench_run "downpour local" "$OUT/local.log" s_run "$p" downpour "${DIST_CMD[@]}"
    echo "$p e2e local $(s_ips "$OUT/local/summary.json")" >>"$RAW"
fi
# The ResNets, both sides, interleaved as above; then the first's per-layer clock.
if [ "${BENCH_RESNET:-1}" != 0 ]; then
    RNETS=${BENCH_RESNET_MODELS:-resnet20 resnet56}
    RSHAPES=${BENCH_RESNET_SHAPES:-1x28x28 3x32x32}
    RPATHS=${BENCH_RESNET_PATHS:-$PATHS}
    echo "ResNets, each round, for NET in $RNETS, T in $THREADS, SHAPE in $RSHAPES and each path P:"
    echo "  env DP_CPU_ISA=P OPENBLAS_CORETYPE=... $BENCH -m NET -i SHAPE -b 128 -t T -s $SECS -r $SAMPLES -w 2"
    [ "$HAVE_TORCH" = 1 ] && echo "  env ... $PY tests/bench/torch_train.py --model NET --input SHAPE --threads T --batches 128 --seconds $SECS --samples $SAMPLES --warmup 2"
    for r in $(seq "$ROUNDS"); do
        echo "ResNet round $r/$ROUNDS ..."
        for N in $RNETS; do
            for S in $RSHAPES; do
                for T in $THREADS; do
                    for p in $RPATHS; do
                        s_run "$p" downpour "$BENCH" -m "$N" -i "$S" -b 128 -t "$T" -s "$SECS" -r "$SAMPLES" -w 2 \
                            | sed -n "s|^sample |$p rsample $N/$S |p" >>"$RAW"
                        if [ "$HAVE_TORCH" = 1 ]; then
                            s_run "$p" torch "$PY" tests/bench/torch_train.py --model "$N" --input "$S" --threads "$T" \
                                --batches 128 --seconds "$SECS" --samples "$SAMPLES" --warmup 2 2>>"$OUT/torch.log" \
                                | sed -n "s|^sample |$p rsample $N/$S |p" >>"$RAW" \
                                || echo "bench: torch_train.py $N failed ($S, $T threads, path $p); see $OUT/torch.log" >&2
                        fi
                    done
                done
            done
        done
    done
    p=${RPATHS%% *}
    T=${THREADS##* }
    N=${RNETS%% *}
    for S in $RSHAPES; do
        s_run "$p" downpour "$BENCH" -m "$N" -i "$S" -b 128 -t "$T" -s "$SECS" -r 1 -w 2 -l >"$OUT/$N-layers-$S.txt"
        sed -n "s/^# kind /$p rkind $S $T /p" "$OUT/$N-layers-$S.txt" >>"$RAW"
    done
    echo "meta rknet $N" >>"$RAW"
fi
{
    echo "meta busy1 $(s_busy)"
    echo "meta took $(( $(date +%s) - t_start ))"
} >>"$RAW"

echo
s_report "$RAW"
echo "(raw samples: $RAW; BENCH_REPORT=$RAW $0 prints this table again)"

# The parameter server's side: its apply (the optimizer's sweep over a
# shard) against memcpy of the same vector, and its wire against a plain
# ZeroMQ round trip of the same bytes, each side by side in one run.
if [ "${BENCH_SERVER:-1}" = 1 ]; then
    echo
    "$BUILD/tests/bench_optim" -r 40
    echo
    "$BUILD/downpour" bench wire --rounds 20
    "$BUILD/downpour" bench wire --rounds 20 --transport ipc
fi

# The client library from Python against the C client, same bytes, same run.
if [ "${BENCH_PYCLIENT:-1}" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
    echo
    PYTHONPATH=$BUILD/python "$PY" tests/bench/py_client.py --build "$BUILD"
fi

# What the servers cost one CPU worker, with the wire behind the compute
# (--overlap on) and in turn, against the standalone trainer in the same
# rounds.
if [ "${BENCH_OVERLAP:-1}" = 1 ]; then
    echo
    BUILD=$BUILD BENCH_OUT=$OUT tests/bench/overlap.sh
fi

# Two workers against PyTorch DDP (gloo) on the same cores, sync and async.
if [ "${BENCH_DDP:-1}" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
    echo
    BUILD=$BUILD BENCH_OUT=$OUT PY=$PY tests/bench/ddp.sh
fi

# PyTorch workers with local steps against the loop alone, and downpour
# launch's start-up against the same processes started by hand.
if [ "${BENCH_TORCH_LOCAL:-1}" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
    echo
    BUILD=$BUILD tests/bench/torch_local.sh
fi

# A3C: env steps per second of the C worker alone, through one shard with 1
# and 2 workers, beside the PyTorch example (tests/bench/a3c.sh).
if [ "${BENCH_A3C:-1}" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
    echo
    BUILD=$BUILD tests/bench/a3c.sh
fi

# Sparse rows: by key per shard against memcpy, and the planted CTR model
# by 2 async workers over 2 shards (tests/bench/rows.sh; its knobs there).
if [ "${BENCH_ROWS:-1}" = 1 ]; then
    echo
    BUILD=$BUILD tests/bench/rows.sh
fi

# Churn: 2 workers over 2 epochs, async and sync, with --chaos kills
# against none (tests/bench/elastic.sh; its knobs are in that file).
if [ "${BENCH_ELASTIC:-1}" = 1 ]; then
    echo
    BUILD=$BUILD tests/bench/elastic.sh
fi
