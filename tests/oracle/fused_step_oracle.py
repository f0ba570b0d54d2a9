"""Oracle for ampp's fused path: torch.optim.SGD/AdamW(fused=True) under torch.amp.GradScaler("cpu").

Per step: loss = sum_i sum(p_i * g_i), scale(loss).backward(), optional explicit unscale_, step,
update; records the parameters, the scale and the growth tracker after every step, and at the end the
number of skipped steps (optimizer state "step" for AdamW).
"""
from oracle_common import bits_double, decode, double_bits, encode, main, torch, unsupported

if __name__ == "__main__" and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
    unsupported("no fused SGD/AdamW on the CPU (added in 2.4)")


def make_optimizer(kind, params, lr):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4, fused=True)
    if kind == "sgd_nesterov":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, fused=True)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if kind == "adamw_amsgrad":
        return torch.optim.AdamW(params, lr=lr, amsgrad=True, weight_decay=0.1, fused=True)
    raise ValueError(kind)


def run_case(c, device="cpu"):
    """One case on `device` (gpu_oracle.py runs it on "cuda")."""
    params = [decode(p).to(device).requires_grad_() for p in c["params"]]
    opt = make_optimizer(c["optimizer"], params, bits_double(c["lr"]))
    scaler = torch.amp.GradScaler(device, init_scale=bits_double(c["init_scale"]),
                                  growth_interval=c["growth_interval"])
    steps = []
    for step in c["steps"]:
        opt.zero_grad()
        loss = sum((p * decode(g).to(device)).sum() for p, g in zip(params, step["grads"]))
        scaler.scale(loss).backward()
        if step["unscale"]:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        steps.append({"params": [encode(p.detach().cpu()) for p in params],
                      "scale": double_bits(scaler.get_scale()),
                      "growth_tracker": scaler._get_growth_tracker()})
    out = {"steps": steps}
    if c["optimizer"].startswith("adamw"):
        out["adam_steps"] = [int(opt.state[p]["step"].item()) for p in params]
    return out


if __name__ == "__main__":
    main(lambda data: {"cases": [run_case(c) for c in data["cases"]]})
