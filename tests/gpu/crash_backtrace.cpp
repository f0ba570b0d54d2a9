// A fatal signal in the GPU suite prints where it happened before the process dies. The GPU machines
// have no debugger, and a call there is minutes of borrowed time: one run must say where it crashed.
//
// It prints the faulting instruction, then every word near the top of the stack that points into
// loaded code (a stack scan), then glibc's backtrace. The scan still finds the callers when the
// unwinder cannot: a call through a null or stale function pointer leaves a PC with no unwind data.
// Addresses print as module(+offset), which scripts/gpu-check.sh turns into lines with addr2line.
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {

void write_err(const char* text) { [[maybe_unused]] auto n = ::write(STDERR_FILENO, text, std::strlen(text)); }

// "label 0x...: module(+0x...) symbol" when `address` lies in a loaded object; false otherwise.
bool describe_code_address(const char* label, std::uintptr_t address) {
  Dl_info info{};
  if (address == 0 || ::dladdr(reinterpret_cast<void*>(address), &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  char line[512];
  std::snprintf(line, sizeof(line), "  %s 0x%lx: %s(+0x%lx) %s\n", label, static_cast<unsigned long>(address),
                base ? base + 1 : info.dli_fname,
                static_cast<unsigned long>(address - reinterpret_cast<std::uintptr_t>(info.dli_fbase)),
                info.dli_sname ? info.dli_sname : "");
  write_err(line);
  return true;
}

void print_crash_site_and_die(int signal, siginfo_t* info, void* context) {
  const auto& regs = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
  const auto pc = static_cast<std::uintptr_t>(regs[REG_RIP]);
  const auto* sp = reinterpret_cast<const std::uintptr_t*>(regs[REG_RSP]);
  char head[160];
  std::snprintf(head, sizeof(head), "\nampp_gpu_tests: fatal signal %d at pc 0x%lx, fault address %p\n", signal,
                static_cast<unsigned long>(pc), info->si_addr);
  write_err(head);
  if (!describe_code_address("pc", pc)) write_err("  pc is in no loaded object (a call through a bad pointer?)\n");
  write_err("stack words that point into code (callers, innermost first):\n");
  for (int i = 0, found = 0; i < 256 && found < 24; ++i) found += describe_code_address("stack", sp[i]);
  write_err("glibc backtrace:\n");
  void* frames[64];
  ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), STDERR_FILENO);
  ::signal(signal, SIG_DFL);  // die of the same signal, so the exit status still names it
  ::raise(signal);
}

const bool installed = [] {
  struct sigaction action{};
  action.sa_sigaction = print_crash_site_and_die;
  action.sa_flags = SA_SIGINFO;
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::sigaction(s, &action, nullptr);
  return true;
}();

}  // namespace
