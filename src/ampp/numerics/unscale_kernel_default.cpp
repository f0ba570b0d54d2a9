// Portable variant of the unscale kernel (ATen's generic Vectorized, whatever the baseline ISA gives).
#define AMPP_UNSCALE_ENTRY unscale_span_default
#include "unscale_kernel.h"
