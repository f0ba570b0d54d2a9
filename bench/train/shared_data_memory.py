#!/usr/bin/env python3
"""What mapping the training images saves: `ampp train` with its images mapped from one file the local
workers share (the default) against `--data-in-memory` (each worker reads its own copy), same run,
alternating, the order flipping every round.

Every 20 ms the script reads, for each process of the run's tree (launcher and workers), VmHWM (the peak
RSS the kernel keeps) and the PSS (proportional set size: a page shared by k processes counts 1/k in
each) from /proc. It prints per mode the largest per-process peak RSS, the peak and the median over the
run of the tree's summed PSS (what the job costs the machine; the peak of a convolution model's run moves
by tens of MiB from run to run with oneDNN's scratch, the median much less) and the peak of the summed RSS
(what adding up `top`'s RES column would say: shared pages counted once per process). Medians over rounds.

    python3 bench/train/shared_data_memory.py --ampp build/bin/ampp [--nproc 2] [--steps 300] [--rounds 3]
"""
import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def children(pid):
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children(p))
    return out


def kib(path, key):
    """The value in kB of `key:` in a /proc file, or None when the process is gone."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def run(a, in_memory, out_dir):
    cmd = [a.ampp, "train", "--nproc", str(a.nproc), "--threads", "1", "--steps", str(a.steps), "--model", a.model,
           "--out", out_dir, "--quiet", "--no-plots"] + (["--data-in-memory"] if in_memory else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    hwm, pss_sum, rss_sum, pss_samples = {}, 0, 0, []
    while proc.poll() is None:
        pss_now = rss_now = 0
        for p in tree(proc.pid):
            peak, pss, rss = kib(f"/proc/{p}/status", "VmHWM"), kib(f"/proc/{p}/smaps_rollup", "Pss"), \
                kib(f"/proc/{p}/status", "VmRSS")
            if peak is not None:
                hwm[p] = max(hwm.get(p, 0), peak)
            pss_now += pss or 0
            rss_now += rss or 0
        pss_sum, rss_sum = max(pss_sum, pss_now), max(rss_sum, rss_now)
        pss_samples.append(pss_now)
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return {"process_peak": max(hwm.values()) / 1024, "tree_pss": pss_sum / 1024, "tree_rss": rss_sum / 1024,
            "tree_pss_median": statistics.median(pss_samples) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    results = {"mapped": [], "in memory": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["mapped", "in memory"] if r % 2 == 0 else ["in memory", "mapped"]
            for mode in order:
                m = run(a, mode == "in memory", f"{tmp}/{mode}-{r}")
                results[mode].append(m)
                print(f"round {r} {mode}: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in m.items()), flush=True)
    print(f"\n{a.model}, {a.nproc} workers x 1 thread, {a.steps} steps, medians of {a.rounds} rounds (MiB):")
    print(f"{'':<32}{'mapped':>10}{'in memory':>12}{'mapped - in memory':>20}")
    for key, label in [("process_peak", "largest process peak RSS"), ("tree_pss", "job's peak PSS (machine)"),
                       ("tree_pss_median", "job's median PSS over the run"), ("tree_rss", "job's peak summed RSS")]:
        mapped = statistics.median(m[key] for m in results["mapped"])
        memory = statistics.median(m[key] for m in results["in memory"])
        print(f"{label:<32}{mapped:>10.1f}{memory:>12.1f}{mapped - memory:>+20.1f}")


if __name__ == "__main__":
    main()
