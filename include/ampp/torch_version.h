#pragma once
// Forwarder kept for existing code: AMPP_TORCH_AT_LEAST lives in <ampp/util/torch_version.h>.
#include <ampp/util/torch_version.h>
