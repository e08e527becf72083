#!/usr/bin/python3
"""docs/experiments/rl_trace_report.py OUT ENV...: the tables of docs/experiments/rl_trace.sh.

First the traces (OUT/traces/E-wW, real downpour local runs): per run, a
worker step's median, p99 and max in ms, the share of the step the worker
held the weights (step - pull - push, over the summed steps), and the real
run's staleness mean and max. Then, for each environment, one row per arm
(A3C = async, A2C = sync, async with --delay-lr adaptive), worker count M
and compute (exp:100 or trace), over the seeds: how many solved, the
median env step at which they did with its quartiles, the return of the
last 100 episodes and the greedy test return (mean ± std), and the
staleness: the mean of the runs' means and the largest of their maxima.
A sweep still going gives its table so far.
"""
import glob
import json
import os
import statistics as st
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rl_report import cells, fmt, quantile  # noqa: E402

ARMS = ["A3C (async)", "A2C (sync)", "async, --delay-lr adaptive"]


def traces(root):
    print("| trace | workers | steps | step ms: median, p99, max | weights held | staleness mean (max) |")
    print("|---|---:|---:|---|---:|---|")
    for d in sorted(glob.glob(f"{root}/traces/*-w*/")):
        steps, held = [], 0.0
        files = sorted(glob.glob(d + "metrics/worker-*.jsonl"))
        for f in files:
            for line in open(f):
                r = json.loads(line)
                steps.append(r["step_ms"])
                held += r["step_ms"] - r.get("pull_ms", 0) - r.get("push_ms", 0)
        if not steps:
            continue
        s = json.load(open(d + "summary.json"))
        print(f"| {os.path.basename(d.rstrip('/'))} | {len(files)} | {len(steps)} | {st.median(steps):.2f}, "
              f"{quantile(steps, 0.99):.2f}, {max(steps):.1f} | {100 * held / sum(steps):.0f} % | "
              f"{s.get('staleness_mean', 0):.2f} ({s.get('staleness_max', 0)}) |")
    print()


def row(arm, m, compute, runs):
    solved = sorted(r["solved_at_env_steps"] for r in runs if r.get("solved_at_env_steps") is not None)
    med = "-" if not solved else (f"{st.median(solved) / 1e3:.0f} k [{quantile(solved, 0.25) / 1e3:.0f}-"
                                 f"{quantile(solved, 0.75) / 1e3:.0f} k]")
    smean = st.mean(r.get("staleness_mean", 0) for r in runs)
    smax = max(r.get("staleness_max", 0) for r in runs)
    print(f"| {arm} | {m} | {compute} | {len(solved)}/{len(runs)} | {med} | "
          f"{fmt([r['return_mean_100'] for r in runs])} | {fmt([r['test_return'] for r in runs])} | "
          f"{smean:.2f} ({smax}) |")


def table(root, env):
    got = {}
    for compute, label in (("exp", "exp:100"), ("trace", "trace")):
        part = cells(f"{root}/{compute}/{env}", lambda f: "A3C (async)" if f["mode"] == "async" else "A2C (sync)")
        part.update(cells(f"{root}/{compute}/{env}-adaptive", lambda f: "async, --delay-lr adaptive"))
        for (arm, m), by_lr in part.items():
            got[(arm, m, label)] = [r for runs in by_lr.values() for r in runs]
    if not got:
        print(f"{env}: no runs in {root}\n")
        return
    print(f"#### {env}\n")
    print("| arm | M | compute | solved | median env steps to solve [quartiles] | return of the last 100 "
          "| greedy test return | staleness mean (max) |")
    print("|---|---:|---|---:|---|---|---|---|")
    for arm in ARMS:
        for m in sorted({k[1] for k in got if k[0] == arm}):
            for label in ("exp:100", "trace"):
                if (arm, m, label) in got:
                    row(arm, m, label, got[(arm, m, label)])
    print()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: rl_trace_report.py OUT ENV...")
    traces(sys.argv[1])
    for env in sys.argv[2:]:
        table(sys.argv[1], env)


if __name__ == "__main__":
    main()
