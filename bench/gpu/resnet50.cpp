// ResNet-50 for the GPU benchmark (resnet50.h).
#include "resnet50.h"

#include <torch/torch.h>

namespace ampp::bench {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// 1x1 reduce, 3x3 (the stride), 1x1 expand to 4x, each with BatchNorm; a 1x1 projection shortcut where the
// shape changes.
struct BottleneckImpl : nn::Module {
  BottleneckImpl(int64_t in, int64_t width, int64_t stride) {
    conv1 = register_module("conv1", conv(in, width, 1, 1));
    bn1 = register_module("bn1", nn::BatchNorm2d(width));
    conv2 = register_module("conv2", conv(width, width, 3, stride));
    bn2 = register_module("bn2", nn::BatchNorm2d(width));
    conv3 = register_module("conv3", conv(width, 4 * width, 1, 1));
    bn3 = register_module("bn3", nn::BatchNorm2d(4 * width));
    if (stride != 1 || in != 4 * width)
      downsample =
          register_module("downsample", nn::Sequential(conv(in, 4 * width, 1, stride), nn::BatchNorm2d(4 * width)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = torch::relu(bn2(conv2(y)));
    y = bn3(conv3(y));
    return torch::relu(y + (downsample ? downsample->forward(x) : x));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNet50Impl : ampp::train::ClassifierImpl {
  ResNet50Impl(int64_t classes, bool channels_last) : channels_last(channels_last) {
    conv1 = register_module("conv1", conv(3, 64, 7, 2));
    bn1 = register_module("bn1", nn::BatchNorm2d(64));
    const int64_t blocks[] = {3, 4, 6, 3};
    int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      nn::Sequential layer;
      const int64_t width = 64 << stage;
      for (int64_t b = 0; b < blocks[stage]; ++b) {
        layer->push_back(Bottleneck(in, width, b == 0 && stage > 0 ? 2 : 1));
        in = 4 * width;
      }
      layers.push_back(register_module("layer" + std::to_string(stage + 1), layer));
    }
    fc = register_module("fc", nn::Linear(in, classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    if (channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 3, 2, 1);
    for (auto& layer : layers) x = layer->forward(x);
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  bool channels_last;
  nn::Conv2d conv1{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  std::vector<nn::Sequential> layers;
  nn::Linear fc{nullptr};
};

}  // namespace

std::shared_ptr<ampp::train::ClassifierImpl> make_resnet50(int64_t classes, bool channels_last) {
  return std::make_shared<ResNet50Impl>(classes, channels_last);
}

}  // namespace ampp::bench
