// Models built by name.
#include <ampp/train/gpt.h>
#include <ampp/train/models.h>
#include <gtest/gtest.h>

#include "ampp_test.h"

using namespace ampp::train;

TEST(Models, EachNameBuildsAModelWithTheRightOutputShape) {
  torch::manual_seed(0);
  for (const auto& name : model_names()) {
    if (is_gpt(name)) continue;  // text: gpt_test.cpp
    auto model = make_model(name, ModelOptions().num_classes(7));
    auto out = model->forward(torch::randn({3, 1, 28, 28}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 7})) << name;
    out.sum().backward();
    for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  }
}

TEST(Models, CnnAndResnetHaveBatchNorm) {
  for (const std::string name : {"cnn", "resnet"}) {
    auto model = make_model(name);
    int bn = 0;
    for (const auto& m : model->modules()) bn += m->as<torch::nn::BatchNorm2d>() != nullptr;
    EXPECT_GE(bn, 2) << name;
  }
}

TEST(Models, SameSeedSameWeights) {
  torch::manual_seed(3);
  auto a = make_model("cnn");
  torch::manual_seed(3);
  auto b = make_model("cnn");
  auto pa = a->parameters(), pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

TEST(Models, UnknownNameListsTheChoices) {
  AMPP_EXPECT_THROW_WITH(make_model("vgg"), "choose one of: mlp, cnn, resnet");
}
