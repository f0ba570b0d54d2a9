// A tiny worker for the `ampp run` tests (no LibTorch: it only reports what the launcher gave it).
//   env <dir> [args...]     write <dir>/env.<RANK> (launcher variables + argv), print to stdout/stderr
//   sleep <dir>             write <dir>/pid.<RANK>, then sleep (up to 30 s)
//   ignore-term <dir> <r>   ignore SIGTERM, write the pid file; rank r exits 5, the others sleep
//   trap-signal <dir>       write the pid file; on SIGTERM/SIGINT write <dir>/signal.<RANK>, exit 0
//   fail-first <dir>        write <dir>/attempt.<RANK>.<RESTART>; rank 1 of attempt 0 exits 3 after
//                           the others started; other ranks of attempt 0 sleep; later attempts exit 0
//   exit-rank <r> <code>    rank r exits with <code> at once, the others sleep
// Every sleep is bounded (30 s) so that a broken launcher cannot leave it running forever.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

void write_file(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());  // readers never see a partial file
}

void write_pid(const std::string& dir) { write_file(dir + "/pid." + env("RANK"), std::to_string(getpid())); }

void bounded_sleep(double seconds = 30) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

std::string g_dir;

void on_signal(int sig) {
  const std::string path = g_dir + "/signal." + env("RANK");
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "other";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) {
    std::fputs(name, f);
    std::fclose(f);
  }
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  const std::string mode = argv[1];
  const int rank = std::atoi(env("RANK").c_str());
  if (mode == "env" && argc >= 3) {
    std::string text;
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
          "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
          "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
          "OPENBLAS_NUM_THREADS", "NCCL_ASYNC_ERROR_HANDLING", "AMPP_TEST_INHERITED"}) {
      text += std::string(name) + "=" + env(name) + "\n";
    }
    text += "ARGV=";
    for (int i = 2; i < argc; ++i) text += std::string(i > 2 ? " " : "") + argv[i];
    text += "\n";
    write_file(std::string(argv[2]) + "/env." + env("RANK"), text);
    std::cout << "hello stdout rank " << rank << "\n" << "second line rank " << rank << std::endl;
    std::cerr << "hello stderr rank " << rank << std::endl;
    std::cout << "tail " << rank << std::flush;  // no newline: the launcher must still print it
    return 0;
  }
  if (mode == "sleep" && argc >= 3) {
    write_pid(argv[2]);
    bounded_sleep();
    return 0;
  }
  if (mode == "ignore-term" && argc >= 4) {
    signal(SIGTERM, SIG_IGN);
    write_pid(argv[2]);
    if (rank == std::atoi(argv[3])) {
      bounded_sleep(0.2);
      return 5;
    }
    bounded_sleep();
    return 0;
  }
  if (mode == "trap-signal" && argc >= 3) {
    g_dir = argv[2];
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    write_pid(argv[2]);
    bounded_sleep();
    return 0;
  }
  if (mode == "fail-first" && argc >= 3) {
    const std::string restart = env("TORCHELASTIC_RESTART_COUNT");
    write_file(std::string(argv[2]) + "/attempt." + env("RANK") + "." + restart, "");
    if (restart != "0") return 0;
    if (rank == 1) {
      bounded_sleep(0.3);
      std::cerr << "rank 1 fails on its first attempt" << std::endl;
      return 3;
    }
    bounded_sleep();
    return 0;
  }
  if (mode == "exit-rank" && argc >= 4) {
    if (rank == std::atoi(argv[2])) return std::atoi(argv[3]);
    bounded_sleep();
    return 0;
  }
  std::cerr << "launcher_test_worker: unknown mode " << mode << std::endl;
  return 64;
}
