#!/usr/bin/env python3
"""What `ampp train --doctor` costs: the same short run with and without the doctor, alternating, several
rounds; prints images/s of each and the ratio doctor/plain (1.0 = free). Run from a built tree:
    python3 bench/train/doctor_cost.py --ampp build/bin/ampp [--rounds 5] [--steps 200] [-- extra train flags]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def images_per_sec(ampp, out, steps, doctor, extra):
    cmd = [ampp, "train", "--steps", str(steps), "--out", str(out), "--quiet", "--no-plots"]
    cmd += ["--doctor"] if doctor else []
    subprocess.run(cmd + extra, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())["images_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("extra", nargs="*", help="more ampp train flags (after --)")
    a = ap.parse_args()
    plain, doctor = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for on, runs in ((False, plain), (True, doctor)):
                out = Path(tmp) / f"{'doctor' if on else 'plain'}{r}"
                runs.append(images_per_sec(a.ampp, out, a.steps, on, a.extra))
    p, d = statistics.median(plain), statistics.median(doctor)
    print(f"ampp train, {a.steps} steps, {a.rounds} rounds alternating, median images/s (all workers):")
    print(f"  plain  {p:8.0f}   (rounds: {', '.join(f'{x:.0f}' for x in plain)})")
    print(f"  doctor {d:8.0f}   (rounds: {', '.join(f'{x:.0f}' for x in doctor)})")
    print(f"  doctor / plain = {d / p:.3f}  (1.0 = the doctor is free)")


if __name__ == "__main__":
    sys.exit(main())
