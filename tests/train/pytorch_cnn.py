"""`ampp train --model cnn` in torch.nn (the same module names), used to check that an ampp run's
checkpoint.pt opens with plain torch.load and loads strictly into it.

    python pytorch_cnn.py CHECKPOINT_PT OUT_JSON     (exit 3: no usable torch here)
"""
import json
import os
import sys

try:
    import torch
except Exception as e:  # no torch in this Python: the C++ test skips
    print(f"import torch failed: {e!r}", file=sys.stderr)
    sys.exit(3)

# The network is the hand-off example's (examples/python/train_cnn.py), one definition for both.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from train_cnn import Cnn  # noqa: E402


def main(path, out):
    torch.set_num_threads(1)
    ckpt = torch.load(path)  # the default: weights_only on torch >= 2.6
    model = Cnn()
    model.load_state_dict(ckpt["model"])  # strict
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.5)
    opt.load_state_dict(ckpt["optimizer"])
    scale = None
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        try:
            scaler = torch.amp.GradScaler("cpu")
            scaler.load_state_dict(ckpt["scaler"])
            scale = scaler.get_scale()
        except (TypeError, RuntimeError):
            pass
    model.eval()
    with torch.no_grad():
        logits = model(torch.linspace(-1, 1, 4 * 784).reshape(4, 1, 28, 28))
    json.dump({"epoch": ckpt["epoch"], "step": ckpt["step"], "momentum": opt.param_groups[0]["momentum"],
               "buffers": len(opt.state), "scale": scale,
               "logits": [float(v).hex() for v in logits.flatten().tolist()]}, open(out, "w"))


main(sys.argv[1], sys.argv[2])
