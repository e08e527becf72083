#!/usr/bin/env python3
"""scale_report: tests/bench/scale.sh's samples file into gnuplot data files
(workers.dat, params.dat in OUT) and a Markdown report on stdout: the two
tables, the server's parts measured in the same run, and what the figures
predict for 100 GPU workers on a 25 Gbit/s network (the arithmetic shown).

Samples lines: "meta KEY VALUE...", "optim|optim100 <bench_optim line>",
"wire 0 JSON", "workers|params ROUND JSON" or "... ROUND skip|fail WHY".
A figure is the median over rounds of each run's pushes_per_s (itself a
median over windows); lo / hi are the rounds' extremes.

usage: scale_report.py SAMPLES OUT_DIR"""
import json
import os
import statistics
import sys

LINK_GBIT = 25.0                   # the network of the prediction, per direction
GPUS = 100
# One H200 standalone, default model, fp32 momentum (BENCHMARKS.md, GPU section).
GPU_STEP = {256: 256 / 123205.0, 64: 64 / 54371.0}   # seconds per step


def read(path):
    meta, optim, runs, notes, wire = {}, {}, [], [], None
    for line in open(path):
        f = line.rstrip("\n").split(" ", 2)
        if f[0] == "meta" and len(f) == 3:
            meta[f[1]] = f[2]
        elif f[0] in ("optim", "optim100") and len(f) == 3:
            w = line.split()
            if len(w) >= 3 and w[1] in ("memcpy", "sgd", "momentum", "adam"):
                optim[(f[0], w[1])] = float(w[2])
            elif w[1] == "bench_optim:":
                optim[(f[0], "floats")] = int(w[2])
        elif f[0] == "wire" and len(f) == 3 and f[2].startswith("{"):
            wire = json.loads(f[2])
        elif f[0] in ("workers", "params", "pull") and len(f) == 3:
            if f[2].startswith("{"):
                o = json.loads(f[2])
                o["kind"] = f[0]
                runs.append(o)
            else:
                notes.append("%s round %s: %s" % (f[0], f[1], f[2]))
    return meta, optim, runs, notes, wire


def group(runs, kind, key):
    """{(series, x): [runs]} for one sweep; series = shards or workers."""
    g = {}
    for o in runs:
        if o["kind"] == kind:
            g.setdefault((o[key[0]], o[key[1]]), []).append(o)
    return g


def fig(rs, field="pushes_per_s"):
    v = [o[field] for o in rs]
    return statistics.median(v), min(v), max(v)


def write_dat(path, g, series_name, x_name):
    """One block per series (gnuplot's index), its title in column 2's header."""
    with open(path, "w") as f:
        for s in sorted({k[0] for k in g}):
            f.write('%s "%d %s%s" lo hi push_ms mb_per_s bytes_per_push shard_cpu_ms_per_push\n'
                    % (x_name, s, series_name.rstrip("s"), "s" if s > 1 else ""))
            for x in sorted(k[1] for k in g if k[0] == s):
                rs = g[(s, x)]
                med, lo, hi = fig(rs)
                f.write("%d %.3f %.3f %.3f %.4f %.2f %d %s\n" % (
                    x, med, lo, hi, fig(rs, "push_ms")[0], fig(rs, "mb_per_s")[0],
                    rs[0]["bytes_per_push"], "%.4f" % shard_ms(rs) if shard_ms(rs) else "NaN"))
            f.write("\n\n")


def cpu(rs):
    """'shards + workers' cores over the measured span, medians; '-' if not measured."""
    rs = [o for o in rs if "shards_cpu" in o]
    if not rs:
        return "-"
    return "%.2f + %.2f" % (fig(rs, "shards_cpu")[0], fig(rs, "workers_cpu")[0])


def shard_ms(rs):
    rs = [o for o in rs if o.get("shard_cpu_ms_per_push", -1) > 0]
    return fig(rs, "shard_cpu_ms_per_push")[0] if rs else None


def table_workers(g):
    shards = sorted({k[0] for k in g})
    xs = sorted({k[1] for k in g})
    print("| workers | " + " | ".join("%d shard%s: pushes/s (min-max)" % (s, "s" if s > 1 else "")
                                     for s in shards) +
          " | 1 shard: push ms | MB/s | CPU cores, shard + workers | shard CPU ms per push |")
    print("|---:|" + "---:|" * (len(shards) + 4))
    for x in xs:
        cells = []
        for s in shards:
            rs = g.get((s, x))
            cells.append("%.0f (%.0f-%.0f)" % fig(rs) if rs else "-")
        one = g.get((shards[0], x))
        if one:
            ms = shard_ms(one)
            cells += ["%.2f" % fig(one, "push_ms")[0], "%.0f" % fig(one, "mb_per_s")[0], cpu(one),
                      "%.2f" % ms if ms else "-"]
        else:
            cells += ["-"] * 4
        print("| %d | %s |" % (x, " | ".join(cells)))


def table_params(g):
    ws = sorted({k[0] for k in g})
    xs = sorted({k[1] for k in g})
    head = " | ".join("%d worker%s: pushes/s (min-max) | MB/s | shard CPU ms per push | CPU cores, shard + workers"
                      % (w, "s" if w > 1 else "") for w in ws)
    print("| parameters | MB per push | " + head + " |")
    print("|---:|---:|" + "---:|---:|---:|---:|" * len(ws))
    for x in xs:
        cells = []
        for w in ws:
            rs = g.get((w, x))
            if rs:
                ms = shard_ms(rs)
                cells.append("%.1f (%.1f-%.1f) | %.0f | %s | %s" % (fig(rs) + (
                    fig(rs, "mb_per_s")[0], "%.1f" % ms if ms else "-", cpu(rs))))
            else:
                cells.append("- | - | - | -")
        b = next(g[k][0]["bytes_per_push"] for k in g if k[1] == x)
        print("| %s | %.0f | %s |" % ("{:,}".format(x), b / 1e6, " | ".join(cells)))


def table_pull(g):
    print("| workers | pull + push per s (min-max) | pull ms | push ms | shard CPU ms per pull + push |"
          " CPU cores, shard + workers |")
    print("|---:|---:|---:|---:|---:|---:|")
    for k in sorted(g):
        rs = g[k]
        ms = shard_ms(rs)
        print("| %d | %.0f (%.0f-%.0f) | %.2f | %.2f | %s | %s |" % ((k[1],) + fig(rs) + (
            fig(rs, "pull_ms")[0], fig(rs, "push_ms")[0], "%.2f" % ms if ms else "-", cpu(rs))))


def predict(gw, gp, gl, optim, wire):
    """The arithmetic for 100 GPUs, from this run's figures."""
    one = {k[1]: v for k, v in gw.items() if k[0] == 1}
    if not one:
        return
    rates = {w: fig(v)[0] for w, v in one.items()}
    best_w = max(rates, key=rates.get)
    b = next(v[0]["bytes_per_push"] for v in one.values())
    # The shard's own CPU time per push, whatever share of the cores it got:
    # the median over every 1-shard run of the workers sweep.
    ms = shard_ms([o for v in one.values() for o in v]) or 1e3 / rates[best_w]
    ms_step = shard_ms([o for v in gl.values() for o in v])   # a pull and a push
    link = LINK_GBIT * 1e9 / 8
    apply_ms = optim.get(("optim", "sgd"))
    print("\nWhat it predicts for %d GPU workers on a %.0f Gbit/s network (default model):\n" % (GPUS, LINK_GBIT))
    print("- bytes per push B = %s (%.2f MB); a pull moves the same back." % ("{:,}".format(b), b / 1e6))
    print("- server cost: one shard spent %.2f ms of CPU per push (median over the 1-shard runs),"
          " so one core takes %.0f pushes/s = %.2f GB/s of gradients. Here it got at most %.0f pushes/s"
          " (%d worker%s): the cores are shared with the workers." % (
              ms, 1e3 / ms, b / ms / 1e6, rates[best_w], best_w, "s" if best_w > 1 else ""))
    if apply_ms:
        print("- of the %.2f ms, the optimizer's apply alone (bench_optim, sgd, same run) is %.2f ms (%.0f%%);"
              " the rest is the wire: receiving, checksum and finiteness checks, acknowledging." % (
                  ms, apply_ms, 100 * apply_ms / ms))
    if wire:
        print("- a plain ZeroMQ round trip of B (same run) took %.2f ms: %.2f GB/s each way on loopback." % (
            wire["raw_zmq_roundtrip_ms"], b / (wire["raw_zmq_roundtrip_ms"] / 2e3) / 1e9))
    if ms_step:
        print("- with a pull before each push (a worker's whole exchange) the shard spent %.2f ms of CPU"
              " per pull + push." % ms_step)
    print("- a %.0f Gbit/s link moves %.3f GB/s each way: one push or pull of B takes at least %.2f ms on it,"
          " %.1fx the shard's CPU time for it." % (LINK_GBIT, link / 1e9, 1e3 * b / link, 1e3 * b / link / ms))
    for batch, t in sorted(GPU_STEP.items(), reverse=True):
        demand = GPUS / t
        print("- batch %d: an H200 step takes %.2f ms standalone, so %d GPUs want %.0f pushes/s ="
              " %.0f GB/s into the servers (and as much out for the pulls)."
              % (batch, 1e3 * t, GPUS, demand, demand * b / 1e9))
        k_link = demand * b / link
        k_cpu = demand * ms / 1e3
        k_step = demand * (ms_step or ms) / 1e3
        print("  - a separate server tier needs >= %.0f links of %.0f Gbit/s (inbound; as many outbound) and"
              " >= %.0f cores for the pushes alone, %.0f with the pulls: %s binds first."
              % (k_link, LINK_GBIT, k_cpu, k_step, "the CPU" if k_cpu > k_link else "the network"))
        # One shard on each GPU host: inbound, each host's link takes its
        # worker's pull (B) and its shard's slices of every worker's push
        # (100 x B/100 = B); outbound the same in reverse; the shard's core
        # takes B of pushes per step.
        step_link = 2 * b / link
        step_cpu = (ms_step or ms) / 1e3
        step = max(t, step_link, step_cpu)
        what = "the link" if step == step_link else ("the shard's CPU" if step == step_cpu else "compute")
        print("  - one shard on each of the %d GPU hosts (1/%d of the model each): per step a host's link"
              " carries 2 B each way (%.2f ms) and its shard's core serves B of pulls and takes B of pushes (%.2f ms), so a step"
              " takes >= %.2f ms: %.2fx standalone, %.0f images/s per GPU; %s binds."
              % (GPUS, GPUS, 1e3 * step_link, 1e3 * step_cpu, 1e3 * step, t / step, batch / step, what))


def main():
    samples, out = sys.argv[1], sys.argv[2]
    meta, optim, runs, notes, wire = read(samples)
    gw = group(runs, "workers", ("shards", "workers"))
    gp = group(runs, "params", ("workers", "params"))
    gl = group(runs, "pull", ("shards", "workers"))
    write_dat(os.path.join(out, "workers.dat"), gw, "shards", "workers")
    write_dat(os.path.join(out, "params.dat"), gp, "workers", "params")
    print("Scale: %s, %s, %s cores, %s GiB; commit %s; %s rounds, %s s measured per point; took %s s;"
          % (meta.get("date", "?"), meta.get("cpu", "?"), meta.get("cores", "?"),
             meta.get("mem_gib", "?"), meta.get("commit", "?"), meta.get("rounds", "?"),
             meta.get("seconds", "?"), meta.get("took", "?")))
    print("load average (1, 5, 15 min) %s before, %s after.\n" % (meta.get("load0", "?"), meta.get("load1", "?")))
    if gw:
        print("Pushes/s the shards sustained, default model, as worker processes grow"
              " (median over rounds; min-max of the rounds):\n")
        table_workers(gw)
    if gp:
        print("\nAs the model grows, 1 shard:\n")
        table_params(gp)
    if gl:
        print("\nA pull before every push (--pull; a worker's step without compute), 1 shard, default model:\n")
        table_pull(gl)
    if optim:
        print("\nThe server's apply alone, 1 thread (bench_optim, ms per sweep): " + ", ".join(
            "%s %s floats: %s" % (tag, "{:,}".format(optim.get((tag, "floats"), 0)), " ".join(
                "%s %.3f" % (k, optim[(tag, k)]) for k in ("memcpy", "sgd", "momentum", "adam")
                if (tag, k) in optim)) for tag in ("optim", "optim100") if (tag, "floats") in optim))
    predict(gw, gp, gl, optim, wire)
    for n in notes:
        print("note: " + n)


if __name__ == "__main__":
    main()
