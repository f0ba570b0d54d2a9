// Fused unscale kernel vs a scalar reference written from the ATen op's definition (reference 1.7),
// with ampp's stricter check of what is stored (numerics/unscale.h):
// v = float(x); x = dtype((inv == 1) ? v : v * inv); found |= !isfinite(x).

#include <ampp/numerics/unscale.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <set>

namespace {

using ampp::numerics::has_non_finite;
using ampp::numerics::non_finite_check_and_unscale_;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Reference, element by element in the tensor's own dtype via c10's scalar conversions.
bool reference_unscale_(torch::Tensor t, float inv) {
  bool found = false;
  auto flat = t.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flat.scalar_type(), "ref", [&] {
    scalar_t* p = flat.data_ptr<scalar_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      using opmath = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      const opmath v = static_cast<opmath>(p[i]);
      p[i] = static_cast<scalar_t>(inv == 1.0f ? v : v * static_cast<opmath>(inv));
      found |= !std::isfinite(static_cast<opmath>(p[i]));
    }
  });
  t.copy_(flat);
  return found;
}

// Bitwise equality, treating any two NaNs as equal (NaN payloads are not part of the contract).
void expect_same_bits(const torch::Tensor& got, const torch::Tensor& want) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type());
  ASSERT_EQ(got.sizes(), want.sizes());
  auto g = got.contiguous().to(torch::kDouble), w = want.contiguous().to(torch::kDouble);
  auto both_nan = g.isnan() & w.isnan();
  auto same = (g == w) | both_nan;
  EXPECT_TRUE(same.all().item<bool>()) << "first mismatch at flat index "
                                       << (~same).flatten().nonzero().flatten()[0].item<int64_t>();
  // Sign of zero and exact bits of finite values: compare bit patterns where not NaN.
  const auto itype = got.element_size() == 8 ? torch::kLong : got.element_size() == 4 ? torch::kInt : torch::kShort;
  auto gb = got.contiguous().view(itype).masked_fill(both_nan.view(got.sizes()), 0);
  auto wb = want.contiguous().view(itype).masked_fill(both_nan.view(want.sizes()), 0);
  EXPECT_TRUE(torch::equal(gb, wb));
}

torch::Tensor scaled_values(int64_t n, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  // Spread over many binades, including values that round differently after scaling.
  auto v = torch::randn({n}, torch::kDouble) * torch::pow(2.0, torch::randint(-6, 12, {n}, torch::kDouble));
  return v.to(dtype);
}

// Runs body once per kernel variant available here (portable, and AVX2 when built and supported),
// then restores the default choice.
template <typename Body>
void for_each_variant(Body body) {
  const std::string chosen = ampp::numerics::unscale_kernel_variant();
  for (const auto& v : ampp::numerics::unscale_kernel_variants()) {
    ASSERT_TRUE(ampp::numerics::set_unscale_kernel_variant(v));
    SCOPED_TRACE("kernel variant " + v);
    body();
  }
  ASSERT_TRUE(ampp::numerics::set_unscale_kernel_variant(chosen));
}

struct DtypeCase {
  torch::ScalarType dtype;
  const char* name;
};

class UnscaleDtype : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(UnscaleDtype, MatchesReferenceForOddSizesAndFiniteValues) {
  for_each_variant([&] {
    const auto dtype = GetParam().dtype;
    for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 65, 1000, (1 << 15) + 5, 70001}) {
      auto t = scaled_values(n, dtype, 100 + n);
      auto ref = t.clone();
      auto found = torch::zeros({}, torch::kFloat);
      const float inv = 1.0f / 3.0f;  // not a power of two: exercises rounding back to the dtype
      non_finite_check_and_unscale_({t}, found, torch::full({}, inv));
      const bool ref_found = reference_unscale_(ref, inv);
      EXPECT_FALSE(ref_found);
      EXPECT_EQ(found.item<float>(), 0.0f) << "n=" << n;
      expect_same_bits(t, ref);
    }
  });
}

TEST_P(UnscaleDtype, DetectsInfMinusInfNaNAtEveryPositionKind) {
  for_each_variant([&] {
    const auto dtype = GetParam().dtype;
    for (int64_t n : {1, 17, 33, 64, 1000, (1 << 15) + 3, 70001}) {
      // first element, a vector-body element, the last (scalar tail) element, and the last of a chunk
      std::vector<int64_t> positions = {0, n / 2, n - 1};
      if (n > (1 << 15)) positions.push_back((1 << 15) - 1);
      for (int64_t pos : positions) {
        for (float bad : {kInf, -kInf, kNaN}) {
          auto t = scaled_values(n, dtype, 7);
          t[pos] = bad;
          auto ref = t.clone();
          auto found = torch::zeros({}, torch::kFloat);
          non_finite_check_and_unscale_({t}, found, torch::full({}, 0.25f));
          EXPECT_TRUE(reference_unscale_(ref, 0.25f));
          EXPECT_EQ(found.item<float>(), 1.0f) << "n=" << n << " pos=" << pos << " value=" << bad;
          expect_same_bits(t, ref);
        }
      }
    }
  });
}

// A loss scale below 1 (inv_scale > 1) can turn a finite gradient into inf as it is unscaled. ATen's op
// checks the inputs and reports nothing (PyTorch then steps on the inf); ampp checks what it stored.
struct OverflowCase {
  double value;  // finite in the dtype; value * inv is not
  float inv;
};

OverflowCase overflow_case(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf:
      return {60000.0, 2.0f};  // 120000 is a finite float but above fp16's 65504
    case torch::kBFloat16:
      // 1.796875 * 2^127 (a bf16 value) * float(1/0.9) = 3.39695e38: a finite float that rounds to
      // +inf in bf16 (above the midpoint between bf16's max 3.38953e38 and 2^128), so only a check of
      // the stored bf16 value, not of the float product, sees it.
      return {1.796875 * 0x1p127, static_cast<float>(1.0 / 0.9)};
    case torch::kDouble:
      return {1e308, 4.0f};
    default:
      return {0x1p126, 4.0f};
  }
}

TEST_P(UnscaleDtype, FiniteValuesThatOverflowWhenUnscaledAreFound) {
  for_each_variant([&] {
    const auto dtype = GetParam().dtype;
    const OverflowCase c = overflow_case(dtype);
    for (int64_t n : {1, 17, 33, 1000, (1 << 15) + 3, 70001}) {
      for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
        auto t = scaled_values(n, dtype, 11);
        t[pos] = c.value;
        ASSERT_TRUE(std::isfinite(t[pos].item<double>()));
        auto ref = t.clone();
        auto found = torch::zeros({}, torch::kFloat);
        non_finite_check_and_unscale_({t}, found, torch::full({}, c.inv));
        EXPECT_TRUE(reference_unscale_(ref, c.inv));
        EXPECT_TRUE(std::isinf(t[pos].item<double>())) << "n=" << n << " pos=" << pos;
        EXPECT_EQ(found.item<float>(), 1.0f) << "n=" << n << " pos=" << pos;
        expect_same_bits(t, ref);
      }
    }
    // inv_scale > 1 with results that stay finite: nothing found, same bits as the reference.
    auto t = scaled_values(70001, dtype, 12);
    auto ref = t.clone();
    auto found = torch::zeros({}, torch::kFloat);
    non_finite_check_and_unscale_({t}, found, torch::full({}, 3.0f));
    EXPECT_FALSE(reference_unscale_(ref, 3.0f));
    EXPECT_EQ(found.item<float>(), 0.0f);
    expect_same_bits(t, ref);
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnscaleDtype,
                         ::testing::Values(DtypeCase{torch::kFloat, "fp32"}, DtypeCase{torch::kBFloat16, "bf16"},
                                           DtypeCase{torch::kHalf, "fp16"}, DtypeCase{torch::kDouble, "fp64"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Unscale, OneBadValueInAnyOfManyMixedDtypeTensorsSetsFoundInf) {
  for_each_variant([&] {
    std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kFloat};
    for (size_t which = 0; which < 8; ++which) {
      std::vector<torch::Tensor> ts, refs;
      for (size_t i = 0; i < 8; ++i) {
        ts.push_back(scaled_values(int64_t(37 + 500 * i), dtypes[i % 4], i));
        if (i == which) ts.back()[-1] = kNaN;
        refs.push_back(ts.back().clone());
      }
      auto found = torch::zeros({}, torch::kFloat);
      non_finite_check_and_unscale_(ts, found, torch::full({}, 0.5f));
      EXPECT_EQ(found.item<float>(), 1.0f) << "bad tensor " << which;
      for (size_t i = 0; i < ts.size(); ++i) {
        reference_unscale_(refs[i], 0.5f);
        expect_same_bits(ts[i], refs[i]);
      }
    }
  });
}

// Which tensors overflowed comes from the same pass (per-chunk flags), for the numerics doctor.
TEST(Unscale, PerTensorFlagsNameExactlyTheTensorsWithNonFiniteValues) {
  for_each_variant([&] {
    const std::vector<int64_t> sizes{5, (1 << 15) * 3 + 7, 0, 1000, 70001};
    const std::vector<torch::ScalarType> dtypes{torch::kFloat, torch::kBFloat16, torch::kFloat, torch::kHalf,
                                                torch::kFloat};
    for (const std::set<size_t> bad : {std::set<size_t>{}, {1}, {0, 4}, {3}, {1, 3, 4}}) {
      std::vector<torch::Tensor> ts;
      for (size_t i = 0; i < sizes.size(); ++i) {
        ts.push_back(scaled_values(sizes[i], dtypes[i], 30 + i));
        if (bad.count(i)) ts.back()[sizes[i] - 1 - static_cast<int64_t>(i)] = kNaN;  // late in the last chunk
      }
      auto found = torch::zeros({}, torch::kFloat);
      std::vector<uint8_t> flags;
      non_finite_check_and_unscale_(ts, found, torch::full({}, 0.5f), flags);
      ASSERT_EQ(flags.size(), ts.size());
      for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(flags[i], bad.count(i) ? 1 : 0) << "tensor " << i;
      EXPECT_EQ(found.item<float>(), bad.empty() ? 0.0f : 1.0f);
    }
  });
}

TEST(Unscale, NonContiguousTensorsAreUnscaledInPlaceWithoutTouchingGaps) {
  for_each_variant([&] {
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      // Transposed (non-contiguous but dense) and a strided slice (has gaps).
      auto base_t = scaled_values(33 * 17, dtype, 3).view({33, 17});
      auto transposed = base_t.t();
      auto base_s = scaled_values(41 * 10, dtype, 4).view({41, 10});
      auto strided = base_s.slice(/*dim=*/1, 0, 10, 3);  // columns 0,3,6,9
      ASSERT_FALSE(transposed.is_contiguous());
      ASSERT_FALSE(strided.is_non_overlapping_and_dense());
      strided[40][3] = -kInf;  // last element of the view

      auto want_t = transposed.clone();
      auto want_s = strided.clone();
      auto gaps_before = base_s.slice(1, 1, 10, 3).clone();
      reference_unscale_(want_t, 0.125f);
      reference_unscale_(want_s, 0.125f);

      auto found = torch::zeros({}, torch::kFloat);
      non_finite_check_and_unscale_({transposed, strided}, found, torch::full({}, 0.125f));
      EXPECT_EQ(found.item<float>(), 1.0f);
      expect_same_bits(transposed, want_t);
      expect_same_bits(strided, want_s);
      expect_same_bits(base_s.slice(1, 1, 10, 3), gaps_before);
    }
  });
}

TEST(Unscale, InvScaleOneLeavesValuesBitIdenticalAndStillDetects) {
  for_each_variant([&] {
    auto t = scaled_values(1001, torch::kFloat, 9);
    t[1000] = kNaN;
    auto before = t.clone();
    auto found = torch::zeros({}, torch::kFloat);
    non_finite_check_and_unscale_({t}, found, torch::ones({}));
    EXPECT_EQ(found.item<float>(), 1.0f);
    expect_same_bits(t, before);
  });
}

TEST(Unscale, FoundInfIsNeverClearedAndEmptyListIsANoop) {
  auto found = torch::ones({}, torch::kFloat);
  auto t = scaled_values(100, torch::kFloat, 1);
  non_finite_check_and_unscale_({t}, found, torch::full({}, 0.5f));
  EXPECT_EQ(found.item<float>(), 1.0f);
  found.zero_();
  non_finite_check_and_unscale_({}, found, torch::full({}, 0.5f));
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_FALSE(has_non_finite({t}));
  t[3] = kInf;
  EXPECT_TRUE(has_non_finite({t}));
}

TEST(Unscale, TwoThreadsGiveTheSameBitsAsOne) {
  for_each_variant([&] {
    std::vector<torch::Tensor> a, b;
    for (int i = 0; i < 6; ++i) {
      a.push_back(scaled_values(100000 + 13 * i, i % 2 ? torch::kBFloat16 : torch::kFloat, 50 + i));
      b.push_back(a.back().clone());
    }
    a[5][77777] = kInf;
    b[5][77777] = kInf;
    const int saved = at::get_num_threads();
    auto fa = torch::zeros({}), fb = torch::zeros({});
    at::set_num_threads(1);
    non_finite_check_and_unscale_(a, fa, torch::full({}, 1.0f / 65536));
    at::set_num_threads(2);
    non_finite_check_and_unscale_(b, fb, torch::full({}, 1.0f / 65536));
    at::set_num_threads(saved);
    EXPECT_EQ(fa.item<float>(), 1.0f);
    EXPECT_EQ(fb.item<float>(), 1.0f);
    for (size_t i = 0; i < a.size(); ++i) expect_same_bits(a[i], b[i]);
  });
}

TEST(Unscale, RejectsBadArgumentsWithAtenMessages) {
  auto t = torch::ones({4});
  auto found = torch::zeros({});
  auto inv = torch::ones({});
  auto msg = [&](auto fn) {
    try {
      fn();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("<no error>");
  };
  EXPECT_THAT(msg([&] {
                auto f = torch::zeros({}, torch::kDouble);
                non_finite_check_and_unscale_({t}, f, inv);
              }),
              HasSubstr("found_inf must be a float tensor."));
  EXPECT_THAT(msg([&] { non_finite_check_and_unscale_({t}, found, torch::ones({2})); }),
              HasSubstr("inv_scale must be a 1-element tensor."));
  EXPECT_THAT(msg([&] { non_finite_check_and_unscale_({t}, found, torch::ones({}, torch::kHalf)); }),
              HasSubstr("inv_scale must be a float tensor."));
  EXPECT_THAT(msg([&] {
                auto f = torch::zeros({3});
                non_finite_check_and_unscale_({t}, f, inv);
              }),
              HasSubstr("found_inf must be a 1-element tensor."));
  EXPECT_THAT(msg([&] { non_finite_check_and_unscale_({torch::ones({3}, torch::kInt)}, found, inv); }),
              HasSubstr("gradients must be float, double, bfloat16 or half"));
  EXPECT_THAT(msg([&] { non_finite_check_and_unscale_({t.to_sparse()}, found, inv); }),
              HasSubstr("one of scaled_grads was not a strided tensor."));
}

TEST(Unscale, ReportsAndSelectsKernelVariants) {
  const std::string v = ampp::numerics::unscale_kernel_variant();
  EXPECT_TRUE(v == "avx2" || v == "default") << v;
  const auto all = ampp::numerics::unscale_kernel_variants();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), "default");
  EXPECT_EQ(all.back(), v);  // the best available one is picked by default
  EXPECT_FALSE(ampp::numerics::set_unscale_kernel_variant("avx9000"));
  EXPECT_EQ(ampp::numerics::unscale_kernel_variant(), v);
}

}  // namespace
