// The RNNs under fp16 emulation. On a GPU, autocast runs every LSTM, GRU and RNN in fp16 through one kernel on
// _cudnn_rnn (ATen's cudnn/AutocastRNN.cpp), which casts the input, hx/cx and every flat weight (biases and
// projections too) to fp16. The CPU never reaches _cudnn_rnn: its lstm/gru/rnn_* decompose into oneDNN's
// mkldnn_rnn_layer or the native cells, which CUDA's lists do not name, so the emulation would leave them in
// float32. ampp therefore applies that cast one level up, at the composite ops both devices start from: they are
// lower-precision ops of the emulated CUDA lists, and the generic fp16 path (autocast_kernel.cpp) rounds the input,
// hx and the weights, runs the op in float32 and rounds output, h_n (and c_n).

#include "detail.h"

#include <algorithm>

namespace ampp::precision::detail {

const std::vector<std::string>& cuda_rnn_ops() {
  // Both overloads of each: .input (a padded batch) and .data (a PackedSequence's data and batch sizes).
  static const std::vector<std::string> ops = {"lstm.input",     "lstm.data",     "gru.input",      "gru.data",
                                               "rnn_tanh.input", "rnn_tanh.data", "rnn_relu.input", "rnn_relu.data"};
  return ops;
}

bool is_cuda_rnn_op(const std::string& key) {
  const auto& ops = cuda_rnn_ops();
  return std::find(ops.begin(), ops.end(), key) != ops.end();
}

}  // namespace ampp::precision::detail
