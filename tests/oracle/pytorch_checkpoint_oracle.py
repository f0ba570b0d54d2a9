"""Oracle for ampp's PyTorch-format checkpoints: Python PyTorch reads what ampp wrote (plain torch.load)
and writes what ampp must read (plain torch.save of state_dict()s), then continues training so the C++
test can compare every weight with its own continuation."""
from oracle_common import decode, encode, main, torch


def make_model():
    # The C++ test builds the same torch::nn::Sequential: the state-dict keys are "0.weight", "1.running_mean", ...
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def make_optimizer(kind, params, lr):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    # The single-tensor loop: the C++ side has no foreach form.
    return torch.optim.Adam(params, lr=lr, weight_decay=1e-4, foreach=False)


def cpu_grad_scaler():
    """PyTorch's GradScaler on CPU (torch >= 2.3), else None."""
    try:
        return torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError, RuntimeError):
        return None


def train(model, opt, batches, scaler=None):
    for b in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(decode(b["x"])), decode(b["y"]))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def tensors(model):
    return {k: encode(v) for k, v in model.state_dict().items()}


def load(data):
    ckpt = torch.load(data["path"])  # the default: weights_only on torch >= 2.6
    model = make_model()
    model.load_state_dict(ckpt["model"])  # strict
    opt = make_optimizer(data["optimizer"], model.parameters(), lr=123.0)  # the file's lr must win
    opt.load_state_dict(ckpt["optimizer"])
    out = {"epoch": ckpt["epoch"], "lr": opt.param_groups[0]["lr"], "scaler": None}
    scaler = cpu_grad_scaler()
    if scaler is not None:
        scaler.load_state_dict(ckpt["scaler"])
        out["scaler"] = {"scale": scaler.get_scale(), "growth_tracker": scaler._get_growth_tracker()}
    train(model, opt, data["continue"])
    out["tensors"] = tensors(model)
    return out


def save(data):
    torch.manual_seed(0)
    model = make_model()
    opt = make_optimizer(data["optimizer"], model.parameters(), lr=data["lr"])
    scaler = cpu_grad_scaler()
    train(model, opt, data["before"], scaler)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict() if scaler else {"scale": 1024.0, "growth_factor": 2.0,
                                                              "backoff_factor": 0.5, "growth_interval": 7,
                                                              "_growth_tracker": 3},
                "epoch": 4}, data["path"])
    out = {"scaler": {"scale": scaler.get_scale(), "growth_tracker": scaler._get_growth_tracker()} if scaler else
           {"scale": 1024.0, "growth_tracker": 3}}
    train(model, opt, data["continue"])
    out["tensors"] = tensors(model)
    return out


main(lambda data: load(data) if data["mode"] == "load" else save(data))
