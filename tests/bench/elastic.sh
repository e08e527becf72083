#!/usr/bin/env bash
# elastic.sh: what churn costs, round by round on this machine: `downpour
# local --workers 2:2` over 2 epochs of Fashion-MNIST (the default CNN,
# batch 64, 1 thread a worker), async and sync, without kills and with
# --chaos kill:SECONDS (a worker other than the chief SIGKILLed every
# SECONDS, another started under a free task index). Per run: images/s
# (summary.json: the chief's rate x the workers) and test accuracy; per
# chaos run: the kills, the longest the chief waited between two steps
# (sync: a dead worker holds the step until the heartbeat timeout), and
# from a newcomer's join (the shard's metrics event) to its first applied
# push (its metrics line).
# Knobs: BENCH_EL_ROUNDS (2), BENCH_EL_EPOCHS (2), BENCH_EL_CHAOS (15).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/lib.sh
BENCH_NAME=elastic.sh
ROUNDS=${BENCH_EL_ROUNDS:-2}
EPOCHS=${BENCH_EL_EPOCHS:-2}
CHAOS=${BENCH_EL_CHAOS:-15}
BUILD=${BUILD:-build}
PY=/usr/bin/python3
bench_require make "$BUILD/downpour" "$BUILD/downpour-ps" "$BUILD/downpour-worker"
bench_openblas
out=$(mktemp -d)
bench_samples "$out"
bench_start "churn: 2 workers, $EPOCHS epochs, --chaos kill:$CHAOS against no kills"
# facts DIR: "IMAGES_PER_S ACCURACY KILLS MAX_GAP_S JOIN_TO_PUSH_S" of a run.
facts() {
    "$PY" - "$1" <<'EOF'
import glob, json, sys
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
lines = lambda p: [json.loads(l) for l in open(p) if l.startswith("{")]
steps = [l["t"] for l in lines(d + "/metrics/worker-0.jsonl") if "step" in l and "event" not in l]
gap = max((b - a for a, b in zip(steps, steps[1:])), default=0)
joins = [e for e in lines(d + "/metrics/ps-0.jsonl") if e.get("event") == "join" and e.get("why") == "hello"]
t0 = min(e["t"] for e in joins) if joins else 0
delays = []
for e in joins:
    if e["t"] - t0 < 5: continue  # the first crew's, not a newcomer's
    first = [l["t"] for l in lines(f"{d}/metrics/worker-{e['task']}.jsonl")
             if "step" in l and "event" not in l and l["t"] >= e["t"]]
    if first: delays.append(min(first) - e["t"])
kills = sum(1 for l in open(d + "/local.err") if "--chaos: worker" in l)
med = sorted(delays)[len(delays) // 2] if delays else float("nan")
print(f"{s['images_per_s']:.0f} {s['test_accuracy']:.4f} {kills} {gap:.2f} {med:.2f}")
EOF
}
for ((r = 1; r <= ROUNDS; r++)); do
    for mode in async sync; do
        for how in calm chaos; do
            d=$out/$mode-$how-$r
            extra=()
            [ $how = chaos ] && extra=(--chaos "kill:$CHAOS")
            if ! "$BUILD/downpour" local --workers 2:2 --mode $mode --epochs "$EPOCHS" --batch 64 \
                --threads 1 --seed 3 --no-progress --out "$d" "${extra[@]}" >"$d.out" 2>"$d.err"; then
                echo "$BENCH_NAME: $mode $how failed:" >&2; tail -5 "$d.err" >&2; exit 1
            fi
            mv "$d.err" "$d/local.err"
            read -r ips acc kills gap join <<<"$(facts "$d")"
            echo "$mode-$how $ips" >>"$RAW"
            echo "$mode-$how-acc $acc" >>"$RAW"
            [ $how = chaos ] && echo "$mode-kills $kills" >>"$RAW" && echo "$mode-gap $gap" >>"$RAW" &&
                echo "$mode-join $join" >>"$RAW"
        done
    done
    echo "round $r/$ROUNDS: $(grep -v -- '-acc\|-kills\|-gap\|-join' "$RAW" | tail -4 | awk '{ printf "%s %.0f  ", $1, $2 }')(load $(cut -d' ' -f1 /proc/loadavg))"
done
bench_table '
    function row(k,   m) { m = median(a, n[k])
        if (k ~ /-(calm|chaos)$/) printf "%-14s images/s median %7.0f  (%.0f-%.0f)%s\n", k, m, lo, hi,
                                     k ~ /chaos/ ? sprintf("  = %.3fx of calm (median of per-round ratios)", median(rr, n[k])) : ""
        else printf "%-14s median %8.4f  (%.4f-%.4f)\n", k, m, lo, hi }
    END { rows("async-calm async-chaos", "async-calm"); rows("sync-calm sync-chaos", "sync-calm")
          rows("async-calm-acc async-chaos-acc sync-calm-acc sync-chaos-acc async-kills sync-kills", "async-calm")
          rows("async-gap sync-gap async-join sync-join", "async-calm")
          print "-acc: test accuracy; -kills: SIGKILLs in the run; -gap: the longest seconds between two of the"
          print "chief'"'"'s steps; -join: seconds from a newcomer'"'"'s join to its first applied push (median)"
          printf "load average (1, 5, 15 min) before: %s; after: %s\n", load0, load1 }'
