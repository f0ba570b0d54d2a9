#pragma once
// DDP communication hooks (PyTorch's register_comm_hook / ddp_comm_hooks.default_hooks).
// A hook receives a GradBucket of *local* (not yet averaged) gradients and returns a future whose
// value is one tensor of the bucket's size and dtype holding the averaged gradients. DDP waits on
// all futures before backward() returns and copies the results into the parameters' .grad.
#include <functional>

#include <ATen/core/ivalue.h>

#include <ampp/dist/grad_bucket.h>
#include <ampp/dist/process_group.h>

namespace ampp::dist {

using CommHook = std::function<c10::intrusive_ptr<c10::ivalue::Future>(GradBucket& bucket)>;

// How DDP's forward gives every rank the buffers of rank `source` (broadcast_buffers): an ampp extension
// beside the comm hook (DistributedDataParallel::register_buffer_broadcast). The default packs them into
// Gloo broadcasts (broadcast_coalesced); shared_memory_buffer_broadcast copies them through shared memory.
using BufferBroadcast = std::function<void(const std::vector<torch::Tensor>& buffers, int source)>;

// Plain average: divide by the world size, allreduce SUM (same result as DDP without a hook).
CommHook allreduce_hook(ProcessGroup group);

// Halve the bytes: cast the bucket to float16, divide by the world size, allreduce SUM in float16
// (Gloo adds fp16 values, rounding each partial sum to fp16), cast back into the bucket's dtype.
// As in PyTorch: values beyond fp16's range (65504) become inf and tiny ones flush to zero.
CommHook fp16_compress_hook(ProcessGroup group);

// Halve the bytes with bfloat16 (fp32's range, 8-bit mantissa). Gloo cannot add bfloat16, so each
// rank's bf16 payload travels bit-exactly through an allgather (as 16-bit words) and is summed in
// fp32 after decompression, then divided by the world size: only the one rounding per rank at
// compression is lost (PyTorch's NCCL version also rounds every partial sum to bf16). With an
// allgather each rank receives (W-1) payloads, so the saving over an fp32 ring allreduce holds for
// up to 4 ranks.
CommHook bf16_compress_hook(ProcessGroup group);

enum class BuiltinCommHook { kAllreduce, kFp16Compress, kBf16Compress };
CommHook builtin_comm_hook(BuiltinCommHook type, ProcessGroup group);

// Building blocks for user hooks.
// Async allreduce SUM of `tensor` in place; the future's value is `tensor`. Dtypes Gloo cannot add
// (bfloat16) are summed in fp32 via allgather_sum_fp32 and written back.
c10::intrusive_ptr<c10::ivalue::Future> allreduce_sum_async(const ProcessGroup& group, torch::Tensor tensor);
// Async: allgather a 16-bit tensor bit-exactly and sum the W copies in fp32; the future's value
// is a new fp32 tensor.
c10::intrusive_ptr<c10::ivalue::Future> allgather_sum_fp32(const ProcessGroup& group, const torch::Tensor& tensor16);
// A completed future holding `value` (for hooks that need no communication).
c10::intrusive_ptr<c10::ivalue::Future> completed_future(torch::Tensor value);

}  // namespace ampp::dist
