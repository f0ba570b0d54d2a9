"""Opens an `ampp train --model gpt-*` checkpoint.pt with plain torch.load and loads its model strictly
into the Python twin (examples/python/gpt.py), sizes read from the tensors.

    python pytorch_gpt.py CHECKPOINT_PT     (exit 3: no usable torch here)
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
model.load_state_dict(state)  # strict
print(f"loaded {len(state)} tensors, step {ckpt['step']}")
