// Built-in DDP communication hooks on top of c10d collectives (futures chain the decompression
// after the collective, on the backend's thread, so backward is never blocked).
#include <ampp/dist/comm_hooks.h>

#include "torch_compat.h"

#include <torch/torch.h>

namespace ampp::dist {
namespace {

// Gloo's collectives dispatch on float, double, half and the integer types, and bfloat16 from 2.2.
bool gloo_can_sum(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16:
      return compat::kGlooSumsBFloat16;
    case torch::kFloat:
    case torch::kDouble:
    case torch::kHalf:
    case torch::kChar:
    case torch::kByte:
    case torch::kInt:
    case torch::kLong:
      return true;
    default:
      return false;
  }
}

c10::intrusive_ptr<c10::ivalue::Future> value_of(c10::intrusive_ptr<c10::ivalue::Future> fut, torch::Tensor value) {
  return fut->then(
      [value](c10::ivalue::Future& f) {
        f.value();  // rethrows a collective's error (e.g. Gloo timeout) into the child future
        return c10::IValue(value);
      },
      c10::TensorType::get());
}

}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> completed_future(torch::Tensor value) {
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  fut->markCompleted(c10::IValue(std::move(value)));
  return fut;
}

c10::intrusive_ptr<c10::ivalue::Future> allgather_sum_fp32(const ProcessGroup& group, const torch::Tensor& tensor16) {
  TORCH_CHECK(tensor16.element_size() == 2, "ampp::dist::allgather_sum_fp32 expects a 16-bit tensor, got ",
              tensor16.scalar_type(), ".");
  const auto dtype = tensor16.scalar_type();
  // The payload travels as float16 words: an allgather only copies them, so bf16 bits arrive intact.
  std::vector<torch::Tensor> inputs{tensor16.contiguous().view(torch::kHalf)};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < group.size(); ++r) outputs[0].push_back(torch::empty_like(inputs[0]));
  auto work = group.c10d()->allgather(outputs, inputs);
  return work->getFuture()->then(
      [outputs, dtype](c10::ivalue::Future& f) {
        f.value();
        torch::NoGradGuard no_grad;
        auto sum = torch::zeros(outputs[0][0].sizes(), outputs[0][0].options().dtype(torch::kFloat));
        for (const auto& o : outputs[0]) sum.add_(o.view(dtype).to(torch::kFloat));
        return c10::IValue(sum);
      },
      c10::TensorType::get());
}

c10::intrusive_ptr<c10::ivalue::Future> allreduce_sum_async(const ProcessGroup& group, torch::Tensor tensor) {
  if (gloo_can_sum(tensor.scalar_type()) || group.backend() != "gloo") {
    std::vector<torch::Tensor> t{tensor};
    return value_of(group.c10d()->allreduce(t)->getFuture(), tensor);
  }
  TORCH_CHECK(tensor.element_size() == 2, "ampp::dist: cannot allreduce ", tensor.scalar_type(),
              " with Gloo; cast to float32 first.");
  return allgather_sum_fp32(group, tensor)
      ->then(
          [tensor](c10::ivalue::Future& f) {
            torch::NoGradGuard no_grad;
            tensor.copy_(f.value().toTensor());
            return c10::IValue(tensor);
          },
          c10::TensorType::get());
}

CommHook allreduce_hook(ProcessGroup group) {
  return [group](GradBucket& bucket) {
    torch::NoGradGuard no_grad;
    bucket.buffer().div_(group.size());
    return allreduce_sum_async(group, bucket.buffer());
  };
}

namespace {
// PyTorch's compression hooks: cast, divide by the world size, allreduce in the 16-bit type (every
// partial sum rounded to it), cast back into the bucket's dtype.
CommHook compress_hook(ProcessGroup group, torch::ScalarType dtype) {
  return [group, dtype](GradBucket& bucket) {
    torch::NoGradGuard no_grad;
    auto buffer = bucket.buffer();
    auto compressed = buffer.to(dtype).div_(group.size());
    std::vector<torch::Tensor> t{compressed};
    return group.c10d()->allreduce(t)->getFuture()->then(
        [buffer, compressed](c10::ivalue::Future& f) {
          f.value();
          torch::NoGradGuard guard;
          buffer.copy_(compressed);  // decompress into the bucket's own dtype
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  };
}
}  // namespace

CommHook fp16_compress_hook(ProcessGroup group) { return compress_hook(std::move(group), torch::kHalf); }

CommHook bf16_compress_hook(ProcessGroup group) {
  // Gloo that sums bf16 (2.2+), or another backend: exactly PyTorch's hook.
  if (group.backend() != "gloo" || gloo_can_sum(torch::kBFloat16))
    return compress_hook(std::move(group), torch::kBFloat16);
  // 1.13's Gloo cannot: the bf16 payloads are allgathered bit-exactly and summed in fp32.
  return [group](GradBucket& bucket) {
    torch::NoGradGuard no_grad;
    auto buffer = bucket.buffer();
    const auto world = group.size();
    auto compressed = buffer.to(torch::kBFloat16);
    return allgather_sum_fp32(group, compressed)
        ->then(
            [buffer, world](c10::ivalue::Future& f) {
              torch::NoGradGuard guard;
              buffer.copy_(f.value().toTensor().div_(world));  // average in fp32, then into the bucket dtype
              return c10::IValue(buffer);
            },
            c10::TensorType::get());
  };
}

CommHook builtin_comm_hook(BuiltinCommHook type, ProcessGroup group) {
  switch (type) {
    case BuiltinCommHook::kAllreduce:
      return allreduce_hook(std::move(group));
    case BuiltinCommHook::kFp16Compress:
      return fp16_compress_hook(std::move(group));
    case BuiltinCommHook::kBf16Compress:
      return bf16_compress_hook(std::move(group));
  }
  TORCH_CHECK(false, "ampp::dist::builtin_comm_hook: unknown hook type.");
}

}  // namespace ampp::dist
