"""Opens an `ampp train --model gpt-*` checkpoint.pt with plain torch.load and loads its model strictly
into the Python twin (examples/python/gpt.py), sizes read from the tensors. With AdamW's state in it
(`--optimizer adamw`), loads that into nanoGPT's optimizer (train.py's configure_optimizers: the parameters of
2 or more dimensions with weight decay, the others without) and takes one more step with it; with SAVE_TO,
writes the model and optimizer after that step as a training checkpoint that `ampp train --resume-from` reads.

    python pytorch_gpt.py CHECKPOINT_PT [SAVE_TO]     (exit 3: no usable torch here)
"""
import os
import sys

try:
    import torch
except Exception as e:  # no torch in this Python: the C++ test skips
    print(f"import torch failed: {e!r}", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from gpt import Gpt  # noqa: E402

ckpt = torch.load(sys.argv[1])  # the default: weights_only on torch >= 2.6
state = ckpt["model"]
vocab_size, n_embd = state["wte.weight"].shape
n_layer = len({k.split(".")[1] for k in state if k.startswith("h.")})
n_head = 2  # any divisor of n_embd: the head count changes no parameter's shape
model = Gpt(vocab_size, state["wpe.weight"].shape[0], n_layer, n_head, n_embd)
# `--fp8-recipe delayed`: its Linear layers' scaling state (float8_delayed.h), buffers of those layers here too.
for key, tensor in state.items():
    if key.endswith((".fp8_amax_history", ".fp8_scale")):
        layer, name = key.rsplit(".", 1)
        model.get_submodule(layer).register_buffer(name, torch.empty_like(tensor))
model.load_state_dict(state)  # strict
print(f"loaded {len(state)} tensors, step {ckpt['step']}")


def nanogpt_adamw(model, saved):
    """nanoGPT's AdamW over the twin, with the checkpoint's state: torch's load_state_dict checks the
    groups' sizes, and each moment must have its parameter's shape."""
    params = [p for _, p in model.named_parameters()]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": saved["param_groups"][0]["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=saved["param_groups"][0]["lr"], betas=(0.9, 0.95), eps=1e-8)
    opt.load_state_dict(saved)
    for p in params:
        assert opt.state[p]["exp_avg"].shape == p.shape and opt.state[p]["exp_avg_sq"].shape == p.shape
    return opt


optimizer = ckpt.get("optimizer", {})
if "betas" in optimizer.get("param_groups", [{}])[0]:
    opt = nanogpt_adamw(model, optimizer)
    steps = {int(s["step"]) for s in opt.state.values()}
    x = torch.randint(0, vocab_size, (2, 8))
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    opt.step()
    sizes = [len(g["params"]) for g in opt.param_groups]
    decays = [g["weight_decay"] for g in opt.param_groups]
    print(f"adamw: groups of {sizes[0]} and {sizes[1]} tensors, weight decay {decays[0]:g} and {decays[1]:g}, "
          f"step {','.join(map(str, sorted(steps)))}, stepped once more")
    if len(sys.argv) > 2:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": ckpt.get("scaler", {}),
                    "epoch": ckpt["epoch"], "batch": ckpt["batch"] + 1, "step": ckpt["step"] + 1}, sys.argv[2])
        print(f"saved step {ckpt['step'] + 1}")
