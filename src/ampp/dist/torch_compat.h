#pragma once
// What the distributed layer needs from LibTorch's c10d, one spelling for every supported LibTorch.
#include <ampp/util/torch_version.h>

#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// Gloo's reduce_scatter: LibTorch 2.0 and newer (FSDP's gradient reduction allreduces before that).
#define AMPP_GLOO_HAS_REDUCE_SCATTER AMPP_TORCH_AT_LEAST(2, 0)

// The CUDA wheels compile c10d with NCCL and say so with USE_C10D_NCCL on every compile line.
#if defined(USE_C10D_NCCL) && AMPP_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define AMPP_HAVE_NCCL 1
#else
#define AMPP_HAVE_NCCL 0
#endif

#include <chrono>
#include <string>
#include <utility>

namespace ampp::dist::compat {

// A collective under way.
using Work = c10d::Work;

// 2.0 split c10d's ProcessGroup (the front that dispatches by device) from Backend (pytorch#88330):
// ProcessGroupGloo became a Backend and is wrapped in a ProcessGroup. 2.6 dropped the front's
// Options argument (backend name and timeout now live only in the backend's options).
// `checker`, when given (a second Gloo group), wraps the backend in c10d's ProcessGroupWrapper, which
// compares every collective's fingerprint across ranks before running it (TORCH_DISTRIBUTED_DEBUG=DETAIL).
inline c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo>& checker = {}) {
#if AMPP_TORCH_AT_LEAST(2, 0)
  c10::intrusive_ptr<c10d::Backend> gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  if (checker) gloo = c10::make_intrusive<c10d::ProcessGroupWrapper>(gloo, checker);
#else
  c10::intrusive_ptr<c10d::ProcessGroup> gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  if (checker) gloo = c10::make_intrusive<c10d::ProcessGroupWrapper>(gloo, checker);
#endif
#if AMPP_TORCH_AT_LEAST(2, 6)
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
#elif AMPP_TORCH_AT_LEAST(2, 0)
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, world, c10::make_intrusive<c10d::ProcessGroup::Options>("gloo", options->timeout));
#endif
#if AMPP_TORCH_AT_LEAST(2, 0)
  // As torch.distributed's "gloo": CPU tensors, and CUDA tensors too (Gloo stages them through the host).
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return pg;
#else
  return gloo;
#endif
}

#if AMPP_HAVE_NCCL
// torch.distributed.init_process_group("nccl"): a ProcessGroup whose one backend is NCCL, for CUDA
// tensors only (as PyTorch's; CPU tensors need a Gloo group of their own).
inline c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                                      int rank, int world,
                                                                      std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return pg;
}
#endif

// Autograd graph nodes (grad_fn, gradient accumulators, edges) were std::shared_ptr<Node> up to
// 2.x and are c10::intrusive_ptr<Node> in recent releases: take whatever LibTorch hands out.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::autograd::Variable&>()));

// Gloo sums bfloat16 since 2.2 (pytorch#113557); 1.13's Gloo rejects it.
constexpr bool kGlooSumsBFloat16 = AMPP_TORCH_AT_LEAST(2, 2);

// A TCPStore client tries to connect twice in LibTorch 2.x, each time for the whole timeout; 1.13 once.
constexpr int kTcpStoreConnectTries = AMPP_TORCH_AT_LEAST(2, 0) ? 2 : 1;

// TCPStore got a libuv server in 2.3 and made it the default in 2.4: its errors read differently
// ("address already in use" comes as a libuv message, EADDRINUSE). ampp keeps the default and
// matches both spellings where it explains an error (see process_group.cpp).
inline bool is_address_in_use(const std::string& what) {
  return what.find("ddress already in use") != std::string::npos || what.find("errno: 98") != std::string::npos ||
         what.find("EADDRINUSE") != std::string::npos;
}

// A store wait that ran out of time, as opposed to a lost connection: 1.13 says "Socket Timeout" or
// "Wait timeout", 2.x "wait timeout after ...ms" (c10::DistStoreError); a closed connection is
// "Connection reset", "Broken pipe" or 2.x's "Failed to recv, got 0 bytes".
inline bool is_store_timeout(const std::string& what) {
  return what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
}

}  // namespace ampp::dist::compat
