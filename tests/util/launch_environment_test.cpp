// The one reader of the launch environment: unset and empty variables alike, numbers checked with the
// variable named.
#include <ampp/util/launch_environment.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "ampp_test.h"

namespace {

// Sets the variables for the test's duration and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(LaunchEnvironment, UnsetAndEmptyAreTheSameAndNumbersAreChecked) {
  ScopedEnv world("WORLD_SIZE", nullptr), restarts("TORCHELASTIC_RESTART_COUNT", ""), rank("RANK", "3");
  auto env = ampp::launch_environment();
  EXPECT_FALSE(env.launched());
  EXPECT_EQ(env.world_size_number(), 1);
  EXPECT_EQ(env.restart_count_number(), 0);
  EXPECT_EQ(env.rank, "3");
  {
    ScopedEnv two("WORLD_SIZE", "2"), again("TORCHELASTIC_RESTART_COUNT", "1");
    env = ampp::launch_environment();
    EXPECT_TRUE(env.launched());
    EXPECT_EQ(env.world_size_number(), 2);
    EXPECT_EQ(env.restart_count_number(), 1);
  }
  {
    ScopedEnv bad("WORLD_SIZE", "two");
    AMPP_EXPECT_THROW_WITH(ampp::launch_environment().world_size_number(),
                           "environment variable WORLD_SIZE='two' is not an integer >= 1");
  }
  ScopedEnv zero("WORLD_SIZE", "0");
  AMPP_EXPECT_THROW_WITH(ampp::launch_environment().world_size_number(), "WORLD_SIZE='0' is not an integer >= 1");
}
