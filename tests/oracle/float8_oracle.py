"""Oracle for ampp::float8_linear: torchao 0.18's Float8Linear (convert_to_float8_training on an nn.Linear),
forward and backward on the CPU.

Each case: x, weight, bias (or none), the output's gradient g, the recipe ("tensorwise" or "rowwise"), whether
the module is bf16 and whether the forward and backward run under torch.autocast("cpu", bfloat16). Returns
the output, x.grad, weight.grad and bias.grad.
"""
import warnings

from oracle_common import decode, encode, main, torch, unsupported

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its CUDA extensions do not load on a CPU machine; float8 needs none
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
except Exception as e:  # noqa: BLE001  (no torchao, or one that does not import with this torch)
    unsupported(f"torchao's float8 does not import: {e!r}")


# ATen's reference CPU kernel for _scaled_mm (float32 GEMM on the widened operands), which ampp runs on the
# CPU: with oneDNN on, an AMX CPU takes oneDNN's e4m3 x e4m3 kernel for the forward, ~1 ulp apart and far
# slower (ampp's float8.cpp says why it does not).
torch.backends.mkldnn.enabled = False


def run_case(c):
    weight = decode(c["weight"])
    bias = decode(c["bias"]) if "bias" in c else None
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    model = torch.nn.Sequential(linear)
    if c["bf16_module"]:
        model = model.to(torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(c["recipe"]))
    x = decode(c["x"]).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c["autocast"]):
        out = model(x)
        out.backward(decode(c["g"]).to(out.dtype))
    result = {"out": encode(out), "x_grad": encode(x.grad), "weight_grad": encode(model[0].weight.grad)}
    if bias is not None:
        result["bias_grad"] = encode(model[0].bias.grad)
    return result


if __name__ == "__main__":
    main(lambda data: {"cases": [run_case(c) for c in data["cases"]]})
