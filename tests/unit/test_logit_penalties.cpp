// Penalties and logit bias: the arithmetic on the ids they touch, that the
// draw from an adjusted row is the draw a plain sampler makes from the same
// numbers, and that a sequence rebuilt from its history continues exactly.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/logit_penalties.h"
#include "gpu/sampler.h"
#include "util/rng.h"

namespace troupe {
namespace {

std::vector<float> random_logits(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed ^ 0x5eedull);
  std::vector<float> v(n);
  for (auto& x : v) x = float((rng.next_double() * 2 - 1) * 3);
  return v;
}

SamplingParams penalized(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.presence_penalty = 0.25f;
  p.frequency_penalty = 0.5f;
  p.repetition_penalty = 2;
  p.logit_bias = {{3, 1.0f}, {5, -100.0f}};
  return p;
}

TEST(LogitPenalties, TouchOnlyTheIdsTheyNameInVllmsOrder) {
  LogitPenalties pen(penalized(1, 0));
  // Prompt {0, 3}, output {2, 2, 1}.
  pen.reset(std::vector<int>{0, 3, 2, 2, 1}, 3);
  EXPECT_EQ(pen.output_count(2), 2);
  EXPECT_EQ(pen.output_count(0), 0);
  const std::vector<float> logits = {1, -1, 2, 0.5f, 7, 4, -3};
  std::vector<float> out;
  pen.apply(logits, out);
  ASSERT_EQ(out.size(), logits.size());
  EXPECT_FLOAT_EQ(out[0], 0.5f);    // prompt only: repetition, 1 / 2
  EXPECT_FLOAT_EQ(out[1], -2.75f);  // -1 * 2, - 0.5 * 1, - 0.25
  EXPECT_FLOAT_EQ(out[2], -0.25f);  // 2 / 2, - 0.5 * 2, - 0.25
  EXPECT_FLOAT_EQ(out[3], 0.75f);   // + 1 bias, then / 2
  EXPECT_FLOAT_EQ(out[4], 7.0f);    // untouched
  EXPECT_FLOAT_EQ(out[5], -96.0f);  // bias only
  EXPECT_FLOAT_EQ(out[6], -3.0f);
  // A new output token joins both the counts and the seen set.
  pen.record(6);
  pen.apply(logits, out);
  EXPECT_FLOAT_EQ(out[6], -3.0f * 2 - 0.5f - 0.25f);
  EXPECT_THROW(pen.reset(std::vector<int>{1, 2}, 3), std::invalid_argument);
}

TEST(LogitPenalties, BadParametersThrowNamingThem) {
  auto throws_naming = [](SamplingParams p, const std::string& name) {
    try {
      LogitPenalties pen(p);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(name) != std::string::npos;
    }
    return false;
  };
  SamplingParams p;
  p.presence_penalty = 2.5f;
  EXPECT_TRUE(throws_naming(p, "presence_penalty"));
  p = {};
  p.frequency_penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_naming(p, "frequency_penalty"));
  p = {};
  p.repetition_penalty = 0;
  EXPECT_TRUE(throws_naming(p, "repetition_penalty"));
  p = {};
  p.logit_bias = {{1, 101.0f}};
  EXPECT_TRUE(throws_naming(p, "logit_bias"));
}

// The adjusted draw is a plain sampler's draw from the adjusted numbers,
// step after step, with each sampled id counted.
TEST(LogitPenalties, SequenceSamplersDrawFromTheAdjustedRow) {
  for (float temperature : {0.0f, 0.8f}) {
    SequenceSamplers samplers;
    StepItem item;
    item.seq = 7;
    item.sample = true;
    item.sampling = penalized(temperature, 42);
    item.history = {4, 0, 3};  // the prompt; nothing generated yet
    Sampler plain(SamplingParams{temperature, 1, 0, 42});
    LogitPenalties mirror(item.sampling);
    mirror.reset(item.history, 0);
    std::vector<int> seen;
    for (int step = 0; step < 40; ++step) {
      const auto logits = random_logits(16, uint64_t(step % 3));  // repeats, so ids repeat
      std::vector<float> adjusted;
      mirror.apply(logits, adjusted);
      const int want = plain.sample(adjusted);
      mirror.record(want);
      std::optional<TokenLogprobs> lp;
      item.sampling.logprobs = 2;
      const int got = samplers.sample(item, logits, &lp);
      ASSERT_EQ(got, want) << "step " << step << " temperature " << temperature;
      // Log-probabilities are of the logits as given, before any penalty.
      ASSERT_TRUE(lp.has_value());
      EXPECT_EQ(lp->logprob, token_logprobs(logits, got, 0).logprob);
      EXPECT_NE(got, 5);  // biased -100
      seen.push_back(got);
      item.history.clear();
      item.generated = step + 1;
    }
    // The penalties made the greedy run leave its first choice.
    if (temperature == 0) {
      EXPECT_GT(std::set<int>(seen.begin(), seen.end()).size(), 3u);
    }
    samplers.release(7);
  }
}

// vLLM's min_tokens: the model's EOS ids and the request's stop_token_ids
// are not drawn for the first min_tokens tokens, counted from where a
// resumed sequence is; logprobs still see the row as the model gave it.
TEST(LogitPenalties, MinTokensKeepsTheEndIdsFromBeingDrawn) {
  std::vector<float> logits(12, 0.0f);
  logits[2] = 9;  // EOS, by far the likeliest
  logits[5] = 8;  // a stop id, next
  logits[7] = 7;
  for (float temperature : {0.0f, 1.0f}) {
    for (int resumed_at : {0, 2}) {
      SequenceSamplers samplers;
      samplers.set_eos_ids({2});
      StepItem item;
      item.seq = 3;
      item.sample = true;
      item.sampling.temperature = temperature;
      item.sampling.seed = 5;
      item.sampling.min_tokens = 4;
      item.sampling.stop_token_ids = {5};
      item.sampling.logprobs = 0;
      item.generated = resumed_at;
      for (int n = resumed_at; n < 4; ++n) {
        std::optional<TokenLogprobs> lp;
        const int id = samplers.sample(item, logits, &lp);
        ASSERT_NE(id, 2) << n;
        ASSERT_NE(id, 5) << n;
        if (temperature == 0) {
          EXPECT_EQ(id, 7);
        }
        ASSERT_TRUE(lp);
        EXPECT_EQ(lp->logprob, token_logprobs(logits, id, 0).logprob);
      }
      // The fifth token may end it.
      if (temperature == 0) {
        EXPECT_EQ(samplers.sample(item, logits), 2);
      }
    }
  }
  SamplingParams bad;
  bad.min_tokens = -1;
  EXPECT_THROW(LogitPenalties{bad}, std::invalid_argument);
}

// vLLM's allowed_token_ids and bad_words: only the allowed ids remain; a
// bad word's last id goes where the output ends with the ids before it, and
// a sequence rebuilt from its history knows how its output ends.
TEST(LogitPenalties, AllowedIdsAndBadWords) {
  const std::vector<float> logits = random_logits(10, 4);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.allowed_token_ids = {1, 4, 9};
  std::vector<float> out;
  LogitPenalties allowed(p);
  allowed.apply(logits, out);
  for (size_t id = 0; id < 10; ++id)
    EXPECT_EQ(out[id], id == 1 || id == 4 || id == 9 ? logits[id] : kMasked) << id;

  SamplingParams b;
  b.bad_words = {{7}, {2, 3}, {5, 6, 8}};
  LogitPenalties bad(b);
  bad.reset(std::vector<int>{1, 1}, 0);  // a prompt that ends in 2 3 counts for nothing
  auto masked = [&](LogitPenalties& lp) {
    lp.apply(logits, out);
    std::vector<int> ids;
    for (size_t id = 0; id < out.size(); ++id)
      if (out[id] == kMasked) ids.push_back(int(id));
    return ids;
  };
  EXPECT_EQ(masked(bad), (std::vector<int>{7}));
  bad.record(2);
  EXPECT_EQ(masked(bad), (std::vector<int>{3, 7}));
  bad.record(5);
  EXPECT_EQ(masked(bad), (std::vector<int>{7}));
  bad.record(6);
  EXPECT_EQ(masked(bad), (std::vector<int>{7, 8}));
  // Rebuilt from the sequence (prompt 2, then output 9 5 6): the output ends
  // with 5 6, so 8 goes; the prompt's 2 is not output.
  LogitPenalties resumed(b);
  resumed.reset(std::vector<int>{2, 9, 5, 6}, 3);
  EXPECT_EQ(masked(resumed), (std::vector<int>{7, 8}));
  resumed.reset(std::vector<int>{2, 3, 1}, 1);
  EXPECT_EQ(masked(resumed), (std::vector<int>{7}));
  // Bad words depend on the tokens: the scheduler sends the history for them.
  EXPECT_TRUE(b.penalizes());
  EXPECT_TRUE(p.adjusts_logits());
  EXPECT_FALSE(p.penalizes());
}

// A sequence stopped after k tokens and started again elsewhere, from its
// history, draws what it would have drawn.
TEST(LogitPenalties, ASequenceResumedFromItsHistoryContinuesExactly) {
  for (float temperature : {0.0f, 1.0f}) {
    const std::vector<int> prompt = {1, 2, 3, 2};
    auto run = [&](SequenceSamplers& samplers, std::vector<int> tokens, int generated, int steps) {
      StepItem item;
      item.seq = 1;
      item.sample = true;
      item.sampling = penalized(temperature, 9);
      item.history = tokens;
      item.generated = generated;
      std::vector<int> out;
      for (int k = 0; k < steps; ++k) {
        const int pos = int(tokens.size());
        const int id = samplers.sample(item, random_logits(12, uint64_t(pos % 4)));
        out.push_back(id);
        tokens.push_back(id);
        item.history.clear();
        item.generated = ++generated;
      }
      return out;
    };
    SequenceSamplers whole;
    const std::vector<int> want = run(whole, prompt, 0, 12);
    for (int k : {1, 5, 11}) {
      std::vector<int> tokens = prompt;
      tokens.insert(tokens.end(), want.begin(), want.begin() + k);
      SequenceSamplers elsewhere;
      const std::vector<int> rest = run(elsewhere, tokens, k, 12 - k);
      EXPECT_EQ(rest, std::vector<int>(want.begin() + k, want.end()))
          << "resumed after " << k << ", temperature " << temperature;
    }
  }
}

TEST(LogitPenalties, SamplingWithoutThemIsUntouched) {
  SequencePenalties pens;
  StepItem item;
  item.seq = 3;
  item.history = {1, 2};
  const std::vector<float> logits = {1, 2, 3};
  const auto row = pens.adjust(item, logits);
  EXPECT_EQ(row.data(), logits.data());  // no copy
  EXPECT_EQ(pens.size(), 0u);
  item.sampling.logit_bias = {{0, 5.0f}};
  EXPECT_EQ(pens.adjust(item, logits)[0], 6.0f);
  EXPECT_EQ(pens.size(), 1u);
  pens.release(3);
  EXPECT_EQ(pens.size(), 0u);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// A vocabulary of digits, brackets and commas, for grammar tests: ids 0-1 are
// BOS and EOS (control), the rest text.
VocabularySource digits_vocabulary() {
  std::vector<std::string> bytes = {"<s>", "</s>", "[",  "]",  ",", "0",
                                    "1",   "2",    "12", "[1", "x", " "};
  std::vector<bool> control(bytes.size(), false);
  control[0] = control[1] = true;
  auto vocab = std::make_shared<const grammar::TokenVocabulary>(bytes, control);
  return [vocab] { return vocab; };
}

// Structured output: whatever the model prefers, what is drawn follows the
// grammar, the end only once the text is a whole match; greedy and seeded
// draws alike, and resumed from the history exactly as if not stopped.
TEST(LogitPenalties, AGrammarHoldsTheDrawsToItsMatches) {
  const std::string gbnf = "root ::= \"[\" [0-9] (\",\" [0-9])* \"]\"\n";
  const auto vocab = digits_vocabulary()();
  for (float temperature : {0.0f, 1.0f}) {
    auto run = [&](std::vector<int> tokens, int generated, int steps) {
      SequenceSamplers samplers;
      samplers.set_eos_ids({1});
      samplers.set_vocabulary(digits_vocabulary());
      StepItem item;
      item.seq = 3;
      item.sample = true;
      item.sampling.temperature = temperature;
      item.sampling.seed = 5;
      item.sampling.grammar = gbnf;
      item.history = tokens;
      item.generated = generated;
      std::vector<int> out;
      for (int k = 0; k < steps; ++k) {
        // Logits that favour what the grammar refuses ("x", " ", EOS early).
        std::vector<float> logits = random_logits(12, uint64_t(tokens.size()));
        logits[10] = logits[11] = 8;
        logits[1] = 7;
        const int id = samplers.sample(item, logits);
        out.push_back(id);
        tokens.push_back(id);
        item.history.clear();
        item.generated = ++generated;
        if (id == 1) break;
      }
      return out;
    };
    const std::vector<int> prompt = {0, 10, 11};
    const std::vector<int> whole = run(prompt, 0, 40);
    ASSERT_FALSE(whole.empty());
    ASSERT_EQ(whole.back(), 1) << "the grammar ends; EOS is then the only draw";
    std::string text;
    for (size_t i = 0; i + 1 < whole.size(); ++i) text += vocab->bytes(whole[i]);
    grammar::Matcher m(std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf)));
    EXPECT_TRUE(m.accept(text) && m.is_complete()) << text << " at temperature " << temperature;
    for (size_t k = 1; k + 1 < whole.size(); k += 2) {
      std::vector<int> tokens = prompt;
      tokens.insert(tokens.end(), whole.begin(), whole.begin() + long(k));
      EXPECT_EQ(run(tokens, int(k), 40), std::vector<int>(whole.begin() + long(k), whole.end()))
          << "resumed after " << k << " at temperature " << temperature;
    }
  }
}

// Tokens of a reasoning model's answer: "<think>", "</think>", words,
// whitespace, and the digits grammar's own.
struct ReasoningVocab {
  enum : int {
    Bos,
    Eos,
    Open,
    Close,
    Hmm,
    Para,
    Space,
    Th,
    Ink,
    Lbr,
    SpaceLbr,
    Rbr,
    Comma,
    One,
    X
  };
  static VocabularySource source() {
    std::vector<std::string> bytes = {"<s>",  "</s>", "<think>", "</think>", "hmm",
                                      "\n\n", " ",    "<th",     "ink>",     "[",
                                      " [",   "]",    ",",       "1",        "x"};
    std::vector<bool> control(bytes.size(), false);
    control[Bos] = control[Eos] = true;
    auto vocab = std::make_shared<const grammar::TokenVocabulary>(bytes, control);
    return [vocab] { return vocab; };
  }
  static void set_up(SequenceSamplers& samplers) {
    samplers.set_eos_ids({Eos});
    samplers.set_vocabulary(source());
  }
  // Sequence `seq`'s item, greedy under `grammar` with its reasoning at `start`.
  static StepItem item(uint64_t seq, const std::string& grammar, ReasoningStart start) {
    StepItem item;
    item.seq = seq;
    item.sample = true;
    item.sampling.temperature = 0;
    item.sampling.grammar = grammar;
    item.sampling.reasoning = start;
    return item;
  }
};

// With a reasoning parser the grammar shapes the reply, not the reasoning
// (vLLM's semantics): the reasoning is free; the reply right after
// "</think>" follows the grammar; an answer that may have no reasoning
// (qwen3) opens "<think>" or starts the reply.
TEST(LogitPenalties, WithReasoningTheGrammarShapesTheReplyAfterIt) {
  using V = ReasoningVocab;
  const std::string gbnf = "root ::= \"[\" [0-9] (\",\" [0-9])* \"]\"\n";
  // Greedy draws where each step's logits favour one token, then "x" (which
  // no grammar here takes), then "]" a little.
  auto draw = [&](ReasoningStart start, const std::vector<std::vector<int>>& favoured,
                  const std::string* other_grammar = nullptr) {
    SequenceSamplers samplers;
    V::set_up(samplers);
    StepItem item = V::item(1, other_grammar ? *other_grammar : gbnf, start);
    std::vector<int> out;
    for (const auto& ids : favoured) {
      std::vector<float> logits(15, 0.0f);
      logits[V::X] = 5;
      logits[V::Rbr] = 1;
      float v = 9;
      for (int id : ids) logits[size_t(id)] = v--;
      out.push_back(samplers.sample(item, logits));
    }
    return out;
  };
  using R = ReasoningStart;
  // Reasoning opened by the answer is free, "x" included; the reply then
  // follows the grammar from its first byte ("\n\n" is not the grammar's).
  EXPECT_EQ(
      draw(R::Optional, {{V::Open}, {V::X}, {V::Hmm}, {V::Close}, {V::Para, V::Lbr}, {V::One}}),
      (std::vector<int>{V::Open, V::X, V::Hmm, V::Close, V::Lbr, V::One}));
  // Where the prompt opened it, the answer starts inside the reasoning.
  EXPECT_EQ(draw(R::Open, {{V::Hmm}, {V::Eos}}), (std::vector<int>{V::Hmm, V::Eos}));
  EXPECT_EQ(draw(R::Open, {{V::Close}, {V::SpaceLbr}, {V::Hmm, V::One}}),
            (std::vector<int>{V::Close, V::Lbr, V::One}));
  // qwen3 without "<think>": the grammar from the first token of the reply.
  EXPECT_EQ(draw(R::Optional, {{V::Hmm, V::Lbr}, {V::Para}, {V::Eos}}),
            (std::vector<int>{V::Lbr, V::One, V::Rbr}))
      << "'hmm' is neither reasoning nor the grammar's; '\n\n' inside the reply neither";
  // Whitespace the grammar takes may come before "<think>" too.
  const std::string spaced = "root ::= [ ]* \"[\" [0-9] \"]\"\n";
  EXPECT_EQ(draw(R::Optional, {{V::Space}, {V::Open}, {V::X}}, &spaced),
            (std::vector<int>{V::Space, V::Open, V::X}));
  EXPECT_EQ(draw(R::Optional, {{V::Space}, {V::SpaceLbr}, {V::Hmm, V::One}}, &spaced),
            (std::vector<int>{V::Space, V::SpaceLbr, V::One}));
  EXPECT_EQ(draw(R::Optional, {{V::Space}, {V::Th, V::Lbr}}, &spaced),
            (std::vector<int>{V::Space, V::Lbr}));
  // "<think>" comes whole: its first bytes alone are text like any other.
  EXPECT_EQ(draw(R::Optional, {{V::Th, V::Lbr}}), (std::vector<int>{V::Lbr}));
  // Where the grammar takes them, the rest of the marker may follow.
  const std::string tag = "root ::= \"<th\" [a-z]+\n";
  EXPECT_EQ(draw(R::Optional, {{V::Th}, {V::Lbr, V::Ink}, {V::X}}, &tag),
            (std::vector<int>{V::Th, V::Ink, V::X}));
  EXPECT_EQ(draw(R::Optional, {{V::Th}, {V::Lbr, V::Hmm}, {V::Eos}}, &tag),
            (std::vector<int>{V::Th, V::Hmm, V::Eos}));
  // Without a reasoning parser "<think>" is text the grammar refuses.
  EXPECT_EQ(draw(R::None, {{V::Open, V::Lbr}}), (std::vector<int>{V::Lbr}));

  // Sampled at random, with the model tempted everywhere: the reply the
  // front end's filter tells from the answer follows the grammar, and a
  // sequence resumed from its history continues exactly.
  const auto vocab = V::source()();
  for (R start : {R::Optional, R::Open, R::None}) {
    int reasoned = 0, replied = 0;  // answers with reasoning; with a whole reply
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      auto run = [&](std::vector<int> tokens, int generated) {
        SequenceSamplers samplers;
        V::set_up(samplers);
        StepItem item = V::item(3, gbnf, start);
        item.sampling.temperature = 1;
        item.sampling.seed = seed;
        item.history = tokens;
        item.generated = generated;
        std::vector<int> out;
        while (generated < 60) {
          std::vector<float> logits = random_logits(15, seed * 1000 + uint64_t(tokens.size()));
          logits[V::X] += 2;
          const int id = samplers.sample(item, logits);
          out.push_back(id);
          tokens.push_back(id);
          item.history.clear();
          item.generated = ++generated;
          if (id == V::Eos) break;
        }
        return out;
      };
      const std::vector<int> prompt = {V::Bos, V::X};
      const std::vector<int> whole = run(prompt, 0);
      ReasoningFilter filter(start);
      std::string reply;
      for (int id : whole)
        if (id != V::Eos) reply += filter.push(vocab->bytes(id)).content;
      reply += filter.finish().content;
      grammar::Matcher m(std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf)));
      ASSERT_TRUE(m.accept(reply)) << "reply " << reply << ", seed " << seed;
      if (whole.back() == V::Eos && filter.in_content()) {
        EXPECT_TRUE(m.is_complete()) << reply;
        replied += m.is_complete() ? 1 : 0;
      }
      reasoned += filter.has_reasoning() ? 1 : 0;
      for (size_t k = 1; k < whole.size(); k += 3) {
        std::vector<int> tokens = prompt;
        tokens.insert(tokens.end(), whole.begin(), whole.begin() + long(k));
        ASSERT_EQ(run(tokens, int(k)), std::vector<int>(whole.begin() + long(k), whole.end()))
            << "resumed after " << k << ", seed " << seed;
      }
    }
    // The draws went every way the test means to check.
    EXPECT_GT(replied, 5) << int(start);
    const int expected_low = start == R::Optional ? 6 : start == R::Open ? 40 : 0;
    const int expected_high = start == R::Optional ? 34 : start == R::Open ? 40 : 0;
    EXPECT_GE(reasoned, expected_low) << int(start);
    EXPECT_LE(reasoned, expected_high) << int(start);
  }
}

// A grammar the engine cannot follow (no vocabulary; a text that does not
// parse, which the front end and the wire checks refuse before) ends the
// sequence at once, logged, instead of failing the step of every sequence.
TEST(LogitPenalties, AGrammarTheEngineCannotFollowEndsTheSequence) {
  for (const std::string gbnf : {"root ::= \"a\"\n", "root ::= (\n"}) {
    for (bool with_vocabulary : {false, true}) {
      if (!with_vocabulary && gbnf != "root ::= \"a\"\n") continue;
      SequenceSamplers samplers;
      samplers.set_eos_ids({1});
      if (with_vocabulary) samplers.set_vocabulary(digits_vocabulary());
      StepItem item;
      item.seq = 1;
      item.sample = true;
      item.sampling.grammar = gbnf;
      std::vector<float> logits(12, 0.0f);
      logits[5] = 9;
      EXPECT_EQ(samplers.sample(item, logits), 1) << gbnf;
    }
  }
}

}  // namespace
}  // namespace troupe
