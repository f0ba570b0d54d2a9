#!/usr/bin/env python3
"""The GPU benchmark: ampp (bench/gpu/gpu_bench.cpp) beside Python PyTorch (python_side.py) on the same
device, in the same run, case by case: the same model, batch, precision and fused optimizer, synthetic data.
Prints a markdown table: items (images or tokens) per second, ms per step, peak allocated GPU memory
(max_memory_allocated on both sides), the ratios ampp/Python, the bars of bars.py judged, and the
limit: this GPU's measured bf16 matrix-product rate, with the GPT's model FLOP utilisation against it.

    python3 bench/gpu/compare.py --ampp build/bench/gpu/ampp_gpu_bench [--out table.md] [--budget-s 420]
    python3 bench/gpu/compare.py --ampp ... --device cpu --quick     # both sides run: CI's check

Cases run in order of importance until --budget-s is spent; the rest are listed as not run. A case whose
model or parameter count differs between the sides, or whose loss is not finite, fails the run. With
--results FILE, the cases already in FILE (an earlier run's, on the same machine) are kept and not run again,
and the new ones are added to it: a budget too short for every case is continued by a second run.
"""
import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples" / "python"))
from bars import bar_lines  # noqa: E402
from gpt import PRESETS  # noqa: E402

# (model, precision, channels_last, ampp's extra flags, Python's extra flags), most important first.
GPU_CASES = [
    ("cnn", "fp32", True, [], []),
    ("cnn", "bf16", True, [], []),
    ("cnn", "fp16", True, [], []),
    ("cnn", "bf16", True, ["--cuda-graphs"], ["--compile", "reduce-overhead"]),
    ("gpt2-124m", "bf16", False, [], []),
    ("gpt2-124m", "tf32", False, [], []),
    ("gpt2-124m", "fp16", False, [], []),
    ("resnet50", "fp32", False, [], []),
    ("resnet50", "bf16", True, [], []),
    ("resnet50", "fp16", True, [], []),
    ("resnet50", "tf32", False, [], []),
    ("resnet50", "bf16", False, [], []),
    ("resnet50", "fp16", False, [], []),
    ("cnn", "tf32", True, [], []),
    ("cnn", "o2-fp16", True, [], []),
    ("resnet50", "o2-fp16", True, [], []),
    ("gpt2-124m", "o2-bf16", False, [], []),
    ("cnn", "fp16", True, ["--cuda-graphs"], ["--compile", "reduce-overhead"]),
    ("gpt2-124m", "bf16", False, [], ["--compile", "default"]),
    ("cnn", "fp32", False, [], []),
    ("cnn", "bf16", False, [], []),
    ("cnn", "fp16", False, [], []),
]
# On a CPU: small shapes, a few steps; what CI checks is that both sides run the same models.
CPU_CASES = [
    ("cnn", "fp32", True, ["--batch", "16"], ["--batch", "16"]),
    ("cnn", "bf16", True, ["--batch", "16"], ["--batch", "16"]),
    ("cnn", "fp16", False, ["--batch", "16"], ["--batch", "16"]),
    ("cnn", "o2-bf16", True, ["--batch", "16"], ["--batch", "16"]),
    ("gpt-tiny", "bf16", False, ["--batch", "4"], ["--batch", "4"]),
    ("resnet50", "fp32", True, ["--batch", "2"], ["--batch", "2"]),
]


def run_side(command, timeout):
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["exit code %d" % done.returncode])[-1]}
    return json.loads(lines[-1])


def bf16_matmul_tflops(python):
    """The limit: an 8192^3 bf16 matrix product on this GPU, measured now."""
    code = ("import torch, time\n"
            "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)\n"
            "for _ in range(3): a @ b\n"
            "torch.cuda.synchronize(); t = time.perf_counter()\n"
            "for _ in range(20): a @ b\n"
            "torch.cuda.synchronize(); print(2 * 8192**3 * 20 / (time.perf_counter() - t) / 1e12)\n")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return float(done.stdout.strip()) if done.returncode == 0 else None


def gpt_flops_per_token(model, parameters):
    """nanoGPT's estimate: 6 N for the matrix products, 12 L H Q T for attention."""
    p = PRESETS[model]
    return 6 * parameters + 12 * p["n_layer"] * p["n_embd"] * p["context"]


def check_pair(ampp, python):
    """The reasons a pair fails the run: an error, a loss that is not finite, different models."""
    problems = [f"{side}: {r['error']}" for side, r in (("ampp", ampp), ("python", python)) if "error" in r]
    for side, r in (("ampp", ampp), ("python", python)):
        if "loss" in r and not math.isfinite(r["loss"]):
            problems.append(f"{side}: the loss is {r['loss']}")
    if "parameters" in ampp and "parameters" in python and ampp["parameters"] != python["parameters"]:
        problems.append(f"the models differ: {ampp['parameters']} parameters in ampp, {python['parameters']} in Python")
    return problems


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) and value >= 0 else "-"


def table_row(case, ampp, python, limit):
    model, precision, channels_last, ampp_flags, python_flags = case
    layout = "NHWC" if channels_last and model != "gpt2-124m" and not model.startswith("gpt") else "-"
    how = " ".join(f for f in ampp_flags if f.startswith("--cuda")) or "eager"
    py_how = " ".join(python_flags[python_flags.index("--compile"):][:2]) if "--compile" in python_flags else "eager"
    a, p = ampp.get("items_per_s", -1), python.get("items_per_s", -1)
    ratio = fmt(a / p, ".2f") + "x" if a > 0 and p > 0 else "-"
    am, pm = ampp.get("peak_mib", -1), python.get("peak_mib", -1)
    mem = fmt(am / pm, ".2f") + "x" if am > 0 and pm > 0 else "-"
    mfu = "-"
    if model in PRESETS and limit and a > 0:
        mfu = f"{100 * a * gpt_flops_per_token(model, ampp['parameters']) / (limit * 1e12):.0f} %"
    # Rounds that disagree by more than 10 % (bench/gpu: the median round counts) are named, side by side.
    noisy = [f"{side} rounds spread {100 * r['spread']:.0f} %" for side, r in (("ampp", ampp), ("Python", python))
             if r.get("spread", 0) > 0.1]
    note = "; ".join(([python["skipped"]] if "skipped" in python else []) + noisy)
    return (f"| {model} | {precision} | {layout} | {how} / {py_how} | {fmt(a, ',.0f')} | {fmt(p, ',.0f')} | {ratio} "
            f"| {fmt(ampp.get('ms_per_step', -1), '.2f')} | {fmt(python.get('ms_per_step', -1), '.2f')} "
            f"| {fmt(am, ',.0f')} | {fmt(pm, ',.0f')} | {mem} | {mfu} | {note} |")


def run_case(case, args, steps, timeout):
    """Both sides of one case, ampp's first: its results as each side printed them."""
    model, precision, channels_last, ampp_flags, python_flags = case
    common = ["--model", model, "--precision", precision, "--device", args.device] + steps
    common += ["--channels-last"] if channels_last else []
    ampp = run_side([args.ampp] + common + ampp_flags, timeout)
    python = run_side([args.python, str(HERE / "python_side.py")] + common + python_flags, timeout)
    return ampp, python


def case_key(case):
    return json.dumps(case)


def load_results(path):
    """An earlier run's results by case, from --results (none when the file is not there yet). A case cut off
    by a timeout runs again; any other failure is kept, as it would happen again."""
    if not path or not Path(path).exists():
        return {}
    timed_out = lambda r: "timed out" in r["ampp"].get("error", "") + r["python"].get("error", "")  # noqa: E731
    return {case_key(r["case"]): (r["ampp"], r["python"])
            for r in json.loads(Path(path).read_text()) if not timed_out(r)}


def save_results(path, results):
    """Written after every case, through a new file and a rename: a run cut off keeps what it measured."""
    if not path:
        return
    part = Path(str(path) + ".part")
    part.write_text(json.dumps([{"case": list(c), "ampp": a, "python": p} for c, a, p in results]))
    part.replace(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ampp", required=True, help="the ampp_gpu_bench program")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes, 2 steps (the CPU check)")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--timeout-s", type=float, default=240, help="per side and case")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--results", help="the cases' results as JSON: earlier ones kept, new ones added")
    args = ap.parse_args()
    cases = CPU_CASES if args.device == "cpu" else GPU_CASES
    steps = ["--steps", "2", "--warmup", "1", "--min-seconds", "0"] if args.quick else []
    earlier = load_results(args.results)
    start, results, failures, not_run = time.monotonic(), [], [], []
    for case in cases:
        if case_key(case) in earlier:
            results.append((case, *earlier[case_key(case)]))
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left <= 0:
            not_run.append(case)
            continue
        # A side never runs far past the budget: a hung case costs the rest of it, not two timeouts.
        ampp, python = run_case(case, args, steps, min(args.timeout_s, left + 30))
        results.append((case, ampp, python))
        save_results(args.results, results)
        model, precision, _, ampp_flags, _ = case
        print(f"{model} {precision} {ampp_flags or ''}: ampp {ampp.get('items_per_s', ampp.get('error'))}, "
              f"python {python.get('items_per_s', python.get('error', python.get('skipped')))} "
              f"({time.monotonic() - start:.0f} s)", flush=True)
    for case, ampp, python in results:
        model, precision, _, ampp_flags, _ = case
        failures += [f"{model} {precision} {' '.join(ampp_flags)}: {p}" for p in check_pair(ampp, python)]
    limit = bf16_matmul_tflops(args.python) if args.device.startswith("cuda") else None
    lines = ["| model | precision | layout | ampp / Python | ampp items/s | Python items/s | ratio | ampp ms | Python ms "
             "| ampp MiB | Python MiB | memory | MFU | note |", "|" + "---|" * 14]
    lines += [table_row(c, a, p, limit) for c, a, p in results]
    lines += [""] + bar_lines(results)
    lines += ["", f"Limit: bf16 matrix product (8192^3) measured at {limit:.0f} TFLOP/s on this GPU" if limit
              else "Limit: not measured (no GPU)"]
    lines += [f"Not run (budget {args.budget_s:.0f} s spent): " + ", ".join(f"{c[0]} {c[1]}" for c in not_run)] if not_run else []
    lines += [""] + ["FAILED: " + f for f in failures]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
