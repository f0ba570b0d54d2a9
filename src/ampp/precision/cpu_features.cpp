// bf16 unit detection. Flags, not timing: the choice of compute path changes numerics, so it must be
// deterministic for a given machine.

#include <ampp/precision/cpu_features.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace ampp::precision {
namespace {

CpuBf16Support detect() {
  CpuBf16Support s;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    const unsigned max_subleaf = a;
    s.amx_bf16 = (d >> 22) & 1u;  // CPUID.(7,0):EDX[22]
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
      s.avx512_bf16 = (a >> 5) & 1u;  // CPUID.(7,1):EAX[5]
  }
#endif
#if defined(__aarch64__) && defined(__linux__)
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16
  s.arm_bf16 = (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
#endif
  return s;
}

}  // namespace

std::string CpuBf16Support::describe() const {
  std::string out;
  auto add = [&](bool f, const char* name) {
    if (!f) return;
    if (!out.empty()) out += ",";
    out += name;
  };
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  add(arm_bf16, "arm_bf16");
  return out.empty() ? "none" : out;
}

const CpuBf16Support& cpu_bf16_support() {
  static const CpuBf16Support s = detect();
  return s;
}

}  // namespace ampp::precision
