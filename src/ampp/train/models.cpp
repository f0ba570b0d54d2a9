#include <ampp/train/models.h>

#include <ampp/dist/fully_shard.h>
#include <ampp/dist/sync_batch_norm.h>
#include <ampp/train/gpt.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampp::train {
namespace {
namespace nn = torch::nn;

// BatchNorm2d, or SyncBatchNorm for ModelOptions::sync_batch_norm (the same parameter and buffer
// names, so checkpoints and state dicts do not change).
nn::AnyModule batch_norm(int64_t channels, const ModelOptions& o) {
  if (o.sync_batch_norm()) return nn::AnyModule(dist::SyncBatchNorm(channels));
  return nn::AnyModule(nn::BatchNorm2d(channels));
}

// 784-256-128-10 with ReLU: the cheapest baseline (~0.24 MFLOP per image).
struct MlpImpl : ClassifierImpl {
  explicit MlpImpl(const ModelOptions& o) {
    fc1 = register_module("fc1", nn::Linear(o.in_channels() * o.height() * o.width(), 256));
    fc2 = register_module("fc2", nn::Linear(256, 128));
    fc3 = register_module("fc3", nn::Linear(128, o.num_classes()));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(fc1->forward(x.flatten(1)));
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// ModelOptions::channels_last: the input in channels-last order, so that the first convolution's output, and
// every activation after it (oneDNN's convolutions keep the layout of their input), is channels-last too, in
// the forward pass and in the backward one. A [N, 1, H, W] tensor is contiguous in both orders and only its
// strides tell oneDNN which one is meant, so it is restrided (a view: no copy); `contiguous(ChannelsLast)`
// would leave it as it is. Converting the first convolution's output instead cost a copy of that activation
// forward and of its gradient backward (2.6 of 24 ms per bf16 CNN step at batch 128).
torch::Tensor input_layout(const torch::Tensor& x, bool channels_last) {
  if (!channels_last || x.dim() != 4) return x;
  if (x.size(1) == 1 && x.is_contiguous()) return x.as_strided(x.sizes(), {x.size(2) * x.size(3), 1, x.size(3), 1});
  return x.contiguous(torch::MemoryFormat::ChannelsLast);
}

// conv3x3(16)-BN-ReLU-pool, conv3x3(32)-BN-ReLU-pool, fc128, fc10. Small enough for a
// 2-core CPU (~2.4 MFLOP per image forward), BatchNorm for the O2 keep_batchnorm_fp32 case.
struct CnnImpl : ClassifierImpl {
  explicit CnnImpl(const ModelOptions& o) : channels_last(o.channels_last()) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(o.in_channels(), 16, 3).padding(1).bias(false)));
    bn1 = batch_norm(16, o);
    register_module("bn1", bn1.ptr());
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)));
    bn2 = batch_norm(32, o);
    register_module("bn2", bn2.ptr());
    fc1 = register_module("fc1", nn::Linear(32 * (o.height() / 4) * (o.width() / 4), 128));
    fc2 = register_module("fc2", nn::Linear(128, o.num_classes()));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::max_pool2d(torch::relu(bn1.forward(conv1->forward(input_layout(x, channels_last)))), 2);
    x = torch::max_pool2d(torch::relu(bn2.forward(conv2->forward(x))), 2);
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }
  bool channels_last;
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::AnyModule bn1, bn2;
  nn::Linear fc1{nullptr}, fc2{nullptr};
};

// He et al.'s basic block: two 3x3 conv-BN, identity or 1x1-conv shortcut.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride, const ModelOptions& o) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = batch_norm(out, o);
    register_module("bn1", bn1.ptr());
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = batch_norm(out, o);
    register_module("bn2", bn2.ptr());
    if (stride != 1 || in != out) {
      shortcut = nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      shortcut->push_back(batch_norm(out, o));
      register_module("shortcut", shortcut);
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1.forward(conv1->forward(x)));
    y = bn2.forward(conv2->forward(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::AnyModule bn1, bn2;
  nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// A small ResNet for 28x28: stem conv(16), stages of one block each at 16/32/64 channels
// (28 -> 14 -> 7), global average pool, fc.
struct ResNetImpl : ClassifierImpl {
  explicit ResNetImpl(const ModelOptions& o) : channels_last(o.channels_last()) {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(o.in_channels(), 16, 3).padding(1).bias(false)));
    bn = batch_norm(16, o);
    register_module("bn", bn.ptr());
    layer1 = register_module("layer1", BasicBlock(16, 16, 1, o));
    layer2 = register_module("layer2", BasicBlock(16, 32, 2, o));
    layer3 = register_module("layer3", BasicBlock(32, 64, 2, o));
    fc = register_module("fc", nn::Linear(64, o.num_classes()));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(bn.forward(stem->forward(input_layout(x, channels_last))));
    for (auto* layer : {&layer1, &layer2, &layer3}) x = dist::unit_forward(*layer, x);  // FSDP's units
    return fc->forward(x.mean({2, 3}));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> sharding_units() const override {
    return {layer1.ptr(), layer2.ptr(), layer3.ptr()};
  }
  bool channels_last;
  nn::Conv2d stem{nullptr};
  nn::AnyModule bn;
  BasicBlock layer1{nullptr}, layer2{nullptr}, layer3{nullptr};
  nn::Linear fc{nullptr};
};

// The preset with ModelOptions' non-zero sizes; the data's classes (tokens) must fit its vocabulary.
std::shared_ptr<ClassifierImpl> make_gpt_model(const std::string& name, const ModelOptions& o) {
  GptOptions g = gpt_preset(name);
  if (o.context() != 0) g.context(o.context());
  if (o.n_layer() != 0) g.n_layer(o.n_layer());
  if (o.n_head() != 0) g.n_head(o.n_head());
  if (o.n_embd() != 0) g.n_embd(o.n_embd());
  TORCH_CHECK(o.num_classes() <= g.vocab_size(), "the data has ", o.num_classes(), " token values but ", name,
              "'s vocabulary is ", g.vocab_size());
  return make_gpt(g);
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all{"mlp", "cnn", "resnet"};
    all.insert(all.end(), gpt_names().begin(), gpt_names().end());
    return all;
  }();
  return names;
}

std::shared_ptr<ClassifierImpl> make_model(const std::string& name, const ModelOptions& o) {
  if (is_gpt(name)) return make_gpt_model(name, o);
  TORCH_CHECK(o.in_channels() > 0 && o.height() >= 4 && o.width() >= 4 && o.num_classes() >= 2,
              "model options need positive channels, images of at least 4x4 and at least 2 classes");
  if (name == "mlp") return std::make_shared<MlpImpl>(o);
  if (name == "cnn") return std::make_shared<CnnImpl>(o);
  if (name == "resnet") return std::make_shared<ResNetImpl>(o);
  TORCH_CHECK(false, "unknown model '", name, "'; choose one of: ", fmt::format("{}", fmt::join(model_names(), ", ")));
}

}  // namespace ampp::train
