#!/usr/bin/env python3
"""ampp against Python PyTorch on the same job, side by side: `ampp train` and bench/peer/peer_train.py
(the same models, data, sampler, batch, SGD, DDP over Gloo, autocast), alternating, several rounds (the
order flips every round), per configuration. Prints per configuration the medians and the ratios
ampp/Python of images/s, peak RSS (the largest process of each run's process tree: the max over ranks, from
the kernel's accounting of the waited-for children), wall time from start to the final accuracy, and the
final test losses and accuracies side by side. For the GPTs (--models gpt-tiny) the rate is tokens/s and the
accuracy is next-token accuracy.

The recipe (--recipe): `peer`, one for every model (SGD at a constant lr, no clipping, global batch 128), or
`gpt`, a GPT's own in ampp train (nanoGPT's: AdamW, the cosine schedule, clipping at 1, global batch 32), given
to both sides as the same flags (RECIPES). Each round also checks that the two trained the same schedule: the
lr of every step in ampp's metrics.jsonl against peer_train.py's (it stops on a mismatch), and prints rank 0's
loss at ampp's first logged step on both sides (the same weights and batch: equal up to rounding).

    python3 bench/peer/compare.py --ampp build/bin/ampp [--python .venv/bin/python] [--rounds 3]
        [--models cnn mlp] [--precisions fp32 bf16] [--epochs 3] [--nproc 2] [--recipe peer]
    python3 bench/peer/compare.py --ampp build/bin/ampp --models gpt-mini --precisions fp32 --recipe gpt
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

PEER = Path(__file__).resolve().parent / "peer_train.py"
AMPP_PRECISION = {"fp32": ["--opt-level", "O0"], "bf16": ["--opt-level", "O1", "--dtype", "bf16"],
                  "fp16": ["--opt-level", "O1", "--dtype", "fp16"]}
# The same flags for both sides: ampp train's names, which peer_train.py takes too. `peer`: for every model SGD at
# a constant lr, no clipping, ampp's default batch 128, lr 0.05 and weight decay 1e-4 (a GPT's own default is
# nanoGPT's). `gpt`: a GPT's defaults in ampp (with_model_defaults in src/ampp/train/options.cpp) written out, so
# that they hold for any model, at nanoGPT-on-a-CPU's global batch 32.
RECIPES = {
    "peer": ["--optimizer", "sgd", "--lr-schedule", "step", "--clip-grad-norm", "0"],
    "gpt": ["--batch-size", "32", "--optimizer", "adamw", "--lr", "6e-4", "--weight-decay", "0.1",
            "--lr-schedule", "cosine", "--warmup-steps", "0", "--clip-grad-norm", "1"],
}


def timed(cmd):
    """Runs cmd; returns (wall seconds, peak RSS in MiB of its largest process)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024.0


def run_ampp(a, model, precision, out):
    cmd = [a.ampp, "train", "--model", model, "--nproc", str(a.nproc), "--epochs", str(a.epochs), "--seed", "0",
           "--out", str(out), "--quiet", "--no-plots"] + AMPP_PRECISION[precision] + (["--nchw"] if a.nchw else [])
    wall, rss = timed(cmd + RECIPES[a.recipe])
    s = json.loads((out / "summary.json").read_text())
    # The whole run's rate, evaluations included, as peer_train.py counts it (ampp's summary leads with the
    # steady state: docs/training.md); tokens/s for the GPTs.
    rate = s.get("wall_images_per_sec", s["images_per_sec"])
    if "tokens_per_sec" in s:
        rate *= s["tokens_per_sec"] / s["images_per_sec"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: (r["lr"], r["loss"]) for r in records if r["type"] == "step"}  # every --log-every steps
    return {"images_per_sec": rate, "rss": rss, "wall": wall, "accuracy": s["test_accuracy"], "loss": s["test_loss"],
            "steps": steps}


def run_python(a, model, precision, out):
    cmd = [a.python, str(PEER), "--model", model, "--precision", precision, "--nproc", str(a.nproc),
           "--epochs", str(a.epochs), "--out", str(out), "--recipe", a.recipe] + RECIPES[a.recipe] + \
        (["--nchw"] if a.nchw else []) + (["--widen-attention"] if a.widen_attention else [])
    wall, rss = timed(cmd)
    s = json.loads(out.read_text())
    steps = {k + 1: (lr, loss) for k, (lr, loss) in enumerate(zip(s["lrs"], s["losses"]))}  # ampp counts from 1
    return {"images_per_sec": s.get("tokens_per_sec") or s["images_per_sec"], "rss": rss, "wall": wall,
            "accuracy": s["test_accuracy"], "loss": s["test_loss"], "steps": steps}


def same_schedule(ampp, py):
    """Stops unless both ran as many steps, at the same lr at each step ampp logged (both doubles of the one
    formula); returns a line with the lr and rank 0's loss at ampp's first and last logged steps."""
    logged = sorted(ampp["steps"])
    wrong = [k for k in logged
             if k not in py["steps"] or not math.isclose(ampp["steps"][k][0], py["steps"][k][0], rel_tol=1e-6)]
    if wrong or len(py["steps"]) != logged[-1]:
        raise SystemExit(f"ampp and peer_train.py trained different schedules: {len(py['steps'])} steps in Python, "
                         f"ampp's last logged step {logged[-1]}, lr differs at steps {wrong[:5]}")
    return ", ".join(f"step {k}: lr {ampp['steps'][k][0]:.3g}, loss ampp {ampp['steps'][k][1]:.4f} Python "
                     f"{py['steps'][k][1]:.4f}" for k in (logged[0], logged[-1]))


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--nchw", action="store_true",
                    help="both sides keep cnn/resnet activations in NCHW order (default: channels-last, ampp's default)")
    ap.add_argument("--widen-attention", action="store_true",
                    help="the Python GPTs get ampp's attention (default: nanoGPT's, as written)")
    ap.add_argument("--python", default=str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python"))
    ap.add_argument("--models", nargs="+", default=["cnn", "mlp"])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=sorted(AMPP_PRECISION))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="peer",
                    help="peer: SGD, constant lr, no clipping, batch 128 for every model; gpt: a GPT's own (nanoGPT's)")
    a = ap.parse_args()
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            for precision in a.precisions:
                ampp, py = [], []
                for r in range(a.rounds):
                    order = [("ampp", run_ampp, ampp), ("python", run_python, py)]
                    for name, fn, into in (order if r % 2 == 0 else order[::-1]):
                        out = Path(tmp) / f"{model}-{precision}-{name}-{r}"
                        into.append(fn(a, model, precision, out if name == "ampp" else out.with_suffix(".json")))
                    shown = ("images_per_sec", "rss", "wall", "accuracy", "loss")
                    print(f"{model} {precision} round {r}: ampp {({k: ampp[-1][k] for k in shown})}, "
                          f"python {({k: py[-1][k] for k in shown})}; {same_schedule(ampp[-1], py[-1])}", flush=True)
                rows.append((model, precision, ampp, py))
    flags = RECIPES[a.recipe]
    batch = flags[flags.index("--batch-size") + 1] if "--batch-size" in flags else "128 (ampp's default)"
    print(f"\n{a.nproc} processes x 1 thread, recipe {a.recipe} ({' '.join(flags)}), global batch {batch}, "
          f"{a.epochs} epochs, {a.rounds} rounds (medians):")
    print("| model | precision | images/s (GPTs: tokens/s) ampp | Python | ratio | peak RSS MiB ampp | Python | ratio "
          "| wall s ampp | Python | ratio | test loss ampp | Python | test accuracy ampp | Python |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model, precision, ampp, py in rows:
        cells = [model, precision]
        for key, fmt in (("images_per_sec", "{:.0f}"), ("rss", "{:.0f}"), ("wall", "{:.1f}")):
            x, y = median(ampp, key), median(py, key)
            cells += [fmt.format(x), fmt.format(y), f"{x / y:.2f}"]
        cells += [f"{median(ampp, 'loss'):.4f}", f"{median(py, 'loss'):.4f}"]
        cells += [f"{median(ampp, 'accuracy'):.2f}", f"{median(py, 'accuracy'):.2f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
