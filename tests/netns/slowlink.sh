#!/usr/bin/env bash
# tests/netns/slowlink.sh [STEPS [REPEAT]]: the slow-link table. Four hosts
# in network namespaces (tests/netns/lib.sh; root), the parameter server on
# host 0 and three workers on hosts 1-3, host 3 behind a link made slow
# (nfq_delay) and lossy (iptables); for each link, sync, sync with a backup
# worker (--replicas-to-aggregate 2) and async train STEPS steps per worker
# (default 150), each step at least SLOWLINK_STEP_MS (default 20) ms long,
# REPEAT times (default 1; the table gives medians). Prints
# one Markdown row per mode and link, and the load average before and after.
# A benchmark, not a test: it asserts nothing but that the runs finish.
#
#   make tests && sudo tests/netns/slowlink.sh 150 3
#   NT_MODEL="conv5x5:32 relu maxpool2 fc:10 softmax" tests/netns/slowlink.sh
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIN=$PWD/$BUILD
NT_MODEL=${NT_MODEL:-fc:512 relu fc:10 softmax} # 1.6 MB each way per step
source tests/netns/lib.sh
source tests/netns/train.sh
steps=${1:-150} repeat=${2:-1}
NT_LIMIT=${NT_LIMIT:-600}
# Each worker step takes at least this long (downpour-worker --delay-ms): a
# stand-in for the compute of a real model, which the small default one lacks.
step_ms=${SLOWLINK_STEP_MS:-20}
NT_WORKER_ARGS=(--delay-ms "$step_ms")
# "delay_ms jitter_ms loss" of host 3's incoming link.
links=("0 0 0" "20 2 0" "80 8 0" "80 8 0.01")
out=$(mktemp -d /tmp/downpour-slowlink.XXXXXX)
trap 'nn_down; rm -rf "$out"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

echo "slowlink: $steps steps per worker, 3 workers, model \"$NT_MODEL\", batch $NT_BATCH, >= $step_ms ms a step, $repeat run(s) each"
echo "load before: $(uptime | sed 's/.*load average: //')"
for link in "${links[@]}"; do
    read -r delay jitter loss <<<"$link"
    for mode in sync backup async; do
        for ((r = 0; r < repeat; r++)); do
            # A fresh set of hosts per run: nothing queued from the last one.
            nn_up 10.200.2 4 || { echo "slowlink: $NN_WHY" >&2; exit 1; }
            if [ "$delay" != 0 ]; then nn_delay 3 "$delay" "$jitter" 2>/dev/null || { echo "slowlink: $NN_WHY" >&2; exit 1; }; fi
            if [ "$loss" != 0 ]; then nn_loss 3 "$loss" || { echo "slowlink: $NN_WHY" >&2; exit 1; }; fi
            dir=$out/$mode-$delay-$loss-$r
            case $mode in
            sync) nt_run "$dir" sync 3 "$steps" ;;
            backup) nt_run "$dir" sync 3 "$steps" --replicas-to-aggregate 2 ;;
            async) nt_run "$dir" async 3 "$steps" ;;
            esac || { echo "slowlink: $mode, link $link: $NT_WHY" >&2; exit 1; }
            nn_down
            printf '{"mode": "%s", "delay": %s, "jitter": %s, "loss": %s, "stats": %s}\n' \
                "$mode" "$delay" "$jitter" "$loss" "$(python3 tests/netns/runstats.py "$dir")" >>"$out/runs.jsonl"
            echo "  done: $mode, link +${delay}ms loss $loss, run $((r + 1))" >&2
        done
    done
done
echo "load after: $(uptime | sed 's/.*load average: //')"
python3 - "$out/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in runs:
    groups.setdefault((r["mode"], r["delay"], r["jitter"], r["loss"]), []).append(r["stats"])
names = {"sync": "sync", "backup": "sync, R=2 of 3", "async": "async"}
print("| mode | worker 3's link | images/s, all | fast workers, each | slow worker | staleness mean / max | dropped | test accuracy |")
print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |")
for (mode, delay, jitter, loss), ss in groups.items():
    med = lambda f: statistics.median(f(s) for s in ss)
    link = "direct" if delay == 0 and loss == 0 else f"+{delay}..{delay + jitter} ms" + (f", {loss:.0%} lost" if loss else "")
    fast = med(lambda s: statistics.mean(w["images_per_s"] for w in s["per_worker"][:2]))
    print(f"| {names[mode]} | {link} | {med(lambda s: s['images_per_s']):.0f} | {fast:.0f} | "
          f"{med(lambda s: s['per_worker'][2]['images_per_s']):.0f} | "
          f"{med(lambda s: s['staleness_mean']):.2f} / {med(lambda s: s['staleness_max']):.0f} | "
          f"{med(lambda s: s['updates_dropped']):.0f} | {med(lambda s: s['test_accuracy']):.3f} |")
PY
