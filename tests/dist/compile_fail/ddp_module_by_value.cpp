// Must NOT compile: DDP over a module held by value, as pytorch/examples' cpp/mnist holds its Net. The
// test (tests/dist/CMakeLists.txt) wants the static_assert of ddp.h that names the fix.
#include <ampp/dist/ddp.h>

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

int main() {
  Net model;
  ampp::dist::DistributedDataParallel ddp(model);
  return 0;
}
