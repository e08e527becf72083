# tests/bench/lib.sh: what the benchmark scripts (run.sh, scale.sh,
# overlap.sh, ddp.sh) share, sourced by each after its cd to the repository
# root. A script sets BENCH_NAME (the prefix of its error lines) first.
#
# The round-by-round scripts (overlap.sh, ddp.sh) run every column once a
# round, each run's "NAME IMAGES_PER_S ..." line into $RAW, and print their
# table from $RAW alone with bench_table: the awk in BENCH_AWK reads the
# first two fields of every line and gives the table's medians, ranges and
# per-round ratios; the script's own awk adds its columns and rows.

# bench_require HINT FILE...: every FILE an executable, or one line naming
# the first that is not and what to run (HINT), and exit.
bench_require() {
    local hint=$1 f
    shift
    for f in "$@"; do
        if [ ! -x "$f" ]; then
            echo "$BENCH_NAME: $f is missing; run $hint" >&2
            exit 1
        fi
    done
}

# bench_samples DIR: DIR made, RAW=DIR/samples.txt, empty.
bench_samples() {
    mkdir -p "$1"
    RAW=$1/samples.txt
    : >"$RAW"
}

# OpenBLAS 0.3.21 misdetects some AVX-512 x86 CPUs (tests/bench/run.sh says
# more): SkylakeX there, unless the environment sets a core type.
bench_openblas() {
    if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo; then
        export OPENBLAS_CORETYPE=SkylakeX
    fi
}

bench_load() { cut -d' ' -f1-3 /proc/loadavg; }

# bench_start WHAT: LOAD0 taken, the run's first line printed.
bench_start() {
    LOAD0=$(bench_load)
    echo "== $1: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $LOAD0; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
}

# bench_run NAME LOG CMD...: CMD, its output into LOG; on failure the last
# lines of LOG and exit.
bench_run() {
    local name=$1 log=$2
    shift 2
    if ! "$@" >"$log" 2>&1; then
        echo "$BENCH_NAME: $name failed:" >&2; tail -5 "$log" >&2; exit 1
    fi
}

# bench_round N: round $r's line, from its N samples (the last N of $RAW).
bench_round() {
    echo "round $r/$ROUNDS: $(tail -"$1" "$RAW" | awk '{ printf "%s %.0f  ", $1, $2 }')(load $(cut -d' ' -f1 /proc/loadavg))"
}

# The table's shared awk: v[k, i] is column k's images/s in round i, n[k]
# its rounds. rows(KEYS, BASE) calls the script's row(k) for each column in
# KEYS that ran, with a[1..n[k]] its images/s (median(a, n[k]) sorts them),
# lo and hi their range and rr[i] round i's ratio to column BASE; footer()
# says what the ratio column is and the load before and after.
BENCH_AWK='
    function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function rows(keys, base,   order, nk, i, j, k) {
        nk = split(keys, order, " ")
        for (i = 1; i <= nk; i++) {
            k = order[i]; if (!n[k]) continue
            lo = hi = v[k, 1]
            for (j = 1; j <= n[k]; j++) { a[j] = v[k, j]; if (v[k, j] < lo) lo = v[k, j]; if (v[k, j] > hi) hi = v[k, j]
                                          rr[j] = v[k, j] / v[base, j] }
            row(k)
        }
    }
    function footer(ratio, base, what) {
        printf "%s = median over the rounds of (that run / the same round'"'"'s %s run); %d rounds.\n", ratio, what, n[base]
        printf "load average (1, 5, 15 min) before: %s; after: %s\n", load0, load1
    }
    { k = $1; n[k]++; v[k, n[k]] = $2 }
'

# bench_table [AWK-OPTION...] PROGRAM: LOAD1 taken, the table printed by
# BENCH_AWK and PROGRAM (awk, with load0 and load1 set) from $RAW.
bench_table() {
    local prog=${!#}
    LOAD1=$(bench_load)
    awk -v load0="$LOAD0" -v load1="$LOAD1" "${@:1:$#-1}" "$BENCH_AWK$prog" "$RAW"
    echo "(samples: $RAW)"
}
