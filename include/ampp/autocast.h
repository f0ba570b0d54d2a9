#pragma once
// Forwarder kept for existing code: ampp::autocast lives in <ampp/precision/autocast.h>.
#include <ampp/precision/autocast.h>
