// SkipLedger (skip_ledger.h): each step's skip flag and the counts derived from it, where it was decided.
#include <ampp/scaling/skip_ledger.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

namespace ampp {

void SkipLedger::place(const torch::Device& device) {
  const bool here = last_.defined() && last_.device().type() == device.type() &&
                    (!device.has_index() || last_.device().index() == device.index());
  if (here) return;
  if (last_.defined()) {  // a ledger made by a host decision (on the CPU) meets a device's flag: moved once
    last_ = last_.to(device);
    skipped_ = skipped_.to(device);
    taken_ = taken_.to(device);
    return;
  }
  const auto on = torch::TensorOptions().device(device);
  last_ = torch::zeros({}, on.dtype(torch::kFloat));
  skipped_ = torch::zeros({}, on.dtype(torch::kLong));
  taken_ = torch::zeros({}, on.dtype(torch::kLong));
}

void SkipLedger::record(const torch::Tensor& skipped) {
  TORCH_CHECK(skipped.defined() && skipped.numel() == 1, "SkipLedger::record: the flag must be one value, got ",
              skipped.defined() ? skipped.sizes() : c10::IntArrayRef{});
  torch::NoGradGuard no_grad;
  place(skipped.device());
  const torch::Tensor was_skipped = skipped.reshape({}).ne(0);
  last_.copy_(was_skipped);
  skipped_.add_(was_skipped);
  taken_.add_(was_skipped.logical_not());
  ++steps_;
}

void SkipLedger::record(bool skipped) {
  torch::NoGradGuard no_grad;
  place(last_.defined() ? last_.device() : torch::Device(torch::kCPU));
  last_.fill_(skipped ? 1.0F : 0.0F);
  (skipped ? skipped_ : taken_).add_(1);
  ++steps_;
}

bool SkipLedger::last_skipped() const { return last_.defined() && last_.item<float>() != 0.0F; }

int64_t SkipLedger::skipped() const { return skipped_.defined() ? skipped_.item<int64_t>() : 0; }

const torch::Tensor& SkipLedger::taken_on(const torch::Device& device) {
  place(device);
  return taken_;
}

void SkipLedger::restore(int64_t taken, int64_t skipped) {
  TORCH_CHECK(taken >= 0 && skipped >= 0, "SkipLedger::restore: counts must be >= 0, got ", taken, " taken and ",
              skipped, " skipped");
  place(last_.defined() ? last_.device() : torch::Device(torch::kCPU));
  taken_.fill_(taken);
  skipped_.fill_(skipped);
  last_.zero_();
  steps_ = taken + skipped;
}

SkipLedger SkipLedger::clone() const {
  SkipLedger copy;
  copy.steps_ = steps_;
  if (last_.defined()) {
    copy.last_ = last_.clone();
    copy.skipped_ = skipped_.clone();
    copy.taken_ = taken_.clone();
  }
  return copy;
}

}  // namespace ampp
