// ampp::StateDict (util/state_dict.h) is usable as a user expects (issue 53, item 4): default- and
// brace-constructible, nests in other dicts and IValues as the c10::Dict it holds, copies share entries as
// c10::Dict's and Python's dicts do. And <ampp/util/version.h> agrees with the CMake project's version.
#include <ampp/util/state_dict.h>
#include <ampp/util/version.h>
#include <gtest/gtest.h>

#include <string>

namespace {

TEST(StateDict, IsDefaultAndBraceConstructible) {
  ampp::StateDict empty;
  EXPECT_TRUE(empty.empty());
  ampp::StateDict sd{{"scale", 512.0}, {"_growth_tracker", int64_t{1}}, {"scale", 2.0}};
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd.at("scale").toDouble(), 2.0) << "a repeated key keeps its last value";
  std::vector<std::string> keys;
  for (const auto& item : sd) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"scale", "_growth_tracker"})) << "in insertion order";
}

TEST(StateDict, NestsAsAnIValueDictAndConvertsBack) {
  ampp::StateDict inner{{"lr", 0.1}};
  ampp::StateDict outer;
  outer.insert("inner", inner);
  const c10::IValue value = outer;
  ASSERT_TRUE(value.isGenericDict());
  EXPECT_EQ(value.toGenericDict().at("inner").toGenericDict().at("lr").toDouble(), 0.1);
  const ampp::StateDict::Dict& dict = outer;  // where LibTorch takes the dict itself
  EXPECT_TRUE(dict.contains("inner"));
  ampp::StateDict from_dict = outer.dict();
  EXPECT_EQ(from_dict.size(), 1u);
}

TEST(StateDict, CopiesShareEntriesAndCopyDoesNot) {
  ampp::StateDict a{{"epoch", int64_t{1}}};
  ampp::StateDict shared = a, separate = a.copy();
  a.insert_or_assign("epoch", int64_t{2});
  EXPECT_EQ(shared.at("epoch").toInt(), 2);
  EXPECT_EQ(separate.at("epoch").toInt(), 1);
  EXPECT_EQ(a.erase("epoch"), 1u);
  EXPECT_FALSE(shared.contains("epoch"));
}

TEST(Version, TheMacrosTheFunctionAndTheCMakeProjectAgree) {
  const std::string macros = std::to_string(AMPP_VERSION_MAJOR) + "." + std::to_string(AMPP_VERSION_MINOR) + "." +
                             std::to_string(AMPP_VERSION_PATCH);
  EXPECT_EQ(ampp::version(), macros);
  EXPECT_EQ(macros, AMPP_PROJECT_VERSION);
  EXPECT_TRUE(AMPP_VERSION_AT_LEAST(0, 2, 0));
  EXPECT_TRUE(AMPP_VERSION_AT_LEAST(AMPP_VERSION_MAJOR, AMPP_VERSION_MINOR, AMPP_VERSION_PATCH));
  EXPECT_FALSE(AMPP_VERSION_AT_LEAST(AMPP_VERSION_MAJOR, AMPP_VERSION_MINOR + 1, 0));
  EXPECT_FALSE(AMPP_VERSION_AT_LEAST(AMPP_VERSION_MAJOR + 1, 0, 0));
}

}  // namespace
