"""Oracle for several models under one ampp::initialize (a GAN): apex's loss scaling for several losses and
optimizers (amp.initialize([G, D], [optG, optD], num_losses=3), amp.scale_loss(loss, optimizer, loss_id)),
written from apex's documented semantics on PyTorch's own amp kernels:

- each loss id has its scale (2^16 at the start), updated at the end of each of its backwards by
  torch._amp_update_scale_ (x2 after 2000 clean ones, /2 on overflow);
- a backward sets aside the gradients its optimizer's parameters already hold, runs, unscales the new ones
  with torch._amp_foreach_non_finite_check_and_unscale_ (the inf/NaN check in the same pass) and adds the
  set-aside ones back;
- an overflow in a loss's gradients skips the next step of the optimizer it was given, alone (its
  gradients are dropped);
- each optimizer steps when its own backward is done.

Input: G's and D's parameters (nn.Sequential(Linear, ReLU, Linear) and nn.Sequential(Linear, LeakyReLU,
Linear)), each iteration's real batch and noise, and the iteration whose loss on the fakes overflows. The
loop is PyTorch's DCGAN example's, with SGD (momentum 0.9). Returns the parameters at the end, each loss's
scale and each optimizer's skipped steps.
"""
import torch.nn.functional as F
from oracle_common import decode, encode, main, torch


def models(c):
    g = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    d = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(), torch.nn.Linear(32, 1))
    with torch.no_grad():
        for p, t in zip(list(g.parameters()) + list(d.parameters()), c["params"]):
            p.copy_(decode(t))
    return g, d


class ApexLosses:
    def __init__(self, n):
        self.scale = [torch.full((), 65536.0) for _ in range(n)]
        self.tracker = [torch.zeros((), dtype=torch.int32) for _ in range(n)]
        self.skip = {}

    def backward(self, loss, opt, loss_id):
        params = [p for group in opt.param_groups for p in group["params"]]
        stash = [p.grad for p in params]
        for p in params:
            p.grad = None
        (loss.float() * self.scale[loss_id]).backward()
        grads = [p.grad for p in params if p.grad is not None]
        found = torch.zeros(())
        inv = self.scale[loss_id].double().reciprocal().float()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        for p, s in zip(params, stash):
            if s is not None:
                p.grad = s if p.grad is None else p.grad.add_(s)
        torch._amp_update_scale_(self.scale[loss_id], self.tracker[loss_id], found, 2.0, 0.5, 2000)
        self.skip[opt] = self.skip.get(opt, 0.0) + found.item()

    def step(self, opt):
        if self.skip.pop(opt, 0.0) != 0.0:
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = None
            return False
        opt.step()
        return True


def bce(logits, target):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def run_case(c):
    g, d = models(c)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.05, momentum=0.9)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.05, momentum=0.9)
    amp = ApexLosses(3)
    skipped = {"g": 0, "d": 0}
    for i, (real, noise) in enumerate(zip(c["reals"], c["noises"])):
        for p in list(g.parameters()) + list(d.parameters()):
            p.grad = None
        fake = g(decode(noise))
        amp.backward(bce(d(decode(real)), 1.0), opt_d, 0)
        loss_fake = bce(d(fake.detach()), 0.0)
        if i == c["inf_at"]:
            loss_fake = loss_fake * float("inf")
        amp.backward(loss_fake, opt_d, 1)
        skipped["d"] += 0 if amp.step(opt_d) else 1
        amp.backward(bce(d(fake), 1.0), opt_g, 2)
        skipped["g"] += 0 if amp.step(opt_g) else 1
    return {"params": [encode(p) for p in list(g.parameters()) + list(d.parameters())],
            "scales": [s.item() for s in amp.scale], "skipped": skipped}


if __name__ == "__main__":
    main(lambda data: {"cases": [run_case(c) for c in data["cases"]]})
