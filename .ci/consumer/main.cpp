// Uses the installed ampp the way a user would: one scaled step of a tiny model.
#include <ampp/ampp.h>
#include <torch/torch.h>

// ampp's public API needs LibTorch and nothing else in a program's code (its libraries link zlib and
// protobuf themselves): no fmt or nlohmann-json types in its headers.
#if defined(FMT_VERSION) || defined(NLOHMANN_JSON_VERSION_MAJOR)
#error "ampp's public headers include fmt or nlohmann-json"
#endif

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ampp::GradScaler scaler;
  auto before = model->weight.clone();
  auto loss = model->forward(torch::ones({8, 4})).pow(2).mean();
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
  if (torch::equal(before, model->weight)) {
    std::cerr << "consumer: the scaled step did not update the weights\n";
    return 1;
  }
  std::cout << "consumer: ok, scale " << scaler.get_scale() << "\n";
  return 0;
}
