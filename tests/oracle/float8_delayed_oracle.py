"""Oracle for ampp's delayed fp8 recipe (ampp::float8_delayed_linear): a Python twin written from
TransformerEngine's documented DelayedScaling formula (its recipe docstring and "FP8 Delayed Scaling" page):

    amax    = max(amax_history) ("max") or amax_history[0] ("most_recent")
    scale   = (FP8_MAX / amax) / 2^margin          float32; kept where amax is not finite and positive
    history rotated after the scale's update: row 0 (this pass's amax) moves to the end, the oldest entry
            (row 1) is dropped, row 0 is zeroed for the next pass's amax

with x and weights in e4m3 and gradients in e5m2 (Format.HYBRID), products through torch._scaled_mm on the
operands' reciprocal scales. TE's kernel also sets a scale that overflows float32 to the largest float32.

Each case: weight, bias (or none), a sequence of inputs and output gradients, the recipe's history length,
amax algorithm and margin, and whether the passes run under torch.autocast("cpu", bfloat16). Each step runs a
training forward and backward; then one forward in eval mode (which uses the next scales and records
nothing). Returns every step's output and gradients, the eval output, and the final history and scales.
"""
from oracle_common import decode, encode, main, torch

# ATen's reference CPU kernel for _scaled_mm, which ampp runs on the CPU (float8_oracle.py says why).
torch.backends.mkldnn.enabled = False

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}


class DelayedScaling:
    """One layer's amax history [len, 3] (x, weight, gradient) and scales [3]."""

    def __init__(self, length, algo, margin):
        self.amax_history = torch.zeros(length, 3)
        self.scale = torch.ones(3)
        self.algo, self.margin = algo, margin

    def scales(self, cols, fp8):
        history = self.amax_history[:, cols]
        amax = history.max(dim=0).values if self.algo == "max" else history[0]
        fp8_max = torch.full_like(amax, FP8_MAX[fp8])
        new = (fp8_max / amax) / (2.0 ** self.margin)  # tensor / tensor: a true float32 division
        new = torch.where(torch.isfinite(amax) & (amax > 0), new, self.scale[cols])
        return torch.where(torch.isinf(new), torch.full_like(new, torch.finfo(torch.float32).max), new)

    def update(self, cols, fp8):
        """The scales for this pass from the history, then the history rotated."""
        new = self.scales(cols, fp8)
        self.scale[cols] = new
        history = self.amax_history[:, cols]
        rotated = torch.roll(history, -1, dims=0)
        rotated[0] = 0
        self.amax_history[:, cols] = rotated
        return new

    def record(self, col, t):
        self.amax_history[0, col] = t.detach().abs().max().float()


def cast(t, scale, fp8):
    return (t.float() * scale).clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8)


def column_major(m):
    return m.t().contiguous().t()


class DelayedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, state, training, out_dtype):
        with torch.autocast("cpu", enabled=False):
            s = state.update([0, 1], E4M3) if training else state.scales([0, 1], E4M3)
            x8, w8 = cast(x, s[0], E4M3), cast(weight, s[1], E4M3)
            if training:
                state.record(0, x)
                state.record(1, weight)
            ctx.save_for_backward(x8, w8, s)
            ctx.state, ctx.training = state, training
            return torch._scaled_mm(x8, column_major(w8.t()), s[0].reciprocal(), s[1].reciprocal(),
                                    out_dtype=out_dtype, use_fast_accum=True)

    @staticmethod
    def backward(ctx, g):
        x8, w8, s = ctx.saved_tensors
        state = ctx.state
        with torch.autocast("cpu", enabled=False):
            sg = (state.update([2], E5M2) if ctx.training else state.scales([2], E5M2))[0]
            g8 = cast(g, sg, E5M2)
            if ctx.training:
                state.record(2, g)
            grad_x = torch._scaled_mm(g8, column_major(w8), sg.reciprocal(), s[1].reciprocal(),
                                      out_dtype=g.dtype, use_fast_accum=False)
            grad_w = torch._scaled_mm(g8.t().contiguous(), column_major(x8), sg.reciprocal(),
                                      s[0].reciprocal(), out_dtype=g.dtype, use_fast_accum=False)
        return grad_x, grad_w, None, None, None


def linear(x, weight, bias, state, training):
    out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    out = DelayedMatmul.apply(x.reshape(-1, x.shape[-1]), weight, state, training, out_dtype)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out + bias.to(out.dtype) if bias is not None else out


def run_case(c):
    weight = decode(c["weight"]).requires_grad_()
    bias = decode(c["bias"]).requires_grad_() if "bias" in c else None
    state = DelayedScaling(c["history_len"], c["algo"], c["margin"])
    steps = []
    for x_json, g_json in zip(c["xs"], c["gs"]):
        x = decode(x_json).requires_grad_()
        weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c["autocast"]):
            out = linear(x, weight, bias, state, training=True)
            out.backward(decode(g_json).to(out.dtype))
        steps.append({"out": encode(out), "x_grad": encode(x.grad), "weight_grad": encode(weight.grad)})
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=c["autocast"]):
        evaluated = linear(decode(c["xs"][-1]), weight, bias, state, training=False)
    return {"steps": steps, "eval_out": encode(evaluated), "amax_history": encode(state.amax_history),
            "scale": encode(state.scale)}


if __name__ == "__main__":
    main(lambda data: {"cases": [run_case(c) for c in data["cases"]]})
