#include "layout_choice.h"

#include <ampp/amp/opt_level.h>
#include <ampp/precision/dtype.h>
#include <ampp/train/checkpoint.h>
#include <ampp/train/dataset.h>
#include <ampp/train/gpt.h>
#include <ampp/train/options.h>
#include <ampp/util/atomic_file.h>
#include <ampp/util/cache_dir.h>
#include <ampp/util/parse_number.h>
#include <ampp/util/remove_tree.h>
#include <ampp/util/threads.h>
#include <ampp/util/torch_version.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <vector>

extern char** environ;

namespace ampp::cli {
namespace {

namespace fs = std::filesystem;
constexpr int kMeasuredSteps = 40, kLogEvery = 10;  // images/s from step 10 to 40: no warm-up step

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

// What the fastest layout depends on: the machine, LibTorch, and the job's shape and precision.
std::string job_key(const train::TrainOptions& o) {
  return fmt::format(
             "cpu={} cores={} torch={} model={} data={} num_classes={} opt_level={} dtype={} loss_scale={} "
             "batch_size={} "
             "threads={} sync_bn={} zero={} deterministic={} shared_memory_allreduce={} channels_last={}",
             cpu_model(), usable_cores(), TORCH_VERSION, o.model(), train::dataset_name(o.data()), o.num_classes(),
             to_string(o.opt_level()), low_precision_dtype_name(o.dtype()),
             o.loss_scale() ? o.loss_scale()->to_string() : "default", o.batch_size(), o.threads(), o.sync_batch_norm(),
             o.zero(), o.deterministic(), o.shared_memory_allreduce(), o.channels_last()) +
         (train::is_gpt(o.model()) ? fmt::format(" context={} n_layer={} n_head={} n_embd={}", o.context(), o.n_layer(),
                                                 o.n_head(), o.n_embd())
                                   : "") +
         (o.fsdp() ? " fsdp=1" : "") +  // only when set: the keys cached before --fsdp existed stay valid
         (o.fp8() ? " fp8=" + to_string(*o.fp8()) + (o.fp8_all_layers() ? ":all" : "") : "");
}

std::optional<int> checkpoint_world_size(const train::TrainOptions& o) {
  if (!o.resume() || o.checkpoint_dir().empty()) return std::nullopt;
  const std::string path = train::checkpoint_path(o);
  if (!fs::exists(path)) return std::nullopt;
  const std::string fingerprint = train::TrainingCheckpoint(path).position().fingerprint;
  std::smatch m;
  if (!std::regex_search(fingerprint, m, std::regex(R"(world_size=(\d+))"))) return std::nullopt;
  return std::stoi(m[1]);
}

std::vector<int> candidates(const train::TrainOptions& o) {
  std::vector<int> nprocs;
  const int cores = usable_cores();
  for (int p = 1; p <= cores; ++p)
    if (cores % p == 0 && p <= o.batch_size()) nprocs.push_back(p);
  return nprocs;
}

// The job itself, short, into `out`: the flags that shape its speed, none that write elsewhere.
std::vector<std::string> measurement_command(const std::string& self_exe, const train::TrainOptions& o, int nproc,
                                             const fs::path& out) {
  std::vector<std::string> argv{self_exe,
                                "train",
                                "--nproc",
                                std::to_string(nproc),
                                "--model",
                                o.model(),
                                "--opt-level",
                                to_string(o.opt_level()),
                                "--dtype",
                                low_precision_dtype_name(o.dtype()),
                                "--batch-size",
                                std::to_string(o.batch_size()),
                                "--seed",
                                std::to_string(o.seed()),
                                "--num-classes",
                                std::to_string(o.num_classes()),
                                "--threads",
                                std::to_string(o.threads()),
                                "--steps",
                                std::to_string(kMeasuredSteps),
                                "--epochs",
                                "1000000",
                                "--log-every",
                                std::to_string(kLogEvery),
                                "--max-consecutive-skips",
                                "0",
                                "--timeout",
                                fmt::format("{}", o.timeout()),
                                "--quiet",
                                "--no-plots",
                                "--out",
                                out.string()};
  if (!o.data().empty()) argv.insert(argv.end(), {"--data", o.data()});
  for (auto [value, flag] : {std::pair{o.context(), "--context"},
                             {o.n_layer(), "--n-layer"},
                             {o.n_head(), "--n-head"},
                             {o.n_embd(), "--n-embd"}})
    if (value != 0) argv.insert(argv.end(), {flag, std::to_string(value)});
  if (o.loss_scale()) argv.insert(argv.end(), {"--loss-scale", o.loss_scale()->to_string()});
  for (auto [on, flag] : {std::pair{o.sync_batch_norm(), "--sync-bn"},
                          {o.zero(), "--zero"},
                          {o.fsdp(), "--fsdp"},
                          {o.deterministic(), "--deterministic"}})
    if (on) argv.emplace_back(flag);
  return argv;
}

// Runs argv with its output into `log`; true when it exited with 0.
bool run_quietly(const std::vector<std::string>& argv, const fs::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int failed = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  return failed == 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Images/s between the first and the last logged step of a measurement run.
double images_per_sec(const fs::path& metrics, int64_t batch_size) {
  std::ifstream in(metrics);
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("type", "") == "step") steps.push_back(std::move(j));
  }
  TORCH_CHECK(steps.size() >= 2, "the measurement run logged ", steps.size(), " steps; ", metrics, " has too few");
  const auto &first = steps.front(), &last = steps.back();
  const double seconds = last.at("elapsed").get<double>() - first.at("elapsed").get<double>();
  return static_cast<double>(last.at("step").get<int64_t>() - first.at("step").get<int64_t>()) * batch_size /
         std::max(seconds, 1e-9);
}

// {"1": images/s, "2": images/s, ...}; throws with the failed run's last output line.
nlohmann::json measure(const train::TrainOptions& o, const std::string& self_exe) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("ampp-layout-{}", ::getpid());
  fs::create_directories(tmp);
  nlohmann::json rates = nlohmann::json::object();
  try {
    for (int nproc : candidates(o)) {
      const fs::path out = tmp / std::to_string(nproc), log = tmp / fmt::format("{}.log", nproc);
      if (!run_quietly(measurement_command(self_exe, o, nproc, out), log)) {
        std::ifstream in(log);
        std::string line, last;
        while (std::getline(in, line))
          if (!line.empty()) last = line;
        TORCH_CHECK(false, "the ", nproc, "-worker measurement run failed: ", last);
      }
      rates[std::to_string(nproc)] = images_per_sec(out / "metrics.jsonl", o.batch_size());
    }
  } catch (...) {
    remove_tree(tmp.string());
    throw;
  }
  remove_tree(tmp.string());
  return rates;
}

nlohmann::json read_cache(const std::string& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();  // an unreadable cache is measured again
}

// A cached entry is used only as measure() writes it: {"N": images/s} for this job's candidate worker
// counts, each rate a finite positive number. Anything else (a damaged or edited file) is measured again.
bool valid_rates(const nlohmann::json& rates, const std::vector<int>& nprocs) {
  if (!rates.is_object() || rates.empty()) return false;
  for (const auto& [nproc, rate] : rates.items()) {
    const auto n = parse_int(nproc);
    if (!n || std::find(nprocs.begin(), nprocs.end(), *n) == nprocs.end()) return false;
    if (!rate.is_number() || !std::isfinite(rate.get<double>()) || rate.get<double>() <= 0) return false;
  }
  return true;
}

std::string workers_label(int nproc, const train::TrainOptions& o) {
  const int threads = o.threads() > 0 ? o.threads() : threads_per_worker(nproc);
  return fmt::format("{} worker{} x {} thread{}", nproc, nproc == 1 ? "" : "s", threads, threads == 1 ? "" : "s");
}

LayoutChoice fastest(const nlohmann::json& rates, const train::TrainOptions& o, const std::string& origin) {
  LayoutChoice best;
  double best_rate = -1;
  std::vector<std::string> measured;
  for (const auto& [nproc, rate] : rates.items()) {
    measured.push_back(fmt::format("{} {:.0f} images/s", workers_label(std::stoi(nproc), o), rate.get<double>()));
    if (rate.get<double>() > best_rate) best_rate = rate.get<double>(), best.nproc = std::stoi(nproc);
  }
  best.reason = fmt::format("{}: the fastest layout for this job on this machine ({}: {}; --nproc N to choose)",
                            workers_label(best.nproc, o), origin, fmt::join(measured, ", "));
  return best;
}

}  // namespace

std::string default_layout_cache() { return (fs::path(user_cache_dir()) / "layouts.json").string(); }

LayoutChoice choose_layout(const train::TrainOptions& o, const std::string& self_exe, const std::string& cache_file) {
  if (const auto world = checkpoint_world_size(o))
    return {*world, fmt::format("{}: as the checkpoint being resumed", workers_label(*world, o))};
  // On GPUs the layout is one worker per GPU (cuda:N names one): workers sharing a GPU only queue behind
  // each other, and measuring that would cost a run per layout.
  const torch::Device device = train::device_of(o);
  if (device.is_cuda()) {
    const int gpus = device.has_index() ? 1 : std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    return {gpus, fmt::format("{}: one worker per GPU", workers_label(gpus, o))};
  }
  const auto nprocs = candidates(o);
  if (nprocs.size() == 1) return {1, workers_label(1, o) + ": one core"};
  const std::string key = job_key(o);
  nlohmann::json cache = read_cache(cache_file);
  if (cache.contains(key) && valid_rates(cache[key], nprocs))
    return fastest(cache[key], o, "measured earlier, " + cache_file);
  if (o.progress()) {  // TrainOptions::progress: --quiet keeps the terminal quiet
    std::printf("ampp train: measuring which layout of workers x threads runs this job fastest here (once)...\n");
    std::fflush(stdout);
  }
  nlohmann::json rates;
  try {
    rates = measure(o, self_exe);
  } catch (const std::exception& e) {
    return {1, fmt::format("{}: the layout could not be measured ({})", workers_label(1, o), e.what())};
  }
  cache[key] = rates;
  try {
    fs::create_directories(fs::path(cache_file).parent_path());
    write_file_atomic(cache_file, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampp train: warning: the measured layout was not cached: %s\n", e.what());
  }
  return fastest(rates, o, "measured now, cached in " + cache_file);
}

}  // namespace ampp::cli
