// Clipping (issue 52, defect 13): torch.nn.utils.clip_grad_norm_'s values, with one _foreach_norm for all the
// gradients (PyTorch's way) instead of a norm per parameter, which on a GPU was a kernel launch each.

#include "ampp/train/clip_grad_norm.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

// The ATen ops called on this thread outside any other op, by name, while alive.
class TopLevelOps {
 public:
  TopLevelOps() : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end))) { state() = {}; }
  ~TopLevelOps() { at::removeCallback(handle_); }
  int count(const std::string& name) const { return state().calls[name]; }

 private:
  struct State {
    std::map<std::string, int> calls;
    int depth = 0;
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (state().depth++ == 0) ++state().calls[fn.name()];
    return nullptr;
  }
  static void on_end(const at::RecordFunction&, at::ObserverContext*) { --state().depth; }
  at::CallbackHandle handle_;
};

std::vector<torch::Tensor> params_with_grads(int64_t count, double grad_scale) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < count; ++i) {
    auto p = torch::randn({3 + i, 5}).requires_grad_();
    p.mutable_grad() = torch::randn({3 + i, 5}) * grad_scale;
    params.push_back(p);
  }
  return params;
}

TEST(ClipGradNorm, EqualsLibTorchsClipGradNormWithOneNormOpForAllGradients) {
  for (const double grad_scale : {0.01, 10.0}) {  // below and above the max norm
    auto ours = params_with_grads(10, grad_scale);
    auto theirs = params_with_grads(10, grad_scale);
    TopLevelOps ops;
    ampp::train::detail::clip_grad_norm_on_device(ours, 1.0);
    EXPECT_EQ(ops.count("aten::_foreach_norm"), 1) << grad_scale;
    EXPECT_EQ(ops.count("aten::norm") + ops.count("aten::linalg_vector_norm"), 1)
        << "one norm of the norms, not one per parameter";
    EXPECT_EQ(ops.count("aten::item") + ops.count("aten::_local_scalar_dense"), 0) << "no host read";
    torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_TRUE(torch::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 0)) << grad_scale << " " << i;
  }
}

TEST(ClipGradNorm, ParametersWithoutGradientsAreLeftOut) {
  auto params = params_with_grads(3, 10.0);
  params[1].mutable_grad() = torch::Tensor();
  ampp::train::detail::clip_grad_norm_on_device(params, 1.0);
  EXPECT_FALSE(params[1].grad().defined());
  const auto total = torch::stack({params[0].grad().norm(), params[2].grad().norm()}).norm().item<double>();
  EXPECT_NEAR(total, 1.0, 1e-5);
}

}  // namespace
