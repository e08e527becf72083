#!/usr/bin/env bash
# `make run`: the main job on the embedded default — a local cluster of one
# parameter server and two asynchronous CPU workers training the default
# network on Fashion-MNIST (Debian's dataset-fashion-mnist) for one epoch.
# Results land in runs/make-run/. Extra flags: make run ARGS="--mode sync".
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/make-run}
mkdir -p "$out"
./build/downpour local --workers 2 --ps-shards 1 --mode async --epochs 1 --out "$out" ${ARGS:-}
echo "summary: $out/summary.json"
cat "$out/summary.json"
