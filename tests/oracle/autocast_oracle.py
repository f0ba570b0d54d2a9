"""Oracle for ampp::autocast on CPU: each op of a list run inside torch.autocast("cpu", dtype).

Input: {"region": "bfloat16"|"float16", "cases": [{"op", "input_dtype", "inputs": [float32 tensors]}]}.
Inputs are cast to input_dtype before the region (as the C++ side does); "mixed" casts only the
first input to the region's dtype. Output per case:
{"ok": true, "out": <tensor>} or {"ok": false, "error": "..."}. Auxiliary integer tensors (class
targets, embedding indices) are built the same way on both sides (see autocast_oracle_test.cpp).
"""
from oracle_common import _DTYPES, decode, encode, main, torch, unsupported  # first: exits with code 3 without torch

import torch.nn.functional as F  # noqa: E402


def targets(n, classes):
    return torch.arange(n) % classes


# Keep in sync with ops() in autocast_oracle_test.cpp (same names, same arguments).
OPS = {
    "mm": lambda a, b: torch.mm(a, b),
    "matmul": lambda a, b: torch.matmul(a, b),
    "matmul_mv": lambda a, b: torch.matmul(a, b),
    "matmul_dot": lambda a, b: torch.matmul(a, b),
    "matmul_folded_mv": lambda a, b: torch.matmul(a, b),
    "addmm": lambda c, a, b: torch.addmm(c, a, b),
    "bmm": lambda a, b: torch.bmm(a, b),
    "baddbmm": lambda c, a, b: torch.baddbmm(c, a, b),
    "addbmm": lambda c, a, b: torch.addbmm(c, a, b),
    "linear": lambda x, w, b: F.linear(x, w, b),
    "conv1d": lambda x, w, b: F.conv1d(x, w, b),
    "conv2d": lambda x, w, b: F.conv2d(x, w, b, padding=1),
    "conv3d": lambda x, w, b: F.conv3d(x, w, b),
    "conv_transpose1d": lambda x, w, b: F.conv_transpose1d(x, w, b),
    "conv_transpose2d": lambda x, w, b: F.conv_transpose2d(x, w, b),
    "prelu": lambda x, w: F.prelu(x, w),
    "scaled_dot_product_attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "scaled_dot_product_attention_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "einsum": lambda a, b: torch.einsum("ij,jk->ik", a, b),
    "linalg_vecdot": lambda a, b: torch.linalg.vecdot(a, b),
    "relu": lambda x: torch.relu(x),
    "sigmoid": lambda x: torch.sigmoid(x),
    "tanh": lambda x: torch.tanh(x),
    "gelu": lambda x: F.gelu(x),
    "exp": lambda x: torch.exp(x),
    "log": lambda x: torch.log(x),
    "sqrt": lambda x: torch.sqrt(x),
    "pow": lambda x: torch.pow(x, 2),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x, w, b: F.layer_norm(x, [x.shape[-1]], w, b),
    "group_norm": lambda x, w, b: F.group_norm(x, 2, w, b),
    "batch_norm": lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
    "sum": lambda x: torch.sum(x),
    "mean": lambda x: torch.mean(x),
    "prod": lambda x: torch.prod(x),
    "cumsum": lambda x: torch.cumsum(x, 0),
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "mse_loss": lambda a, b: F.mse_loss(a, b),
    "l1_loss": lambda a, b: F.l1_loss(a, b),
    "smooth_l1_loss": lambda a, b: F.smooth_l1_loss(a, b),
    # reduction passed explicitly: torch.kl_div(a, b) from Python returns the unreduced tensor in
    # torch 2.13 although the schema says reduction=Mean (C++ at::kl_div(a, b) reduces).
    "kl_div": lambda a, b: torch.kl_div(a, b, 1),
    "cross_entropy": lambda x: F.cross_entropy(x, targets(x.shape[0], x.shape[1])),
    "cross_entropy_vocabulary": lambda x: F.cross_entropy(x, targets(x.shape[0], x.shape[1])),
    "nll_loss": lambda x: F.nll_loss(x, targets(x.shape[0], x.shape[1])),
    "binary_cross_entropy": lambda p, t: F.binary_cross_entropy(p, t),
    "binary_cross_entropy_with_logits": lambda x, t: F.binary_cross_entropy_with_logits(x, t),
    "cdist": lambda a, b: torch.cdist(a, b),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 2),
    "embedding": lambda w: F.embedding(targets(4, w.shape[0]), w),
    "inverse": lambda x: torch.inverse(x),
    "linalg_matrix_norm": lambda x: torch.linalg.matrix_norm(x),
    "fft_rfft": lambda x: torch.fft.rfft(x),
}


def run_case(case, region):
    op = OPS.get(case["op"])
    if op is None:
        raise SystemExit(f"autocast_oracle.py: unknown op '{case['op']}' (add it to OPS)")
    inputs = [decode(t) for t in case["inputs"]]
    if case["input_dtype"] == "mixed":  # first input in the region's dtype, the others float32
        inputs[0] = inputs[0].to(region)
    elif "," in case["input_dtype"]:  # one dtype per input, e.g. "float16,bfloat16"
        inputs = [t.to(_DTYPES[d]) for t, d in zip(inputs, case["input_dtype"].split(","))]
    else:
        inputs = [t.to(_DTYPES[case["input_dtype"]]) for t in inputs]
    try:
        with torch.autocast("cpu", dtype=region):
            out = op(*inputs)
    except Exception as e:  # reported, compared with ampp's behaviour on the C++ side
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "out": encode(out)}


def run(data):
    region = _DTYPES[data["region"]]
    if region == torch.float16 and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):
        unsupported("CPU autocast has no float16 (added in 2.2)")
    return {"results": [run_case(c, region) for c in data["cases"]]}


main(run)
