// What a receiver checks of a message from another process
// (actors/wire_checks.h): the real messages pass, each kind of nonsense is
// refused naming its field. The fuzz target tests/fuzz/fuzz_wire_messages.cpp
// drives the same checks with decoded messages; its seeds are the real
// messages of tests/fuzz/wire_samples.h, checked here to be what the wire
// types write today.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>

#include "actors/wire_checks.h"
#include "fuzz/wire_samples.h"
#include "support/test_support.h"

namespace troupe {
namespace {

using fuzz::WireMessage;

template <class T>
T sample(const std::string& name) {
  for (const auto& s : fuzz::wire_samples())
    if (s.name == name) {
      T x;
      size_t rest = 0;
      EXPECT_FALSE(fuzz::wire_decode(s.bytes.data() + 1, s.bytes.size() - 1, rest, x)) << name;
      EXPECT_EQ(rest, 0u) << name;
      return x;
    }
  ADD_FAILURE() << "no sample " << name;
  return T{};
}

bool names(const std::string& problem, const std::string& what) {
  return problem.find(what) != std::string::npos;
}

// The committed seeds (scripts/fuzz.sh writes them with wire_seeds) are the
// samples as the wire types serialize them now: after a change to a wire
// type, run scripts/fuzz.sh wire_messages (and bump kWireProtocol).
TEST(WireSeeds, TheCommittedSeedsAreTheSamplesAsSerializedNow) {
  const auto dir = test::source_dir() / "tests/fuzz/corpus/wire_messages";
  for (const auto& s : fuzz::wire_samples()) {
    const auto path = dir / ("seed-" + s.name);
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    EXPECT_EQ(test::read_file(path), std::string(s.bytes.begin(), s.bytes.end())) << path;
  }
}

TEST(WireChecks, TheRealMessagesPass) {
  EXPECT_EQ(replica_plan_problem(sample<ReplicaPlan>("replica-plan-whole")), "");
  EXPECT_EQ(replica_plan_problem(sample<ReplicaPlan>("replica-plan-spanning")), "");
  EXPECT_EQ(replica_plan_problem(sample<ReplicaPlan>("replica-plan-tensor")), "");
  EXPECT_EQ(assignment_problem(sample<Assignment>("assignment-new"), 300, 128), "");
  EXPECT_EQ(assignment_problem(sample<Assignment>("assignment-resumed"), 300, 128), "");
  EXPECT_EQ(step_events_problem(sample<StepEvents>("step-events-step")), "");
  EXPECT_EQ(step_events_problem(sample<StepEvents>("step-events-ended")), "");
  EXPECT_EQ(fault_order_problem(sample<FaultOrder>("fault-order-slow")), "");
  EXPECT_EQ(fault_order_problem(sample<FaultOrder>("fault-order-kill-shard")), "");
  EXPECT_EQ(fault_order_problem(sample<FaultOrder>("fault-order-kv-end")), "");
  EXPECT_EQ(fault_report_problem(sample<FaultReport>("fault-report-confirmed")), "");
  for (const std::string name : {"step-prefill", "step-mixed"})
    for (const auto& s : fuzz::wire_samples())
      if (s.name == name) {
        std::vector<StepItem> items;
        int m = 0;
        size_t rest = 0;
        ASSERT_FALSE(fuzz::wire_decode(s.bytes.data() + 1, s.bytes.size() - 1, rest, items, m));
        EXPECT_EQ(step_problem(items, m, {300, 128, 48, 16, 4, 64}), "") << name;
      }
}

TEST(WireChecks, SamplingAsTheSamplerTakesIt) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sampling_problem({0, 1, 0, 0}), "");
  EXPECT_TRUE(names(sampling_problem({-1, 1, 0, 0}), "temperature"));
  EXPECT_TRUE(names(sampling_problem({nan, 1, 0, 0}), "temperature"));
  EXPECT_TRUE(names(sampling_problem({INFINITY, 1, 0, 0}), "temperature"));
  EXPECT_TRUE(names(sampling_problem({1, 0, 0, 0}), "top_p"));
  EXPECT_TRUE(names(sampling_problem({1, 1.5f, 0, 0}), "top_p"));
  EXPECT_TRUE(names(sampling_problem({1, nan, 0, 0}), "top_p"));
  EXPECT_TRUE(names(sampling_problem({1, 1, -1, 0}), "top_k"));
  EXPECT_EQ(sampling_problem({1, 1, 0, 0, kMaxLogprobs}), "");
  EXPECT_TRUE(names(sampling_problem({1, 1, 0, 0, -2}), "logprobs"));
  EXPECT_TRUE(names(sampling_problem({1, 1, 0, 0, kMaxLogprobs + 1}), "logprobs"));
}

TEST(WireChecks, PenaltiesAndBiasAsTheSamplerTakesThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto change) {
    SamplingParams p;
    change(p);
    return p;
  };
  EXPECT_EQ(sampling_problem(with([](auto& p) {
                               p.presence_penalty = -2;
                               p.frequency_penalty = 2;
                               p.repetition_penalty = 2;
                               p.logit_bias = {{0, -100.0f}, {299, 100.0f}};
                             }),
                             300),
            "");
  EXPECT_TRUE(names(sampling_problem(with([&](auto& p) { p.presence_penalty = nan; })),
                    "presence_penalty"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.frequency_penalty = -2.5f; })),
                    "frequency_penalty"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.repetition_penalty = 0; })),
                    "repetition_penalty"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                                       p.logit_bias = {{300, 1.0f}};
                                     }),
                                     300),
                    "outside the vocabulary"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.logit_bias = {{-1, 1.0f}};
                    })),
                    "outside the vocabulary"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.logit_bias = {{5, 1.0f}, {5, 2.0f}};
                    })),
                    "not ascending"));
  EXPECT_TRUE(names(sampling_problem(with([&](auto& p) {
                      p.logit_bias = {{5, nan}};
                    })),
                    "outside [-100"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.logit_bias.resize(size_t(kMaxLogitBias) + 1);
                      for (int i = 0; i <= kMaxLogitBias; ++i) p.logit_bias[size_t(i)] = {i, 0.0f};
                    })),
                    "entries"));
}

TEST(WireChecks, AStepItemsHistoryIsTheWholeSequence) {
  StepItem it;
  it.seq = 1;
  it.tokens = {7, 8};
  it.position = 3;
  it.blocks = {0};
  it.sample = true;
  it.generated = 1;
  it.sampling.frequency_penalty = 1;
  it.history = {1, 2, 3, 7, 8};
  const StepLimits limits{300, 128, 48, 16, 4, 64};
  EXPECT_EQ(step_problem({it}, 1, limits), "");
  StepItem short_history = it;
  short_history.history.pop_back();
  EXPECT_TRUE(names(step_problem({short_history}, 1, limits), "history has 4 tokens"));
  StepItem bad_id = it;
  bad_id.history[0] = 300;
  EXPECT_TRUE(names(step_problem({bad_id}, 1, limits), "history token id 300"));
  // A prefill chunk that does not sample may know more of its sequence.
  StepItem chunk = it;
  chunk.sample = false;
  chunk.history.push_back(9);
  EXPECT_EQ(step_problem({chunk}, 1, limits), "");
  chunk.history.resize(4);
  EXPECT_TRUE(names(step_problem({chunk}, 1, limits), "fewer than the 5"));
  chunk.history.assign(129, 1);
  EXPECT_TRUE(names(step_problem({chunk}, 1, limits), "more than the context length"));
  StepItem too_many = it;
  too_many.generated = 6;
  EXPECT_TRUE(names(step_problem({too_many}, 1, limits), "more than its history"));
}

// Penalties and bias cross as they are: the bias's values bit for bit.
TEST(WireChecks, VllmSamplingOptionsAsTheSamplerTakesThem) {
  auto with = [](auto change) {
    SamplingParams p;
    change(p);
    return p;
  };
  EXPECT_EQ(sampling_problem(with([](auto& p) {
                               p.min_p = 1;
                               p.min_tokens = 7;
                               p.stop_token_ids = {0, 4, 299};
                             }),
                             300),
            "");
  EXPECT_TRUE(names(
      sampling_problem(with([](auto& p) { p.min_p = std::numeric_limits<float>::quiet_NaN(); })),
      "min_p"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.min_p = 1.01f; })), "min_p"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.min_tokens = -3; })), "min_tokens"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.stop_token_ids = {300}; }), 300),
                    "outside the vocabulary"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.stop_token_ids = {4, 4};
                    })),
                    "not ascending"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.stop_token_ids.resize(size_t(kMaxStopTokenIds) + 1);
                      for (int i = 0; i <= kMaxStopTokenIds; ++i) p.stop_token_ids[size_t(i)] = i;
                    })),
                    "entries"));
  EXPECT_EQ(sampling_problem(with([](auto& p) {
                               p.allowed_token_ids = {1, 2, 299};
                               p.bad_words = {{5}, {6, 7}};
                             }),
                             300),
            "");
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                      p.allowed_token_ids = {2, 1};
                    })),
                    "allowed_token_ids are not ascending"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.bad_words = {{}}; })), "bad_words"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) {
                                       p.bad_words = {{4, 300}};
                                     }),
                                     300),
                    "bad_words id"));
  EXPECT_TRUE(names(
      sampling_problem(with([](auto& p) { p.bad_words.assign(size_t(kMaxBadWords) + 1, {1}); })),
      "bad_words has"));
  EXPECT_TRUE(
      names(sampling_problem(with([](auto& p) { p.grammar.assign(kMaxGrammarBytes + 1, 'x'); })),
            "sampling.grammar has"));
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.grammar = "root ::= (\"a\""; })),
                    "sampling.grammar: grammar: line 1"));
  EXPECT_EQ(sampling_problem(with([](auto& p) { p.grammar = "root ::= [0-9]+"; })), "");
  EXPECT_TRUE(names(sampling_problem(with([](auto& p) { p.reasoning = ReasoningStart(7); })),
                    "sampling.reasoning 7"));
  // And they cross exactly.
  SamplingParams p;
  p.grammar = "root ::= \"{\" [^}]* \"}\"\n";
  p.reasoning = ReasoningStart::Optional;
  p.allowed_token_ids = {0, 9};
  p.bad_words = {{1, 2}, {3}};
  p.min_p = 1e-40f;
  p.min_tokens = 12;
  p.stop_token_ids = {3, 8};
  const auto bytes = fuzz::wire_encode(p);
  SamplingParams q;
  size_t rest = 0;
  ASSERT_FALSE(fuzz::wire_decode(bytes.data(), bytes.size(), rest, q));
  EXPECT_EQ(rest, 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(q.min_p), std::bit_cast<uint32_t>(p.min_p));
  EXPECT_EQ(q.min_tokens, 12);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(q.allowed_token_ids, p.allowed_token_ids);
  EXPECT_EQ(q.bad_words, p.bad_words);
  EXPECT_EQ(q.grammar, p.grammar);
  EXPECT_EQ(q.reasoning, ReasoningStart::Optional);
}

TEST(WireChecks, PenaltiesCrossTheWireExactly) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -1e-40f;  // a subnormal, which CAF's own float encoding mangles
  p.repetition_penalty = 1.25f;
  p.logit_bias = {{3, -0.0f}, {17, 99.5f}, {40, -1e-39f}};
  const auto bytes = fuzz::wire_encode(p);
  SamplingParams q;
  size_t rest = 0;
  ASSERT_FALSE(fuzz::wire_decode(bytes.data(), bytes.size(), rest, q));
  EXPECT_EQ(rest, 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(q.frequency_penalty),
            std::bit_cast<uint32_t>(p.frequency_penalty));
  EXPECT_EQ(q.presence_penalty, p.presence_penalty);
  EXPECT_EQ(q.repetition_penalty, p.repetition_penalty);
  ASSERT_EQ(q.logit_bias.size(), p.logit_bias.size());
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    EXPECT_EQ(q.logit_bias[i].first, p.logit_bias[i].first);
    EXPECT_EQ(std::bit_cast<uint32_t>(q.logit_bias[i].second),
              std::bit_cast<uint32_t>(p.logit_bias[i].second));
  }
}

TEST(WireChecks, ReplicaPlansANodeCannotIndexAreRefused) {
  const ReplicaPlan ok = sample<ReplicaPlan>("replica-plan-spanning");
  auto with = [&](auto change) {
    ReplicaPlan p = ok;
    change(p);
    return replica_plan_problem(p);
  };
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.replica = -1; }), "replica"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.pipeline = 0; }), "pipeline"));
  EXPECT_TRUE(
      names(with([](ReplicaPlan& p) { p.tensor = 1 << 20, p.pipeline = 1 << 20; }), "devices"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.stage_bounds = {0, 2}; }), "stage_bounds"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.stage_bounds = {0, 3, 3}; }), "increasing"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.blocks = 0; }), "blocks"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.block_tokens = -16; }), "block_tokens"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.kv_dtype = "int4"; }), "kv_dtype 'int4'"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.prefill_chunk_tokens = 4096; }), "prefill"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.hosts = {0}; }), "hosts"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.hosts = {0, 2}; }), "host 2"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.part = 2; }), "part 2"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.part_names.push_back("c"); }), "no devices"));
  EXPECT_TRUE(names(with([](ReplicaPlan& p) { p.hosts.clear(), p.part = 0; }), "no hosts"));
}

TEST(WireChecks, AssignmentsTheEngineWouldRefuseAreRefused) {
  const Assignment ok = sample<Assignment>("assignment-resumed");
  auto with = [&](auto change) {
    Assignment a = ok;
    change(a);
    return assignment_problem(a, 300, 128);
  };
  EXPECT_TRUE(names(with([](Assignment& a) { a.tokens.clear(); }), "no tokens"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.tokens[1] = 300; }), "vocabulary"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.tokens[1] = -5; }), "vocabulary"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.tokens.resize(129, 1); }), "context"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.generated = -1; }), "generated"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.generated = 6; }), "generated"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.max_tokens = 0; }), "max_tokens"));
  EXPECT_TRUE(names(with([](Assignment& a) { a.sampling.top_p = 0; }), "top_p"));
  // Limits of 0 are not checked.
  Assignment big = ok;
  big.tokens[1] = 100000;
  EXPECT_EQ(assignment_problem(big, 0, 0), "");
}

TEST(WireChecks, StepsAPartCannotRunAreRefused) {
  const StepLimits limits{300, 128, 48, 16, 4, 64};
  const StepItem ok{7, {1, 30, 40}, 0, {0}, true, {0.8f, 0.9f, 40, 7}, 0};
  auto one = [&](auto change, int m = 1) {
    StepItem it = ok;
    change(it);
    return step_problem({it}, m, limits);
  };
  EXPECT_EQ(one([](StepItem&) {}), "");
  EXPECT_TRUE(names(step_problem({}, 1, limits), "no items"));
  EXPECT_TRUE(names(one([](StepItem&) {}, 0), "microbatches"));
  EXPECT_TRUE(names(one([](StepItem&) {}, 2), "microbatches"));
  EXPECT_TRUE(names(step_problem({ok, ok}, 1, limits), "twice"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.tokens.clear(); }), "no tokens"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.tokens[0] = 300; }), "vocabulary"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.position = -1; }), "position"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.position = 126; }), "context"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.position = 14; }), "cover"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.blocks = {48}; }), "KV block 48"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.blocks = {-1}; }), "KV block -1"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.generated = -1; }), "generated"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.generated = 129; }), "generated"));
  EXPECT_TRUE(names(one([](StepItem& i) { i.sampling.temperature = -1; }), "temperature"));
  std::vector<StepItem> many;
  for (uint64_t s = 0; s < 5; ++s) many.push_back({s, {1}, 0, {int(s)}, false, {}, 0});
  EXPECT_TRUE(names(step_problem(many, 1, limits), "5 items"));
  many.pop_back();
  many[0].tokens.assign(62, 1);
  many[0].blocks = {0, 5, 6, 7};
  EXPECT_TRUE(names(step_problem(many, 1, limits), "65 tokens"));
}

TEST(WireChecks, StepEventsThatWouldSkewTheLoadViewAreRefused) {
  const StepEvents ok = sample<StepEvents>("step-events-step");
  auto with = [&](auto change) {
    StepEvents ev = ok;
    change(ev);
    return step_events_problem(ev);
  };
  EXPECT_TRUE(names(with([](StepEvents& e) { e.replica = -1; }), "replica"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.step_s = NAN; }), "step_s"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.step_s = -1; }), "step_s"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.running = -1; }), "running"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.queued_tokens = -1; }), "queued_tokens"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.blocks_used = -2; }), "blocks_used"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.prefill_tokens = 7; }), "prefill_tokens"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.tokens[0].index = -1; }), "index"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.done[0].reason = FinishReason(7); }), "reason"));
  // Log-probabilities are at most 0, never NaN, and as many as may be asked.
  EXPECT_TRUE(ok.tokens[0].has_logprobs);
  EXPECT_TRUE(names(with([](StepEvents& e) { e.tokens[0].logprobs.logprob = 0.5f; }), "log-prob"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.tokens[0].logprobs.logprob = NAN; }), "log-prob"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.tokens[0].logprobs.top[1].token = -3; }), "top"));
  EXPECT_TRUE(names(with([](StepEvents& e) { e.tokens[0].logprobs.top.resize(kMaxLogprobs + 1); }),
                    "log-prob"));
  EXPECT_EQ(with([](StepEvents& e) { e.tokens[0].logprobs.logprob = -INFINITY; }), "");
  EXPECT_TRUE(
      names(with([](StepEvents& e) { e.done[0].completion_tokens = -1; }), "completion_tokens"));
}

TEST(WireChecks, FaultOrdersAndReportsThatMakeNoSenseAreRefused) {
  const FaultOrder ok = sample<FaultOrder>("fault-order-slow");
  auto order = [&](auto change) {
    FaultOrder o = ok;
    change(o);
    return fault_order_problem(o);
  };
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.kind = FaultKind(9); }), "kind"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.role = FaultRole(9); }), "role"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.replica = -1; }), "replica"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.device = -2; }), "device"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.device = 4096; }), "device"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.factor = 1; }), "factor"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.factor = NAN; }), "factor"));
  EXPECT_TRUE(names(order([](FaultOrder& o) { o.factor = 1e300; }), "factor"));
  EXPECT_EQ(order([](FaultOrder& o) { o.factor = 1e300, o.end = true; }), "");  // ends it

  FaultReport r = sample<FaultReport>("fault-report-refused");
  EXPECT_EQ(fault_report_problem(r), "");
  r.outcome = FaultOutcome::Withdrawn;
  EXPECT_EQ(fault_report_problem(r), "");
  r.outcome = FaultOutcome(4);
  EXPECT_TRUE(names(fault_report_problem(r), "outcome"));
  r.outcome = FaultOutcome::Applied;
  r.text.assign(kMaxFaultText + 1, 'x');
  EXPECT_TRUE(names(fault_report_problem(r), "bytes"));
  r.text = "caf\xe9";
  EXPECT_TRUE(names(fault_report_problem(r), "UTF-8"));
}

}  // namespace
}  // namespace troupe
