"""bars.py judged on made-up results (no GPU needed): each bar met, not met, and not measured."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bars import bar_lines  # noqa: E402


def side(rate, peak=-1):
    return {"items_per_s": rate, "peak_mib": peak}


def case(model, precision, nhwc=False, ampp_flags=(), python_flags=()):
    return (model, precision, nhwc, list(ampp_flags), list(python_flags))


def lines_about(lines, number, text):
    return [line for line in lines if line.startswith(f"- {number}. ") and text in line]


class Bars(unittest.TestCase):
    def test_throughput_needs_the_rate_and_no_more_memory(self):
        lines = bar_lines([
            (case("resnet50", "bf16", True), side(3600, 5000), side(3500, 6000)),
            (case("resnet50", "fp16", True), side(3600, 7000), side(3500, 6000)),  # faster, but more memory
            (case("cnn", "bf16", True), side(90_000), side(109_000)),
            (case("cnn", "fp16", True), side(90_000), {"error": "timed out"}),
            (case("cnn", "fp32", False, ["--batch", "16"], ["--batch", "16"]), side(1), side(1)),  # eager too
            (case("cnn", "bf16", False, ["--batch", "16"], ["--batch", "16"]), side(2), side(1)),
            (case("cnn", "bf16", True, ["--cuda-graphs"], ["--compile", "reduce-overhead"]), side(1), side(9)),
        ])
        self.assertIn("met: 1.03x Python's throughput, 0.83x its peak memory",
                      lines_about(lines, 1, "resnet50 bf16 NHWC")[0])
        self.assertIn("NOT met", lines_about(lines, 1, "resnet50 fp16 NHWC")[0])
        self.assertIn("NOT met: 0.83x", lines_about(lines, 1, "cnn bf16 NHWC")[0])
        self.assertIn("not measured", lines_about(lines, 1, "cnn fp16 NHWC")[0])
        self.assertIn("met: 2.00x", lines_about(lines, 1, "cnn bf16:")[0])  # a batch flag on both sides is eager
        self.assertEqual(len(lines_about(lines, 1, "")), 5)  # the graphed case is not held to bar 1

    def test_amp_speedup_is_over_each_sides_own_fp32_or_the_gpts_tf32(self):
        lines = bar_lines([
            (case("cnn", "fp32", True), side(200_000), side(125_000)),
            (case("cnn", "bf16", True), side(260_000), side(109_000)),
            (case("gpt2-124m", "tf32"), side(140_000), side(137_000)),
            (case("gpt2-124m", "bf16"), side(250_000), side(247_000)),
        ])
        self.assertIn("met: ampp 1.30x, Python 0.87x", lines_about(lines, 2, "cnn bf16 NHWC over fp32")[0])
        self.assertIn("met: ampp 1.79x, Python 1.80x", lines_about(lines, 2, "gpt2-124m bf16 over tf32")[0])
        self.assertTrue(lines_about(lines, 2, "gpt2-124m bf16 over tf32")[0].startswith("- 2. gpt2-124m bf16 over tf32: NOT"))

    def test_the_graphed_cnn_and_the_gpt_against_torch_compile(self):
        lines = bar_lines([
            (case("cnn", "bf16", True, ["--cuda-graphs"], ["--compile", "reduce-overhead"]), side(219_000), side(146_000)),
            (case("gpt2-124m", "bf16", False, [], ["--compile", "default"]), side(290_000), side(298_000)),
        ])
        self.assertIn("met: 1.50x (the bar: 1.5x)", lines_about(lines, 3, "cnn")[0])
        self.assertIn("NOT met: 0.97x (the bar: 1.0x)", lines_about(lines, 4, "gpt2-124m")[0])

    def test_the_graphed_cnn_against_pytorchs_hand_written_graph(self):
        graphed = case("cnn", "bf16", True, ["--cuda-graphs"], ["--capture"])
        met = bar_lines([(graphed, side(600_000), side(550_000))])
        self.assertIn("met: 1.09x", lines_about(met, 5, "whole-step")[0])
        missed = bar_lines([(graphed, side(500_000), side(550_000))])
        self.assertIn("NOT met: 0.91x", lines_about(missed, 5, "whole-step")[0])
        # Against compile's reduce-overhead it is bar 3, not 5.
        other = bar_lines([(case("cnn", "bf16", True, ["--cuda-graphs"], ["--compile", "reduce-overhead"]),
                            side(600_000), side(100_000))])
        self.assertIn("not measured", lines_about(other, 5, "cnn")[0])

    def test_every_bar_says_when_it_was_not_measured(self):
        lines = bar_lines([])
        self.assertEqual(lines[0], "Bars (docs/gpu.md):")
        self.assertIn("not measured", lines_about(lines, 3, "cnn")[0])
        self.assertIn("not measured", lines_about(lines, 4, "gpt2-124m")[0])
        self.assertIn("not measured", lines_about(lines, 5, "cnn")[0])


if __name__ == "__main__":
    unittest.main()
