#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/restart_intensity.h"

namespace troupe {
namespace {

TEST(RestartIntensity, AtMostNRestartsWithinTheWindow) {
  RestartIntensity r(2, 10);
  EXPECT_TRUE(r.allow_restart(0));
  EXPECT_TRUE(r.allow_restart(1));
  EXPECT_FALSE(r.allow_restart(2));  // the third death within 10 s is final
  EXPECT_EQ(r.restarts(), 2);
  // Once the first restart leaves the window, one more is allowed.
  EXPECT_TRUE(r.allow_restart(10.5));
  EXPECT_FALSE(r.allow_restart(10.6));
  EXPECT_EQ(r.restarts(), 3);
}

TEST(RestartIntensity, ZeroMeansNeverAndBadLimitsAreRefused) {
  RestartIntensity never(0, 5);
  EXPECT_FALSE(never.allow_restart(0));
  EXPECT_THROW(RestartIntensity(-1, 5), std::invalid_argument);
  EXPECT_THROW(RestartIntensity(1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
