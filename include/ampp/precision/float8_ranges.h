#pragma once
// The numerics doctor for fp8: how each Float8Linear's casts use their float8 format. Per layer and tensor
// (its input, its weight, the gradient of its output): the largest |value| x scale against the format's
// largest value, the values saturated (so far beyond the range that they would round past its largest
// value: clamped to it) and those flushed (nonzero, cast to zero). A dynamic recipe scales each tensor to its own amax,
// so it cannot saturate and can only flush; the delayed recipe saturates when a tensor outgrows its history.
//
//   ampp::Float8RangeRecorder recorder;      // from now on, every fp8 cast of a training pass is measured
//   for (...) { recorder.set_step(step); train_step(); }
//   if (auto first = recorder.first_saturated()) ...   // the layer that went out of range first
//
// Each measured cast costs a few reductions and a host read (the doctor's price, rank 0 only). The
// forward's casts are measured with gradients enabled only (not evaluation's), the backward's always.
#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ampp {

struct Float8TensorRange {
  std::string layer;   // the Float8Linear's path in the model (convert_to_float8_training), "" if none
  std::string tensor;  // "input", "weight" or "gradient"
  c10::ScalarType format = c10::ScalarType::Undefined;  // Float8_e4m3fn or Float8_e5m2
  int64_t casts = 0, values = 0, saturated = 0, flushed = 0;
  double max_range_used = 0;          // the largest |value| x scale / the format's largest value (> 1: saturated)
  int64_t first_saturated_step = -1;  // -1: never
};

class Float8RangeRecorder {
 public:
  Float8RangeRecorder();  // one at a time in a process
  ~Float8RangeRecorder();
  Float8RangeRecorder(const Float8RangeRecorder&) = delete;
  Float8RangeRecorder& operator=(const Float8RangeRecorder&) = delete;

  void set_step(int64_t step);
  std::vector<Float8TensorRange> ranges() const;  // in the order first cast
  // The tensor that saturated at the earliest step (the first cast of that step among several).
  std::optional<Float8TensorRange> first_saturated() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

namespace detail {

// The layer whose forward runs on this thread (Float8LinearImpl::forward), for the recorder's names.
class Float8LayerScope {
 public:
  explicit Float8LayerScope(const std::string& name);
  ~Float8LayerScope();

 private:
  const std::string* previous_;
};
const std::string& current_float8_layer();

// Called by the recipes' casts: `t` cast to `fp8` with `scale`. Does nothing without a recorder.
void record_float8_cast(const std::string& layer, const char* tensor, const torch::Tensor& t,
                        const torch::Tensor& scale, const torch::Tensor& fp8);

}  // namespace detail

}  // namespace ampp
