#pragma once
// Shared helpers of the GradScaler tests.

#include <ampp/scaling/grad_scaler.h>

#include "ampp_test.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace ampp_test {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A four-weight linear problem: one scripted iteration = scale(loss).backward(), optional injected
/// non-finite value in the gradient, step(), update().
struct Tiny {
  torch::Tensor p = torch::ones({4}).requires_grad_();
  torch::optim::SGD opt{std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.01)};

  bool iterate(ampp::GradScaler& scaler, bool overflow, float bad = kInf) {
    opt.zero_grad();
    auto loss = (p * torch::arange(1, 5, torch::kFloat)).sum();
    scaler.scale(loss).backward();
    if (overflow) p.mutable_grad()[2].fill_(bad);
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }
};

struct Point {
  double scale;
  int64_t tracker;
  bool operator==(const Point& o) const { return scale == o.scale && tracker == o.tracker; }
};

inline std::ostream& operator<<(std::ostream& os, const Point& p) {
  return os << "{scale " << p.scale << ", tracker " << p.tracker << "}";
}

/// Runs a script ('F' finite, 'N' non-finite) and returns (scale, growth tracker) after each update.
inline std::vector<Point> trajectory(ampp::GradScaler& scaler, const std::string& script) {
  Tiny t;
  std::vector<Point> out;
  for (char c : script) {
    t.iterate(scaler, c == 'N');
    out.push_back({scaler.get_scale(), scaler.get_growth_tracker()});
  }
  return out;
}

}  // namespace ampp_test
