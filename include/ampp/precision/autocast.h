#pragma once
// ampp::autocast: PyTorch-style autocast regions for LibTorch, as an RAII guard.
//
//   {
//     ampp::autocast guard(torch::kCPU, torch::kBFloat16);   // or torch::kHalf (emulated on CPU)
//     loss = criterion(net->forward(x), y);
//   }                                                        // previous state restored here
//
// Inside a region, listed ATen ops cast their floating-point tensor arguments according to a
// per-op CastPolicy (op_policy.h: PyTorch's published lists by default, see docs/precision.md, queried
// and extended at run time).
//
// fp16 on CPU: LibTorch's fp16 CPU kernels are scalar (1.13 has none). ampp emulates fp16 faithfully: values and
// gradients that cross lower-precision ops are rounded to IEEE half (overflow to inf, underflow to
// subnormals/zero) while the arithmetic runs in fp32 and tensors are stored as float32 carriers.
//
// bf16 on CPU: GEMMs/convolutions run on LibTorch's native bf16 kernels when the CPU has bf16 units;
// otherwise (by default) activations are stored in bf16 but GEMMs/convolutions compute in fp32.

#include <ampp/precision/op_policy.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <string>
#include <vector>

namespace ampp {

/// Where bf16 GEMMs and convolutions compute on CPU.
enum class Bf16Compute {
  kAutomatic,  ///< `kNative` if the CPU has bf16 dot-product units (avx512_bf16, AMX, Arm bf16), else `kFp32`
  kNative,     ///< LibTorch's bf16 kernels (what PyTorch's CPU autocast does)
  kFp32,       ///< activations stored in bf16, GEMMs/convolutions computed in fp32 (fast without bf16 units)
};

const char* to_string(Bf16Compute compute);
/// The one parser of Bf16Compute's text (AMPP_BF16_COMPUTE and any flag): "native", "fp32", "auto" or
/// "automatic" (also ""). Throws c10::Error naming `what` and the accepted values.
Bf16Compute parse_bf16_compute(const std::string& text, const std::string& what = "bf16_compute");

/// Which op lists an fp16 region on CPU follows. fp16 on CPU emulates GPU fp16 training, so by default
/// it is the CUDA lists of the LibTorch built against (mv, addmv, addr, RNN cells, ... in fp16; exp,
/// softmax, layer_norm, sum, ... in fp32). kCpu follows torch.autocast("cpu", torch.float16) instead.
enum class Fp16OpLists {
  kCuda,  ///< CUDA autocast's lists (docs/precision.md lists them op by op)
  kCpu,   ///< CPU autocast's lists (the same as bf16 regions)
};

struct AutocastOptions {
  /// Cache the low-precision copies of fp32 leaf tensors (weights) until the outermost region ends.
  TORCH_ARG(bool, cache_enabled) = true;
  /// CPU bf16 only: see Bf16Compute. `automatic` resolves to default_bf16_compute().
  TORCH_ARG(Bf16Compute, bf16_compute) = Bf16Compute::kAutomatic;
  /// Run `banned` ops in fp32 instead of raising (apex's allow_banned).
  TORCH_ARG(bool, allow_banned) = false;
  /// CPU fp16 only: the op lists the emulation follows.
  TORCH_ARG(Fp16OpLists, fp16_op_lists) = Fp16OpLists::kCuda;
};

/// RAII autocast region. Nests; the destructor restores the previous state (also during exception
/// unwinding) and clears the cast caches when the outermost region on this thread exits.
/// `enabled = false` disables autocast inside an enclosing region (custom FP32 sections).
/// Autocast state is thread local, as in PyTorch. Run backward outside the region.
class autocast {
 public:
  autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled, const AutocastOptions& options);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;
  autocast(autocast&&) = delete;
  autocast& operator=(autocast&&) = delete;

 private:
  struct Saved {
    bool libtorch_enabled = false;
    c10::ScalarType libtorch_dtype = c10::ScalarType::BFloat16;
    bool libtorch_cache_enabled = true;
    bool active = false;
    c10::ScalarType dtype = c10::ScalarType::BFloat16;
    Bf16Compute bf16_compute = Bf16Compute::kNative;
    bool allow_banned = false;
    Fp16OpLists fp16_op_lists = Fp16OpLists::kCuda;
  };
  c10::DeviceType device_type_;
  Saved saved_;
};

/// Is an autocast region (ampp's or LibTorch's own flag) active for `device_type` on this thread?
bool is_autocast_enabled(c10::DeviceType device_type = c10::DeviceType::CPU);

/// The dtype lower-precision ops target on this thread: kHalf inside an fp16 (emulated on CPU)
/// region, else LibTorch's autocast dtype for the device.
c10::ScalarType autocast_dtype(c10::DeviceType device_type = c10::DeviceType::CPU);

/// True inside a CPU fp16 region: lowered ops produce float32 tensors holding fp16 values.
bool is_fp16_emulated();

/// The effective Bf16Compute of the current CPU bf16 region (never `automatic`).
Bf16Compute current_bf16_compute();

/// Process-wide resolution of Bf16Compute::kAutomatic. Initially from the environment variable
/// AMPP_BF16_COMPUTE (native|fp32), else from the CPU's bf16 units. Setting `automatic` restores that.
Bf16Compute default_bf16_compute();
void set_default_bf16_compute(Bf16Compute compute);

/// Drop the cached low-precision weight copies of this thread (done automatically when the
/// outermost region exits).
void clear_autocast_cache();

}  // namespace ampp
