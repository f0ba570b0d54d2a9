#pragma once
// Helpers for the suites that drive the built `ampp` binary (AMPP_CLI): run it, a small fast run's
// flags, and a tensor-by-tensor comparison of two model.pt files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ampp_test {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string output;  // stdout + stderr
};

// Runs a shell command line, stdout and stderr together.
inline Result run_shell(const std::string& command_line) {
  std::FILE* p = ::popen((command_line + " 2>&1").c_str(), "r");
  Result r{-1, ""};
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs the built `ampp` with `args`.
inline Result run_ampp(const std::string& args) { return run_shell(std::string(AMPP_CLI) + " " + args); }

// Small, fast and deterministic: 384 synthetic images, cnn with BatchNorm, 1 thread per worker, 2
// workers unless `extra` says (not --nproc auto's measured choice, which depends on the machine).
inline std::string small_run(const fs::path& dir, const std::string& extra) {
  const std::string workers = extra.find("--nproc") == std::string::npos ? "--nproc 2 " : "";
  return "train --data synthetic:384 --model cnn --batch-size 32 --deterministic --threads 1 --quiet "
         "--no-plots " +
         workers + "--out " + (dir / "out").string() + " --checkpoint-dir " + (dir / "ckpt").string() + " " + extra;
}

// Every tensor of the model.pt files (parameters and buffers of every submodule), compared bit
// for bit in the dtype it was saved in. Reading into a fresh FP32 module would not do: under O2 the
// file holds bf16 tensors, and a module's load() re-points its FP32 tensors at their storage.
inline void collect_tensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                            std::map<std::string, torch::Tensor>& out) {
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    ASSERT_TRUE(archive.try_read(key, value)) << prefix << key;
    if (value.isTensor()) {
      out[prefix + key] = value.toTensor();
    } else if (value.isObject()) {
      torch::serialize::InputArchive child;
      ASSERT_TRUE(archive.try_read(key, child)) << prefix << key;
      collect_tensors(child, prefix + key + ".", out);
    }
  }
}

// `tolerance` 0: bit for bit; otherwise every element within tolerance (relative and absolute).
inline void expect_same_model(const fs::path& a, const fs::path& b, double tolerance = 0.0) {
  auto load = [](const fs::path& p) {
    torch::serialize::InputArchive in;
    in.load_from(p.string());
    std::map<std::string, torch::Tensor> tensors;
    collect_tensors(in, "", tensors);
    return tensors;
  };
  const auto ta = load(a), tb = load(b);
  ASSERT_EQ(ta.size(), tb.size());
  ASSERT_GE(ta.size(), 14u) << "the cnn has 14 parameters and buffers at least; the file was not read fully";
  for (const auto& [key, tensor] : ta) {
    ASSERT_EQ(tb.count(key), 1u) << key;
    EXPECT_EQ(tensor.scalar_type(), tb.at(key).scalar_type()) << key;
    if (tolerance == 0.0)
      EXPECT_TRUE(torch::equal(tensor, tb.at(key))) << key;
    else
      EXPECT_TRUE(torch::allclose(tensor.to(torch::kDouble), tb.at(key).to(torch::kDouble), tolerance, tolerance))
          << key << ": largest difference " << (tensor.to(torch::kDouble) - tb.at(key)).abs().max().item<double>();
  }
}

// Two epochs straight, and one epoch then a --resume to two, end in the same model.pt, bit for bit. `run_for`
// gives the `ampp train` arguments of a run in a folder (small_run by default).
inline void check_resume_is_exact(
    const std::string& flags,
    const std::function<std::string(const fs::path&, const std::string&)>& run_for = small_run) {
  TempDir straight, split;
  auto r = run_ampp(run_for(straight.path(), "--epochs 2 " + flags));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_ampp(run_for(split.path(), "--epochs 1 " + flags));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_ampp(run_for(split.path(), "--epochs 2 --resume " + flags));
  ASSERT_EQ(r.code, 0) << r.output;
  expect_same_model(straight.path() / "out" / "model.pt", split.path() / "out" / "model.pt");
}

// A run in `root / dir` started with `first` and resumed with `then` ends with the model.pt of the run in
// `root / reference`, bit for bit. `run(dir, flags)` trains in a folder of `root`.
inline void expect_resumes_as(const std::function<void(const std::string& dir, const std::string& flags)>& run,
                              const fs::path& root, const std::string& reference, const std::string& dir,
                              const std::string& first, const std::string& then) {
  run(dir, first);
  run(dir, then);
  expect_same_model(root / reference / "out" / "model.pt", root / dir / "out" / "model.pt");
}

// Each `ampp train --quiet <flags>` fails, and its output holds the expected message.
inline void expect_train_errors(const std::vector<std::pair<std::string, std::string>>& flags_and_messages) {
  for (const auto& [flags, message] : flags_and_messages) {
    auto r = run_ampp("train --quiet " + flags);
    EXPECT_NE(r.code, 0) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace ampp_test
