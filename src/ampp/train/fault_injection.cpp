#include "fault_injection.h"

#include <atomic>

namespace ampp::train::detail {
namespace {

std::atomic<FaultSource> registered_source{nullptr};

}  // namespace

void set_fault_source(FaultSource source) { registered_source.store(source); }

FaultInjection faults_for(int rank, int world, bool restarted) {
  const FaultSource source = registered_source.load();
  return source != nullptr ? source(rank, world, restarted) : FaultInjection{};
}

}  // namespace ampp::train::detail
