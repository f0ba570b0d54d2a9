#pragma once
// Forwarder kept for existing code: ampp::initialize lives in <ampp/amp/initialize.h>.
#include <ampp/amp/initialize.h>
