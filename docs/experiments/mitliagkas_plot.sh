#!/bin/bash
# docs/experiments/mitliagkas_plot.sh SWEEP_OUT PNG: final test accuracy
# against explicit momentum, one line per worker count, from the sweep's
# results.json (mean over seeds, error bars one std).
set -eu
out=$1 png=$2
python3 - "$out/results.json" >"$out/by_momentum.dat" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = {}
for c in r["configs"]:
    a = c["axes"]
    rows.setdefault(int(a["workers"]), []).append((float(a["momentum"]), c["final_accuracy_mean"], c["final_accuracy_std"]))
for m in sorted(rows):
    print(f"# workers {m}")
    for mu, acc, sd in sorted(rows[m]):
        print(mu, acc, sd)
    print("\n")
PY
ms=$(grep '^# workers' "$out/by_momentum.dat" | cut -d' ' -f3 | tr '\n' ' ')
n=$(echo $ms | wc -w)
gnuplot <<GP
set terminal png size 700,450 noenhanced
set output '$png'
set grid
set key bottom left
set xlabel 'explicit momentum'
set ylabel 'final test accuracy'
set title 'Async SGD: final accuracy against explicit momentum'
set xrange [-0.05:0.95]
plot for [i=0:$((n - 1))] '$out/by_momentum.dat' index i using 1:2:3 with yerrorlines pt 7 title 'M = '.word('$ms', i + 1).' workers'
GP
