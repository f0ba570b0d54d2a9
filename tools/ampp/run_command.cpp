// `ampp run`: torchrun-compatible launcher (static rendezvous), see docs/launcher.md.
//   ampp run --nproc-per-node 2 -- ./train --epochs 3
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <ampp/dist/launcher.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/threads.h>

#include "command_registry.h"

namespace {

struct RunArgs {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int max_restarts = 0;
  std::string run_id = "none";
  bool standalone = false;
  bool no_python = false;
  double shutdown_grace_s = 5.0;
  double stall_timeout_s = ampp::dist::LaunchOptions().stall_timeout().count() / 1000.0;
  bool no_prefix = false;
  bool quiet = false;
};

// LaunchOptions fields whose torchrun flag has another name.
const std::map<std::string, std::string> kRunRenamedFields = {{"run_id", "--rdzv-id"}};

int parse_int(const std::string& flag, const std::string& text) {
  const auto value = ampp::parse_int(text);
  TORCH_CHECK(value && *value >= INT_MIN && *value <= INT_MAX, flag, " expects an integer, got '", text, "'");
  return static_cast<int>(*value);
}

// torchrun: an integer, "cpu" (cores), "gpu" (CUDA devices) or "auto" (gpu if any, else cpu).
int parse_nproc(const std::string& text) {
  if (text == "cpu") return ampp::usable_cores();
  if (text == "gpu") {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    TORCH_CHECK(gpus > 0, "--nproc-per-node gpu: CUDA is not available; give a number or 'cpu'");
    return gpus;
  }
  if (text == "auto") {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    return gpus > 0 ? gpus : ampp::usable_cores();
  }
  return parse_int("--nproc-per-node", text);
}

// torchrun: "N" or "MIN:MAX". Only a fixed size is supported (no elastic membership here).
int parse_nnodes(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return parse_int("--nnodes", text);
  TORCH_CHECK(text.find(':', colon + 1) == std::string::npos, "--nnodes=", text, " is not in \"MIN:MAX\" format");
  const int lo = parse_int("--nnodes (MIN)", text.substr(0, colon));
  const int hi = parse_int("--nnodes (MAX)", text.substr(colon + 1));
  TORCH_CHECK(lo == hi, "--nnodes=", text,
              ": elastic node ranges need a dynamic rendezvous, which "
              "ampp run does not implement; give a fixed node count such as --nnodes ",
              hi);
  return lo;
}

int run(const RunArgs& a, std::vector<std::string> program) {
  TORCH_CHECK(a.shutdown_grace_s >= 0 && a.shutdown_grace_s <= 1e6, "--shutdown-grace must be 0 to 1e6 seconds (got ",
              a.shutdown_grace_s, ")");
  TORCH_CHECK(a.stall_timeout_s >= 0 && a.stall_timeout_s <= 1e6,
              "--stall-timeout must be 0 (off) to 1e6 seconds (got ", a.stall_timeout_s, ")");
  ampp::dist::LaunchOptions options;
  options.nproc_per_node(parse_nproc(a.nproc_per_node))
      .nnodes(parse_nnodes(a.nnodes))
      .node_rank(a.node_rank)
      .master_addr(a.master_addr)
      .master_port(a.master_port)
      .max_restarts(a.max_restarts)
      .run_id(a.run_id)
      .shutdown_grace(std::chrono::milliseconds(static_cast<long long>(a.shutdown_grace_s * 1000)))
      .stall_timeout(std::chrono::milliseconds(static_cast<long long>(a.stall_timeout_s * 1000)))
      .prefix_output(!a.no_prefix)
      .verbose(!a.quiet);
  if (a.standalone) {  // torchrun --standalone: one node, local rendezvous on a free port
    TORCH_CHECK(options.nnodes() == 1, "--standalone runs a single node; drop --nnodes ", options.nnodes(),
                " or --standalone");
    options.master_addr("localhost");
  }
  // The "--" separator before the program (CLI11 keeps it in remaining()).
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  if (a.no_python && !program.empty() && program.front().size() > 3 &&
      program.front().compare(program.front().size() - 3, 3, ".py") == 0) {
    // --no-python: run a *.py file directly (it needs its own #! line), as torchrun does.
    program.front() = program.front().find('/') == std::string::npos ? "./" + program.front() : program.front();
  }
  TORCH_CHECK(!program.empty(), "no program given; usage: ampp run [options] -- <program> [args...]");
  return ampp::dist::launch(options, std::move(program));
}

const bool registered_run = ampp::cli::register_command(
    {"run", "Launch a program as N distributed workers (torchrun-compatible flags)",
     [](CLI::App& sub) -> std::function<int()> {
       auto args = std::make_shared<RunArgs>();
       sub.add_option("--nproc-per-node,--nproc_per_node", args->nproc_per_node,
                      "Workers on this node: a number, cpu, gpu or auto")
           ->capture_default_str();
       sub.add_option("--nnodes", args->nnodes, "Number of nodes (N, or MIN:MAX with MIN == MAX)")
           ->capture_default_str();
       ampp::cli::add_number(sub, "--node-rank,--node_rank", args->node_rank, "This node's rank in 0..nnodes-1");
       sub.add_option("--master-addr,--master_addr", args->master_addr, "Address of the node with node rank 0")
           ->capture_default_str();
       ampp::cli::add_number(sub, "--master-port,--master_port", args->master_port,
                             "Rendezvous port (0: a free port on one node, 29500 with several)");
       ampp::cli::add_number(sub, "--max-restarts,--max_restarts", args->max_restarts,
                             "Restarts of the whole worker group after a failure");
       sub.add_option("--rdzv-id,--rdzv_id", args->run_id, "Job id (TORCHELASTIC_RUN_ID)")->capture_default_str();
       sub.add_flag("--standalone", args->standalone, "Single-node job on localhost with a free port");
       sub.add_flag("--no-python,--no_python", args->no_python,
                    "Run the program directly, even a *.py file (the default for other files)");
       ampp::cli::add_number(sub, "--shutdown-grace", args->shutdown_grace_s,
                             "Seconds between SIGTERM and SIGKILL when tearing the group down (torchrun: 30)");
       ampp::cli::add_number(sub, "--stall-timeout", args->stall_timeout_s,
                             "Seconds a worker that reports progress (ampp train does) may fall silent before it "
                             "is named and the group torn down (0: off)");
       sub.add_flag("--no-prefix", args->no_prefix, "Do not prefix worker output with [rank<R>]:");
       sub.add_flag("-q,--quiet", args->quiet, "Only print failures, not progress");
       // The program and its arguments are collected from remaining(), so that everything from
       // the program name on belongs to the program (options included), as with torchrun. The
       // positional exists only so that "--" is accepted; its check sends every value on to
       // remaining() (prefix_command then stops option parsing there).
       auto unused = std::make_shared<std::string>();  // never assigned, kept alive below
       sub.add_option("program", *unused, "Program and its arguments (after an optional --)")
           ->check(CLI::Validator([](std::string&) { return std::string("goes to remaining()"); }, "PROGRAM [ARGS...]",
                                  "program"));
       sub.validate_positionals();
       sub.prefix_command();
       return [args, unused, &sub]() {
         std::vector<std::string> argv = sub.remaining();
         try {
           return run(*args, std::move(argv));
         } catch (const c10::Error& e) {
           // Without LibTorch's C++ backtrace: these are user errors.
           std::cerr << "ampp run: error: " << ampp::cli::flag_names(e.what_without_backtrace(), kRunRenamedFields)
                     << "\n";
           return 2;
         }
       };
     },
     kRunRenamedFields});

}  // namespace
