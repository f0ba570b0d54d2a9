#pragma once
// ampp_test::HostReadCounter: the tests' way to prove a step free of host synchronisations on the CPU.
#include <ATen/record_function.h>

#include <memory>
#include <string_view>

namespace ampp_test {

// Counts the reads of tensor values made on this thread by ampp or the test itself while alive: calls
// of aten::item or aten::_local_scalar_dense outside any other ATen op. On a GPU each is a
// synchronisation. ATen's CPU kernels read their own scalars inside their op (the CPU fused AdamW
// reads each step count), which is no synchronisation: they run on the host. Those are not counted.
class HostReadCounter {
 public:
  HostReadCounter() : handle_(at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end))) {
    state() = {};
  }
  ~HostReadCounter() { at::removeCallback(handle_); }
  int count() const { return state().reads; }

 private:
  struct State {
    int reads = 0, depth = 0;
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const std::string_view name = fn.name();
    if (state().depth++ == 0 && (name == "aten::item" || name == "aten::_local_scalar_dense")) ++state().reads;
    return nullptr;
  }
  static void on_end(const at::RecordFunction&, at::ObserverContext*) { --state().depth; }
  at::CallbackHandle handle_;
};

}  // namespace ampp_test
