#pragma once
// Which bf16 arithmetic units this CPU has: decides where bf16 GEMMs compute (ampp::Bf16Compute).

#include <string>

namespace ampp::precision {

struct CpuBf16Support {
  bool avx512_bf16 = false;  ///< x86 AVX512_BF16 (vdpbf16ps): Cooper Lake, Sapphire Rapids, Zen 4
  bool amx_bf16 = false;     ///< x86 AMX-BF16 tiles: Sapphire Rapids and later
  bool arm_bf16 = false;     ///< Armv8.6 BF16 (bfdot/bfmmla)
  /// True if any of the above: bf16 GEMMs can beat fp32 ones.
  bool any() const { return avx512_bf16 || amx_bf16 || arm_bf16; }
  /// e.g. "avx512_bf16" or "none".
  std::string describe() const;
};

/// Detected once (cpuid on x86, hwcaps on Arm Linux).
const CpuBf16Support& cpu_bf16_support();

}  // namespace ampp::precision
