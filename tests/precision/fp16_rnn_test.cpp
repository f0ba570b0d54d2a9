// fp16 emulation of CUDA's RNNs (issue 53, item 2). On a GPU, autocast casts input, hx/cx and the flat weights of
// every LSTM, GRU and RNN to fp16 at _cudnn_rnn, below the CPU's decomposition (mkldnn_rnn_layer or the native cells),
// so ampp emulates it at lstm/gru/rnn_tanh/rnn_relu (.input and .data): inputs and weights rounded to fp16 values,
// float32 arithmetic, outputs rounded (docs/precision.md). Under bf16 and the CPU lists nothing changes.

#include "precision/test_util.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/kernels.h>
#include <ampp/precision/rounding.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using Fp16Rnn = ampp_test::OneThread;
using Tensors = std::vector<torch::Tensor>;
using ampp::precision::round_to_fp16;
namespace rnn_utils = torch::nn::utils::rnn;

bool all_fp16_values(const torch::Tensor& t) { return torch::equal(round_to_fp16(t), t); }

Tensors round_all(const Tensors& ts) {
  Tensors out;
  for (const auto& t : ts) out.push_back(round_to_fp16(t));
  return out;
}

// One RNN module and a forward on inputs {x, h0[, c0]} that returns every output tensor (output, h_n[, c_n]).
struct RnnCase {
  std::string op;  // the aten overload the forward calls
  std::shared_ptr<torch::nn::Module> module;
  Tensors inputs;
  std::function<Tensors(const Tensors&)> forward;
};

// Every output tensor of a forward: (output, (h_n, c_n)) of an LSTM, (output, h_n) of a GRU or RNN.
Tensors outputs(const torch::Tensor& out, const std::tuple<torch::Tensor, torch::Tensor>& hc) {
  return {out, std::get<0>(hc), std::get<1>(hc)};
}
Tensors outputs(const torch::Tensor& out, const torch::Tensor& h) { return {out, h}; }
template <class Out, class Hx>
Tensors outputs(const std::tuple<Out, Hx>& r) {
  if constexpr (std::is_same_v<Out, rnn_utils::PackedSequence>)
    return outputs(std::get<0>(r).data(), std::get<1>(r));
  else
    return outputs(std::get<0>(r), std::get<1>(r));
}

// Sequences of lengths 4 and 2 (time-major, padded), packed: the .data overloads.
rnn_utils::PackedSequence packed(const torch::Tensor& x) {
  return rnn_utils::pack_padded_sequence(x, torch::tensor({4, 2}));
}

// The module's .input (padded batch) and .data (PackedSequence) forwards; `hx` makes its state from inputs[1...].
template <class Module, class Hx>
void add_both_overloads(std::vector<RnnCase>& cases, const std::string& op, const std::string& note, Module m,
                        const Tensors& inputs, Hx hx) {
  cases.push_back({op + ".input" + note, m.ptr(), inputs,
                   [=](const Tensors& in) mutable { return outputs(m->forward(in[0], hx(in))); }});
  cases.push_back({op + ".data" + note, m.ptr(), inputs, [=](const Tensors& in) mutable {
                     return outputs(m->forward_with_packed_input(packed(in[0]), hx(in)));
                   }});
}

// Two layers, both directions (also an LSTM with projections, which oneDNN does not take: the native path), seq 4,
// batch 2, input 3, hidden 5; inputs scaled so that rounding to fp16 changes them.
std::vector<RnnCase> rnn_cases() {
  torch::manual_seed(11);
  auto x = [] { return torch::randn({4, 2, 3}) * 3; };
  auto h = [](int64_t size) { return torch::randn({4, 2, size}); };
  auto lstm_hx = [](const Tensors& in) { return std::make_tuple(in[1], in[2]); };
  auto hx = [](const Tensors& in) { return in[1]; };
  using namespace torch::nn;
  std::vector<RnnCase> cases;
  add_both_overloads(cases, "lstm", "", LSTM(LSTMOptions(3, 5).num_layers(2).bidirectional(true)), {x(), h(5), h(5)},
                     lstm_hx);
  add_both_overloads(cases, "lstm", " (proj_size)",
                     LSTM(LSTMOptions(3, 5).num_layers(2).bidirectional(true).proj_size(2)), {x(), h(2), h(5)},
                     lstm_hx);
  add_both_overloads(cases, "gru", "", GRU(GRUOptions(3, 5).num_layers(2).bidirectional(true)), {x(), h(5)}, hx);
  add_both_overloads(cases, "rnn_tanh", "", RNN(RNNOptions(3, 5).num_layers(2).bidirectional(true)), {x(), h(5)}, hx);
  add_both_overloads(cases, "rnn_relu", "",
                     RNN(RNNOptions(3, 5).num_layers(2).bidirectional(true).nonlinearity(torch::kReLU)), {x(), h(5)},
                     hx);
  return cases;
}

// What CUDA's cast implies, computed without a region: the module in float32 on fp16-rounded weights (rounded in
// place, then restored), input and hx, its outputs rounded to fp16.
Tensors reference(const RnnCase& c) {
  auto params = c.module->parameters();
  Tensors saved;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      saved.push_back(p.clone());
      p.copy_(round_to_fp16(p));
    }
  }
  const Tensors out = round_all(c.forward(round_all(c.inputs)));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
  return out;
}

// Each RNN in the region equals, bit for bit, the module outside it on fp16-rounded input, hx and weights with its
// outputs rounded to fp16: float32 tensors holding fp16 values, as the other fp16-emulated ops.
TEST_F(Fp16Rnn, LstmGruAndRnnRunInFp16UnderTheCudaLists) {
  for (const auto& c : rnn_cases()) {
    SCOPED_TRACE(c.op);
    const Tensors want = reference(c);
    Tensors got;
    {
      ampp::autocast guard(torch::kCPU, torch::kHalf);
      got = c.forward(c.inputs);
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].scalar_type(), torch::kFloat);
      EXPECT_TRUE(all_fp16_values(got[i])) << "output " << i << " is not rounded to fp16";
      EXPECT_TRUE(torch::equal(got[i], want[i])) << "output " << i;
    }
  }
}

// Backward rounds where CUDA's casts are: the gradients reaching the weights, the input and hx are fp16 values.
TEST_F(Fp16Rnn, GradientsCrossingAnRnnAreFp16Values) {
  for (const auto& c : rnn_cases()) {
    SCOPED_TRACE(c.op);
    Tensors inputs;
    for (const auto& t : c.inputs) inputs.push_back(t.clone().requires_grad_(true));
    c.module->zero_grad();
    {
      ampp::autocast guard(torch::kCPU, torch::kHalf);
      const Tensors out = c.forward(inputs);
      torch::Tensor loss = out[0].sum() * 0.3;
      for (size_t i = 1; i < out.size(); ++i) loss = loss + out[i].pow(2).sum();
      loss.backward();
    }
    for (const auto& p : c.module->named_parameters())
      EXPECT_TRUE(p->grad().defined() && all_fp16_values(p->grad())) << p.key();
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_TRUE(all_fp16_values(inputs[i].grad())) << "input " << i;
  }
}

// The RNN kernels an fp16 region installs pass bf16 regions and fp16 regions on the CPU lists through, as LibTorch's
// fallthrough does: the result equals the one before they were installed (PyTorch's CPU autocast: an LSTM runs
// oneDNN's layer in bf16, a GRU its linear layers).
TEST_F(Fp16Rnn, Bf16AndCpuListRegionsAreUnchanged) {
  const auto cases = rnn_cases();
  auto run_all = [&](c10::ScalarType dtype, ampp::Fp16OpLists lists) {
    std::vector<Tensors> out;
    ampp::autocast guard(torch::kCPU, dtype, true, ampp::AutocastOptions().fp16_op_lists(lists));
    for (const auto& c : cases) out.push_back(c.forward(c.inputs));
    return out;
  };
  ampp::precision::uninstall_autocast_kernels();  // the next region installs the CPU lists' kernels only
  const auto bf16_before = run_all(torch::kBFloat16, ampp::Fp16OpLists::kCpu);
  const auto cpu_lists_before = run_all(torch::kHalf, ampp::Fp16OpLists::kCpu);
  run_all(torch::kHalf, ampp::Fp16OpLists::kCuda);  // installs the CUDA lists' kernels, the RNNs' included
  const auto bf16_after = run_all(torch::kBFloat16, ampp::Fp16OpLists::kCpu);
  const auto cpu_lists_after = run_all(torch::kHalf, ampp::Fp16OpLists::kCpu);
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(cases[k].op);
    for (size_t i = 0; i < bf16_before[k].size(); ++i) {
      EXPECT_EQ(bf16_after[k][i].scalar_type(), bf16_before[k][i].scalar_type()) << "output " << i;
      EXPECT_TRUE(torch::equal(bf16_after[k][i], bf16_before[k][i])) << "bf16, output " << i;
      EXPECT_TRUE(torch::equal(cpu_lists_after[k][i], cpu_lists_before[k][i])) << "CPU lists, output " << i;
    }
  }
  EXPECT_EQ(bf16_before[0][0].scalar_type(), torch::kBFloat16);  // lstm.input: oneDNN's layer, in bf16
}

}  // namespace
