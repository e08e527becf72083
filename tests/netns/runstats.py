#!/usr/bin/env python3
"""runstats.py DIR: one JSON line about a finished run, from DIR/summary.json
(the chief's) and DIR/metrics/worker-*.jsonl (one line per step and worker).

The summary's images_per_s is the crew's samples (a fixed crew's: the chief's
times the worker count) over the chief's loop and its wait for the last
worker; here each worker's rate is its own images over its own time, and the
cluster's is every worker's images over the span from the first start to the
last step. Staleness per worker is that of
its pushes as the server answered them.

  {"mode", "replicas", "workers", "steps", "images_per_s", "applied_images_per_s",
   "staleness_mean", "staleness_max", "updates_applied", "updates_dropped",
   "test_accuracy", "per_worker": [{"worker", "steps", "images_per_s",
   "staleness_mean", "staleness_max", "applied", "dropped", "t_start", "t_end"}]}
"""
import glob
import json
import os
import sys


def worker_stats(path, batch):
    start, steps = None, []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "start":
                start = rec["t"]
            elif "step" in rec and "status" in rec:
                steps.append(rec)
    if start is None or not steps:
        raise ValueError(f"{path}: no start line or no steps")
    end = steps[-1]["t"]
    span = max(end - start, 1e-9)
    stale = [s["staleness"] for s in steps]
    return {
        "worker": steps[0]["worker"],
        "steps": len(steps),
        "images_per_s": round(len(steps) * batch / span, 1),
        "staleness_mean": round(sum(stale) / len(stale), 3),
        "staleness_max": max(stale),
        "applied": sum(s["status"] == "applied" for s in steps),
        "dropped": sum(s["status"] == "dropped" for s in steps),
        "t_start": start,
        "t_end": end,
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: runstats.py RUN_DIR")
    d = sys.argv[1]
    try:
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
        batch = s["batch"]
        per = [worker_stats(p, batch) for p in sorted(glob.glob(os.path.join(d, "metrics", "worker-*.jsonl")))]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"runstats: {d}: {e}")
    if not per:
        sys.exit(f"runstats: {d}: no metrics/worker-*.jsonl")
    span = max(max(w["t_end"] for w in per) - min(w["t_start"] for w in per), 1e-9)
    out = {
        "mode": s["mode"],
        "replicas": s.get("replicas_to_aggregate"),
        "workers": s["workers"],
        "steps": s["steps"],
        "images_per_s": round(sum(w["steps"] for w in per) * batch / span, 1),
        "applied_images_per_s": round(sum(w["applied"] for w in per) * batch / span, 1),
        "staleness_mean": round(s["staleness_mean"], 3),
        "staleness_max": s["staleness_max"],
        "updates_applied": s["updates_applied"],
        "updates_dropped": s["updates_dropped"],
        "test_accuracy": s["test_accuracy"],
        "per_worker": sorted(per, key=lambda w: w["worker"]),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
