// `ampp train` as the worker program of real torchrun (the Python torch of the tests' oracle), in
// torchrun's default mode (the agent hosts the store: TORCHELASTIC_USE_AGENT_STORE=True),
// --standalone and --rdzv_backend c10d. Before: the default mode failed, ampp tried to host the
// store on the agent's port and blamed "another job or a leftover process".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "ampp_test.h"
#include "train_cli.h"

namespace fs = std::filesystem;

namespace {

// torchrun itself must work: Debian 12's python3-torch 1.13 under Python 3.11 fails before starting
// any worker (AttributeError in elastic's to_map), even for /bin/true.
bool torchrun_works() {
  return ampp_test::run_shell(std::string(AMPP_PYTHON) +
                              " -m torch.distributed.run --no_python --standalone --nproc_per_node 1 true")
             .code == 0;
}

std::string train_flags(const fs::path& dir) {
  return "train --data synthetic:384 --model cnn --batch-size 32 --epochs 1 --deterministic --threads 1 --quiet "
         "--no-plots --opt-level O1 --dtype fp16 --out " +
         (dir / "out").string();
}

}  // namespace

TEST(TrainUnderTorchrun, DefaultStandaloneAndC10dModesTrainTheSameModelAsAmppsLauncher) {
  if (!torchrun_works()) GTEST_SKIP() << "the torchrun of " << AMPP_PYTHON << " cannot start even `true`";
  ampp_test::TempDir reference;
  auto r = ampp_test::run_ampp(train_flags(reference.path()) + " --nproc 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string endpoint = "127.0.0.1:" + std::to_string(ampp_test::free_port());
  // Underscored flags: torchrun 1.13 knows no other spelling.
  const std::vector<std::pair<std::string, std::string>> modes{
      {"default (agent store)", "--master_addr 127.0.0.1 --master_port " + std::to_string(ampp_test::free_port())},
      {"standalone", "--standalone"},
      {"c10d rendezvous", "--rdzv_backend c10d --rdzv_endpoint " + endpoint + " --rdzv_id ampp-test"},
  };
  for (const auto& [name, flags] : modes) {
    ampp_test::TempDir tmp;
    r = ampp_test::run_shell(std::string(AMPP_PYTHON) + " -m torch.distributed.run --no_python --nproc_per_node 2 " +
                             flags + " " + AMPP_CLI + " " + train_flags(tmp.path()));
    ASSERT_EQ(r.code, 0) << name << "\n" << r.output;
    ampp_test::expect_same_model(reference.path() / "out" / "model.pt", tmp.path() / "out" / "model.pt");
  }
}
