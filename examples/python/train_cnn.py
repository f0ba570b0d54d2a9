"""`ampp train --model cnn` in plain PyTorch: the Python half of one training run handed back and forth
between Python and ampp through PyTorch-format checkpoints (docs/training.md, "Hand a run between
Python and ampp").

    python train_cnn.py --steps 50 --save py.pt                      # Python starts the run
    ampp train --opt-level O0 --loss-scale dynamic --resume-from py.pt --steps 100 --checkpoint-dir ck
    python train_cnn.py --resume-from ck/checkpoint.pt --steps 150 --save py.pt   # and takes it back

It is ampp train's job, step for step: the same data (Fashion-MNIST from Debian's dataset-fashion-mnist,
or `--data synthetic:N`, the same seeded set), standardised by the training split's mean and std;
DistributedSampler with the run's seed and epoch; batches of --batch-size with the last partial batch
dropped; cross-entropy; SGD with momentum and weight decay; a GradScaler. With --autocast none (fp32,
as ampp's O0) both sides compute the same bits. The checkpoint is the training dict ampp reads and
writes: {"model", "optimizer", "scaler", "epoch" (to continue), "batch" (done in it), "step"}.
"""
import argparse
import gzip
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data.distributed import DistributedSampler

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def input_layout(x, channels_last):
    """ampp's ModelOptions::channels_last: the input in channels-last order, so that every activation from the
    first convolution on is channels-last. A [N, 1, H, W] tensor is contiguous in both orders: only its strides
    tell oneDNN which is meant, so it is restrided (a view), as ampp does."""
    if not channels_last or x.dim() != 4:
        return x
    if x.shape[1] == 1 and x.is_contiguous():
        return x.as_strided(x.shape, (x.shape[2] * x.shape[3], 1, x.shape[3], 1))
    return x.contiguous(memory_format=torch.channels_last)


class Cnn(nn.Module):
    """ampp::train::make_model("cnn"): the same modules under the same names, and the same activation layout
    (ModelOptions::channels_last: channels-last from the input on, the layout LibTorch's CPU
    max-pool and BatchNorm kernels are fast in; the same kernels as ampp's, so the same bits)."""

    def __init__(self, classes=10, channels_last=True):
        super().__init__()
        self.channels_last = channels_last
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(input_layout(x, self.channels_last)))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def pixel_statistics(pixels):
    """Mean and unbiased standard deviation of pixels / 255, exact in double from the 256-bin histogram,
    in the order ampp::train sums them (so both standardise to the same float32 values)."""
    counts = torch.bincount(pixels.flatten(), minlength=256).tolist()
    n = float(sum(counts))
    mean = 0.0
    for v, c in enumerate(counts):
        mean += c * (v / 255.0)
    mean /= n
    squares = 0.0
    for v, c in enumerate(counts):
        squares += c * (v / 255.0 - mean) * (v / 255.0 - mean)
    std = (squares / (n - 1)) ** 0.5 if n > 1 else 0.0
    return mean, (std if std >= 1e-12 else 1.0)


def training_images(spec, seed):
    """ampp::train::load_dataset's training split (images, labels), standardised as ampp does."""
    if spec.startswith("synthetic"):
        n = int(spec.split(":")[1]) if ":" in spec else 2048
        gen = torch.Generator().manual_seed(seed)
        prototypes = torch.normal(0.0, 1.0, (10, 1, 28, 28), generator=gen)
        labels = torch.randint(10, (n,), generator=gen, dtype=torch.int64)
        images = prototypes.index_select(0, labels) + 1.0 * torch.normal(0.0, 1.0, (n, 1, 28, 28), generator=gen)
    else:
        folder = FASHION_MNIST if spec == "fashion-mnist" else spec
        pixels = read_idx(os.path.join(folder, "train-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(folder, "train-labels-idx1-ubyte.gz")).to(torch.int64)
        mean, std = pixel_statistics(pixels)
        return pixels.unsqueeze(1).to(torch.float32).div_(255.0).sub_(mean).div_(std), labels
    mean, std = images.mean().item(), images.std().item()
    return images.sub_(mean).div_(std), labels


def save(path, model, opt, scaler, epoch, batch, step):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
                "epoch": epoch, "batch": batch, "step": step}, tmp)
    os.replace(tmp, path)  # never a half-written checkpoint


def train_step(model, opt, scaler, dtype, images, labels):
    """One optimizer step of ampp train's loop (autocast to `dtype` if given, loss in float32)."""
    opt.zero_grad()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits = model(images)
    # Over the last dimension: [N, classes] against [N], or a GPT's [N, T, vocabulary] against [N, T].
    loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images, labels = training_images(args.data, args.seed)
    model = Cnn()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cpu", enabled=args.autocast != "bf16")  # bf16 needs no loss scaling
    epoch = batch = step = 0
    if args.resume_from:
        ckpt = torch.load(args.resume_from)  # weights_only: plain data, no code
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        epoch, batch, step = ckpt["epoch"], ckpt.get("batch", 0), ckpt["step"]
    sampler = DistributedSampler(range(len(labels)), num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
    model.train()
    while epoch < args.epochs and step < args.steps:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.int64)
        batches = len(order) // args.batch_size
        while batch < batches and step < args.steps:
            idx = order[batch * args.batch_size:(batch + 1) * args.batch_size]
            loss = train_step(model, opt, scaler, dtype, images.index_select(0, idx), labels.index_select(0, idx))
            batch, step = batch + 1, step + 1
            if step % args.log_every == 0:
                print(f"step {step}: loss {loss.item():.4f}, scale {scaler.get_scale()}", flush=True)
        if batch == batches:
            epoch, batch = epoch + 1, 0
    if args.save:
        save(args.save, model, opt, scaler, epoch, batch, step)
        print(f"saved {args.save}: epoch {epoch}, batch {batch}, step {step}")
    if args.save_weights:  # what the seed 000 loop saves: the model's state_dict alone
        torch.save(model.state_dict(), args.save_weights)
        print(f"saved {args.save_weights}: the model's state_dict")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="fashion-mnist", help="fashion-mnist, synthetic[:N] or an MNIST-format folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=10**12, help="stop when the run has taken this many steps in all")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--autocast", choices=["none", "bf16", "fp16"], default="none")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume-from", help="a training dict written by this script or by ampp train")
    p.add_argument("--save", help="write the training dict here at the end")
    p.add_argument("--save-weights", help="write model.state_dict() alone here at the end (as seed 000 does)")
    train(p.parse_args())


if __name__ == "__main__":
    main()
