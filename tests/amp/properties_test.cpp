// apex's property table, override rules and opt-level parsing.
#include <ampp/amp/initialize.h>

#include "ampp_test.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using ampp::LossScale;
using ampp::OptLevel;
using ampp::Properties;
using ::testing::HasSubstr;

TEST(OptLevel, ParsesTheFourLevels) {
  EXPECT_EQ(ampp::parse_opt_level("O0"), OptLevel::O0);
  EXPECT_EQ(ampp::parse_opt_level("O1"), OptLevel::O1);
  EXPECT_EQ(ampp::parse_opt_level("O2"), OptLevel::O2);
  EXPECT_EQ(ampp::parse_opt_level("O3"), OptLevel::O3);
  EXPECT_STREQ(ampp::to_string(OptLevel::O2), "O2");
}

TEST(OptLevel, RejectsUnknownSpellingsWithTheValidOnes) {
  AMPP_EXPECT_THROW_WITH(ampp::parse_opt_level("o2"), "Options are 'O0', 'O1', 'O2', 'O3'");
  AMPP_EXPECT_THROW_WITH(ampp::parse_opt_level("o2"), "capital O");
  AMPP_EXPECT_THROW_WITH(ampp::parse_opt_level("O4"), "Unexpected optimization level 'O4'");
  AMPP_EXPECT_THROW_WITH(ampp::parse_opt_level("02"), "letter O, not the digit zero");
  AMPP_EXPECT_THROW_WITH(ampp::parse_opt_level(""), "Options are");
  AMPP_EXPECT_THROW_WITH(Properties("O5"), "Unexpected optimization level 'O5'");
}

// The table of apex's frontend.py, with "low" = the low-precision dtype (bf16 on CPU by default).
TEST(Properties, LevelDefaultsMatchApexTable) {
  Properties o0(OptLevel::O0), o1(OptLevel::O1), o2(OptLevel::O2), o3(OptLevel::O3);
  EXPECT_EQ(o0.cast_model_type(), c10::make_optional(torch::kFloat));
  EXPECT_FALSE(o1.cast_model_type().has_value());
  EXPECT_EQ(o2.cast_model_type(), c10::make_optional(torch::kBFloat16));
  EXPECT_EQ(o3.cast_model_type(), c10::make_optional(torch::kBFloat16));

  EXPECT_FALSE(o0.patch_torch_functions());
  EXPECT_TRUE(o1.patch_torch_functions());
  EXPECT_FALSE(o2.patch_torch_functions());
  EXPECT_FALSE(o3.patch_torch_functions());

  EXPECT_FALSE(o0.keep_batchnorm_fp32().has_value());
  EXPECT_FALSE(o1.keep_batchnorm_fp32().has_value());
  EXPECT_EQ(o2.keep_batchnorm_fp32(), c10::make_optional(true));
  EXPECT_EQ(o3.keep_batchnorm_fp32(), c10::make_optional(false));

  EXPECT_EQ(o0.master_weights(), c10::make_optional(false));
  EXPECT_FALSE(o1.master_weights().has_value());
  EXPECT_EQ(o2.master_weights(), c10::make_optional(true));
  EXPECT_EQ(o3.master_weights(), c10::make_optional(false));

  EXPECT_EQ(o0.loss_scale(), LossScale(1.0));
  EXPECT_TRUE(o1.loss_scale().is_dynamic());
  EXPECT_TRUE(o2.loss_scale().is_dynamic());
  EXPECT_EQ(o3.loss_scale(), LossScale(1.0));

  for (const auto& p : {o0, o1, o2, o3}) {
    EXPECT_TRUE(p.enabled());
    EXPECT_EQ(p.num_losses(), 1);
    EXPECT_EQ(p.max_loss_scale(), 16777216.0);  // 2^24
    EXPECT_FALSE(p.min_loss_scale().has_value());
  }
  EXPECT_EQ(Properties().opt_level(), OptLevel::O1);  // apex's default level
}

TEST(Properties, LowPrecisionDtypeFollowsDeviceAndOverrides) {
  EXPECT_EQ(ampp::default_low_precision_dtype(c10::DeviceType::CPU), torch::kBFloat16);
  EXPECT_EQ(ampp::default_low_precision_dtype(c10::DeviceType::CUDA), torch::kHalf);
  EXPECT_EQ(Properties("O2").device_type(c10::DeviceType::CUDA).cast_model_type(), c10::make_optional(torch::kHalf));
  EXPECT_EQ(Properties("O2").dtype(torch::kHalf).cast_model_type(), c10::make_optional(torch::kHalf));
  // apex-style override: cast_model_type(kHalf) under O2 is the same knob.
  auto p = Properties("O3").cast_model_type(torch::kHalf);
  EXPECT_EQ(p.cast_model_type(), c10::make_optional(torch::kHalf));
  EXPECT_EQ(p.resolved_dtype(), torch::kHalf);
  EXPECT_EQ(Properties("O2").cast_model_type(torch::kFloat).cast_model_type(), c10::make_optional(torch::kFloat));
  EXPECT_FALSE(Properties("O2").cast_model_type(c10::nullopt).cast_model_type().has_value());
  AMPP_EXPECT_THROW_WITH(Properties("O1").dtype(torch::kFloat), "must be torch::kBFloat16 or torch::kHalf");
  AMPP_EXPECT_THROW_WITH(Properties("O2").cast_model_type(torch::kDouble), "cast_model_type must be torch::kFloat");
}

TEST(Properties, AllowedOverrides) {
  auto o2 = Properties("O2").keep_batchnorm_fp32(false).master_weights(false).loss_scale(128.0);
  EXPECT_EQ(o2.keep_batchnorm_fp32(), c10::make_optional(false));
  EXPECT_EQ(o2.master_weights(), c10::make_optional(false));
  EXPECT_EQ(o2.loss_scale(), LossScale(128.0));
  EXPECT_EQ(Properties("O3").keep_batchnorm_fp32("True").keep_batchnorm_fp32(), c10::make_optional(true));
  EXPECT_EQ(Properties("O3").keep_batchnorm_fp32("False").keep_batchnorm_fp32(), c10::make_optional(false));
  EXPECT_EQ(Properties("O1").cast_model_type(torch::kFloat).cast_model_type(), c10::make_optional(torch::kFloat));
  EXPECT_FALSE(Properties("O1").patch_torch_functions(false).patch_torch_functions());
  EXPECT_EQ(Properties("O1").loss_scale("128.0").loss_scale(), LossScale(128.0));
  EXPECT_TRUE(Properties("O0").loss_scale("dynamic").loss_scale().is_dynamic());
  EXPECT_EQ(Properties("O0").master_weights(true).master_weights(), c10::make_optional(true));
}

TEST(Properties, ApexForbiddenOverridesThrowWithTheFix) {
  AMPP_EXPECT_THROW_WITH(Properties("O1").cast_model_type(torch::kHalf), "use OptLevel::O2 or O3");
  AMPP_EXPECT_THROW_WITH(Properties("O1").keep_batchnorm_fp32(true), "leave keep_batchnorm_fp32 unset with O1");
  AMPP_EXPECT_THROW_WITH(Properties("O1").keep_batchnorm_fp32(false), "leave keep_batchnorm_fp32 unset with O1");
  AMPP_EXPECT_THROW_WITH(Properties("O1").master_weights(true), "Leave master_weights unset with O1");
  AMPP_EXPECT_THROW_WITH(Properties("O1").master_weights(false), "Leave master_weights unset with O1");
  for (const char* level : {"O0", "O2", "O3"}) {
    AMPP_EXPECT_THROW_WITH(Properties(level).patch_torch_functions(true), "only be had by selecting OptLevel::O1");
  }
  AMPP_EXPECT_THROW_WITH(Properties("O2").keep_batchnorm_fp32("yes"), "the string \"True\" or \"False\"");
}

TEST(Properties, InvalidValuesThrow) {
  AMPP_EXPECT_THROW_WITH(LossScale("abc"), "\"dynamic\" or a number");
  AMPP_EXPECT_THROW_WITH(LossScale("128x"), "\"dynamic\" or a number");
  AMPP_EXPECT_THROW_WITH(LossScale(-1.0), "finite number > 0");
  AMPP_EXPECT_THROW_WITH(LossScale(0.0), "finite number > 0");
  AMPP_EXPECT_THROW_WITH((void)LossScale(std::numeric_limits<double>::infinity()), "finite number > 0");
  AMPP_EXPECT_THROW_WITH(LossScale(1.0).is_dynamic() ? 0.0 : LossScale().value(), "dynamic");
  AMPP_EXPECT_THROW_WITH(Properties("O2").num_losses(0), "num_losses must be >= 1");
  AMPP_EXPECT_THROW_WITH(Properties("O2").min_loss_scale(0.0), "min_loss_scale must be");
  AMPP_EXPECT_THROW_WITH(Properties("O2").max_loss_scale(1024).min_loss_scale(2048.0),
                         "must not exceed max_loss_scale");
  AMPP_EXPECT_THROW_WITH(Properties("O2").min_loss_scale(2048.0).max_loss_scale(1024),
                         "must not be below min_loss_scale");
  AMPP_EXPECT_THROW_WITH(Properties("O2").verbosity(-1), "verbosity");
}

TEST(Properties, PrintsEveryProperty) {
  const std::string text = Properties("O2").loss_scale(128.0).to_string();
  EXPECT_THAT(text, HasSubstr("opt_level              : O2"));
  EXPECT_THAT(text, HasSubstr("cast_model_type        : BFloat16"));
  EXPECT_THAT(text, HasSubstr("keep_batchnorm_fp32    : True"));
  EXPECT_THAT(text, HasSubstr("master_weights         : True"));
  EXPECT_THAT(text, HasSubstr("loss_scale             : 128"));
}

// apex prints the properties table in every process; ampp in rank 0's (or an unlaunched process's) only.
TEST(Properties, TheTablePrintsOnRankZeroOnlyAndVerbosityZeroSilencesIt) {
  auto printed = [](const char* rank, int verbosity) {
    if (rank)
      ::setenv("RANK", rank, 1);
    else
      ::unsetenv("RANK");
    auto net = torch::nn::Linear(2, 2);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    ::testing::internal::CaptureStderr();
    auto amp = ampp::initialize(net, opt, Properties(OptLevel::O2).verbosity(verbosity));
    const std::string out = ::testing::internal::GetCapturedStderr();
    ::unsetenv("RANK");
    return out.find("optimization level O2") != std::string::npos;
  };
  EXPECT_TRUE(printed(nullptr, 1));
  EXPECT_TRUE(printed("0", 1));
  EXPECT_FALSE(printed("1", 1));
  EXPECT_FALSE(printed(nullptr, 0));
}
