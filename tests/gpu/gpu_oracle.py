"""Oracle of the GPU suite: Python torch on the same GPU.

"autocast": the output dtype of each op under torch.autocast("cuda", dtype), with the inputs the
C++ side uses (decoded from the case), and the op's values for the CPU-emulation comparison.
"grad_scaler": torch.amp.GradScaler("cuda") over the case's gradient steps with plain SGD.
"fused_step": torch.optim.SGD/AdamW(fused=True) under that GradScaler (tests/oracle/fused_step_oracle.py).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from oracle_common import bits_double, decode, dtype_name, encode, main, torch, unsupported  # noqa: E402
from fused_step_oracle import run_case as fused_step_case  # noqa: E402

if not torch.cuda.is_available():
    unsupported("no CUDA device visible to Python")
F = torch.nn.functional


def ops(x, w, img, kernel, logits, target):
    return {
        "mm": lambda: torch.mm(x, w),
        "addmm": lambda: torch.addmm(x[:, :1].expand(-1, w.shape[1]).contiguous(), x, w),
        "conv2d": lambda: F.conv2d(img, kernel, padding=1),
        "conv2d_same": lambda: F.conv2d(img, kernel, padding="same"),
        "relu": lambda: torch.relu(torch.mm(x, w)),
        "gelu": lambda: F.gelu(torch.mm(x, w)),
        "softmax": lambda: torch.softmax(torch.mm(x, w), 1),
        "log_softmax": lambda: torch.log_softmax(torch.mm(x, w), 1),
        "layer_norm": lambda: F.layer_norm(torch.mm(x, w), (w.shape[1],)),
        "sum": lambda: torch.mm(x, w).sum(),
        "exp": lambda: torch.exp(torch.mm(x, w) / 16),
        "cross_entropy": lambda: F.cross_entropy(logits, target),
        "cross_entropy_half": lambda: F.cross_entropy(logits.half(), target),
        "sdpa": lambda: F.scaled_dot_product_attention(img[:, :1], img[:, :1], img[:, :1]),
        "sdpa_causal": lambda: F.scaled_dot_product_attention(img[:, :1], img[:, :1], img[:, :1], is_causal=True),
    }


def autocast(case):
    t = {k: decode(v).cuda() for k, v in case["inputs"].items()}
    table = ops(t["x"], t["w"], t["img"], t["kernel"], t["logits"], t["target"])
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[case["dtype"]]
    out = {}
    for name in case["ops"]:
        with torch.autocast("cuda", dtype=dtype):
            y = table[name]()
        out[name] = {"dtype": dtype_name(y.dtype), "value": encode(y.float())}
    return out


def grad_scaler(case):
    params = [decode(p).cuda().requires_grad_() for p in case["params"]]
    opt = torch.optim.SGD(params, lr=bits_double(case["lr"]))
    scaler = torch.amp.GradScaler("cuda", init_scale=bits_double(case["init_scale"]), growth_interval=case["growth_interval"])
    steps = []
    for grads in case["steps"]:
        opt.zero_grad()
        loss = sum((p * decode(g).cuda()).sum() for p, g in zip(params, grads))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        steps.append({"scale": scaler.get_scale(), "params": [encode(p.detach()) for p in params]})
    return {"steps": steps}


if __name__ == "__main__":
    handlers = {"autocast": autocast, "grad_scaler": grad_scaler,
                "fused_step": lambda case: {"cases": [fused_step_case(c, "cuda") for c in case["cases"]]}}
    main(lambda case: handlers[case["kind"]](case))
