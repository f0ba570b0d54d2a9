#!/usr/bin/env python3
"""What low-precision kernels cost in memory, ampp and Python PyTorch side by side, same run.

ampp: the peak RSS of `ampp train` at O2 bf16 minus O0 (1 worker x 1 thread, the same job and steps).
Python PyTorch (the oracle, same LibTorch kernels): the growth of the peak RSS over the same number of
training steps of the same model with bf16 weights minus with fp32 weights, each in a fresh process.
When Python's bf16 - fp32 is as large as ampp's O2 - O0, the difference is the kernels' (oneDNN's bf16
primitives and their scratch), not ampp's copies. Alternating rounds, medians.

    python3 bench/peer/low_precision_memory.py --ampp build/bin/ampp [--models mlp cnn] [--rounds 3]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def python_growth(model, dtype, batch, steps):
    """Child process body: peak RSS growth (MiB) over `steps` SGD steps of `model` in `dtype`."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(HERE))
    from peer_train import MODELS, peak_rss_mb
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    net = MODELS[model]().to(dt)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 1, 28, 28).to(dt), torch.randint(0, 10, (batch,))
    before = peak_rss_mb()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x).float(), y).backward()
        opt.step()
    return peak_rss_mb() - before


def run_python(a, model, dtype):
    out = subprocess.run([a.python, __file__, "--child", model, dtype, str(a.batch_size), str(a.steps)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def run_ampp(a, model, level, tmp):
    flags = ["--opt-level", "O0"] if level == "O0" else ["--opt-level", "O2", "--dtype", "bf16"]
    out = Path(tmp) / f"{model}-{level}"
    subprocess.run([a.ampp, "train", "--model", model, "--nproc", "1", "--threads", "1", "--steps", str(a.steps),
                    "--batch-size", str(a.batch_size), "--out", str(out), "--quiet", "--no-plots"] + flags,
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())["peak_rss_mb"]


def measure(a, model, tmp):
    runs = {k: [] for k in ("O0", "O2", "fp32", "bf16")}
    for r in range(a.rounds):
        order = ["O0", "O2", "fp32", "bf16"] if r % 2 == 0 else ["bf16", "fp32", "O2", "O0"]
        for k in order:
            runs[k].append(run_ampp(a, model, k, tmp) if k.startswith("O") else run_python(a, model, k))
    return {k: statistics.median(v) for k, v in runs.items()}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(python_growth(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--python", default=str(HERE.parents[1] / ".venv" / "bin" / "python"))
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print(f"1 thread, batch {a.batch_size}, {a.steps} steps, {a.rounds} rounds (medians, MiB)")
    print("| model | ampp O0 peak | ampp O2 bf16 peak | ampp O2 - O0 | Python fp32 growth | Python bf16 growth "
          "| Python bf16 - fp32 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            m = measure(a, model, tmp)
            print(f"| {model} | {m['O0']:.0f} | {m['O2']:.0f} | {m['O2'] - m['O0']:+.1f} | {m['fp32']:.1f} "
                  f"| {m['bf16']:.1f} | {m['bf16'] - m['fp32']:+.1f} |", flush=True)


if __name__ == "__main__":
    main()
