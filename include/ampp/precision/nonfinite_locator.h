#pragma once
// The numerics doctor's locator (debug mode): the first op whose output held inf/NaN although every
// floating input it got was finite, i.e. where a non-finite value was born, with the ops it ran inside
// (under autocast, the lowered op and the rounding cast that overflowed). It watches this thread's ops and
// those of the autograd worker threads that run its backward (a GPU's).
//
//   std::optional<ampp::NonFiniteOrigin> origin;
//   {
//     ampp::NonFiniteLocator locate;            // observes every op on this thread from here on
//     ampp::autocast region(torch::kCPU, torch::kHalf);
//     loss = model->forward(x);
//     origin = locate.first();
//   }
//   if (origin) std::cerr << origin->describe() << "\n";
//
// It watches ops through LibTorch's dispatcher (a thread-local RecordFunction callback with inputs and
// outputs, which LibTorch hands on to the threads that run this thread's backward), so it sees every aten
// op, whatever module or function called it, the scaled backward's on a GPU's autograd thread included.
// One locator at a time in a process. Off by default and free
// when no locator exists: nothing is registered. While one exists, each op's floating inputs and
// outputs are read once more, so run it on the step to diagnose, not on every step. LibTorch's C++
// modules record no scope of their own; given the model, the locator names the module by its
// parameters: the one whose weights the op (or an op around it) took as input, else the last such
// module before it ("after fc1", e.g. for a relu).

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ampp {

struct NonFiniteOrigin {
  /// Ops open when it happened, outermost first ("aten::linear", "aten::addmm", "aten::_to_copy").
  std::vector<std::string> ops;
  /// Position of the innermost op among the ops observed since the locator started (1-based).
  int64_t op_index = 0;
  /// One line per floating tensor input: "float32 [4, 5] in [-2.1, 3.5]".
  std::vector<std::string> inputs;
  /// The first non-finite output: "float32 [4, 3]: 2 inf, 0 NaN of 12".
  std::string output;
  /// With a model: its module path ("layer2.conv1"), "after <path>", or "" when not known.
  std::string module;
  /// All of the above in one line.
  std::string describe() const;
};

class NonFiniteLocator {
 public:
  NonFiniteLocator();
  /// Also names the module of `model` (by its parameters) where the value was born.
  explicit NonFiniteLocator(const torch::nn::Module& model);
  ~NonFiniteLocator();
  NonFiniteLocator(const NonFiniteLocator&) = delete;
  NonFiniteLocator& operator=(const NonFiniteLocator&) = delete;

  /// The first origin found since construction (nullopt while every op's output was finite).
  std::optional<NonFiniteOrigin> first() const;
  /// Ops observed so far.
  int64_t ops_seen() const;

  struct State;  // what the callbacks record (nonfinite_locator.cpp)

 private:
  std::shared_ptr<State> state_;
  uint64_t handle_ = 0;
};

}  // namespace ampp
