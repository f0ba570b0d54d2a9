#!/usr/bin/env python3
"""The GPU benchmark: ampp (bench/gpu/gpu_bench.cpp) beside Python PyTorch (python_side.py) on the same
device, in the same run, case by case: the same model, batch, precision and fused optimizer, synthetic data.
Prints a markdown table: items (images or tokens) per second, ms per step, peak allocated GPU memory
(max_memory_allocated on both sides), the ratios ampp/Python, the bars of bars.py judged, and the
limit: this GPU's measured bf16 matrix-product rate, with the GPT's model FLOP utilisation against it.
Then which CUDA libraries (cuBLAS, cuBLASLt, cuDNN, NCCL, cudart) each side loaded, with the versions they
report, and the kernel profile: per case, each side's kernels that took the most time in --profile-steps
steps, and the kernels whose time differs most between the sides.

    python3 bench/gpu/compare.py --ampp build/bench/gpu/ampp_gpu_bench [--out table.md] [--budget-s 300]
    python3 bench/gpu/compare.py --ampp ... --device cpu --quick     # both sides run: CI's check

Each side is one long-lived process (--serve) that runs every case in turn, the two taking turns on the
device: CUDA, cuBLAS and cuDNN start once per side, not once per case. A side that fails a case, or runs past
--timeout-s, is started again for the next one. Cases run in order of importance until --budget-s is spent;
the rest are listed as not run. A case whose model or parameter count differs between the sides, or whose
loss is not finite, fails the run. With --results FILE, the cases already in FILE (an earlier run's, on the
same machine) are kept and not run again, and the new ones are added to it.
"""
import argparse
import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples" / "python"))
from bars import bar_lines  # noqa: E402
from python_side import BENCH_PRESETS as PRESETS  # noqa: E402  (the GPT presets and gpt2-xl)

# (model, precision, channels_last, ampp's extra flags, Python's extra flags), most important first: issue
# 41's table. --capture: PyTorch's hand-written whole-step CUDA graph (python_side.py).
GRAPHS, CAPTURE = ["--cuda-graphs"], ["--capture"]
# Issue 42's fp8 cases (a GPT's Linear products in float8; Python: torchao's Float8Linear).
FP8_TENSORWISE, FP8_ROWWISE, FP8_DELAYED = ["--fp8", "tensorwise"], ["--fp8", "rowwise"], ["--fp8", "delayed"]
ALL_LAYERS = ["--fp8-layers", "all"]
GPU_CASES = [
    ("cnn", "fp32", True, [], []),
    ("cnn", "bf16", True, [], []),
    ("cnn", "fp16", True, [], []),
    ("cnn", "bf16", True, GRAPHS, ["--compile", "reduce-overhead"]),
    ("cnn", "bf16", True, GRAPHS, CAPTURE),
    ("gpt2-124m", "bf16", False, [], []),
    ("gpt2-124m", "fp16", False, [], []),
    ("gpt2-124m", "tf32", False, [], []),
    ("resnet50", "fp32", False, [], []),
    ("resnet50", "fp32", True, [], []),
    ("resnet50", "bf16", True, [], []),
    ("resnet50", "fp16", True, [], []),
    ("resnet50", "bf16", False, [], []),
    ("resnet50", "fp16", False, [], []),
    ("resnet50", "o2-bf16", True, [], []),
    ("resnet50", "o2-fp16", True, [], []),
    ("gpt2-124m", "bf16", False, [], ["--compile", "default"]),
    ("gpt2-124m", "o2-bf16", False, [], []),
    ("gpt2-xl", "bf16", False, [], []),
    ("gpt2-xl", "bf16", False, FP8_TENSORWISE, FP8_TENSORWISE),
    ("gpt2-xl", "bf16", False, FP8_ROWWISE, FP8_ROWWISE),
    ("gpt2-xl", "bf16", False, FP8_DELAYED, FP8_DELAYED),
    ("gpt2-xl", "bf16", False, FP8_TENSORWISE, FP8_TENSORWISE + ["--compile", "default"]),
    ("gpt2-124m", "bf16", False, FP8_TENSORWISE + ALL_LAYERS, FP8_TENSORWISE + ALL_LAYERS),
    ("cnn", "fp16", True, GRAPHS, CAPTURE),
    ("cnn", "o2-fp16", True, [], []),
    ("gpt2-124m", "bf16", False, GRAPHS, CAPTURE),
    ("resnet50", "tf32", False, [], []),
    ("resnet50", "o2-bf16", False, [], []),
    ("resnet50", "o2-fp16", False, [], []),
    ("cnn", "tf32", True, [], []),
    ("cnn", "fp32", False, [], []),
    ("cnn", "bf16", False, [], []),
    ("cnn", "fp16", False, [], []),
    ("resnet50", "bf16", True, [], ["--compile", "default"]),
    ("gpt2-124m", "bf16", False, [], ["--compile", "max-autotune"]),
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


def request_of(flags):
    """A case's command-line flags as a --serve line's fields: '--x v' is x: v, a lone '--x' is x: true."""
    request, i = {}, 0
    while i < len(flags):
        key = flags[i].lstrip("-").replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value = flags[i + 1]
            request[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            request[key], i = True, i + 1
    return request


class Side:
    """One side's long-lived --serve process: a case in, a JSON line out. Started again after a failed case
    (a CUDA error can leave the context unusable) or a timeout; its stderr goes to a file, its tail quoted
    when the process dies."""

    def __init__(self, name, command):
        self.name, self.command, self.process = name, command, None
        self.stderr = tempfile.TemporaryFile(mode="w+")

    def stop(self):
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process.stdin.close()
            self.process.stdout.close()
            self.process = None

    def _last_error_line(self):
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        self.stderr.seek(0, 2)
        return lines[-1] if lines else "no message"

    def _start(self):
        self.process = subprocess.Popen(self.command + ["--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr)
        self.pending = b""

    def _next_line(self, deadline):
        """The process's next line of output (bytes read from its pipe directly: a buffered reader would hold
        lines that select() then no longer sees), None at a timeout, b"" when the process has ended."""
        while b"\n" not in self.pending:
            with selectors.DefaultSelector() as sel:
                sel.register(self.process.stdout, selectors.EVENT_READ)
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    return None
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                return b""
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line + b"\n"

    def ask(self, request, timeout):
        if self.process and self.process.poll() is not None:
            self.stop()  # it ended after its last answer: a fresh one for this case
        if not self.process:
            self._start()
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:  # lines that are not JSON (a library's message) are passed over
            line = self._next_line(deadline)
            if line is None:
                self.stop()
                return {"error": f"timed out after {timeout:.0f} s"}
            if not line:
                code = self.process.wait()
                self.stop()
                return {"error": f"the process ended (exit code {code}): {self._last_error_line()}"}
            if line.startswith(b"{"):
                out = json.loads(line)
                if "error" in out:
                    self.stop()
                return out


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
    for side, r in (("ampp", ampp), ("python", python)):
        if "items_per_s" in r and r.get("kernels") is not None and not r["kernels"].get("top"):
            problems.append(f"{side}: the profile recorded no {r['kernels'].get('what', 'kernels')}")
    if "parameters" in ampp and "parameters" in python and ampp["parameters"] != python["parameters"]:
        problems.append(f"the models differ: {ampp['parameters']} parameters in ampp, {python['parameters']} in Python")
    return problems


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) and value >= 0 else "-"


def precision_label(precision, flags):
    """The precision, and where the Linear products run in fp8, the recipe ("all": every layer)."""
    if "--fp8" not in flags:
        return precision
    recipe = flags[flags.index("--fp8") + 1]
    return f"{precision} + fp8 {recipe}" + (" (all layers)" if "--fp8-layers" in flags else "")


def table_row(case, ampp, python, limit):
    model, precision, channels_last, ampp_flags, python_flags = case
    precision = precision_label(precision, ampp_flags)
    layout = "NHWC" if channels_last and model != "gpt2-124m" and not model.startswith("gpt") else "-"
    how = " ".join(f for f in ampp_flags if f.startswith("--cuda")) or "eager"
    py_how = (" ".join(python_flags[python_flags.index("--compile"):][:2]) if "--compile" in python_flags
              else "whole-step graph" if "--capture" in python_flags else "eager")
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


def run_case(case, sides, common, timeout):
    """Both sides of one case, ampp's first: its results as each side printed them."""
    model, precision, channels_last, ampp_flags, python_flags = case
    request = {**common, "model": model, "precision": precision, "channels_last": channels_last}
    ampp = sides[0].ask({**request, **request_of(ampp_flags)}, timeout)
    python = sides[1].ask({**request, **request_of(python_flags)}, timeout)
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


def short(name, width=70):
    return name if len(name) <= width else name[:width - 3] + "..."


def case_name(case):
    model, precision, channels_last, ampp_flags, python_flags = case
    layout = " NHWC" if channels_last and not model.startswith("gpt") else ""
    how = " ".join(ampp_flags + (["/"] + python_flags if python_flags != ampp_flags else []))
    return f"{model} {precision}{layout} {how}".strip()


def profile_lines(results, top=8):
    """Per case: each side's top kernels (time per step) and the kernels whose time differs most."""
    lines = ["## Kernel profile", "", "Per case, each side's kernels that took the most time, per step (µs), and "
             "the names whose time differs most between the sides (ampp - Python).", ""]
    for case, ampp, python in results:
        ka, kp = ampp.get("kernels"), python.get("kernels")
        if not ka or not kp:
            continue
        per_step = lambda k: {n: us / k["steps"] for n, us, _ in k["top"]}  # noqa: E731
        a, p = per_step(ka), per_step(kp)
        lines += [f"### {case_name(case)}: {ka['what']}",
                  f"all counted: ampp {ka['total_us'] / ka['steps']:,.0f} µs/step, Python {kp['total_us'] / kp['steps']:,.0f}",
                  "", "| ampp kernel | µs | Python kernel | µs |", "|---|---|---|---|"]
        ra, rp = list(a.items())[:top], list(p.items())[:top]
        for i in range(max(len(ra), len(rp))):
            left = f"`{short(ra[i][0])}` | {ra[i][1]:,.1f}" if i < len(ra) else " | "
            right = f"`{short(rp[i][0])}` | {rp[i][1]:,.1f}" if i < len(rp) else " | "
            lines.append(f"| {left} | {right} |")
        # A name in one side's list only may still run on the other, below its top: said, not taken as 0 µs.
        gaps = sorted(((a.get(n, 0) - p.get(n, 0), n) for n in set(a) | set(p)), key=lambda g: -abs(g[0]))[:3]
        where = lambda n: "" if n in a and n in p else f" (in {'ampp' if n in a else 'Python'}'s top only)"  # noqa: E731
        lines += ["", "largest gaps: " + "; ".join(f"`{short(n, 50)}` {d:+,.1f} µs{where(n)}" for d, n in gaps), ""]
    return lines


def library_lines(libraries):
    lines = ["## CUDA libraries loaded", "", "| side | library | version | path |", "|---|---|---|---|"]
    for side, libs in libraries:
        lines += [f"| {side} | {lib['library']} | {lib['version']} | `{lib['path']}` |" for lib in libs]
        lines += [f"| {side} | none | - | - |"] if not libs else []
    return lines


def run_cases(args, sides, common, earlier):
    """Every case in order while the budget lasts: (results, cases not run)."""
    start, results, not_run = time.monotonic(), [], []
    for case in (CPU_CASES if args.device == "cpu" else GPU_CASES):
        if case_key(case) in earlier:
            results.append((case, *earlier[case_key(case)]))
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left <= 0:
            not_run.append(case)
            continue
        # A side never runs far past the budget: a hung case costs the rest of it, not two timeouts.
        ampp, python = run_case(case, sides, common, min(args.timeout_s, left + 30))
        results.append((case, ampp, python))
        save_results(args.results, results)
        print(f"{case_name(case)}: ampp {ampp.get('items_per_s', ampp.get('error'))}, "
              f"python {python.get('items_per_s', python.get('error', python.get('skipped')))} "
              f"({time.monotonic() - start:.0f} s)", flush=True)
    return results, not_run


def report(args, results, not_run, limit, libraries):
    failures = [f"{case_name(c)}: {p}" for c, a, py in results for p in check_pair(a, py)]
    lines = ["| model | precision | layout | ampp / Python | ampp items/s | Python items/s | ratio | ampp ms | Python ms "
             "| ampp MiB | Python MiB | memory | MFU | note |", "|" + "---|" * 14]
    lines += [table_row(c, a, p, limit) for c, a, p in results]
    lines += [""] + bar_lines(results) + mfu_bar(results, limit)
    lines += ["", f"Limit: bf16 matrix product (8192^3) measured at {limit:.0f} TFLOP/s on this GPU" if limit
              else "Limit: not measured (no GPU)"]
    lines += [f"Not run (budget {args.budget_s:.0f} s spent): " + ", ".join(map(case_name, not_run))] if not_run else []
    lines += [""] + library_lines(libraries) + [""] + profile_lines(results)
    lines += [""] + ["FAILED: " + f for f in failures]
    return "\n".join(lines), failures


def mfu_bar(results, limit, bar=0.30):
    """Issue 41's bar: gpt2-124m bf16 (eager) at a model FLOP utilisation of at least 30 %."""
    for (model, precision, _, af, pf), a, _ in results:
        if model == "gpt2-124m" and precision == "bf16" and not af and not pf and limit and a.get("items_per_s", 0) > 0:
            mfu = a["items_per_s"] * gpt_flops_per_token(model, a["parameters"]) / (limit * 1e12)
            return [f"- 6. gpt2-124m bf16 MFU: {'met' if mfu >= bar else 'NOT met'}: {100 * mfu:.0f} % "
                    f"(the bar: {100 * bar:.0f} %)"]
    return ["- 6. gpt2-124m bf16 MFU: not measured"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ampp", required=True, help="the ampp_gpu_bench program")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes, 2 steps (the CPU check)")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--timeout-s", type=float, default=240, help="per side and case")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.6, help="timed rounds until this much has passed")
    ap.add_argument("--profile-steps", type=int, default=3, help="steps profiled per case and side (0: none)")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--results", help="the cases' results as JSON: earlier ones kept, new ones added")
    args = ap.parse_args()
    common = {"device": args.device, "steps": args.steps, "warmup": args.warmup, "min_seconds": args.min_seconds,
              "profile_steps": args.profile_steps}
    if args.quick:
        common.update(steps=2, warmup=1, min_seconds=0, profile_steps=1)
    sides = [Side("ampp", [args.ampp]), Side("python", [args.python, str(HERE / "python_side.py")])]
    try:
        results, not_run = run_cases(args, sides, common, load_results(args.results))
        libraries = [(side.name, side.ask({"query": "libraries"}, 60).get("libraries", [])) for side in sides]
        limit = sides[1].ask({"query": "matmul"}, 120).get("tflops") if args.device.startswith("cuda") else None
    finally:
        for side in sides:
            side.stop()
    text, failures = report(args, results, not_run, limit, libraries)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
