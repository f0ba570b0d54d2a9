#!/usr/bin/env python3
"""Which layout of processes x threads trains fastest on this machine, and what stops data parallelism from
scaling: `ampp train` (same job, same global batch) in each layout, alternating, several rounds; images/s of
all workers (median), and the ratio to one process with one thread (1x1) measured in the same run.

Besides the layouts (PxT: P DDP processes with T intra-op threads each) it measures the *ceiling* of P
processes: P independent one-process trainings started together, each on the per-process batch (global / P),
with no communication at all. Their summed images/s is what P x 1 DDP could reach on this machine if
communication and synchronisation were free; what is left between DDP and the ceiling is DDP's, what is left
between the ceiling and P times 1x1 is the machine's (shared caches, memory bandwidth, the smaller batch).

    python3 bench/train/layouts.py --ampp build/bin/ampp [--layouts 1x1 1x2 2x1] [--rounds 3] [--steps 300]
        [--precisions fp32 bf16] [-- more ampp train flags, e.g. --model resnet]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PRECISION = {"fp32": ["--opt-level", "O0"], "bf16": ["--opt-level", "O1", "--dtype", "bf16"],
             "fp16": ["--opt-level", "O1", "--dtype", "fp16"]}


def train_cmd(a, out, nproc, threads, batch, precision, log_every=None):
    return [a.ampp, "train", "--nproc", str(nproc), "--threads", str(threads), "--batch-size", str(batch),
            "--steps", str(a.steps), "--epochs", "1", "--seed", "0", "--out", str(out), "--quiet", "--no-plots",
            "--data", a.data, "--log-every", str(log_every or a.steps // 10)] + PRECISION[precision] + a.extra


def training_rate(out, batch):
    """images/s between the first and the last logged step: training only (no start-up, data loading,
    first-step warm-up or evaluation)."""
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("type") == "step"]
    first, last = steps[0], steps[-1]
    return (last["step"] - first["step"]) * batch / (last["elapsed"] - first["elapsed"])


def lockstep_rate(outs, batch):
    """The independent runs' images/s had they met once per step, as DDP's workers do: step i of all of
    them ends when the slowest ends (their logged step times, step by step, maxed). The independent runs'
    own noise alone, without any communication, costs this much."""
    times = []
    for out in outs:
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        elapsed = [s["elapsed"] for s in steps if s.get("type") == "step"]
        times.append([b - e for e, b in zip(elapsed[9:], elapsed[10:])])  # from step 10: past the warm-up
    n = min(len(t) for t in times)
    return n * batch * len(outs) / sum(max(t[i] for t in times) for i in range(n))


def run_together(cmds, outs, batch):
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p, c in zip(procs, cmds):
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"failed: {' '.join(c)}\n{err.decode()}")
    return sum(training_rate(o, batch) for o in outs)


def measure(a, tmp, layout, precision, r):
    nproc, threads = (int(x) for x in layout.rstrip("i").split("x"))
    out = Path(tmp) / f"{layout}-{precision}-{r}"
    if not layout.endswith("i"):
        return run_together([train_cmd(a, out, nproc, threads, a.batch_size, precision)], [out], a.batch_size)
    outs = [out.with_name(f"{out.name}-{k}") for k in range(nproc)]  # the ceiling: independent processes
    batch = a.batch_size // nproc
    rate = run_together([train_cmd(a, o, 1, threads, batch, precision, log_every=1) for o in outs], outs, batch)
    return rate, lockstep_rate(outs, batch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--layouts", nargs="+", default=["1x1", "1x2", "2x1", "2x1i"],
                    help="PxT: P DDP processes x T threads; PxTi: P independent processes (the ceiling)")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=sorted(PRECISION))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=128, help="global batch")
    ap.add_argument("--data", default="fashion-mnist")
    ap.add_argument("extra", nargs="*", help="more ampp train flags (after --)")
    a = ap.parse_args()
    if a.layouts[0] != "1x1":
        ap.error("the first layout is the baseline and must be 1x1")
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}, {os.cpu_count()} cores", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = a.layouts if r % 2 == 0 else a.layouts[::-1]
            for precision in a.precisions:
                for layout in order:
                    rate = measure(a, tmp, layout, precision, r)
                    if isinstance(rate, tuple):  # an independent layout: its rate and its lockstep rate
                        rate, lockstep = rate
                        results.setdefault((precision, layout + " lockstep"), []).append(lockstep)
                    results.setdefault((precision, layout), []).append(rate)
            print(f"round {r}: " + ", ".join(f"{p} {l} {v[-1]:.0f}" for (p, l), v in results.items()), flush=True)
    print(f"\n`ampp train {' '.join(a.extra)}`, global batch {a.batch_size}, {a.steps} steps, "
          f"median of {a.rounds} rounds, images/s of all workers (ratio to 1x1 of the same precision):")
    print("| layout | " + " | ".join(a.precisions) + " |")
    print("|---|" + "---|" * len(a.precisions))
    rows = a.layouts + [l + " lockstep" for l in a.layouts if l.endswith("i")]
    for layout in rows:
        cells = []
        for precision in a.precisions:
            v, base = statistics.median(results[(precision, layout)]), statistics.median(results[(precision, "1x1")])
            cells.append(f"{v:.0f} ({v / base:.2f}x)")
        name = layout
        if layout.endswith("i"):
            name = layout + " independent (ceiling)"
        elif layout.endswith(" lockstep"):
            name = layout.split()[0] + " independent, had they met once per step"
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    sys.exit(main())
