// Seed 003 (insightface arcface_torch) ported to ampp: two optimizers, a max-clipped dynamic loss
// scale, and gradient clipping on the TRUE gradients (clip_grad_norm_ after unscale_).
//
// Python (seed 003)                                       C++ (below)
// grad_scaler = MaxClipGradScaler(bs, 128 * bs,           ampp::GradScaler grad_scaler(GradScalerOptions()
//                                 growth_interval=100)      .init_scale(bs).max_scale(128 * bs).growth_interval(100))
// train_sampler.set_epoch(epoch)                          train_sampler.set_epoch(epoch)
// features = F.normalize(backbone(img))                   features = normalize(backbone->forward(img))
// x_grad, loss_v = module_partial_fc.forward_backward(..) partial_fc_forward_backward(...)
// features.backward(grad_scaler.scale(x_grad))            features.backward(grad_scaler.scale(x_grad))
// grad_scaler.unscale_(opt_backbone)                      grad_scaler.unscale_(opt_backbone)
// clip_grad_norm_(backbone.parameters(), max_norm=5)      torch::nn::utils::clip_grad_norm_(..., 5, 2)
// grad_scaler.step(opt_backbone); grad_scaler.update()    grad_scaler.step(opt_backbone); grad_scaler.update()
// opt_pfc.step(); opt_backbone.zero_grad(); ...           opt_pfc.step(); opt_backbone.zero_grad(); ...
// scheduler_backbone.step(); scheduler_pfc.step()         scheduler_backbone.step(); scheduler_pfc.step()
#include <ampp/ampp.h>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

namespace F = torch::nn::functional;

int main(int argc, char** argv) {
  int64_t epochs = 2, steps_per_epoch = 20, batch_size = 64;
  CLI::App app{"seed 003: insightface's MaxClipGradScaler loop on synthetic face embeddings"};
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps_per_epoch, "steps per epoch")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  torch::manual_seed(3);
  const int64_t num_classes = 10, embedding = 32, dataset_size = steps_per_epoch * batch_size;
  // Synthetic "images": class-dependent means so the loss can fall.
  auto labels = torch::randint(num_classes, {dataset_size}, torch::kLong);
  auto centers = torch::randn({num_classes, 64});
  auto images = centers.index_select(0, labels) + 0.5 * torch::randn({dataset_size, 64});

  torch::nn::Sequential backbone(torch::nn::Linear(64, 128), torch::nn::ReLU(), torch::nn::Linear(128, embedding));
  torch::nn::Linear partial_fc(torch::nn::LinearOptions(embedding, num_classes).bias(false));
  torch::optim::SGD opt_backbone(backbone->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt_pfc(partial_fc->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR scheduler_backbone(opt_backbone, /*step_size=*/1, /*gamma=*/0.5);
  torch::optim::StepLR scheduler_pfc(opt_pfc, 1, 0.5);

  // insightface: MaxClipGradScaler(cfg.batch_size, 128 * cfg.batch_size, growth_interval=100).
  ampp::GradScaler grad_scaler(ampp::GradScalerOptions()
                                   .init_scale(static_cast<double>(batch_size))
                                   .max_scale(128.0 * batch_size)
                                   .growth_interval(100));
  ampp::dist::DistributedSampler train_sampler(dataset_size,
                                               ampp::dist::DistributedSamplerOptions().num_replicas(1).rank(0).seed(3));

  // PartialFC.forward_backward: the head's loss and its gradient w.r.t. the features; the head's
  // own gradients land in its parameters (stepped by opt_pfc, unscaled, as in insightface).
  auto partial_fc_forward_backward = [&](const torch::Tensor& label, const torch::Tensor& features) {
    auto x = features.detach().requires_grad_(true);
    auto loss = F::cross_entropy(partial_fc->forward(x) * 8.0, label);
    loss.backward();
    return std::make_pair(x.grad(), loss.item<double>());
  };

  double first_loss = 0, last_loss = 0;
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    train_sampler.set_epoch(epoch);
    const auto indices = train_sampler.indices();
    auto order = torch::tensor(std::vector<int64_t>(indices.begin(), indices.end()));
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      ++global_step;
      auto idx = order.slice(0, step * batch_size, (step + 1) * batch_size);
      auto img = images.index_select(0, idx), label = labels.index_select(0, idx);
      auto features = F::normalize(backbone->forward(img), F::NormalizeFuncOptions().dim(1));
      auto [x_grad, loss_v] = partial_fc_forward_backward(label, features);
      features.backward(grad_scaler.scale(x_grad));
      grad_scaler.unscale_(opt_backbone);
      torch::nn::utils::clip_grad_norm_(backbone->parameters(), /*max_norm=*/5, /*norm_type=*/2);
      grad_scaler.step(opt_backbone);
      grad_scaler.update();
      opt_pfc.step();
      opt_backbone.zero_grad();
      opt_pfc.zero_grad();
      if (global_step == 1) first_loss = loss_v;
      last_loss = loss_v;
      if (global_step % 10 == 0)
        fmt::print("epoch {} step {} loss {:.4f} scale {}\n", epoch, global_step, loss_v, grad_scaler.get_scale());
    }
    scheduler_backbone.step();
    scheduler_pfc.step();
  }
  fmt::print("seed003: loss {:.4f} -> {:.4f}, final scale {}, skipped steps {}\n", first_loss, last_loss,
             grad_scaler.get_scale(), grad_scaler.skipped_steps());
  // The scale may never exceed the MaxClip cap; the loss must have fallen.
  if (grad_scaler.get_scale() > 128.0 * batch_size || !(last_loss < first_loss)) return 1;
  return 0;
}
