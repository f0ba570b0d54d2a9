#!/usr/bin/env python3
"""Python PyTorch's side of the GPU benchmark: the same model, batch, precision and optimizer as
bench/gpu/gpu_bench.cpp, written as a PyTorch user writes it (eager, torch.amp, fused optimizers), and the
same JSON line. compare.py runs both on the same GPU in the same run.

    python3 bench/gpu/python_side.py --model cnn --precision bf16 [--channels-last] [--compile MODE | --capture]
    python3 bench/gpu/python_side.py --serve    # cases as JSON lines on stdin, as ampp_gpu_bench --serve

--capture is PyTorch's hand-written whole-step CUDA graph (torch.cuda.graph, its docs' recipe): forward,
backward and the fused optimizer's step captured, the optimizer made capturable where it has the flag. With
GradScaler (fp16) only forward and backward are captured and the scaler's step and update run eagerly, as
PyTorch's CUDA-graph notes prescribe: its step syncs with the host.
o2-fp16 / o2-bf16 (apex's O2) have no PyTorch equivalent without apex: the line says "skipped".
"""
import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples" / "python"))
from gpt import PRESETS, Gpt  # noqa: E402  (ampp train's GPT, the same names and shapes)
from resnet50 import ResNet50  # noqa: E402
from train_cnn import Cnn  # noqa: E402  (ampp train's cnn)


# GPT-2 XL's shapes (1.5B parameters), as ampp_gpu_bench's gpt2-xl: issue 42's size where fp8 pays.
BENCH_PRESETS = {**PRESETS, "gpt2-xl": dict(PRESETS["gpt2-124m"], n_layer=48, n_head=25, n_embd=1600)}


def convert_to_fp8(args, model):
    """--fp8: torchao's Float8Linear for the layers --fp8-layers takes (auto: torchao's own filter)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe
    if args.fp8_layers == "all":
        keep = lambda m, fqn: m.in_features % 16 == 0 and m.out_features % 16 == 0  # noqa: E731
    else:
        keep = _auto_filter_for_recipe(args.fp8, filter_fqns=[])
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(args.fp8), module_filter_fn=keep)


def workload(args, device):
    torch.manual_seed(0)
    if args.model in BENCH_PRESETS:
        preset = dict(BENCH_PRESETS[args.model])
        if args.context:
            preset["context"] = args.context
        batch = args.batch or 8
        model = Gpt(**preset)
        x = torch.randint(0, preset["vocab_size"], (batch, preset["context"]))
        y = torch.randint(0, preset["vocab_size"], (batch, preset["context"]))
        items = batch * preset["context"]
    elif args.model == "resnet50":
        batch = args.batch or 128
        model = ResNet50(1000, args.channels_last)
        x, y, items = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,)), batch
    elif args.model == "cnn":
        batch = args.batch or 256
        model = Cnn(10, args.channels_last)
        x, y, items = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,)), batch
    else:
        sys.exit(f"unknown --model {args.model!r}: cnn, resnet50 or one of {sorted(BENCH_PRESETS)}")
    model = model.to(device)
    if args.fp8:
        convert_to_fp8(args, model)
    return model, x.to(device), y.to(device), items, args.model in BENCH_PRESETS


def make_step(args, model, x, y, is_gpt, device):
    fused = device.type == "cuda"  # PyTorch's fused kernels: CUDA (and CPU from 2.4); ampp's are fused everywhere
    if is_gpt:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused,
                                capturable=args.capture)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=fused)
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
    forward = torch.compile(model, mode=args.compile) if args.compile else model

    def forward_backward():
        with torch.autocast(device.type, dtype=low or torch.float32, enabled=low is not None):
            logits = forward(x)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        (loss if scaler is None else scaler.scale(loss)).backward()
        return loss.detach()

    def optimizer_step():
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_backward()
        optimizer_step()
        return loss

    return capture(forward_backward, optimizer_step, opt, scaler is None) if args.capture else step


def capture(forward_backward, optimizer_step, opt, whole):
    """PyTorch's whole-network capture recipe (docs: CUDA semantics, CUDA graphs): warm up on a side stream,
    gradients None before the capture so that the graph's backward allocates and then rewrites them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward_backward()
            optimizer_step()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = forward_backward()
        if whole:
            optimizer_step()

    def replay():
        graph.replay()
        if not whole:
            optimizer_step()  # GradScaler's step and update, outside the graph
        return loss

    return replay


def run(args):
    device = torch.device(args.device)
    line = {"side": "python", "model": args.model, "precision": args.precision, "fp8": args.fp8,
            "channels_last": args.channels_last,
            "compile": args.compile or None, "capture": args.capture, "device": args.device, "torch": torch.__version__}
    if args.precision.startswith("o2-"):
        return {**line, "skipped": "apex's O2 has no PyTorch equivalent (apex is not installed)"}
    if args.fp8 == "delayed":
        return {**line, "skipped": "torchao has no delayed recipe, and TransformerEngine is not installed"}
    if args.fp8:
        try:
            import torchao.float8  # noqa: F401
        except Exception as e:  # noqa: BLE001  (not installed, or not for this torch)
            return {**line, "skipped": f"torchao's float8 does not import: {e!r}"}
    if args.capture and args.compile:
        return {**line, "error": "--capture and --compile: one or the other"}
    torch.backends.cudnn.benchmark = True  # as ampp_gpu_bench
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    model, x, y, items, is_gpt = workload(args, device)
    step = make_step(args, model, x, y, is_gpt, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        loss = step()
    # As ampp_gpu_bench: rounds of --steps until --min-seconds have passed, the median round counts.
    sync()
    times = []
    while not times or sum(times) < args.min_seconds:
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    seconds = times[len(times) // 2]
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else -1
    kernels = profile_kernels(step, args.profile_steps, device, sync) if args.profile_steps > 0 else None
    return {**line, "kernels": kernels, "batch": x.shape[0], "items_per_step": items, "items_per_s": items * args.steps / seconds,
            "ms_per_step": 1e3 * seconds / args.steps, "rounds": len(times), "spread": (times[-1] - times[0]) / seconds,
            "peak_mib": peak, "loss": loss.item(),
            "parameters": sum(p.numel() for p in model.parameters())}


def profile_kernels(step, steps, device, sync, top=20):  # as many as kernel_profile.cpp's caller keeps
    """As ampp_gpu_bench's kernel_profile.cpp: a GPU's kernels, copies and sets, or on a CPU ATen's operators
    (inclusive), their time summed by name."""
    from torch.profiler import ProfilerActivity, profile
    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    tally = {}
    for e in prof.events():
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if (gpu and on_gpu) or (not gpu and not on_gpu and e.name.startswith("aten::")):
            us, count = tally.get(e.name, (0.0, 0))
            # A device event's own time is its device time; a CPU operator's, its CPU time.
            tally[e.name] = (us + (e.device_time if on_gpu else e.cpu_time), count + 1)
    rows = sorted(tally.items(), key=lambda kv: -kv[1][0])
    return {"unit": "us", "what": "GPU kernels, copies and sets" if gpu else "ATen operators (CPU, inclusive)",
            "total_us": sum(us for us, _ in tally.values()), "steps": steps,
            "top": [[name, us, count] for name, (us, count) in rows[:top]]}


LIBRARIES = {"libcublasLt.so": "cublasLt", "libcublas.so": "cublas", "libcudnn.so": "cudnn", "libnccl.so": "nccl",
             "libcudart.so": "cudart"}


def _dotted(v, major, minor):
    return f"{v // major}.{v % major // minor}.{v % minor}"


def library_version(library, path):
    """The version the library itself reports (the same calls as bench/gpu/loaded_libraries.cpp)."""
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | 4)  # 4: RTLD_NOLOAD, only one already mapped
        if library in ("cublasLt", "cudnn"):
            f = lib.cublasLtGetVersion if library == "cublasLt" else lib.cudnnGetVersion
            f.restype = ctypes.c_size_t
            return _dotted(f(), 10000, 100)
        if library == "cublas":
            parts = [ctypes.c_int(-1) for _ in range(3)]
            for i, part in enumerate(parts):
                lib.cublasGetProperty(i, ctypes.byref(part))
            return ".".join(str(p.value) for p in parts)
        v = ctypes.c_int(-1)
        (lib.ncclGetVersion if library == "nccl" else lib.cudaRuntimeGetVersion)(ctypes.byref(v))
        return _dotted(v.value, 10000, 100) if library == "nccl" else _dotted(v.value, 1000, 10)
    except (OSError, AttributeError):
        return "?"


def loaded_cuda_libraries():
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line[line.find("/"):].strip() if "/" in line else ""
            if any(path.rsplit("/", 1)[-1].startswith(prefix) for prefix in LIBRARIES):
                paths.add(path)
    out = []
    for path in sorted(paths):
        base = path.rsplit("/", 1)[-1]
        library = next(name for prefix, name in LIBRARIES.items() if base.startswith(prefix))
        out.append({"library": library, "path": path, "version": library_version(library, path)})
    return out


def bf16_matmul_tflops(n=8192, repeats=20):
    """The limit: an n^3 bf16 matrix product on this GPU, measured now."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16", "o2-fp16", "o2-bf16"])
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--context", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--min-seconds", type=float, default=1.0, help="time rounds of --steps until this much has passed")
    p.add_argument("--device", default="cuda")
    p.add_argument("--fp8", default="", choices=["", "tensorwise", "rowwise", "delayed"],
                   help="a GPT's Linear products in float8 (torchao), under bf16")
    p.add_argument("--fp8-layers", default="auto", choices=["auto", "all"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", default="", help="torch.compile mode: default, reduce-overhead, max-autotune")
    p.add_argument("--capture", action="store_true", help="the hand-written whole-step CUDA graph")
    p.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps: the top kernels")
    p.add_argument("--serve", action="store_true", help="cases as JSON lines on stdin, one result line each")
    return p


def case_args(p, request):
    """A --serve line as the command line's arguments: the option names without their dashes."""
    argv = []
    for key, value in request.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return p.parse_args(argv)


def serve(p):
    """compare.py's long-lived process: torch, CUDA, cuBLAS and cuDNN are set up once for every case."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if request.get("query") == "libraries":
                out = {"side": "python", "libraries": loaded_cuda_libraries()}
            elif request.get("query") == "matmul":
                out = {"side": "python", "tflops": bf16_matmul_tflops()}
            else:
                out = run(case_args(p, request))
        except (Exception, SystemExit) as e:  # a failed case says why; the process goes on
            out = {"side": "python", "error": f"{type(e).__name__}: {e}"}
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # compiled code of one case only
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(json.dumps(out), flush=True)


def main():
    p = parser()
    args = p.parse_args()
    if args.serve:
        serve(p)
    else:
        print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
