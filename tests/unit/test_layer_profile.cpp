// Per-layer profiling for the partitioner: one measured time per layer and
// the bytes each layer's stage would hold (deploy/engine_builder's
// balanced_stages turns them into stages: test_engine_builder.cpp). Times
// are only checked for sanity here (timing belongs in benchmarks).
#include <gtest/gtest.h>

#include <cmath>

#include "gpu/layer_profile.h"
#include "gpu/model.h"
#include "support/test_support.h"

namespace troupe {
namespace {

TEST(LayerProfile, OneTimePerLayerAndTheBytesEachLayerBrings) {
  const auto ck = load_checkpoint(test::model_path("fortune"));  // 5 layers, tied embedding
  LayerProfileOptions o;
  o.repeats = 3;
  const LayerProfile p = profile_layers(ck, DType::F32, o);
  ASSERT_EQ(p.seconds.size(), 5u);
  ASSERT_EQ(p.weight_bytes.size(), 5u);
  for (double t : p.seconds) {
    EXPECT_TRUE(std::isfinite(t));
    EXPECT_GT(t, 0);
  }
  // The first layer brings the embedding and the last the classifier; the
  // middle ones are alike.
  EXPECT_EQ(p.weight_bytes[1], p.weight_bytes[2]);
  EXPECT_GT(p.weight_bytes[0], p.weight_bytes[1]);
  EXPECT_GT(p.weight_bytes[4], p.weight_bytes[1]);
  const Model whole(ck, DType::F32);
  uint64_t sum = 0;
  for (uint64_t b : p.weight_bytes) sum += b;
  EXPECT_GE(sum, whole.weight_bytes());
  LayerProfileOptions bad;
  bad.batch = 0;
  EXPECT_THROW(profile_layers(ck, DType::F32, bad), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
