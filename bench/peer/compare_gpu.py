#!/usr/bin/env python3
"""`ampp train --device cuda` against its Python twin (bench/peer/peer_train_gpu.py) on the same GPU: the
same model, data size on the device, batch, fused SGD, opt level and a read every 10 steps. Alternating
rounds (the order flips every round); the medians of steady-state images/s (after the first 20 steps,
evaluation excluded, as both summaries count them) and their ratio, for the eager trainer and for
`--cuda-graphs` (against the same eager Python twin), with the issue's bars judged in the same table:
cnn at least 1.3x eager and 3x graphed, resnet at least 1.0x.

    python3 bench/peer/compare_gpu.py --ampp build/bin/ampp [--python python3] [--rounds 2]
        [--models cnn resnet] [--levels O0 O1-bf16 O1-fp16 O2-fp16] [--budget-s 200]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

TWIN = Path(__file__).resolve().parent / "peer_train_gpu.py"
BARS = {("cnn", False): 1.3, ("cnn", True): 3.0, ("resnet", False): 1.0, ("resnet", True): 1.0}


def level_flags(level):
    opt, _, dtype = level.partition("-")
    return opt, dtype or "bf16"


def run(cmd, summary):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(Path(summary).read_text())


def run_ampp(a, model, level, graphs, out):
    opt, dtype = level_flags(level)
    cmd = [a.ampp, "train", "--device", a.device, "--nproc", "1", "--model", model, "--data", f"synthetic:{a.images}",
           "--batch-size", str(a.batch_size), "--epochs", str(a.epochs), "--log-every", "10", "--opt-level", opt,
           "--dtype", dtype, "--quiet", "--no-plots", "--out", str(out)] + (["--cuda-graphs"] if graphs else [])
    return run(cmd, out / "summary.json")


def run_python(a, model, level, out):
    opt, dtype = level_flags(level)
    cmd = [a.python, str(TWIN), "--model", model, "--level", opt, "--dtype", dtype, "--images", str(a.images),
           "--batch-size", str(a.batch_size), "--epochs", str(a.epochs), "--log-every", "10", "--device", a.device,
           "--out", str(out)]
    return run(cmd, out)


def rate(results):
    rates = [r["images_per_sec"] for r in results if "images_per_sec" in r]
    return statistics.median(rates) if rates else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampp", required=True)
    ap.add_argument("--python", default="python3")
    ap.add_argument("--models", nargs="+", default=["cnn", "resnet"])
    ap.add_argument("--levels", nargs="+", default=["O0", "O1-bf16", "O1-fp16", "O2-fp16"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--images", type=int, default=32768)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1e9, help="no new case starts after this many seconds")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to check this script where there is no GPU")
    a = ap.parse_args()
    start, rows, left_out = time.monotonic(), [], []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            for level in a.levels:
                if time.monotonic() - start > a.budget_s:
                    left_out.append(f"{model} {level}")
                    continue
                eager, graphed, py = [], [], []
                for r in range(a.rounds):
                    sides = [lambda: eager.append(run_ampp(a, model, level, False, Path(tmp) / f"e{r}")),
                             lambda: graphed.append(run_ampp(a, model, level, True, Path(tmp) / f"g{r}")),
                             lambda: py.append(run_python(a, model, level, Path(tmp) / f"p{r}.json"))]
                    for side in (sides if r % 2 == 0 else sides[::-1]):
                        side()
                print(f"{model} {level}: ampp {eager}, graphed {graphed}, python {py}", flush=True)
                rows.append((model, level, rate(eager), rate(graphed), rate(py), eager + graphed + py))
    print(f"\n`ampp train --device cuda` against its Python twin, synthetic:{a.images}, batch {a.batch_size}, "
          f"{a.epochs} epochs, {a.rounds} rounds (medians of steady-state images/s):")
    print("| model | level | ampp eager | ampp --cuda-graphs | Python eager | eager ratio | graphed ratio | bars |")
    print("|---|---|---|---|---|---|---|---|")
    for model, level, e, g, p, runs in rows:
        errors = [r["error"] for r in runs if "error" in r]
        ratio = [x / p if x and p else None for x in (e, g)]
        bars = [f"{'met' if r >= BARS[(model, graphs)] else 'NOT met'} ({BARS[(model, graphs)]}x)" if r else "not measured"
                for r, graphs in zip(ratio, (False, True))]
        cells = [model, level] + [f"{x:.0f}" if x else "failed" for x in (e, g, p)] + \
            [f"{r:.2f}x" if r else "-" for r in ratio] + ["eager " + bars[0] + ", graphed " + bars[1]]
        print("| " + " | ".join(cells) + " |" + (f" errors: {errors}" if errors else ""))
    if left_out:
        print(f"left out (budget of {a.budget_s:.0f} s spent): {', '.join(left_out)}")


if __name__ == "__main__":
    main()
