#pragma once
// Python PyTorch as a test oracle: a C++ test writes a JSON case file, runs
// `<AMPP_ORACLE_PYTHON> <AMPP_ORACLE_DIR>/<script> <in.json> <out.json>` and compares the JSON answer
// with what ampp computes. Tensors travel as exact bit patterns (see encode/decode), never as
// decimal text, so comparisons can be bit-exact.
//
//   auto answer = ampp_oracle::run("sampler_oracle.py", input);
//   if (!answer) GTEST_SKIP() << ampp_oracle::skip_message();
//
// Random inputs are generated once, here, and shipped: both sides then use the same values.

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ampp_oracle {

using json = nlohmann::json;

/// Runs the oracle script on `input`. nullopt when the configured Python cannot import torch (the
/// caller skips with skip_message()); throws c10::Error with the script's stderr on any other failure.
std::optional<json> run(const std::string& script, const json& input);

/// "no Python torch at <path>: run scripts/install-deps.sh" plus the reason seen.
std::string skip_message();

/// Canonical dtype names shared with Python (str(torch.float32) without "torch."): "float32", ...
std::string dtype_name(c10::ScalarType type);
c10::ScalarType dtype_from_name(const std::string& name);

/// {"dtype", "shape", "bits"}: the elements' bits as unsigned integers, row-major.
json encode(const torch::Tensor& t);
torch::Tensor decode(const json& j);

uint64_t double_bits(double x);
double bits_double(uint64_t bits);

/// Bit-for-bit equality (dtype, shape, every bit: -0 != +0, NaN payloads count); on failure the
/// message shows the first differing elements with values and bit patterns on both sides.
::testing::AssertionResult same_bits(const torch::Tensor& ampp, const torch::Tensor& oracle);

/// Standard-normal tensors of `shapes`, drawn in order from one CPU generator seeded with `seed`
/// (independent of torch's global generator).
std::vector<torch::Tensor> randn_tensors(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed);

/// Deterministic choices for the test cases (independent of torch's generator state).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  /// Uniform integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(engine_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(engine_() >> 11) * 0x1.0p-53 < p; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace ampp_oracle
