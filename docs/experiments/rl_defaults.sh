#!/bin/bash
# docs/experiments/rl_defaults.sh [BUILD [OUT [SEEDS]]]: A3C and A2C at
# their defaults, in real processes: `downpour local --env E --workers W
# --mode M --seed S` with no other flag (the defaults: fc:64 tanh fc:64
# tanh ac, Adam 0.0007, --reward-scale 0.1, 500 k env steps), for
# cartpole-v1 and acrobot-v1 with 2 async, 2 sync and 4 async workers,
# seeds 1-10 (SEEDS: a list). Resumable (a run with its summary.json is
# kept). Prints docs/EXPERIMENTS.md section 12's table: per crew the seeds
# solved (the mean of the last 100 reaching the environment's threshold
# at some point), the env steps it took, the last 100's mean at the end,
# and the greedy test return.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/rl_defaults}
SEEDS=${3:-1 2 3 4 5 6 7 8 9 10}
mkdir -p "$R"
for env in cartpole-v1 acrobot-v1; do
    for crew in "async 2" "sync 2" "async 4"; do
        set -- $crew
        for seed in $SEEDS; do
            d=$R/$env-$1-$2-s$seed
            [ -s "$d/summary.json" ] && continue
            rm -rf "$d"
            echo "$(date +%T) $d load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$R/log"
            "$B/downpour" local --env "$env" --workers "$2" --mode "$1" --seed "$seed" --out "$d" \
                --no-progress >"$d.log" 2>&1
        done
    done
done
python3 - "$R" <<'EOF'
import glob, json, os, statistics as st, sys
runs = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*", "summary.json"))):
    env, mode, w, _ = os.path.basename(os.path.dirname(p)).rsplit("-", 3)
    runs.setdefault((env, mode, w), []).append(json.load(open(p)))
print("| env | mode | workers | solved | env steps to solve, median (range) | last 100 at the end: at the threshold; median (range) | greedy test return at 500 / -100 or better; median |")
print("|---|---|---:|---:|---|---|---|")
for (env, mode, w), rs in runs.items():
    thr = 475 if env.startswith("cartpole") else -100
    best = 500 if env.startswith("cartpole") else -100
    sa = sorted(r["solved_at_env_steps"] for r in rs if r.get("solved_at_env_steps") is not None)
    last = [r["return_mean_100"] for r in rs]
    test = [r["test_return"] for r in rs]
    steps = f"{st.median(sa) / 1000:.0f} k ({sa[0] / 1000:.0f}-{sa[-1] / 1000:.0f} k)" if sa else "-"
    print(f"| {env} | {mode} | {w} | {len(sa)} of {len(rs)} | {steps} | {sum(x >= thr for x in last)} of {len(rs)}; "
          f"{st.median(last):.1f} ({min(last):.1f} to {max(last):.1f}) | {sum(t >= best for t in test)} of {len(rs)}; "
          f"{st.median(test):.1f} |")
EOF
