#!/usr/bin/env python3
"""`ampp train --device cuda`'s job in Python PyTorch on the same GPU, for bench/peer/compare_gpu.py.

The same models (`cnn`, `resnet`: examples/python/train_cnn.py and bench/peer/peer_train.py, channels-last
as ampp's default), a synthetic set of the same shape and size held on the GPU (1x28x28 images, 10 classes;
batches gathered there by a shuffled index, as ampp does when the data fits), SGD with momentum and weight
decay as PyTorch's fused kernel (`fused=True`, ampp::FusedSGD's), the loss read every --log-every steps.
Precision as ampp's opt levels: O0 fp32; O1 autocast to bf16 or fp16 with a dynamic GradScaler (apex's O1
scales the loss in both); O2 the model cast to the low-precision type (BatchNorm kept fp32) with FP32
master weights that the optimizer steps, written the way apex's O2 works. Images/s as ampp's summary
counts them: the steps after the first 20, between two reads (each waits for the GPU), evaluation excluded.

    python3 bench/peer/peer_train_gpu.py --model cnn --level O1 --dtype bf16 --out py.json
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_cnn import Cnn  # noqa: E402  (ampp train's CNN)
from peer_train import ResNet  # noqa: E402  (ampp train's resnet)

WARM_STEPS = 20  # ampp's SteadyRate::kWarmSteps
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def synthetic(n, n_test, seed, device):
    """Class prototypes plus Gaussian noise (the shape and size of ampp's synthetic:N): train and test splits."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(10, 1, 28, 28, generator=g)

    def split(count):
        labels = torch.randint(0, 10, (count,), generator=g)
        return (prototypes[labels] + torch.randn(count, 1, 28, 28, generator=g)).to(device), labels.to(device)
    return (*split(n), *split(n_test))


class Step:
    """One training step at an opt level; nothing in it reads the GPU on the host."""

    def __init__(self, model, level, dtype, device, lr, momentum, weight_decay):
        self.model, self.level, self.dtype, self.device = model, level, dtype, device
        sgd = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True)
        self.scaler = torch.amp.GradScaler(device, enabled=level != "O0")
        if level == "O2":  # apex O2: low-precision model, BatchNorm fp32, FP32 masters
            for m in model.modules():
                if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    for p in m.parameters(recurse=False):
                        p.data = p.data.to(dtype)
            self.params = [p for p in model.parameters()]
            self.masters = [p.detach().float().clone().requires_grad_() for p in self.params]
            for m in self.masters:
                m.grad = torch.zeros_like(m)
            self.opt = torch.optim.SGD(self.masters, **sgd)
        else:
            self.opt = torch.optim.SGD(model.parameters(), **sgd)

    def __call__(self, x, y):
        if self.level == "O2":
            return self.o2(x, y)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=self.dtype or torch.bfloat16, enabled=self.level == "O1"):
            logits = self.model(x)
        loss = F.cross_entropy(logits.float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss.detach(), logits.detach()

    def o2(self, x, y):
        for p in self.params:
            p.grad = None
        logits = self.model(x.to(self.dtype)).float()
        loss = F.cross_entropy(logits, y)
        self.scaler.scale(loss).backward()
        torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.params])
        self.scaler.step(self.opt)
        self.scaler.update()
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self.params], self.masters)
        return loss.detach(), logits.detach()


def evaluate(model, x, y, level, dtype):
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    with torch.no_grad():
        for i in range(0, len(y), 512):
            with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=level == "O1"):
                batch = x[i:i + 512]
                logits = model(batch.to(dtype) if level == "O2" else batch)
            correct += (logits.float().argmax(-1) == y[i:i + 512]).sum()
    model.train()
    return 100.0 * correct.item() / len(y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["cnn", "resnet"], default="cnn")
    p.add_argument("--level", choices=["O0", "O1", "O2"], default="O1")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--images", type=int, default=32768)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda; cpu for a smoke test where there is no GPU")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True  # ampp train's default (--no-cudnn-benchmark turns it off)
    torch.manual_seed(a.seed)
    dtype = DTYPES[a.dtype] if a.level != "O0" else None
    model = (Cnn() if a.model == "cnn" else ResNet()).to(a.device)
    step = Step(model, a.level, dtype, a.device, lr=0.05, momentum=0.9, weight_decay=1e-4)
    x, y, test_x, test_y = synthetic(a.images, 512, a.seed, a.device)
    steps = steady_steps = 0
    steady_seconds, started, accuracy = 0.0, time.perf_counter(), 0.0
    for epoch in range(a.epochs):
        order = torch.randperm(len(y), device=a.device)
        since = None
        for b in range(len(y) // a.batch_size):
            idx = order[b * a.batch_size:(b + 1) * a.batch_size]
            loss, _ = step(x.index_select(0, idx), y.index_select(0, idx))
            steps += 1
            if steps % a.log_every == 0 or b + 1 == len(y) // a.batch_size:
                loss.item()  # the read a logged step makes: waits for the GPU
                now = time.perf_counter()
                if since is not None and steps >= WARM_STEPS:
                    steady_steps += steps - since[0]
                    steady_seconds += now - since[1]
                since = (steps, now) if steps >= WARM_STEPS else None
        accuracy = evaluate(model, test_x, test_y, a.level, dtype)
    wall = time.perf_counter() - started
    Path(a.out).write_text(json.dumps({
        "images_per_sec": steady_steps * a.batch_size / steady_seconds if steady_seconds > 0 else 0.0,
        "wall_images_per_sec": steps * a.batch_size / wall, "steps": steps, "steady_steps": steady_steps,
        "test_accuracy": accuracy, "torch": torch.__version__,
        "peak_gpu_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else None,
        "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None}, indent=2))


if __name__ == "__main__":
    main()
