#!/usr/bin/env python3
"""What a debugging aid costs `ampp train`: the same short run with and without it, alternating, several
rounds; prints images/s of each and the ratio with/without (1.0 = free). The aid is a train flag
(`--flag=--doctor`) or an environment setting (`--env TORCH_DISTRIBUTED_DEBUG=DETAIL`). From a built tree:
    python3 bench/train/cost_of.py --ampp build/bin/ampp --flag=--doctor [--rounds 5] [--steps 200] [-- train flags]
    python3 bench/train/cost_of.py --ampp build/bin/ampp --env TORCH_DISTRIBUTED_DEBUG=DETAIL
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def images_per_sec(ampp, out, steps, flags, env, extra):
    cmd = [ampp, "train", "--steps", str(steps), "--out", str(out), "--quiet", "--no-plots"] + flags + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads((out / "summary.json").read_text())["images_per_sec"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--flag", action="append", default=[], help="a train flag that turns the aid on")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE that turns the aid on")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("extra", nargs="*", help="more ampp train flags (after --)")
    a = ap.parse_args()
    if not a.flag and not a.env:
        ap.error("name the aid: --flag=--doctor or --env NAME=VALUE")
    with_env = dict(os.environ, **dict(kv.split("=", 1) for kv in a.env))
    plain, aided = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            plain.append(images_per_sec(a.ampp, Path(tmp) / f"plain{r}", a.steps, [], os.environ, a.extra))
            aided.append(images_per_sec(a.ampp, Path(tmp) / f"aided{r}", a.steps, a.flag, with_env, a.extra))
    p, d = statistics.median(plain), statistics.median(aided)
    aid = " ".join(a.flag + a.env)
    print(f"ampp train, {a.steps} steps, {a.rounds} rounds alternating, median images/s (all workers):")
    print(f"  without   {p:8.0f}   (rounds: {', '.join(f'{x:.0f}' for x in plain)})")
    print(f"  with      {d:8.0f}   (rounds: {', '.join(f'{x:.0f}' for x in aided)})   [{aid}]")
    print(f"  with / without = {d / p:.3f}  (1.0 = free)")


if __name__ == "__main__":
    sys.exit(main())
