#!/usr/bin/env python3
"""Issue 42's quality bar for fp8 training: the same `ampp train` GPT run in bf16 and with its Linear products
in fp8 (each recipe), printing each run's validation loss, its ratio to bf16's (the bar: within 2 %) and its
tokens/s beside bf16's. On a CPU fp8 is a check of the numerics, not a speedup (its products are float32
GEMMs on widened operands); on a GPU (--device cuda) the tokens/s ratio is the speedup.

    python3 bench/train/fp8_losses.py --ampp build/bin/ampp [--model gpt-tiny] [--steps 300]
        [--recipes tensorwise rowwise delayed] [--layers all] [--device cpu]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(ampp, args, flags, out):
    cmd = [ampp, "train", "--model", args.model, "--nproc", "1", "--steps", str(args.steps), "--device", args.device,
           "--quiet", "--no-plots", "--out", str(out)] + flags
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--recipes", nargs="+", default=["tensorwise", "rowwise", "delayed"])
    ap.add_argument("--layers", default="all", choices=["auto", "all"], help="--fp8-layers")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = run(args.ampp, args, ["--dtype", "bf16"], Path(tmp) / "bf16")
        rows.append(("bf16", base))
        for recipe in args.recipes:
            flags = ["--dtype", "fp8", "--fp8-recipe", recipe, "--fp8-layers", args.layers]
            rows.append((f"fp8 {recipe}", run(args.ampp, args, flags, Path(tmp) / recipe)))
    print(f"{args.model}, {args.steps} steps on {args.device} (`ampp train` defaults otherwise; fp8 layers: "
          f"{args.layers})\n")
    print("| precision | validation loss | vs bf16 | within 2 % | tokens/s | vs bf16 |")
    print("|---|---|---|---|---|---|")
    for name, s in rows:
        loss, rate = s["test_loss"], s["tokens_per_sec"]
        ratio = loss / base["test_loss"]
        print(f"| {name} | {loss:.4f} | {100 * (ratio - 1):+.2f} % | {'yes' if abs(ratio - 1) <= 0.02 else 'NO'} "
              f"| {rate:,.0f} | {rate / base['tokens_per_sec']:.2f}x |")
        print(f"  precision line: {s.get('precision', '?')}", file=sys.stderr)


if __name__ == "__main__":
    main()
