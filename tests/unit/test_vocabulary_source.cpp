// The engines' vocabulary for structured output (apps/commands.h): built
// once, in the background from the start, the same for every caller, and
// a source dropped while it builds waits for it rather than leave a thread
// behind.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "apps/commands.h"
#include "support/test_support.h"

namespace troupe::app {
namespace {

TEST(VocabularySource, BuiltOnceInTheBackgroundTheSameForEveryCaller) {
  const auto tokenizer = test::model_path("fortune") / "tokenizer.model";
  VocabularySource source = vocabulary_source(tokenizer, 2000);
  std::vector<std::shared_ptr<const grammar::TokenVocabulary>> got(4);
  std::vector<std::thread> callers;
  for (auto& g : got) callers.emplace_back([&] { g = source(); });
  for (auto& t : callers) t.join();
  ASSERT_NE(got[0], nullptr);
  EXPECT_EQ(got[0]->size(), 2000);
  for (const auto& g : got) EXPECT_EQ(g, got[0]);
  // From the tokenizer a server already holds: the same tokens.
  const auto held = vocabulary_source(Tokenizer::load(tokenizer))();
  ASSERT_NE(held, nullptr);
  ASSERT_EQ(held->size(), got[0]->size());
  for (int id = 0; id < held->size(); ++id) EXPECT_EQ(held->bytes(id), got[0]->bytes(id)) << id;
}

TEST(VocabularySource, DroppedAtOnceOrNeverUsedItStopsCleanly) {
  const auto tokenizer = test::model_path("fortune") / "tokenizer.model";
  for (int i = 0; i < 20; ++i) {
    VocabularySource source = vocabulary_source(tokenizer, 2000);
    if (i % 2) source = nullptr;  // while the warm-up may still run
  }
  // A tokenizer that does not belong to the model: no vocabulary, said once.
  VocabularySource wrong = vocabulary_source(tokenizer, 100);
  EXPECT_EQ(wrong(), nullptr);
  EXPECT_EQ(wrong(), nullptr);
}

}  // namespace
}  // namespace troupe::app
