"""Oracle for ampp::GradScaler: torch.amp.GradScaler("cpu") trajectories with plain SGD.

Per step: loss = sum_i sum(p_i * g_i) so that scale(loss).backward() leaves grad_i = scale * g_i,
optional explicit unscale_, step, update; records what the C++ side compares. With "scale_cases":
scale() of single outputs instead.
"""
from oracle_common import bits_double, decode, double_bits, encode, main, torch, unsupported

if not hasattr(torch.amp, "GradScaler"):
    unsupported("no torch.amp.GradScaler('cpu') (added in 2.3)")


def run_set(s):
    params = [decode(p).requires_grad_() for p in s["params"]]
    opt = torch.optim.SGD(params, lr=bits_double(s["lr"]))
    scaler = torch.amp.GradScaler("cpu", init_scale=bits_double(s["init_scale"]),
                                  growth_factor=bits_double(s["growth_factor"]),
                                  backoff_factor=bits_double(s["backoff_factor"]),
                                  growth_interval=s["growth_interval"])
    steps = []
    for step in s["steps"]:
        opt.zero_grad()
        g = [decode(x) for x in step["grads"]]
        loss = sum((p * gi).sum() for p, gi in zip(params, g))
        scaled = scaler.scale(loss)
        scaled.backward()
        scaled_grads = [encode(p.grad) for p in params]
        if step["unscale"]:
            scaler.unscale_(opt)
        scaler.step(opt)
        # What step() based its decision on (the per-optimizer found_inf, before update() clears it).
        found = scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
        skipped = bool(sum(v.item() for v in found.values()))
        unscaled_grads = [encode(p.grad) for p in params]
        scaler.update()
        steps.append({
            "scaled_grads": scaled_grads,
            "unscaled_grads": unscaled_grads,
            "skipped": skipped,
            "params": [encode(p.detach()) for p in params],
            "scale_tensor": encode(scaler._scale),
            "get_scale": double_bits(scaler.get_scale()),
            "growth_tracker": scaler._get_growth_tracker(),
        })
    sd = scaler.state_dict()
    state = {k: (double_bits(v) if isinstance(v, float) else int(v)) for k, v in sd.items()}
    return {"steps": steps, "state_dict": state,
            "state_dict_types": {k: type(v).__name__ for k, v in sd.items()}}


def scale_case(c):
    """scale() of one output: torch's own result, and torch's result on the output widened to float32."""
    out = decode(c["output"])
    scaler = torch.amp.GradScaler("cpu", init_scale=bits_double(c["init_scale"]))
    return {"native": encode(scaler.scale(out)), "float32": encode(scaler.scale(out.float()))}


def answer(data):
    if "scale_cases" in data:
        return {"scale_cases": [scale_case(c) for c in data["scale_cases"]]}
    return {"sets": [run_set(s) for s in data["sets"]]}


main(answer)
