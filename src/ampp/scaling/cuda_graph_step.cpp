// CudaGraphStep (cuda_graph_step.h): warm-up, capture and replay of a whole training step. In a LibTorch
// built without CUDA everything but the checks compiles away, and the constructor says why it cannot run.
#include <ampp/scaling/cuda_graph_step.h>

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <exception>
#include <sstream>
#include <string>

#include "graph_capture_scope.h"
#include "torch_compat.h"

#if AMPP_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ampp {

namespace scaling::detail {
namespace {
thread_local bool capturing = false;
}  // namespace
bool capturing_a_graph() { return capturing; }
GraphCaptureScope::GraphCaptureScope() : before_(capturing) { capturing = true; }
GraphCaptureScope::~GraphCaptureScope() { capturing = before_; }
}  // namespace scaling::detail

bool cuda_graphs_compiled() { return AMPP_TORCH_HAS_CUDA; }

#if AMPP_TORCH_HAS_CUDA
ErrorOnCudaSync::ErrorOnCudaSync() : mode_before_(static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode())) {
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
}
ErrorOnCudaSync::~ErrorOnCudaSync() {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode_before_));
}
#else
ErrorOnCudaSync::ErrorOnCudaSync() = default;
ErrorOnCudaSync::~ErrorOnCudaSync() = default;
#endif

#if AMPP_TORCH_HAS_CUDA
struct CudaGraphStep::Graph {
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
};
#else
struct CudaGraphStep::Graph {};
#endif

namespace {

std::string shape_and_dtype(const torch::Tensor& t) {
  std::ostringstream text;
  text << t.sizes() << " " << t.dtype();
  return text.str();
}

void check_can_capture(const std::vector<torch::Tensor>& static_inputs, const CudaGraphStepOptions& options) {
  TORCH_CHECK(cuda_graphs_compiled(),
              "CudaGraphStep: this LibTorch was built without CUDA, so it cannot capture CUDA graphs. Fix: build "
              "ampp against a CUDA LibTorch (AMPP_TORCH=cuda, docs/gpu.md), or train without CUDA graphs.");
  TORCH_CHECK(torch::cuda::is_available(),
              "CudaGraphStep: no CUDA device: this LibTorch has CUDA, but torch::cuda::is_available() is false. "
              "Fix: run on a machine with an NVIDIA GPU, or train without CUDA graphs.");
  TORCH_CHECK(options.warmup_steps() >= 1, "CudaGraphStep: warmup_steps is ", options.warmup_steps(),
              "; at least 1 eager step must run before the capture, since what a step creates lazily (cuBLAS "
              "handles, optimizer state) cannot be created inside one.");
  TORCH_CHECK(!static_inputs.empty(),
              "CudaGraphStep: no static inputs. Fix: pass the GPU tensors the step reads "
              "(a batch's inputs and targets); each call copies its batch into them.");
  for (size_t i = 0; i < static_inputs.size(); ++i) {
    const torch::Tensor& t = static_inputs[i];
    TORCH_CHECK(t.defined() && t.is_cuda(), "CudaGraphStep: static input ", i, " is ",
                t.defined() ? "on " + t.device().str() : std::string("undefined"),
                "; a CUDA graph reads fixed GPU memory. Fix: allocate it on the GPU, e.g. torch::empty(shape, "
                "torch::kCUDA).");
  }
}

}  // namespace

CudaGraphStep::CudaGraphStep(std::vector<torch::Tensor> static_inputs, StepFunction step, CudaGraphStepOptions options)
    : static_inputs_(std::move(static_inputs)), step_(std::move(step)), options_(options) {
  check_can_capture(static_inputs_, options_);
  TORCH_CHECK(step_, "CudaGraphStep: the step function is empty.");
  graph_ = std::make_unique<Graph>();
}

CudaGraphStep::~CudaGraphStep() = default;

void CudaGraphStep::copy_inputs(const std::vector<torch::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == static_inputs_.size(), "CudaGraphStep: ", inputs.size(),
              " inputs given, and the step was built for ", static_inputs_.size(), ".");
  for (size_t i = 0; i < inputs.size(); ++i) {
    // copy_ would broadcast a smaller batch silently: a graph replays the captured shapes, so they must match.
    TORCH_CHECK(inputs[i].sizes() == static_inputs_[i].sizes() && inputs[i].dtype() == static_inputs_[i].dtype(),
                "CudaGraphStep: input ", i, " is ", shape_and_dtype(inputs[i]), ", and the step was captured for ",
                shape_and_dtype(static_inputs_[i]),
                ". A CUDA graph replays fixed shapes. Fix: give every batch "
                "the same shape (drop the last partial batch), or run this batch without the graph.");
    static_inputs_[i].copy_(inputs[i], /*non_blocking=*/true);
  }
}

const torch::Tensor& CudaGraphStep::operator()(const std::vector<torch::Tensor>& inputs) {
  copy_inputs(inputs);
#if AMPP_TORCH_HAS_CUDA
  TORCH_CHECK(!at::autocast::is_autocast_enabled(at::kCUDA),
              "CudaGraphStep: called inside an autocast region. Its cast cache would keep casts of the weights "
              "made before the capture, and every replay would reuse them as the weights change. Fix: enter "
              "ampp::autocast inside the step function.");
  if (captured_) {
    graph_->graph.replay();
  } else if (steps_ < options_.warmup_steps()) {
    run_eagerly_on_side_stream(/*last_warmup_step=*/steps_ + 1 == options_.warmup_steps());
  } else {
    capture();
    graph_->graph.replay();  // the capture recorded this call's step; the replay performs it
  }
#endif
  ++steps_;
  return output_;
}

#if AMPP_TORCH_HAS_CUDA
namespace {

// `waiter` waits for what was queued on `producer` so far (torch.cuda.Stream.wait_stream).
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& producer) {
  at::cuda::CUDAEvent event;
  event.record(producer);
  event.block(waiter);
}

// An exception's message without c10's backtrace.
std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

const char* const kSyncCauses =
    " Typical causes: .item() or printing a GPU tensor in the step, a branch on a GPU value, or "
    "GradScaler::step with an optimizer that is not fused. Fix: use ampp::FusedSGD or ampp::FusedAdamW with "
    "the GradScaler, and read metrics from the returned tensor outside the step, every N steps.";

}  // namespace

// PyTorch's whole-network recipe: warm up on a side stream that has waited for the current one, and
// make the current stream wait for it after. The last warm-up step runs with host synchronisation made
// an error, so that a step a graph could not capture is refused here, with the name of the call.
void CudaGraphStep::run_eagerly_on_side_stream(bool last_warmup_step) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  wait_for(graph_->side, current);
  {
    c10::cuda::CUDAStreamGuard on_side(graph_->side);
    if (!last_warmup_step) {
      output_ = step_();
    } else {
      try {
        ErrorOnCudaSync no_sync;
        output_ = step_();
      } catch (const c10::Error& e) {
        TORCH_CHECK(false, "CudaGraphStep: the step synchronises with the host, which a CUDA graph cannot capture: ",
                    e.what_without_backtrace(), kSyncCauses);
      }
    }
  }
  wait_for(current, graph_->side);
}

void CudaGraphStep::capture() {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  at::autocast::clear_cache();  // no cast made outside the graph's memory may be reused inside it
  wait_for(graph_->side, current);
  {
    c10::cuda::CUDAStreamGuard on_side(graph_->side);
    // Thread-local mode: only this thread's calls are checked against the capture. In the global mode a
    // call that CUDA forbids during any capture, made on another thread (a loader thread pinning host
    // memory: cudaHostAlloc), invalidates it: the likely cause of `ampp train --cuda-graphs`'s "cuDNN
    // error: CUDNN_STATUS_EXECUTION_FAILED" on 2026-11-28, when its batches were pinned by such a thread.
    graph_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      const scaling::detail::GraphCaptureScope capturing;
      output_ = step_();
    } catch (const std::exception& e) {  // whatever the step threw, the stream must leave capture mode
      try {
        graph_->graph.capture_end();  // so that CUDA stays usable
      } catch (const std::exception&) {
      }
      TORCH_CHECK(false, "CudaGraphStep: capturing the step failed: ", message_of(e), kSyncCauses);
    }
    graph_->graph.capture_end();
  }
  wait_for(current, graph_->side);
  captured_ = true;
}
#else
void CudaGraphStep::run_eagerly_on_side_stream(bool) {}
void CudaGraphStep::capture() {}
#endif

}  // namespace ampp
