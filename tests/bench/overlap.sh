#!/usr/bin/env bash
# overlap.sh: what the parameter server costs one CPU worker. Side by side in
# one run, round by round (so that load from other users of a shared machine
# falls on every column alike):
#   standalone   downpour-worker --standalone, 1 thread
#   overlap on   downpour local --workers 1 --mode async --threads 1 --overlap on
#   overlap off  the same with --overlap off (pull, compute, push in turn;
#                the push in parts, each part stepped by the shard as it
#                comes, --stream-push on, the CPU default; the pull through
#                shared memory, `downpour local`'s transport, which is read
#                whole)
#   frames       overlap off over ZeroMQ frames (--transport zmq), where the
#                pull comes in parts as the forward needs them too
#                (--stream-pull on, the CPU default)
#   frames, whole pull: the same with --stream-pull off
#   whole push   overlap off with --stream-push off
#   sync         --mode sync, 1 worker, overlap off (the push in parts);
#   sync frames, sync frames whole pull, sync whole push: as in async
#   local steps  the same with --local-steps 8 (a push every 8 steps of the
#                worker's own optimizer; BENCH_OVERLAP_H changes 8)
# each at batch 64 for the same steps on Fashion-MNIST. The worker computes
# on 1 thread like the standalone trainer; the shard's optimizer takes
# `downpour local`'s default, the host's cores (BENCH_OVERLAP_PS_ARGS, e.g.
# "--ps-threads 1", changes it). The figure is each
# run's summary.json images_per_s (the training loop only: no start-up, no
# evaluation); the table gives medians over the rounds, the median of the
# per-round ratios to standalone, the test accuracy of each column (the
# same every round: the runs are deterministic), and where a step goes:
# the worker's wait_ms per step (its metrics: the time it waits for the
# servers), the step's time (step_ms, from the median images/s), the
# worker's compute_ms (both the mean of a run's steps, the median over the
# rounds) and the rest by difference. OpenBLAS gets
# OPENBLAS_CORETYPE=SkylakeX on an AVX-512 x86 (0.3.21 misdetects some such
# CPUs; tests/bench/run.sh says more), unless the environment sets one.
#
# Knobs (environment): BUILD (build), BENCH_OUT ($BUILD/bench),
# BENCH_OVERLAP_ROUNDS (3), BENCH_OVERLAP_STEPS (200), BENCH_OVERLAP_H (8), BENCH_OVERLAP_PS_ARGS
# (flags for `downpour local` alone, e.g. "--ps-threads 1"; default none).
set -euo pipefail
cd "$(dirname "$0")/../.."

. tests/bench/lib.sh
BENCH_NAME=overlap.sh

BUILD=${BUILD:-build}
OUT=${BENCH_OUT:-$BUILD/bench}/overlap
ROUNDS=${BENCH_OVERLAP_ROUNDS:-3}
STEPS=${BENCH_OVERLAP_STEPS:-200}
H=${BENCH_OVERLAP_H:-8}
bench_require "'make' first" "$BUILD/downpour-worker" "$BUILD/downpour" "$BUILD/downpour-ps"
bench_openblas
rm -rf "$OUT"
bench_samples "$OUT"
common=(--steps "$STEPS" --batch 64 --threads 1 --no-progress)
read -r -a ps_args <<<"${BENCH_OVERLAP_PS_ARGS:-}"
s_num() { # FILE KEY: a number from a summary.json
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
s_wait() { # DIR: the worker's mean wait_ms and compute_ms per push, or 0 0 (standalone)
    python3 - "$1/metrics/worker-0.jsonl" <<'PYEOF2'
import json, os, statistics, sys
p = sys.argv[1]
rows = [json.loads(l) for l in open(p) if '"wait_ms"' in l] if os.path.exists(p) else []
mean = lambda key: statistics.fmean(r[key] for r in rows) if rows else 0
print(mean("wait_ms"), mean("compute_ms"))
PYEOF2
}
s_one() { # NAME CMD...: one run; "NAME images_per_s accuracy staleness_mean wait_ms compute_ms" into RAW
    local name=$1 dir=$OUT/$1-$r; shift
    bench_run "$name" "$dir.log" "$@"
    local sum=$dir/summary.json
    [ -f "$sum" ] || sum=$dir.json
    echo "$name $(s_num "$sum" images_per_s) $(s_num "$sum" test_accuracy) $(s_num "$sum" staleness_mean) $(s_wait "$dir")" >>"$RAW"
}

bench_start overlap
echo "commands (each round, in this order):"
echo "  $BUILD/downpour-worker --standalone ${common[*]} --summary DIR.json"
echo "  $BUILD/downpour local --workers 1 --mode async --overlap on ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode async --overlap off ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode async --local-steps $H ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode async --overlap off --transport zmq ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode async --overlap off --transport zmq --stream-pull off ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode async --overlap off --stream-push off ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode sync ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode sync --transport zmq ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode sync --transport zmq --stream-pull off ${common[*]} ${ps_args[*]} --out DIR"
echo "  $BUILD/downpour local --workers 1 --mode sync --stream-push off ${common[*]} ${ps_args[*]} --out DIR"
for r in $(seq "$ROUNDS"); do
    s_one standalone "$BUILD/downpour-worker" --standalone "${common[@]}" --summary "$OUT/standalone-$r.json"
    s_one on "$BUILD/downpour" local --workers 1 --mode async --overlap on "${common[@]}" "${ps_args[@]}" --out "$OUT/on-$r"
    s_one off "$BUILD/downpour" local --workers 1 --mode async --overlap off "${common[@]}" "${ps_args[@]}" --out "$OUT/off-$r"
    s_one local "$BUILD/downpour" local --workers 1 --mode async --local-steps "$H" "${common[@]}" "${ps_args[@]}" --out "$OUT/local-$r"
    s_one frames "$BUILD/downpour" local --workers 1 --mode async --overlap off --transport zmq "${common[@]}" "${ps_args[@]}" --out "$OUT/frames-$r"
    s_one framespullwhole "$BUILD/downpour" local --workers 1 --mode async --overlap off --transport zmq --stream-pull off "${common[@]}" "${ps_args[@]}" --out "$OUT/framespullwhole-$r"
    s_one whole "$BUILD/downpour" local --workers 1 --mode async --overlap off --stream-push off "${common[@]}" "${ps_args[@]}" --out "$OUT/whole-$r"
    s_one sync "$BUILD/downpour" local --workers 1 --mode sync "${common[@]}" "${ps_args[@]}" --out "$OUT/sync-$r"
    s_one syncframes "$BUILD/downpour" local --workers 1 --mode sync --transport zmq "${common[@]}" "${ps_args[@]}" --out "$OUT/syncframes-$r"
    s_one syncframespullwhole "$BUILD/downpour" local --workers 1 --mode sync --transport zmq --stream-pull off "${common[@]}" "${ps_args[@]}" --out "$OUT/syncframespullwhole-$r"
    s_one syncwhole "$BUILD/downpour" local --workers 1 --mode sync --stream-push off "${common[@]}" "${ps_args[@]}" --out "$OUT/syncwhole-$r"
    bench_round 11
done
bench_table -v steps="$STEPS" -v h="$H" '
    { acc[k] = $3; st[k] = $4; wt[k, n[k]] = $5; cm[k, n[k]] = $6 }
    # where a step goes: step_ms from the median images/s (batch 64), the
    # worker'"'"'s compute_ms (forward and backward, with the pull'"'"'s and
    # push'"'"'s work done in their hooks) and wait_ms (blocked on the
    # servers), each the mean of a run'"'"'s steps (so that they add up) and
    # the median over the rounds; the rest (the batch, the metrics line,
    # the start and end of the loop) by difference. The standalone
    # trainer'"'"'s whole step is its compute (its optimizer step in it);
    # --local-steps pushes once a round, so its compute is a round'"'"'s
    function row(k,   m, ratio, j, ww, cc, step, w, c) {
        m = median(a, n[k]); ratio = median(rr, n[k])
        for (j = 1; j <= n[k]; j++) { ww[j] = wt[k, j]; cc[j] = cm[k, j] }
        step = 64000 / m; w = median(ww, n[k]); c = k == "standalone" ? step : median(cc, n[k])
        if (k == "local")
            printf "%-40s %10.0f %7.0f-%-7.0f %8.2fx %9.4f %10.2f %8s %8.2f %10s %8s\n", label[k], m, lo, hi, ratio, acc[k],
                   st[k], "-", step, "-", "-"
        else
            printf "%-40s %10.0f %7.0f-%-7.0f %8.2fx %9.4f %10.2f %8.2f %8.2f %10.2f %8.2f\n", label[k], m, lo, hi, ratio, acc[k],
                   k == "standalone" ? 0 : st[k], w, step, c, step - c - w
    }
    END {
        printf "\n%-40s %10s %15s %9s %9s %10s %8s %8s %10s %8s\n", "1 thread, batch 64, " steps " steps", "images/s", "(min-max)", "ratio",
               "accuracy", "staleness", "wait_ms", "step_ms", "compute_ms", "rest_ms"
        label["standalone"] = "standalone trainer"
        label["on"] = "1 PS + 1 worker, async, overlap on"
        label["off"] = "1 PS + 1 worker, async, overlap off"
        label["local"] = "1 PS + 1 worker, --local-steps " h
        label["frames"] = "... async, overlap off, frames"
        label["framespullwhole"] = "... async, frames, --stream-pull off"
        label["whole"] = "... async, overlap off, --stream-push off"
        label["sync"] = "1 PS + 1 worker, sync"
        label["syncframes"] = "... sync, frames"
        label["syncframespullwhole"] = "... sync, frames, --stream-pull off"
        label["syncwhole"] = "... sync, --stream-push off"
        rows("standalone on off frames framespullwhole whole sync syncframes syncframespullwhole syncwhole local", "standalone")
        footer("ratio", "standalone", "standalone")
    }'
