#!/usr/bin/env python3
"""Python PyTorch's side of the GPU benchmark: the same model, batch, precision and optimizer as
bench/gpu/gpu_bench.cpp, written as a PyTorch user writes it (eager, torch.amp, fused optimizers), and the
same JSON line. compare.py runs both on the same GPU in the same run.

    python3 bench/gpu/python_side.py --model cnn --precision bf16 [--channels-last] [--compile MODE]

o2-fp16 / o2-bf16 (apex's O2) have no PyTorch equivalent without apex: the line says "skipped".
"""
import argparse
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


def workload(args, device):
    torch.manual_seed(0)
    if args.model in PRESETS:
        preset = dict(PRESETS[args.model])
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
        sys.exit(f"unknown --model {args.model!r}: cnn, resnet50 or one of {sorted(PRESETS)}")
    return model.to(device), x.to(device), y.to(device), items, args.model in PRESETS


def make_step(args, model, x, y, is_gpt, device):
    fused = device.type == "cuda"  # PyTorch's fused kernels: CUDA (and CPU from 2.4); ampp's are fused everywhere
    if is_gpt:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=fused)
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
    forward = torch.compile(model, mode=args.compile) if args.compile else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=low or torch.float32, enabled=low is not None):
            logits = forward(x)
            loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()

    return step


def run(args):
    device = torch.device(args.device)
    line = {"side": "python", "model": args.model, "precision": args.precision, "channels_last": args.channels_last,
            "compile": args.compile or None, "device": args.device, "torch": torch.__version__}
    if args.precision.startswith("o2-"):
        return {**line, "skipped": "apex's O2 has no PyTorch equivalent (apex is not installed)"}
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
    return {**line, "batch": x.shape[0], "items_per_step": items, "items_per_s": items * args.steps / seconds,
            "ms_per_step": 1e3 * seconds / args.steps, "rounds": len(times), "spread": (times[-1] - times[0]) / seconds,
            "peak_mib": peak, "loss": loss.item(),
            "parameters": sum(p.numel() for p in model.parameters())}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16", "o2-fp16", "o2-bf16"])
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--context", type=int, default=0)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--min-seconds", type=float, default=1.0, help="time rounds of --steps until this much has passed")
    p.add_argument("--device", default="cuda")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", default="", help="torch.compile mode: default, reduce-overhead, max-autotune")
    print(json.dumps(run(p.parse_args())))


if __name__ == "__main__":
    main()
