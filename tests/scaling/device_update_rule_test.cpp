// GradScaler::update() on the device (at_min_scale kIgnore, a static scale, or every step fused): the
// host rule is the oracle. Both scalers see the same scripts of finite and overflowing iterations, with
// every ampp policy (the cap, the floor, hysteresis of both kinds), and must agree on the scale, the
// growth tracker, the hysteresis tracker, the overflows at the floor and the counts after every update.
#include "host_reads.h"
#include "scaler_test_util.h"

#include <random>

namespace {

using ampp::GradScaler;
using ampp::GradScalerOptions;
using ampp::MinScaleAction;
using ampp_test::Tiny;

// Everything a state dict and the counters say, as one comparable string.
std::string state_of(const GradScaler& s) {
  std::ostringstream out;
  out << "scale " << s.get_scale() << " tracker " << s.get_growth_tracker() << " hysteresis " << s.hysteresis_tracker()
      << " skipped " << s.skipped_steps() << " in a row " << s.consecutive_overflows();
  for (const auto& item : s.state_dict()) out << " " << item.key() << "=" << item.value();
  return out.str();
}

// The host rule: at_min_scale kWarn with a patience no script reaches, so it never warns.
GradScalerOptions on_host(GradScalerOptions o) {
  return o.at_min_scale(MinScaleAction::kWarn).min_scale_patience(1 << 30);
}
GradScalerOptions on_device(GradScalerOptions o) { return o.at_min_scale(MinScaleAction::kIgnore); }

void expect_same_trajectory(const GradScalerOptions& options, const std::string& script) {
  GradScaler host(on_host(options)), device(on_device(options));
  Tiny a, b;
  for (size_t i = 0; i < script.size(); ++i) {
    const bool overflow = script[i] == 'N';
    EXPECT_EQ(a.iterate(host, overflow), b.iterate(device, overflow)) << "iteration " << i;
    ASSERT_EQ(state_of(host), state_of(device)) << "after iteration " << i << " of " << script;
  }
  EXPECT_TRUE(torch::equal(a.p, b.p));
}

std::string random_script(std::mt19937& rng, size_t n, double p_overflow) {
  std::bernoulli_distribution overflow(p_overflow);
  std::string s;
  for (size_t i = 0; i < n; ++i) s += overflow(rng) ? 'N' : 'F';
  return s;
}

}  // namespace

TEST(DeviceUpdateRule, FollowsTheHostRuleWithEveryPolicy) {
  const std::vector<std::pair<std::string, GradScalerOptions>> cases{
      {"PyTorch's", GradScalerOptions().init_scale(8).growth_interval(2)},
      {"apex's cap and floor",
       GradScalerOptions().init_scale(1 << 10).growth_interval(2).max_scale(1 << 11).min_scale(1 << 8)},
      {"a factor that rounds",
       GradScalerOptions().init_scale(1000).growth_factor(3.1).backoff_factor(0.3).max_scale(5000).growth_interval(1)},
      {"consecutive hysteresis", GradScalerOptions().init_scale(64).growth_interval(3).hysteresis(3).min_scale(8)},
      {"Megatron's hysteresis",
       GradScalerOptions().init_scale(64).growth_interval(2).hysteresis(2).consecutive_hysteresis(false).min_scale(4)},
      {"the floor of ampp", GradScalerOptions().init_scale(0x1p-120).growth_interval(50)},
  };
  std::mt19937 rng(7);
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name);
    expect_same_trajectory(options, "FFFNFFNNNNFFFFFFNFNNNNNNNNNNFFFF");
    for (const double p : {0.1, 0.5, 0.9}) expect_same_trajectory(options, random_script(rng, 60, p));
  }
}

TEST(DeviceUpdateRule, ResumesFromTheHostsStateDict) {
  const auto options = GradScalerOptions().init_scale(64).growth_interval(2).hysteresis(2).min_scale(16);
  GradScaler host(on_host(options)), device(on_device(options));
  Tiny a, b;
  for (char c : std::string("NFNNF")) a.iterate(host, c == 'N');
  device.load_state_dict(host.state_dict());
  for (char c : std::string("FNNNFFF")) {
    a.iterate(host, c == 'N');
    b.iterate(device, c == 'N');
    ASSERT_EQ(host.get_scale(), device.get_scale());
    ASSERT_EQ(host.hysteresis_tracker(), device.hysteresis_tracker());
  }
}

TEST(DeviceUpdateRule, ReadsNothingOnTheHost) {
  GradScaler scaler(on_device(GradScalerOptions().max_scale(1 << 20).min_scale(4).hysteresis(2)));
  auto p = torch::ones({8}).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  auto iterate = [&](bool overflow) {
    opt.zero_grad();
    scaler.scale((p * p).sum()).backward();
    if (overflow) p.mutable_grad()[3].fill_(ampp_test::kInf);
    scaler.unscale_(opt);  // what ampp::initialize's Amp does: unscale, then its own skip on the flag
    scaler.update();
  };
  ampp_test::HostReadCounter counter;
  for (int i = 0; i < 8; ++i) iterate(i % 3 == 1);
  EXPECT_EQ(counter.count(), 0);
}
