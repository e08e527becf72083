#!/bin/bash
# docs/experiments/a3c.sh [BUILD [OUT]]: does the noise of asynchronous
# updates improve final accuracy? Standalone vs sync vs async (2 workers),
# 1 epoch of Fashion-MNIST, Adam, batch 64, one thread per process.
# Each mode's lr tuned on its own, on seed 1: 0.0008, 0.0015, 0.003 and
# 0.006; then seeds 2-5 at the best. Train accuracy: `downpour eval` on
# the first 10000 training images. Resumable (a finished run is skipped).
# Prints the table at the end and draws OUT/a3c.png.
set -u
cd "$(dirname "$0")/../.."
B=${1:-build}
R=${2:-runs/a3c}
mkdir -p $R
export OPENBLAS_NUM_THREADS=1
TRAIN=idx:/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte,/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte
acc() { python3 -c "import json;print(json.load(open('$1/summary.json'))['test_accuracy'])" 2>/dev/null || echo 0; }
one() { # mode lr seed
  local mode=$1 lr=$2 seed=$3 d=$R/$1-lr$2-s$3
  [ -f $d/train_eval.json ] && [ -s $d/train_eval.json ] && return
  mkdir -p $d
  if [ ! -f $d/summary.json ]; then
    echo "$(date +%T) start $d load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/log
    if [ $mode = standalone ]; then
      $B/downpour-worker --standalone --epochs 1 --batch 64 --threads 1 --lr $lr --seed $seed \
        --save $d/model.safetensors --summary $d/summary.json > $d/stdout.log 2>&1
    else
      $B/downpour local --workers 2 --mode $mode --epochs 1 --batch 64 --threads 1 --lr $lr --seed $seed \
        --out $d > $d/stdout.log 2>&1
    fi
  fi
  $B/downpour eval --checkpoint $d/model.safetensors --data $TRAIN --limit 10000 > $d/train_eval.json 2>>$d/stdout.log
  echo "$(date +%T) done  $d test $(acc $d) train10k $(cat $d/train_eval.json | cut -c1-40)" >> $R/log
}
best() { # mode: the lr with the best seed-1 test accuracy
  for lr in 0.0008 0.0015 0.003 0.006; do echo "$(acc $R/$1-lr$lr-s1) $lr"; done | sort -gr | head -1 | cut -d' ' -f2
}
for m in async sync standalone; do for lr in 0.0008 0.0015 0.003 0.006; do one $m $lr 1; done; done
for m in async sync standalone; do lr=$(best $m); for s in 2 3 4 5; do one $m $lr $s; done; done
echo "$(date +%T) all done" >> $R/log
docs/experiments/a3c_report.sh "$R" "$R/a3c.png"
