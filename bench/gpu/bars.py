"""The bars the GPU benchmark is held to (docs/gpu.md), judged from compare.py's results: one line each,
"met", "NOT met" or "not measured", with the figures it was judged on. Goals, not errors: a bar not met
does not fail the run.

  1. ampp at least 1.0x Python eager's throughput, at no more peak memory, for every model and AMP
     precision (eager on both sides, the same layout).
  2. ampp's AMP speedup over its own fp32 at least Python's, per model, precision and layout (over tf32
     for the GPT, which has no fp32 case).
  3. The cnn in bf16 with --cuda-graphs at least 1.5x torch.compile(mode="reduce-overhead").
  4. The GPT in bf16 (eager) at least torch.compile's tokens per second.
  5. The graphed cnn step (bf16, --cuda-graphs) at least 1.0x PyTorch's hand-written whole-step graph
     (python_side.py --capture).
  (6. The GPT's model FLOP utilisation: compare.py, which measures the limit.)

A result is a (case, ampp, python) triple: case = (model, precision, channels_last, ampp_flags,
python_flags), each side the JSON line it printed.
"""
AMP = ("fp16", "bf16")


def _rate(side):
    value = side.get("items_per_s", -1)
    return value if isinstance(value, (int, float)) and value > 0 else None


def _verdict(ok):
    return "met" if ok else "NOT met"


def _eager(results):
    """The cases eager on both sides (other flags, such as a batch size, are the same on both), by model,
    precision and layout."""
    return {(c[0], c[1], c[2]): (a, p) for c, a, p in results if "--cuda-graphs" not in c[3] and "--compile" not in c[4]}


def throughput_and_memory(results):
    lines = []
    for (model, precision, nhwc), (a, p) in sorted(_eager(results).items()):
        if precision not in AMP:
            continue
        name = f"{model} {precision}{' NHWC' if nhwc else ''}"
        ra, rp, ma, mp = _rate(a), _rate(p), a.get("peak_mib", -1), p.get("peak_mib", -1)
        if not ra or not rp:
            lines.append(f"- 1. {name}: not measured")
            continue
        memory_ok = ma <= 0 or mp <= 0 or ma <= mp  # no GPU: no memory figure to hold against
        lines.append(f"- 1. {name}: {_verdict(ra >= rp and memory_ok)}: {ra / rp:.2f}x Python's throughput"
                     + (f", {ma / mp:.2f}x its peak memory" if ma > 0 and mp > 0 else ""))
    return lines


def amp_speedup(results):
    lines, eager = [], _eager(results)
    for (model, precision, nhwc), (a, p) in sorted(eager.items()):
        # The GPT has no fp32 case (as in the table): its base is tf32.
        base_name = "fp32" if (model, "fp32", nhwc) in eager else "tf32"
        base = eager.get((model, base_name, nhwc))
        if precision not in AMP or not base:
            continue
        name = f"{model} {precision}{' NHWC' if nhwc else ''} over {base_name}"
        rates = [_rate(a), _rate(base[0]), _rate(p), _rate(base[1])]
        if not all(rates):
            lines.append(f"- 2. {name}: not measured")
            continue
        sa, sp = rates[0] / rates[1], rates[2] / rates[3]
        lines.append(f"- 2. {name}: {_verdict(sa >= sp)}: ampp {sa:.2f}x, Python {sp:.2f}x")
    return lines


def _against(results, number, model, ampp_flags, python_flags, what, factor):
    for (m, precision, _, af, pf), a, p in results:
        if m == model and precision == "bf16" and af == ampp_flags and pf[-len(python_flags):] == python_flags:
            ra, rp = _rate(a), _rate(p)
            if ra and rp:
                return [f"- {number}. {model} bf16 {' '.join(ampp_flags) or 'eager'} against {what}: "
                        f"{_verdict(ra >= factor * rp)}: {ra / rp:.2f}x (the bar: {factor:.1f}x)"]
    return [f"- {number}. {model} bf16 against {what}: not measured"]


def _against_compile(results, number, model, ampp_flags, mode, factor):
    return _against(results, number, model, ampp_flags, ["--compile", mode], f"torch.compile {mode}", factor)


def bar_lines(results):
    """Every bar's lines, in the order above."""
    return (["Bars (docs/gpu.md):"] + throughput_and_memory(results) + amp_speedup(results)
            + _against_compile(results, 3, "cnn", ["--cuda-graphs"], "reduce-overhead", 1.5)
            + _against_compile(results, 4, "gpt2-124m", [], "default", 1.0)
            + _against(results, 5, "cnn", ["--cuda-graphs"], ["--capture"], "PyTorch's whole-step CUDA graph", 1.0))
