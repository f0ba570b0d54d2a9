// AVX2+FMA+F16C variant of the unscale kernel; CMake compiles this file with
// -mavx2 -mfma -mf16c -DCPU_CAPABILITY=AVX2 -DCPU_CAPABILITY_AVX2, and it is only called when the CPU
// reports those features (see unscale.cpp).
#define AMPP_UNSCALE_ENTRY unscale_span_avx2
#define AMPP_UNSCALE_F16C 1
#include "unscale_kernel.h"
