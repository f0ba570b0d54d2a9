#pragma once
// The `ampp run` launcher as a library (torchrun with a static rendezvous): starts nproc_per_node
// copies of a program on this node with torchrun's environment, streams their output with a rank
// prefix, tears the whole group down when one worker fails, and restarts it up to max_restarts
// times. `ampp train --nproc N` uses it to re-execute itself as N workers.
//
//   ampp::dist::LaunchOptions options;
//   options.nproc_per_node(2);
//   int code = ampp::dist::launch(options, {"/path/to/trainer", "--epochs", "3"});
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE=False (there is no
// agent store: rank 0 hosts the TCPStore), NCCL_ASYNC_ERROR_HANDLING=1 unless set, and
// OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = max(1, usable cores / nproc_per_node) unless set, and
// AMPP_HEARTBEAT_FILE (see stall_timeout).
#include <chrono>
#include <string>
#include <vector>

#include <torch/arg.h>

namespace ampp::dist {

struct LaunchOptions {
  // Workers on this node (torchrun --nproc-per-node).
  TORCH_ARG(int, nproc_per_node) = 1;
  // Nodes in the job and this node's index (torchrun --nnodes N, --node-rank).
  TORCH_ARG(int, nnodes) = 1;
  TORCH_ARG(int, node_rank) = 0;
  // Where rank 0 hosts the rendezvous store (torchrun --master-addr, --master-port).
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  // 0: on a single node pick a free port (like torchrun --standalone); with several nodes use
  // torchrun's default 29500 (every node must agree on it).
  TORCH_ARG(int, master_port) = 0;
  // Restarts of the whole worker group after a failure (torchrun --max-restarts).
  TORCH_ARG(int, max_restarts) = 0;
  // TORCHELASTIC_RUN_ID (torchrun --rdzv-id; its default is "none").
  TORCH_ARG(std::string, run_id) = "none";
  // After a failure or a forwarded SIGINT/SIGTERM: time the workers get to exit before SIGKILL.
  // torchrun waits 30 s; ampp tears down "within seconds" by default.
  TORCH_ARG(std::chrono::milliseconds, shutdown_grace) = std::chrono::milliseconds(5000);
  // A worker that reports progress (ampp/dist/heartbeat.h; `ampp train` does) and then falls silent
  // this long is named and the group torn down (then restarted if restarts are left), instead of
  // the job waiting for a 30-minute collective timeout. Workers that never report are not watched.
  // 0 = off. Watches this node's workers only.
  TORCH_ARG(std::chrono::milliseconds, stall_timeout) = std::chrono::milliseconds(30000);
  // Prefix every output line with "[rank<R>]: " (torchrun 2.x --tee style).
  TORCH_ARG(bool, prefix_output) = true;
  // Launcher messages ("ampp run: ...") on stderr; false keeps only failure reports.
  TORCH_ARG(bool, verbose) = true;
};

// Checks the options; throws c10::Error naming the bad value and the fix.
void validate(const LaunchOptions& options);

// Runs argv (program + arguments; a program without '/' is looked up in PATH; a *.py script runs
// under $PYTHON_EXEC or python3 -u, as torchrun does) as nproc_per_node workers. Returns 0 when all
// workers of one attempt exit 0; 1 when the group failed and no restarts are left (after printing
// which rank failed and how); 128+signal when the launcher was interrupted by SIGINT/SIGTERM/SIGHUP
// (forwarded to the workers first). Throws c10::Error for invalid options or an empty argv.
int launch(const LaunchOptions& options, std::vector<std::string> argv);

}  // namespace ampp::dist
