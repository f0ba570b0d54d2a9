// The fp8 doctor's recorder (float8_ranges.h).
#include <ampp/precision/float8.h>
#include <ampp/precision/float8_ranges.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <mutex>

namespace ampp {

struct Float8RangeRecorder::State {
  std::mutex mutex;  // the backward's casts may run on autograd's device threads
  int64_t step = 0;
  std::vector<Float8TensorRange> ranges;
};

namespace float8_ranges_impl {

std::mutex active_mutex;
std::shared_ptr<Float8RangeRecorder::State> active;  // the recorder alive, if any
thread_local const std::string* layer_on_this_thread = nullptr;
const std::string kNoLayer;

// The smallest magnitude that rounds past the format's largest value without the clamp: that value plus half
// its ulp (448 = 1.75 x 2^8 with 3 mantissa bits; 57344 = 1.75 x 2^15 with 2). Below it the clamp changes
// nothing that rounding would not.
double rounds_past(c10::ScalarType format) { return format == torch::kFloat8_e5m2 ? 57344.0 + 4096.0 : 448.0 + 16.0; }

Float8TensorRange& entry(Float8RangeRecorder::State& s, const std::string& layer, const char* tensor,
                         c10::ScalarType format) {
  for (auto& r : s.ranges)
    if (r.layer == layer && r.tensor == tensor && r.format == format) return r;
  s.ranges.push_back({layer, tensor, format});
  return s.ranges.back();
}

}  // namespace float8_ranges_impl

Float8RangeRecorder::Float8RangeRecorder() : state_(std::make_shared<State>()) {
  const std::lock_guard<std::mutex> lock(float8_ranges_impl::active_mutex);
  TORCH_CHECK(!float8_ranges_impl::active, "ampp::Float8RangeRecorder: one recorder at a time");
  float8_ranges_impl::active = state_;
}

Float8RangeRecorder::~Float8RangeRecorder() {
  const std::lock_guard<std::mutex> lock(float8_ranges_impl::active_mutex);
  float8_ranges_impl::active.reset();
}

void Float8RangeRecorder::set_step(int64_t step) {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  state_->step = step;
}

std::vector<Float8TensorRange> Float8RangeRecorder::ranges() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->ranges;
}

std::optional<Float8TensorRange> Float8RangeRecorder::first_saturated() const {
  std::optional<Float8TensorRange> first;
  for (const auto& r : ranges())
    if (r.first_saturated_step >= 0 && (!first || r.first_saturated_step < first->first_saturated_step)) first = r;
  return first;
}

using float8_ranges_impl::rounds_past;

namespace detail {

Float8LayerScope::Float8LayerScope(const std::string& name) : previous_(float8_ranges_impl::layer_on_this_thread) {
  float8_ranges_impl::layer_on_this_thread = &name;
}

Float8LayerScope::~Float8LayerScope() { float8_ranges_impl::layer_on_this_thread = previous_; }

const std::string& current_float8_layer() {
  const auto* name = float8_ranges_impl::layer_on_this_thread;
  return name ? *name : float8_ranges_impl::kNoLayer;
}

void record_float8_cast(const std::string& layer, const char* tensor, const torch::Tensor& t,
                        const torch::Tensor& scale, const torch::Tensor& fp8) {
  std::shared_ptr<Float8RangeRecorder::State> state;
  {
    const std::lock_guard<std::mutex> lock(float8_ranges_impl::active_mutex);
    state = float8_ranges_impl::active;
  }
  if (!state) return;
  torch::NoGradGuard no_grad;
  const double most = float8_max(fp8.scalar_type());
  const auto scaled = t.to(torch::kFloat).abs() * scale;  // before the cast's clamp
  // One host read: the largest scaled value, the values the clamp saved from rounding past the largest
  // value, and the nonzero ones cast to 0.
  const auto counts =
      torch::stack({scaled.max() / most, (scaled >= rounds_past(fp8.scalar_type())).sum().to(torch::kFloat),
                    ((t != 0) & (fp8.to(torch::kFloat) == 0)).sum().to(torch::kFloat)})
          .to(torch::kCPU, torch::kDouble);
  const auto* c = counts.data_ptr<double>();
  const std::lock_guard<std::mutex> lock(state->mutex);
  auto& r = float8_ranges_impl::entry(*state, layer, tensor, fp8.scalar_type());
  r.casts += 1;
  r.values += t.numel();
  r.saturated += static_cast<int64_t>(c[1]);
  r.flushed += static_cast<int64_t>(c[2]);
  r.max_range_used = std::max(r.max_range_used, c[0]);
  if (c[1] > 0 && r.first_saturated_step < 0) r.first_saturated_step = state->step;
}

}  // namespace detail

}  // namespace ampp
