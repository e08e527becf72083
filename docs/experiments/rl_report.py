#!/usr/bin/python3
"""docs/experiments/rl_report.py OUT ENV...: the tables of docs/experiments/rl.sh.

For each environment, one row per arm (A3C = async, A2C = sync, async with
--delay-lr adaptive) and worker count M: of the three lrs, the better one
(most seeds solved, then the fewer median env steps to solve, then the
higher final return), and at it, over the seeds: how many solved (the mean
of the last 100 episodes reached the threshold within the budget), the
median env step at which they first did with its quartiles, the final
return of the last 100 episodes and the greedy test return (mean ± std),
and the mean staleness. Every lr's solved count is in the row too, so the
choice can be checked. Runs are read from each run's command.txt and summary.json, so a sweep
still going gives its table so far.
"""
import glob
import json
import statistics as st
import sys


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    i = q * (len(xs) - 1)
    lo = int(i)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (i - lo)


def cells(path, arm_of):
    """{(arm, M): {lr: [summary, ...]}} from a sweep's finished runs (each run's
    command.txt and summary.json: a sweep still going is read as far as it got)."""
    out = {}
    for d in sorted(glob.glob(path + "/runs/c*-s*")):
        try:
            cmd = open(d + "/command.txt").read().split()
            summary = json.load(open(d + "/summary.json"))
        except (OSError, ValueError):
            continue
        flag = {cmd[i][2:]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
        key = (arm_of(flag), int(flag["workers"]))
        out.setdefault(key, {}).setdefault(flag["lr"], []).append(summary)
    return out


def score(runs):
    solved = [r["solved_at_env_steps"] for r in runs if r.get("solved_at_env_steps") is not None]
    med = st.median(solved) if solved else float("inf")
    ret = st.mean(r["return_mean_100"] for r in runs) if runs else float("-inf")
    return (len(solved), -med, ret)


def fmt(xs, nd=1):
    if not xs:
        return "-"
    return f"{st.mean(xs):.{nd}f} ± {st.stdev(xs):.{nd}f}" if len(xs) > 1 else f"{xs[0]:.{nd}f}"


def table(root, env):
    got = cells(f"{root}/{env}", lambda f: "A3C (async)" if f["mode"] == "async" else "A2C (sync)")
    got.update(cells(f"{root}/{env}-adaptive", lambda f: "async, --delay-lr adaptive"))
    if not got:
        print(f"{env}: no runs in {root}\n")
        return
    arms = ["A3C (async)", "A2C (sync)", "async, --delay-lr adaptive"]
    print(f"#### {env}\n")
    print("| arm | M | solved at each lr | best lr | seeds | solved | median env steps to solve [quartiles] "
          "| return of the last 100 | greedy test return | staleness mean |")
    print("|---|---:|---|---:|---:|---:|---|---|---|---:|")
    for arm in arms:
        for m in sorted({k[1] for k in got if k[0] == arm}):
            by_lr = got[(arm, m)]
            each = ", ".join(f"{lr}: {score(r)[0]}/{len(r)}" for lr, r in sorted(by_lr.items(), key=lambda kv: float(kv[0])))
            lr, runs = max(by_lr.items(), key=lambda kv: score(kv[1]))
            solved = sorted(r["solved_at_env_steps"] for r in runs if r.get("solved_at_env_steps") is not None)
            med = "-" if not solved else (f"{st.median(solved) / 1e3:.0f} k [{quantile(solved, 0.25) / 1e3:.0f}-"
                                         f"{quantile(solved, 0.75) / 1e3:.0f} k]")
            stale = st.mean(r.get("staleness_mean", 0) for r in runs) if runs else 0
            print(f"| {arm} | {m} | {each} | {lr} | {len(runs)} | {len(solved)}/{len(runs)} | {med} | "
                  f"{fmt([r['return_mean_100'] for r in runs])} | {fmt([r['test_return'] for r in runs])} | {stale:.2f} |")
    print()


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: rl_report.py OUT ENV...")
    for env in sys.argv[2:]:
        table(sys.argv[1], env)


if __name__ == "__main__":
    main()
