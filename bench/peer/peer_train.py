#!/usr/bin/env python3
"""`ampp train`'s job in Python PyTorch, for the peer benchmark (bench/peer/compare.py).

The same models under the same names (`mlp`, `cnn`, `resnet` of ampp::train::make_model), the same data
(Fashion-MNIST from Debian's dataset-fashion-mnist, standardised by the training split's mean and std),
DistributedSampler with the run's seed and epoch, each of W workers taking batch_size // W images with the
last partial batch dropped, cross-entropy, DDP over Gloo with W processes started as seed 000 does
(torch.multiprocessing.spawn), one evaluation of the test split per epoch. The recipe (--recipe): `peer`, the
benchmark's one recipe for every model (SGD with momentum and weight decay at a constant lr, no clipping,
global batch 128), or `gpt`, ampp train's defaults for a GPT, nanoGPT's (AdamW, cosine lr, clipping; RECIPES).
The GPTs (`gpt-tiny`, `gpt-mini`: examples/python/gpt.py, the names and initialisation of ampp's) read the
byte-level text ampp train reads by default (the fortunes files, 10% held out, windows of the model's context).
Precision: fp32 (ampp's O0), or CPU autocast in bf16/fp16 (ampp's O1; no loss scaler for bf16, a
GradScaler for fp16). Rank 0 writes a summary with ampp's definitions: images/s is the images trained over
the seconds since training started (after DDP was built), evaluations included.

    python3 bench/peer/peer_train.py --model cnn --precision bf16 --nproc 2 --out py.json
    python3 bench/peer/peer_train.py --model gpt-mini --recipe gpt --nproc 2 --out py.json
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
from train_cnn import FASHION_MNIST, Cnn, input_layout, pixel_statistics, read_idx, train_step  # noqa: E402  (ampp train's CNN and step, defined once)
from gpt import PRESETS, Gpt  # noqa: E402  (ampp train's GPT)

TEXT = "/usr/share/games/fortunes"  # ampp::train::kDefaultTextDir


class Mlp(nn.Module):
    """784-256-128-10 with ReLU, as ampp's `mlp`."""

    def __init__(self, classes=10):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, classes)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(nn.Module):
    """ampp's `resnet`: stem conv 16, one basic block per stage at 16/32/64 channels, average pool, fc."""

    def __init__(self, classes=10, channels_last=True):
        super().__init__()
        self.channels_last = channels_last  # as ampp's ModelOptions::channels_last (Cnn's docstring)
        self.stem = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.layer1, self.layer2, self.layer3 = BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(input_layout(x, self.channels_last))))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean((2, 3)))


# The GPTs as nanoGPT writes them (F.scaled_dot_product_attention on the inputs as they are), unless
# --widen-attention gives them ampp's attention (examples/python/gpt.py).
MODELS = {"mlp": Mlp, "cnn": Cnn, "resnet": ResNet,
          "gpt-tiny": lambda widen=False: Gpt(**PRESETS["gpt-tiny"], widen_attention=widen),
          "gpt-mini": lambda widen=False: Gpt(**PRESETS["gpt-mini"], widen_attention=widen)}


# Each recipe's defaults; a flag of the same name overrides one. `gpt` is ampp::train::with_model_defaults for a
# GPT (src/ampp/train/options.cpp) with ampp's AdamW (adamw_options, param_groups_for in src/ampp/train/run.cpp):
# nanoGPT's train.py. eval_batch: sequences or images per evaluation batch, 0 = each worker's training batch
# (ampp's evaluation_batch, as nanoGPT's estimate_loss), in both recipes, so that both sides evaluate alike
# (until 2026-12-07 the twin evaluated 512 at once under `peer`: docs/benchmarks.md says which rows).
RECIPES = {
    "peer": dict(optimizer="sgd", lr=0.05, weight_decay=1e-4, lr_schedule="step", warmup_steps=0, clip_grad_norm=0.0,
                 batch_size=128, eval_batch=0),
    "gpt": dict(optimizer="adamw", lr=6e-4, weight_decay=0.1, lr_schedule="cosine", warmup_steps=0, clip_grad_norm=1.0,
                batch_size=32, eval_batch=0),
}
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.95), 1e-8  # ampp's adamw_options: nanoGPT's beta2, PyTorch's eps


def make_optimizer(model, args):
    """ampp's make_optimizer on the CPU: torch.optim's own, each parameter's update in a loop (foreach=False, which
    is also torch's CPU default; LibTorch's AdamW and SGD loop the same way). AdamW decays the matrices only: no
    weight decay on biases and LayerNorm/BatchNorm weights (every parameter of fewer than 2 dimensions), as ampp's
    param_groups_for and nanoGPT's configure_optimizers."""
    params = list(model.parameters())
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=ADAMW_BETAS, eps=ADAMW_EPS, foreach=False)


def scheduled_lr(args, steps_taken, cosine_steps):
    """ampp's scheduled_lr (src/ampp/train/run.cpp): `step` is constant here (ampp's StepLR with --lr-step 0, its
    default); `cosine` is nanoGPT's get_lr after the warmup, from lr down to lr / 10 over cosine_steps; the warmup
    scales either by (k + 1) / warmup_steps at the k-th step taken."""
    lr = args.lr
    if args.lr_schedule == "cosine":
        ratio = min(max((steps_taken - args.warmup_steps) / max(cosine_steps, 1), 0.0), 1.0)
        lr = args.lr / 10 + (args.lr - args.lr / 10) * 0.5 * (1.0 + math.cos(math.pi * ratio))
    if steps_taken < args.warmup_steps:
        lr *= (steps_taken + 1) / args.warmup_steps
    return lr


def text_windows(context):
    """(train windows, next tokens, test windows, next tokens) as ampp::train::load_text makes them."""
    files = sorted(p for p in Path(TEXT).iterdir() if p.is_file() and not p.is_symlink() and p.suffix != ".dat")
    data = torch.frombuffer(bytearray(b"".join(p.read_bytes() for p in files)), dtype=torch.uint8)
    tail = -(-len(data) // 10)  # ceil(10%)

    def windows(part):
        n = (len(part) - 1) // context
        return part[:n * context].view(n, context).long(), part[1:n * context + 1].view(n, context).long()
    return (*windows(data[:len(data) - tail]), *windows(data[len(data) - tail:]))


def fashion_mnist():
    """(train images, train labels, test images, test labels), standardised as ampp does."""
    def split(kind):
        pixels = read_idx(os.path.join(FASHION_MNIST, f"{kind}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(FASHION_MNIST, f"{kind}-labels-idx1-ubyte.gz")).to(torch.int64)
        return pixels.unsqueeze(1), labels
    train_x, train_y = split("train")
    test_x, test_y = split("t10k")
    mean, std = pixel_statistics(train_x)

    def standardise(pixels):
        return pixels.to(torch.float32).div_(255.0).sub_(mean).div_(std)
    return standardise(train_x), train_y, standardise(test_x), test_y


def evaluate(model, x, y, rank, world, dtype, batch):
    """Each rank a contiguous slice of the test split in batches of `batch`; sums allreduced (as ampp).
    Returns (test loss, test accuracy), per image or token."""
    model.eval()
    begin, end = len(y) * rank // world, len(y) * (rank + 1) // world
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(begin, end, batch):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                logits = model(x[i:min(end, i + batch)]).float()
            target = y[i:min(end, i + batch)]
            sums[0] += F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="sum").item()
            sums[1] += (logits.argmax(-1) == target).sum().item()
    dist.all_reduce(sums)
    model.train()
    return sums[0].item() / y.numel(), 100.0 * sums[1].item() / y.numel()


def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class NoScaler:
    """What a disabled GradScaler does (fp32 and bf16 take no loss scaling); PyTorch 1.13 has no CPU GradScaler."""

    def scale(self, loss):
        return loss

    def unscale_(self, opt):
        pass

    def step(self, opt):
        opt.step()

    def update(self):
        pass

    def get_scale(self):
        return 1.0


class Clipping:
    """A scaler that clips the unscaled gradients to max_norm before the step, as ampp's clip_gradients
    (src/ampp/train/train_step.cpp: after the allreduce and the unscale, before the optimizer). torch's
    clip_grad_norm_ is ampp's clip_grad_norm_on_device: the 2-norm of the norms, coefficient
    min(max_norm / (norm + 1e-6), 1). Lets train_step (examples/python/train_cnn.py) stay the one step."""

    def __init__(self, scaler, params, max_norm):
        self.scaler, self.params, self.max_norm = scaler, list(params), max_norm

    def scale(self, loss):
        return self.scaler.scale(loss)

    def step(self, opt):
        self.scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.scaler.step(opt)

    def update(self):
        self.scaler.update()

    def get_scale(self):
        return self.scaler.get_scale()


def worker(rank, args):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", world_size=args.nproc, rank=rank)
    torch.manual_seed(args.seed)
    gpt = args.model.startswith("gpt")
    train_x, train_y, test_x, test_y = text_windows(PRESETS[args.model]["context"]) if gpt else fashion_mnist()
    layout = {"channels_last": False} if args.nchw and args.model in ("cnn", "resnet") else {}
    if gpt and args.widen_attention:
        layout = {"widen": True}
    model = DistributedDataParallel(MODELS[args.model](**layout))
    opt = make_optimizer(model, args)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cpu") if args.precision == "fp16" else NoScaler()
    if args.clip_grad_norm > 0:
        scaler = Clipping(scaler, model.parameters(), args.clip_grad_norm)
    sampler = DistributedSampler(range(len(train_y)), num_replicas=args.nproc, rank=rank, shuffle=True, seed=args.seed)
    per_rank = args.batch_size // args.nproc
    # ampp's cosine_steps_of: the run's steps after the warmup.
    cosine_steps = max(args.epochs * (len(sampler) // per_rank) - args.warmup_steps, 1)
    # The lr and rank 0's loss of every step, for compare.py to set beside ampp's metrics.jsonl. The schedule
    # counts the steps taken: one the fp16 GradScaler skipped (its scale went down) does not advance it, as in
    # ampp; fp32 and bf16 skip none.
    steps, taken, lrs, losses, started = 0, 0, [], [], time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.int64)
        for b in range(len(order) // per_rank):
            idx = order[b * per_rank:(b + 1) * per_rank]
            lrs.append(scheduled_lr(args, taken, cosine_steps))
            for group in opt.param_groups:
                group["lr"] = lrs[-1]
            scale = scaler.get_scale()
            loss = train_step(model, opt, scaler, dtype, train_x.index_select(0, idx), train_y.index_select(0, idx))
            losses.append(loss.item())
            steps += 1
            taken += scaler.get_scale() >= scale
        test_loss, accuracy = evaluate(model, test_x, test_y, rank, args.nproc, dtype, args.eval_batch or per_rank)
    seconds = time.perf_counter() - started
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "images_per_sec": steps * per_rank * args.nproc / seconds, "seconds": seconds, "steps": steps,
            "tokens_per_sec": steps * per_rank * args.nproc * train_x.shape[1] / seconds if gpt else None,
            "test_accuracy": accuracy, "test_loss": test_loss, "peak_rss_mb_rank0": peak_rss_mb(),
            "torch": torch.__version__, "lrs": lrs, "losses": losses,
            "recipe": {k: getattr(args, k) for k in ["recipe", "momentum", *RECIPES["gpt"]]}}, indent=2))
    dist.destroy_process_group()
    # Without the exit-time teardown, as tests/oracle/fsdp_oracle.py: torch 2.13's aborted a Gloo rank about once
    # in 15 runs after destroy_process_group() had returned; mp.spawn reads the exit code 0 as success.
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="cnn")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--recipe", choices=sorted(RECIPES), default="peer",
                   help="the defaults of the flags below: peer (SGD, constant lr, batch 128) or gpt (a GPT's in ampp)")
    p.add_argument("--batch-size", type=int, help="global, split across the workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nchw", action="store_true", help="activations in NCHW order (ampp train --nchw)")
    p.add_argument("--widen-attention", action="store_true", help="GPTs: ampp's attention (examples/python/gpt.py)")
    p.add_argument("--optimizer", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=float)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD's")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--lr-schedule", choices=["step", "cosine"], help="step: constant (ampp's without --lr-step)")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--clip-grad-norm", type=float, help="0: off")
    p.add_argument("--eval-batch", type=int, help="per evaluation batch; 0: each worker's training batch")
    p.add_argument("--port", type=int, default=29731)
    p.add_argument("--out", required=True, help="the summary JSON (rank 0)")
    args = p.parse_args()
    for key, value in RECIPES[args.recipe].items():  # what was not given is the recipe's
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.model.startswith("gpt") and not os.path.isdir(TEXT):
        sys.exit(f"the text is not in {TEXT}: apt install fortunes")
    if not args.model.startswith("gpt") and not os.path.isdir(FASHION_MNIST):
        sys.exit(f"Fashion-MNIST not found in {FASHION_MNIST}: apt install dataset-fashion-mnist")
    mp.spawn(worker, args=(args,), nprocs=args.nproc)


if __name__ == "__main__":
    main()
