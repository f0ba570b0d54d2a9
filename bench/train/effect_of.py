#!/usr/bin/env python3
"""What a train flag changes in the result and what it costs: whole `ampp train` runs (the default job
unless flags follow `--`) with and without the flag, for seeds 0..N-1, alternating. Prints per seed the
final test accuracy of both, then mean and standard deviation, and the images/s ratio with/without
(median over the seeds; 1.0 = free). From a built tree:
    python3 bench/train/effect_of.py --ampp build/bin/ampp --flag=--sync-bn [--seeds 5] [-- --nproc 2]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path


def run(ampp, out, seed, flags, extra):
    cmd = [ampp, "train", "--seed", str(seed), "--out", str(out), "--quiet", "--no-plots"] + flags + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def describe(values):
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} +- {sd:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--flag", action="append", required=True, help="the train flag whose effect is measured")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="more ampp train flags for both runs (after --)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            plain = run(a.ampp, Path(tmp) / f"plain{seed}", seed, [], a.extra)
            flagged = run(a.ampp, Path(tmp) / f"flag{seed}", seed, a.flag, a.extra)
            rows.append((seed, plain, flagged))
            print(f"seed {seed}: test accuracy {plain['test_accuracy']:.2f}% without, "
                  f"{flagged['test_accuracy']:.2f}% with {' '.join(a.flag)}; images/s "
                  f"{plain['images_per_sec']:.0f} / {flagged['images_per_sec']:.0f}", flush=True)
    acc_plain = [p["test_accuracy"] for _, p, _ in rows]
    acc_flag = [f["test_accuracy"] for _, _, f in rows]
    ratios = [f["images_per_sec"] / p["images_per_sec"] for _, p, f in rows]
    job = " ".join(a.extra) or "the default job"
    print(f"{job}, {a.seeds} seeds: test accuracy {describe(acc_plain)}% without, {describe(acc_flag)}% with "
          f"{' '.join(a.flag)} (difference of means {statistics.mean(acc_flag) - statistics.mean(acc_plain):+.2f} "
          f"points); images/s with/without: median {statistics.median(ratios):.3f}x "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
