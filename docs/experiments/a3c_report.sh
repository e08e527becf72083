#!/bin/bash
# docs/experiments/a3c_report.sh DIR PNG: the A3C question's table (Markdown
# on stdout) and plot from the runs of docs/experiments/a3c.sh in DIR: for
# each mode, the lrs tried on seed 1 and, at the best of those that have all
# 5 seeds, the seeds' mean ± std.
set -eu
R=$1 png=$2
python3 - "$R" <<'PY'
import glob, json, os, re, statistics as st, sys
R = sys.argv[1]
acc = lambda d: json.load(open(d + "/summary.json"))["test_accuracy"]
rows, dat = [], []
print("| mode | lrs tried (seed 1: test accuracy) | lr | seeds | test accuracy | train accuracy (first 10k) | train - test gap |")
print("|---|---|---|---|---|---|---|")
for i, m in enumerate(["standalone", "sync", "async"]):
    tried = {}
    for d in glob.glob(f"{R}/{m}-lr*-s1"):
        if os.path.exists(d + "/train_eval.json") and os.path.getsize(d + "/train_eval.json"):
            tried[re.search(r"-lr([0-9.]+)-s1$", d).group(1)] = acc(d)
    done = lambda lr: all(os.path.exists(f"{R}/{m}-lr{lr}-s{s}/train_eval.json") for s in range(1, 6))
    full = {k: v for k, v in tried.items() if done(k)}
    lr = max(full or tried, key=(full or tried).get)   # the best lr that has its 5 seeds
    te, tr = [], []
    for s in range(1, 6):
        d = f"{R}/{m}-lr{lr}-s{s}"
        if not (os.path.exists(d + "/train_eval.json") and os.path.getsize(d + "/train_eval.json")):
            continue
        te.append(acc(d))
        tr.append(json.load(open(d + "/train_eval.json"))["test_accuracy"])
        dat.append(f"{i + 1 + (s - 3) * 0.06:.2f} {te[-1]} {tr[-1]} {tr[-1] - te[-1]:.5f}")
    gap = [a - b for a, b in zip(tr, te)]
    f = lambda x: f"{st.mean(x):.4f} ± {st.stdev(x):.4f}" if len(x) > 1 else f"{x[0]:.4f}"
    t = ", ".join(f"{k}: {v:.4f}" for k, v in sorted(tried.items(), key=lambda kv: float(kv[0])))
    print(f"| {m} | {t} | {lr} | {len(te)} | {f(te)} | {f(tr)} | {f(gap)} |")
open(R + "/a3c.dat", "w").write("\n".join(dat) + "\n")
PY
gnuplot <<GP
set terminal png size 800,380 noenhanced
set output '$png'
set multiplot layout 1,2 title 'Standalone, sync and async (2 workers), 1 epoch, each at its best lr: one point per seed'
set grid
set xrange [0.5:3.5]
set xtics ('standalone' 1, 'sync' 2, 'async' 3)
set ylabel 'test accuracy'
plot '$R/a3c.dat' using 1:2 with points pt 7 ps 1.2 notitle
set ylabel 'train (first 10k) - test accuracy'
plot '$R/a3c.dat' using 1:4 with points pt 7 ps 1.2 lc 2 notitle
unset multiplot
GP
