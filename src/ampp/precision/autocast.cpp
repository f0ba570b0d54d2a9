// ampp::autocast: the RAII region and the per-thread state it saves and restores.

#include "detail.h"

#include <ampp/precision/autocast.h>
#include <ampp/precision/cpu_features.h>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include "torch_compat.h"

#include <atomic>
#include <cstdlib>

namespace ampp {
namespace {

Bf16Compute from_environment_or_hardware() {
  if (const char* env = std::getenv("AMPP_BF16_COMPUTE")) {
    const Bf16Compute chosen = parse_bf16_compute(env, "AMPP_BF16_COMPUTE");
    if (chosen != Bf16Compute::kAutomatic) return chosen;
  }
  return precision::cpu_bf16_support().any() ? Bf16Compute::kNative : Bf16Compute::kFp32;
}

std::atomic<Bf16Compute>& default_compute() {
  static std::atomic<Bf16Compute> c{from_environment_or_hardware()};
  return c;
}

void check_dtype(c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half,
              "ampp::autocast: dtype must be torch::kBFloat16 or torch::kHalf, got ", c10::toString(dtype),
              "; for an fp32 section inside a region pass enabled=false");
}

}  // namespace

Bf16Compute parse_bf16_compute(const std::string& text, const std::string& what) {
  if (text == "native") return Bf16Compute::kNative;
  if (text == "fp32") return Bf16Compute::kFp32;
  TORCH_CHECK(text == "auto" || text == "automatic" || text.empty(), what, "='", text,
              "' is not understood; use native, fp32 or auto");
  return Bf16Compute::kAutomatic;
}

const char* to_string(Bf16Compute compute) {
  switch (compute) {
    case Bf16Compute::kAutomatic:
      return "automatic";
    case Bf16Compute::kNative:
      return "native";
    case Bf16Compute::kFp32:
      return "fp32";
  }
  return "?";
}

Bf16Compute default_bf16_compute() { return default_compute().load(); }

void set_default_bf16_compute(Bf16Compute compute) {
  default_compute().store(compute == Bf16Compute::kAutomatic ? from_environment_or_hardware() : compute);
}

namespace precision::detail {
CpuRegion& cpu_region() {
  thread_local CpuRegion r;
  return r;
}
}  // namespace precision::detail

autocast::autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : autocast(device_type, dtype, enabled, AutocastOptions()) {}

autocast::autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled, const AutocastOptions& options)
    : device_type_(device_type) {
  // Validate everything before touching any state: a throwing constructor runs no destructor.
  if (enabled) check_dtype(dtype);
  if (device_type == c10::DeviceType::CPU) {
    if (enabled) precision::detail::ensure_kernels_installed();
    if (enabled && dtype == c10::ScalarType::Half && options.fp16_op_lists() == Fp16OpLists::kCuda)
      precision::detail::ensure_cuda_list_kernels_installed();
    auto& region = precision::detail::cpu_region();
    saved_.libtorch_enabled = precision::compat::autocast_enabled(c10::DeviceType::CPU);
    saved_.libtorch_dtype = precision::compat::autocast_dtype(c10::DeviceType::CPU);
    saved_.libtorch_cache_enabled = at::autocast::is_autocast_cache_enabled();
    saved_.active = region.active;
    saved_.dtype = region.dtype;
    saved_.bf16_compute = region.bf16_compute;
    saved_.allow_banned = region.allow_banned;
    saved_.fp16_op_lists = region.fp16_op_lists;

    precision::compat::set_autocast_enabled(c10::DeviceType::CPU, enabled);
    if (enabled) {
      // LibTorch's CPU autocast accepts only bf16; under fp16 it stays the carrier for the few
      // LibTorch kernels ampp does not replace, while ampp's kernels read region.dtype.
      precision::compat::set_autocast_dtype(c10::DeviceType::CPU, c10::ScalarType::BFloat16);
      region.active = true;
      region.dtype = dtype;
      region.bf16_compute =
          options.bf16_compute() == Bf16Compute::kAutomatic ? default_bf16_compute() : options.bf16_compute();
      region.allow_banned = options.allow_banned();
      region.fp16_op_lists = options.fp16_op_lists();
    } else {
      region.active = false;
    }
    at::autocast::set_autocast_cache_enabled(options.cache_enabled());
    at::autocast::increment_nesting();
    return;
  }
  if (device_type == c10::DeviceType::CUDA) {
#if AMPP_TORCH_HAS_CUDA
    TORCH_CHECK(!enabled || torch::cuda::is_available(),
                "ampp::autocast: CUDA autocast requested but no CUDA device is available; use torch::kCPU");
    saved_.libtorch_enabled = precision::compat::autocast_enabled(c10::DeviceType::CUDA);
    saved_.libtorch_dtype = precision::compat::autocast_dtype(c10::DeviceType::CUDA);
    saved_.libtorch_cache_enabled = at::autocast::is_autocast_cache_enabled();
    precision::compat::set_autocast_enabled(c10::DeviceType::CUDA, enabled);
    if (enabled) precision::compat::set_autocast_dtype(c10::DeviceType::CUDA, dtype);
    at::autocast::set_autocast_cache_enabled(options.cache_enabled());
    at::autocast::increment_nesting();
    return;
#else
    TORCH_CHECK(!enabled,
                "ampp::autocast: CUDA autocast requested, but this LibTorch build has no CUDA support "
                "(CPU-only); use torch::kCPU (bf16, or fp16 emulated with fp16 rounding) or a CUDA build of "
                "LibTorch");
    return;  // disabling CUDA autocast where there is none: nothing to do
#endif
  }
  TORCH_CHECK(false, "ampp::autocast: device type '", c10::DeviceTypeName(device_type),
              "' has no autocast support in ampp; use torch::kCPU (bf16, or fp16 emulated) or torch::kCUDA");
}

autocast::~autocast() {
  if (device_type_ == c10::DeviceType::CPU) {
    // Leaving the outermost region: drop cached weight casts (else they live forever, cf. #46649).
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
      precision::detail::clear_fp16_cache();
    }
    precision::compat::set_autocast_enabled(c10::DeviceType::CPU, saved_.libtorch_enabled);
    precision::compat::set_autocast_dtype(c10::DeviceType::CPU, saved_.libtorch_dtype);
    at::autocast::set_autocast_cache_enabled(saved_.libtorch_cache_enabled);
    auto& region = precision::detail::cpu_region();
    region.active = saved_.active;
    region.dtype = saved_.dtype;
    region.bf16_compute = saved_.bf16_compute;
    region.allow_banned = saved_.allow_banned;
    region.fp16_op_lists = saved_.fp16_op_lists;
    return;
  }
#if AMPP_TORCH_HAS_CUDA
  if (device_type_ == c10::DeviceType::CUDA) {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    precision::compat::set_autocast_enabled(c10::DeviceType::CUDA, saved_.libtorch_enabled);
    precision::compat::set_autocast_dtype(c10::DeviceType::CUDA, saved_.libtorch_dtype);
    at::autocast::set_autocast_cache_enabled(saved_.libtorch_cache_enabled);
  }
#endif
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::CPU) return precision::compat::autocast_enabled(c10::DeviceType::CPU);
  if (device_type == c10::DeviceType::CUDA) return precision::compat::autocast_enabled(c10::DeviceType::CUDA);
  return false;
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::CPU) {
    const auto& region = precision::detail::cpu_region();
    return region.active ? region.dtype : precision::compat::autocast_dtype(c10::DeviceType::CPU);
  }
  if (device_type == c10::DeviceType::CUDA) return precision::compat::autocast_dtype(c10::DeviceType::CUDA);
  TORCH_CHECK(false, "ampp::autocast_dtype: no autocast for device type '", c10::DeviceTypeName(device_type),
              "'; ask for torch::kCPU or torch::kCUDA");
}

bool is_fp16_emulated() {
  const auto& region = precision::detail::cpu_region();
  return precision::compat::autocast_enabled(c10::DeviceType::CPU) && region.active &&
         region.dtype == c10::ScalarType::Half;
}

Bf16Compute current_bf16_compute() {
  const auto& region = precision::detail::cpu_region();
  return region.active ? region.bf16_compute : Bf16Compute::kNative;
}

void clear_autocast_cache() {
  at::autocast::clear_cache();
  precision::detail::clear_fp16_cache();
}

}  // namespace ampp
