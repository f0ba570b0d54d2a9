#pragma once
// Forwarder kept for existing code: ampp::GradScaler lives in <ampp/scaling/grad_scaler.h>.
#include <ampp/scaling/grad_scaler.h>
