"""Oracle for one training step of ampp's GPT (include/ampp/train/gpt.h) at each opt level: the same
weights and batch through examples/python/gpt.py, as PyTorch users write each level:
  O0: float32; O1: torch.autocast("cpu", dtype); O2/O3: the model cast to dtype (no BatchNorm to keep).
The logits are widened to float32 before the loss, as ampp train does (and apex's O2 output cast).

Input: {"config": {vocab_size, context, n_layer, n_head, n_embd}, "state": {name: tensor},
        "tokens": tensor, "targets": tensor, "cases": [{"level": "O1", "dtype": "bfloat16"}, ...]}
Output: {"cases": [{"loss": tensor, "grads": {name: float32 tensor}}, ...]}
"""
import os
import sys

from oracle_common import _DTYPES, decode, encode, main, torch, unsupported

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from gpt import Gpt  # noqa: E402

import torch.nn.functional as F  # noqa: E402

if not hasattr(F, "scaled_dot_product_attention"):
    unsupported("no scaled_dot_product_attention, which examples/python/gpt.py uses (added in 2.0)")


def step(data, case):
    model = Gpt(**data["config"])
    model.load_state_dict({k: decode(v) for k, v in data["state"].items()})  # strict
    tokens, targets = decode(data["tokens"]), decode(data["targets"])
    dtype = _DTYPES[case["dtype"]]
    if case["level"] in ("O2", "O3"):
        model.to(dtype)
    if case["level"] == "O1":
        with torch.autocast("cpu", dtype=dtype):
            logits = model(tokens)
    else:
        logits = model(tokens)
    logits = logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    return {"loss": encode(loss.detach()),
            "grads": {k: encode(p.grad.float()) for k, p in model.named_parameters()}}


main(lambda data: {"cases": [step(data, c) for c in data["cases"]]})
