// One replica's continuous batching without actors or engines: steps
// planned over the KV-block book, tokens judged by the stop rule, blocks
// returned on every way a request ends, cancellation and preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "scheduler/replica_scheduler.h"

namespace troupe {
namespace {

ReplicaSchedulerOptions options(int blocks, int groups = 1) {
  ReplicaSchedulerOptions o;
  o.replica = 3;
  o.kv_blocks = blocks;
  o.block_tokens = 4;
  o.limits = {4, 64, 8};  // 4 sequences, 64 tokens, prefill chunks of 8
  o.groups = groups;
  o.stop = StopRule{{2}, 32};  // EOS 2, context 32
  o.bos = 1;
  return o;
}

Assignment assignment(uint64_t id, std::vector<int> tokens, int max_tokens, int generated = 0) {
  Assignment a;
  a.id = id;
  a.tokens = std::move(tokens);
  a.generated = generated;
  a.max_tokens = max_tokens;
  a.sampling.temperature = 0;
  return a;
}

// The ids an engine would return: `token` for every sampled item.
std::vector<int> sampled(const PlannedStep& s, int token) {
  std::vector<int> out;
  for (const auto& it : s.items) out.push_back(it.sample ? token : -1);
  return out;
}

TEST(ReplicaScheduler, PrefillsInChunksThenDecodesWithGrowingBlockTables) {
  ReplicaScheduler r(options(16));
  std::vector<int> prompt(11, 7);
  r.add(assignment(1, prompt, 3));
  auto s1 = r.next_step();
  ASSERT_TRUE(s1);
  ASSERT_EQ(s1->items.size(), 1u);
  EXPECT_EQ(s1->items[0].tokens.size(), 8u);  // one prefill chunk
  EXPECT_EQ(s1->items[0].position, 0);
  EXPECT_FALSE(s1->items[0].sample);
  EXPECT_EQ(s1->items[0].blocks.size(), 2u);  // 8 positions, 4 per block
  EXPECT_FALSE(r.can_launch());               // one group: one step at a time
  EXPECT_FALSE(r.next_step());
  auto ev = r.finish_step(s1->id, sampled(*s1, 0), 0.01);
  EXPECT_EQ(ev.replica, 3);
  EXPECT_EQ(ev.prefill_tokens, 8);
  EXPECT_TRUE(ev.tokens.empty());
  EXPECT_EQ(ev.queued_tokens, 3);
  auto s2 = r.next_step();
  ASSERT_TRUE(s2);
  EXPECT_EQ(s2->items[0].tokens.size(), 3u);
  EXPECT_EQ(s2->items[0].position, 8);
  EXPECT_TRUE(s2->items[0].sample);
  EXPECT_EQ(s2->items[0].blocks.size(), 3u);
  EXPECT_EQ(std::vector<int>(s2->items[0].blocks.begin(), s2->items[0].blocks.begin() + 2),
            s1->items[0].blocks);  // the table only grows
  ev = r.finish_step(s2->id, sampled(*s2, 40), 0.01);
  ASSERT_EQ(ev.tokens.size(), 1u);
  EXPECT_EQ(ev.tokens[0].index, 0);
  EXPECT_EQ(ev.tokens[0].token, 40);
  auto s3 = r.next_step();
  ASSERT_TRUE(s3);
  EXPECT_EQ(s3->items[0].tokens, (std::vector<int>{40}));  // the sampled token is fed back
  EXPECT_EQ(s3->items[0].position, 11);
  EXPECT_EQ(s3->items[0].generated, 1);
  ev = r.finish_step(s3->id, sampled(*s3, 41), 0.01);
  auto s4 = r.next_step();
  ev = r.finish_step(s4->id, sampled(*s4, 42), 0.01);
  ASSERT_EQ(ev.done.size(), 1u);  // max_tokens 3
  EXPECT_EQ(ev.done[0].reason, FinishReason::Length);
  EXPECT_EQ(ev.done[0].completion_tokens, 3);
  EXPECT_EQ(ev.blocks_used, 0);  // every block back
  EXPECT_EQ(ev.blocks_free, 16);
  EXPECT_EQ(r.take_released(), (std::vector<uint64_t>{1}));
  EXPECT_FALSE(r.next_step());
}

TEST(ReplicaScheduler, EosEndsWithoutDeliveringUnlessIgnored) {
  ReplicaScheduler r(options(16));
  r.add(assignment(1, {1, 5}, 8));
  auto ig = assignment(2, {1, 6}, 2);
  ig.ignore_eos = true;
  r.add(ig);
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  auto ev = r.finish_step(s->id, sampled(*s, 2), 0.01);  // both sample EOS
  ASSERT_EQ(ev.tokens.size(), 1u);
  EXPECT_EQ(ev.tokens[0].id, 2u);
  ASSERT_EQ(ev.done.size(), 1u);
  EXPECT_EQ(ev.done[0].id, 1u);
  EXPECT_EQ(ev.done[0].reason, FinishReason::Stop);
  EXPECT_EQ(ev.done[0].completion_tokens, 0);
}

TEST(ReplicaScheduler, LogprobsRideWithTheTokensTheyBelongTo) {
  ReplicaScheduler r(options(16));
  r.add(assignment(1, {1, 5}, 8));
  auto asked = assignment(2, {1, 6}, 8);
  asked.sampling.logprobs = 1;
  r.add(asked);
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_EQ(s->items[1].sampling.logprobs, 1);  // the engine is told
  std::vector<std::optional<TokenLogprobs>> lps(2);
  lps[1] = TokenLogprobs{-0.25f, {{9, -0.25f}}};
  auto ev = r.finish_step(s->id, sampled(*s, 9), 0.01, lps);
  ASSERT_EQ(ev.tokens.size(), 2u);
  EXPECT_FALSE(ev.tokens[0].has_logprobs);
  ASSERT_TRUE(ev.tokens[1].has_logprobs);
  EXPECT_EQ(ev.tokens[1].logprobs.logprob, -0.25f);
  ASSERT_EQ(ev.tokens[1].logprobs.top.size(), 1u);
  EXPECT_EQ(ev.tokens[1].logprobs.top[0].token, 9);
  // One per item or none at all.
  auto next = r.next_step();
  lps.resize(1);
  EXPECT_THROW(r.finish_step(next->id, sampled(*next, 9), 0.01, lps), std::logic_error);
}

TEST(ReplicaScheduler, TheContextEndsASequence) {
  ReplicaScheduler r(options(16));
  r.add(assignment(1, std::vector<int>(31, 5), 100));
  auto s = r.next_step();
  r.finish_step(s->id, sampled(*s, 0), 0.01);
  for (int i = 0; i < 10 && r.holds(1); ++i) {
    s = r.next_step();
    ASSERT_TRUE(s);
    const auto ev = r.finish_step(s->id, sampled(*s, 9), 0.01);
    if (!ev.done.empty()) {
      EXPECT_EQ(ev.done[0].reason, FinishReason::Length);
      // 31 prompt tokens + 2 generated: the second has no room to be fed.
      EXPECT_EQ(ev.done[0].completion_tokens, 2);
    }
  }
  EXPECT_FALSE(r.holds(1));
}

TEST(ReplicaScheduler, AResumedRequestRegeneratesFromItsNextToken) {
  ReplicaScheduler r(options(16));
  // Prompt of 3 plus 2 tokens already delivered elsewhere.
  r.add(assignment(7, {1, 5, 9, 20, 21}, 4, 2));
  auto s = r.next_step();
  EXPECT_EQ(s->items[0].tokens.size(), 5u);
  EXPECT_EQ(s->items[0].generated, 2);  // its sampler skips two draws
  const auto ev = r.finish_step(s->id, sampled(*s, 22), 0.01);
  EXPECT_EQ(ev.prefill_tokens, 5);
  ASSERT_EQ(ev.tokens.size(), 1u);
  EXPECT_EQ(ev.tokens[0].index, 2);
}

// The item that ends a prefill of a sequence with penalties carries the
// whole sequence, so the engine can count what it holds; others carry none.
TEST(ReplicaScheduler, TheItemThatEndsAPenalizedPrefillCarriesTheSequence) {
  ReplicaScheduler r(options(16));
  // Resumed: prompt of 9 plus 2 delivered elsewhere, in two chunks.
  Assignment a = assignment(7, {1, 5, 9, 5, 9, 5, 9, 5, 9, 20, 21}, 6, 2);
  a.sampling.frequency_penalty = 0.5f;
  r.add(a);
  r.add(assignment(8, {1, 4}, 6));  // no penalties
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_FALSE(s->items[0].sample);  // the first chunk of 8
  EXPECT_TRUE(s->items[0].history.empty());
  EXPECT_TRUE(s->items[1].sample);
  EXPECT_TRUE(s->items[1].history.empty());
  r.finish_step(s->id, sampled(*s, 30), 0.01);
  s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  for (const auto& it : s->items) {
    if (it.seq != 7) {
      EXPECT_TRUE(it.history.empty());  // 8 decodes
      continue;
    }
    EXPECT_TRUE(it.sample);
    EXPECT_EQ(it.generated, 2);
    EXPECT_EQ(it.history, a.tokens);
  }
  r.finish_step(s->id, sampled(*s, 31), 0.01);
  s = r.next_step();  // decoding: the engine keeps count itself
  for (const auto& it : s->items) EXPECT_TRUE(it.history.empty());
}

// A new sequence that asks for its prompt's log-probabilities carries its
// prompt on every prefill chunk; the engine's lists are gathered and
// reported whole with its first token. A resumed one asks nothing of it.
TEST(ReplicaScheduler, PromptLogprobsAreGatheredOverThePrefill) {
  ReplicaScheduler r(options(16));
  Assignment a = assignment(7, {1, 5, 9, 5, 9, 5, 9, 5, 9, 20, 21}, 4);
  a.sampling.prompt_logprobs = 1;
  r.add(a);
  Assignment resumed = assignment(8, {1, 4, 30}, 4, 1);
  resumed.sampling.prompt_logprobs = 1;
  resumed.sampling.presence_penalty = 0.5f;  // so it carries its history
  r.add(resumed);
  auto lps = [](int from, int n) {
    std::vector<TokenLogprobs> out;
    for (int i = 0; i < n; ++i) out.push_back({-float(from + i), {}});
    return out;
  };
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_EQ(s->items[0].history, a.tokens);  // the first chunk of 8
  EXPECT_TRUE(s->items[0].wants_prompt_logprobs());
  EXPECT_EQ(s->items[0].prompt_rows_predicting(), 8);
  // 8 was resumed: its history is for its penalties, its prompt's were
  // reported before.
  EXPECT_EQ(s->items[1].history, resumed.tokens);
  EXPECT_FALSE(s->items[1].wants_prompt_logprobs());
  EXPECT_EQ(s->items[1].prompt_rows_predicting(), 0);
  auto ev = r.finish_step(s->id, sampled(*s, 30), 0.01, {}, {lps(1, 8), {}});
  EXPECT_TRUE(ev.prompts.empty());
  s = r.next_step();
  const auto seven = std::find_if(s->items.begin(), s->items.end(),
                                  [](const StepItem& it) { return it.seq == 7; });
  ASSERT_NE(seven, s->items.end());
  EXPECT_EQ(seven->history, a.tokens);
  EXPECT_EQ(seven->prompt_rows_predicting(), 2);  // positions 9 and 10; 11 is sampled
  std::vector<std::vector<TokenLogprobs>> lists(s->items.size());
  lists[size_t(seven - s->items.begin())] = lps(9, 2);
  ev = r.finish_step(s->id, sampled(*s, 31), 0.01, {}, lists);
  ASSERT_EQ(ev.prompts.size(), 1u);
  EXPECT_EQ(ev.prompts[0].id, 7u);
  ASSERT_EQ(ev.prompts[0].entries.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(ev.prompts[0].entries[size_t(i)].logprob, -float(1 + i));
  s = r.next_step();  // decoding
  for (const auto& it : s->items) EXPECT_TRUE(it.history.empty());
}

TEST(ReplicaScheduler, CancelledRequestsEndBeforeTheNextStepOrWhenTheirStepReturns) {
  ReplicaScheduler r(options(16));
  r.add(assignment(1, {1, 5}, 8));
  r.add(assignment(2, {1, 6}, 8));
  auto s = r.next_step();
  r.cancel(1);  // in a step in flight: ends when it returns
  auto ev = r.finish_step(s->id, sampled(*s, 30), 0.01);
  ASSERT_EQ(ev.tokens.size(), 1u);  // only request 2's token
  EXPECT_EQ(ev.tokens[0].id, 2u);
  EXPECT_TRUE(r.holds(1));
  auto next = r.next_step();
  auto ended = r.take_ended();
  ASSERT_TRUE(ended);
  ASSERT_EQ(ended->done.size(), 1u);
  EXPECT_EQ(ended->done[0].id, 1u);
  EXPECT_EQ(ended->done[0].reason, FinishReason::Cancelled);
  EXPECT_FALSE(r.holds(1));
  ASSERT_TRUE(next);
  ASSERT_EQ(next->items.size(), 1u);
  EXPECT_EQ(next->items[0].seq, 2u);
  const auto released = r.take_released();
  EXPECT_NE(std::find(released.begin(), released.end(), 1u), released.end());
  // Idle and cancelled: ends at the next planning, with its blocks back.
  r.finish_step(next->id, sampled(*next, 31), 0.01);
  r.cancel(2);
  r.cancel(99);  // unknown: ignored
  EXPECT_FALSE(r.next_step());
  ended = r.take_ended();
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->done[0].id, 2u);
  EXPECT_EQ(ended->blocks_used, 0);
}

TEST(ReplicaScheduler, WhenBlocksRunOutTheNewestIsPreemptedAndRecomputedLater) {
  ReplicaScheduler r(options(6));  // 24 positions
  r.add(assignment(1, std::vector<int>(8, 5), 20));
  r.add(assignment(2, std::vector<int>(8, 6), 20));
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  r.finish_step(s->id, sampled(*s, 9), 0.01);  // 2 x 9 tokens: 3 + 3 blocks needed next
  std::set<uint64_t> preempted;
  for (int i = 0; i < 6; ++i) {
    s = r.next_step();
    ASSERT_TRUE(s);
    for (uint64_t id : r.take_released()) preempted.insert(id);
    std::set<int> blocks;
    for (const auto& it : s->items)
      for (int b : it.blocks) EXPECT_TRUE(blocks.insert(b).second) << "block " << b << " twice";
    r.finish_step(s->id, sampled(*s, 9), 0.01);
    EXPECT_LE(r.blocks_used(), 6);
  }
  EXPECT_EQ(preempted, (std::set<uint64_t>{2}));  // the newest gave way
}

TEST(ReplicaScheduler, GroupsKeepSeveralStepsInFlightOverDisjointSequences) {
  ReplicaScheduler r(options(32, 2));
  for (uint64_t id = 1; id <= 4; ++id) r.add(assignment(id, {1, int(id) + 4}, 8));
  auto a = r.next_step(), b = r.next_step();
  ASSERT_TRUE(a);
  ASSERT_TRUE(b);
  EXPECT_FALSE(r.can_launch());
  std::set<uint64_t> seen;
  for (const auto* s : {&*a, &*b})
    for (const auto& it : s->items) EXPECT_TRUE(seen.insert(it.seq).second);
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ(a->items.size(), 2u);              // each group takes its share
  r.finish_step(b->id, sampled(*b, 9), 0.01);  // out of order is fine
  EXPECT_TRUE(r.can_launch());
  EXPECT_THROW(r.finish_step(b->id, sampled(*b, 9), 0.01), std::logic_error);
}

TEST(ReplicaScheduler, TheProbeStepBorrowsOneBlock) {
  ReplicaScheduler r(options(4));
  auto p = r.probe_step();
  ASSERT_EQ(p.items.size(), 1u);
  EXPECT_EQ(p.items[0].tokens, (std::vector<int>{1}));
  EXPECT_EQ(p.items[0].blocks.size(), 1u);
  EXPECT_EQ(r.blocks_used(), 1);
  r.finish_probe(p.id);
  EXPECT_EQ(r.blocks_used(), 0);
  EXPECT_EQ(r.take_released().size(), 1u);
}

void expect_same_step(const PlannedStep& x, const PlannedStep& y) {
  EXPECT_EQ(x.id, y.id);
  ASSERT_EQ(x.items.size(), y.items.size());
  for (size_t i = 0; i < x.items.size(); ++i) {
    const StepItem &a = x.items[i], &b = y.items[i];
    EXPECT_EQ(a.seq, b.seq);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.position, b.position);
    EXPECT_EQ(a.blocks, b.blocks);
    EXPECT_EQ(a.sample, b.sample);
    EXPECT_EQ(a.generated, b.generated);
  }
}

void expect_same_events(const StepEvents& x, const StepEvents& y) {
  EXPECT_EQ(x.step_s, y.step_s);
  EXPECT_EQ(x.batch_sequences, y.batch_sequences);
  EXPECT_EQ(x.batch_tokens, y.batch_tokens);
  EXPECT_EQ(x.prefill_tokens, y.prefill_tokens);
  EXPECT_EQ(x.running, y.running);
  EXPECT_EQ(x.queued_tokens, y.queued_tokens);
  EXPECT_EQ(x.blocks_used, y.blocks_used);
  EXPECT_EQ(x.blocks_free, y.blocks_free);
  ASSERT_EQ(x.tokens.size(), y.tokens.size());
  for (size_t i = 0; i < x.tokens.size(); ++i) {
    EXPECT_EQ(x.tokens[i].id, y.tokens[i].id);
    EXPECT_EQ(x.tokens[i].index, y.tokens[i].index);
    EXPECT_EQ(x.tokens[i].token, y.tokens[i].token);
  }
  ASSERT_EQ(x.done.size(), y.done.size());
  for (size_t i = 0; i < x.done.size(); ++i) {
    EXPECT_EQ(x.done[i].id, y.done[i].id);
    EXPECT_EQ(x.done[i].reason, y.done[i].reason);
    EXPECT_EQ(x.done[i].completion_tokens, y.done[i].completion_tokens);
  }
}

// The calls that reuse the caller's buffers (the simulator's) plan and report
// exactly what the plain ones (the batcher's) do, and the replica's running
// sum of queued prompt tokens matches a recount kept here from what it
// reports, through chunked prefill, preemption, cancellation, EOS and steps
// finished out of order.
TEST(ReplicaScheduler, ReusedBuffersGiveTheSameStepsAndQueuedTokensAddUp) {
  for (int groups : {1, 2}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    ReplicaScheduler plain(options(10, groups)), reused(options(10, groups));
    struct Known {
      int tokens, prefill_end, cached;
    };
    std::map<uint64_t, Known> known;
    auto recount = [&] {
      int n = 0;
      for (const auto& [id, k] : known) n += std::max(0, k.prefill_end - k.cached);
      return n;
    };
    auto forget_ended = [&](const std::optional<StepEvents>& ev) {
      if (ev)
        for (const auto& d : ev->done) known.erase(d.id);
    };
    std::mt19937 rng(11);
    PlannedStep step_buf;
    StepEvents ev_buf;
    std::vector<PlannedStep> flying;
    uint64_t next_id = 1;
    int preemptions = 0, cancels = 0, eos = 0;
    for (int round = 0; round < 3000; ++round) {
      const unsigned op = rng() % 8;
      if (op < 2 && known.size() < 12) {
        const int len = 1 + int(rng() % 14);
        const int max_tokens = 1 + int(rng() % 12);
        plain.add(assignment(next_id, std::vector<int>(size_t(len), 5), max_tokens));
        reused.add(assignment(next_id, std::vector<int>(size_t(len), 5), max_tokens));
        known[next_id++] = {len, len, 0};
      } else if (op == 2 && !known.empty() && rng() % 4 == 0) {
        auto it = std::next(known.begin(), long(rng() % known.size()));
        plain.cancel(it->first);
        reused.cancel(it->first);
        ++cancels;
      } else if (op < 6) {
        const auto a = plain.next_step();
        const bool b = reused.next_step(step_buf);
        ASSERT_EQ(bool(a), b);
        const auto released = plain.take_released();
        ASSERT_EQ(released, reused.take_released());
        for (uint64_t id : released)
          if (plain.holds(id)) {  // preempted: recomputed from all its tokens
            known[id].cached = 0;
            known[id].prefill_end = known[id].tokens;
            ++preemptions;
          }
        const auto ended = plain.take_ended();
        const auto ended_reused = reused.take_ended();
        ASSERT_EQ(bool(ended), bool(ended_reused));
        if (ended) expect_same_events(*ended, *ended_reused);
        forget_ended(ended);
        if (a) {
          expect_same_step(*a, step_buf);
          flying.push_back(*a);
        }
      } else if (!flying.empty()) {
        const size_t k = rng() % flying.size();
        const PlannedStep s = flying[k];
        flying.erase(flying.begin() + long(k));
        std::vector<int> ids;
        for (const auto& it : s.items) ids.push_back(it.sample ? (rng() % 6 == 0 ? 2 : 9) : -1);
        const StepEvents ev = plain.finish_step(s.id, ids, 0.01);
        reused.finish_step(s.id, ids, 0.01, ev_buf);
        expect_same_events(ev, ev_buf);
        ASSERT_EQ(plain.take_released(), reused.take_released());
        for (const auto& it : s.items)
          if (auto k2 = known.find(it.seq); k2 != known.end())
            k2->second.cached = it.position + int(it.tokens.size());
        for (const auto& t : ev.tokens) ++known[t.id].tokens;
        for (const auto& d : ev.done) eos += d.reason == FinishReason::Stop;
        forget_ended(ev);
      }
      ASSERT_EQ(plain.queued_tokens(), recount()) << "round " << round;
      ASSERT_EQ(reused.queued_tokens(), recount()) << "round " << round;
    }
    // The walk went through what it is meant to check.
    EXPECT_GT(preemptions, 0);
    EXPECT_GT(cancels, 0);
    EXPECT_GT(eos, 0);
  }
}

// Refused blocks count as soon as they change a step, not only when they
// preempt: here one sequence is left out for want of a block while the other,
// still inside its block, runs on.
TEST(ReplicaScheduler, RefusedBlocksCountWhenTheyLeaveASequenceOut) {
  ReplicaScheduler r(options(16));
  r.add(assignment(1, {1, 5, 6, 7}, 8));  // one full block
  r.add(assignment(2, {1, 5}, 8));        // half a block
  auto s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  r.finish_step(s->id, sampled(*s, 9), 0.01);
  r.refuse_blocks(true);
  s = r.next_step();
  ASSERT_TRUE(s);
  ASSERT_EQ(s->items.size(), 1u);
  EXPECT_EQ(s->items[0].seq, 2u);  // its next position fits the block it has
  EXPECT_EQ(r.refusals(), 1u);
  EXPECT_TRUE(r.take_released().empty());  // nobody preempted
  r.finish_step(s->id, sampled(*s, 9), 0.01);
  r.refuse_blocks(false);
  s = r.next_step();
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_EQ(r.refusals(), 1u);
}

ReplicaSchedulerOptions ahead_options(int blocks) {
  ReplicaSchedulerOptions o = options(blocks);
  o.lookahead = true;
  return o;
}

// A replica's waiting sequences start in priority order (higher first,
// arrival order within one), as the admission queue releases requests: a
// request placed behind a full waiting list does not wait for every
// lower-priority one before it.
TEST(ReplicaScheduler, WaitingSequencesStartInPriorityOrder) {
  ReplicaSchedulerOptions o = options(64);
  o.limits = {1, 64, 8};  // one sequence at a time
  ReplicaScheduler r(o);
  const auto with = [](Assignment a, int priority) {
    a.priority = priority;
    return a;
  };
  r.add(with(assignment(1, {1, 5}, 1), 0));
  r.add(with(assignment(2, {1, 6}, 1), 0));
  r.add(with(assignment(3, {1, 7}, 1), 1));
  r.add(with(assignment(4, {1, 8}, 1), 1));
  r.add(with(assignment(5, {1, 9}, 1), 0));
  std::vector<uint64_t> order;
  while (auto s = r.next_step()) {
    ASSERT_EQ(s->items.size(), 1u);
    order.push_back(s->items[0].seq);
    r.finish_step(s->id, sampled(*s, 7), 0.001);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{3, 4, 1, 2, 5}));
}

// Scheduling ahead stays on while steps are short on average (under a
// millisecond), and only where the options allow it.
TEST(ReplicaScheduler, StepTimesTurnSchedulingAheadOnAndOff) {
  ReplicaScheduler r(ahead_options(16));
  EXPECT_TRUE(r.lookahead());
  r.observe_step_time(0.0002);
  EXPECT_TRUE(r.lookahead());
  r.observe_step_time(0.02);  // the mean: 0.8 x 0.2 ms + 0.2 x 20 ms
  EXPECT_FALSE(r.lookahead());
  for (int i = 0; i < 30; ++i) r.observe_step_time(0.0002);
  EXPECT_TRUE(r.lookahead());
  ReplicaScheduler off(options(16));
  off.observe_step_time(0.0001);
  EXPECT_FALSE(off.lookahead());
}

TEST(ReplicaScheduler, LookaheadPlansTheNextTokenWhileTheStepBeforeItRuns) {
  ReplicaScheduler r(ahead_options(16));
  r.add(assignment(1, {1, 5, 6}, 4));
  auto s1 = r.next_step();
  ASSERT_TRUE(s1);
  EXPECT_TRUE(r.can_launch());
  auto s2 = r.next_step();  // while s1 runs
  ASSERT_TRUE(s2);
  ASSERT_EQ(s2->items.size(), 1u);
  EXPECT_TRUE(s2->items[0].feeds_sampled_token());
  EXPECT_EQ(s2->items[0].position, 3);
  EXPECT_TRUE(s2->items[0].sample);
  EXPECT_EQ(s2->items[0].generated, 1);
  EXPECT_EQ(s2->items[0].blocks.size(), 1u);  // positions 0..3
  EXPECT_FALSE(r.can_launch());               // two steps at most
  EXPECT_FALSE(r.next_step());
  auto ev = r.finish_step(s1->id, sampled(*s1, 40), 0.01);
  ASSERT_EQ(ev.tokens.size(), 1u);
  EXPECT_EQ(ev.tokens[0].token, 40);
  EXPECT_EQ(ev.tokens[0].index, 0);
  auto s3 = r.next_step();  // ahead of s2
  ASSERT_TRUE(s3);
  EXPECT_TRUE(s3->items[0].feeds_sampled_token());
  EXPECT_EQ(s3->items[0].position, 4);
  EXPECT_EQ(s3->items[0].blocks.size(), 2u);
  EXPECT_EQ(s3->items[0].generated, 2);
  ev = r.finish_step(s2->id, sampled(*s2, 41), 0.01);
  ASSERT_EQ(ev.tokens.size(), 1u);
  EXPECT_EQ(ev.tokens[0].index, 1);
  EXPECT_EQ(ev.tokens[0].token, 41);
  // s3 samples the 3rd token of 4: the 4th (the last) is planned ahead;
  // nothing is planned ahead of the last.
  auto s4 = r.next_step();
  ASSERT_TRUE(s4);
  EXPECT_EQ(s4->items[0].position, 5);
  ev = r.finish_step(s3->id, sampled(*s3, 42), 0.01);
  EXPECT_FALSE(r.next_step());
  ev = r.finish_step(s4->id, sampled(*s4, 43), 0.01);
  ASSERT_EQ(ev.done.size(), 1u);
  EXPECT_EQ(ev.done[0].reason, FinishReason::Length);
  EXPECT_EQ(ev.done[0].completion_tokens, 4);
  EXPECT_EQ(ev.blocks_used, 0);
}

TEST(ReplicaScheduler, APromptsNextChunkIsPlannedAheadOfTheOneInFlight) {
  ReplicaScheduler r(ahead_options(16));
  r.add(assignment(1, std::vector<int>(11, 7), 3));
  auto s1 = r.next_step();
  auto s2 = r.next_step();
  ASSERT_TRUE(s1 && s2);
  EXPECT_EQ(s1->items[0].tokens.size(), 8u);
  EXPECT_EQ(s2->items[0].tokens, std::vector<int>(3, 7));
  EXPECT_EQ(s2->items[0].position, 8);
  EXPECT_TRUE(s2->items[0].sample);
  auto ev = r.finish_step(s1->id, sampled(*s1, 0), 0.01);
  EXPECT_EQ(ev.prefill_tokens, 8);
  EXPECT_EQ(ev.queued_tokens, 3);
  ev = r.finish_step(s2->id, sampled(*s2, 40), 0.01);
  EXPECT_EQ(ev.queued_tokens, 0);
  ASSERT_EQ(ev.tokens.size(), 1u);
}

// EOS from step N ends the request at N (its end is reported at once); the
// item planned ahead in N+1 is dropped, and its blocks come back, with the
// engine's note to release the sequence, only once N+1 is answered.
TEST(ReplicaScheduler, ATokenThatEndsASequenceDropsItsItemPlannedAhead) {
  ReplicaScheduler r(ahead_options(16));
  r.add(assignment(1, {1, 5, 6, 7, 8}, 8));  // 5 tokens: 2 blocks with the next
  auto s1 = r.next_step();
  auto s2 = r.next_step();
  ASSERT_TRUE(s1 && s2);
  auto ev = r.finish_step(s1->id, sampled(*s1, 2), 0.01);  // EOS
  ASSERT_EQ(ev.done.size(), 1u);
  EXPECT_EQ(ev.done[0].reason, FinishReason::Stop);
  EXPECT_EQ(ev.running, 0);
  EXPECT_FALSE(r.holds(1));
  EXPECT_EQ(ev.blocks_used, 2);  // still written by s2
  EXPECT_TRUE(r.take_released().empty());
  r.add(assignment(2, {1, 9}, 8));  // planned alongside, in other blocks
  auto s3 = r.next_step();
  ASSERT_TRUE(s3);
  ASSERT_EQ(s3->items.size(), 1u);
  for (int b : s3->items[0].blocks)
    EXPECT_EQ(std::count(s2->items[0].blocks.begin(), s2->items[0].blocks.end(), b), 0);
  ev = r.finish_step(s2->id, sampled(*s2, 50), 0.01);
  EXPECT_TRUE(ev.tokens.empty());  // dropped
  EXPECT_TRUE(ev.done.empty());    // ended once
  EXPECT_EQ(ev.blocks_used, 1);    // request 2's
  EXPECT_EQ(r.take_released(), (std::vector<uint64_t>{1}));
  r.finish_step(s3->id, sampled(*s3, 2), 0.01);
  EXPECT_EQ(r.blocks_used(), 0);
}

TEST(ReplicaScheduler, ACancelledSequenceIsNotPlannedAheadAndEndsAfterItsLastStep) {
  ReplicaScheduler r(ahead_options(16));
  r.add(assignment(1, {1, 5}, 8));
  r.add(assignment(2, {1, 6}, 8));
  auto s1 = r.next_step();
  r.cancel(1);
  auto s2 = r.next_step();
  ASSERT_TRUE(s1 && s2);
  ASSERT_EQ(s2->items.size(), 1u);
  EXPECT_EQ(s2->items[0].seq, 2u);
  r.cancel(2);  // planned ahead already
  auto ev = r.finish_step(s1->id, sampled(*s1, 30), 0.01);
  EXPECT_TRUE(ev.tokens.empty());
  EXPECT_FALSE(r.next_step());  // s2 still holds 2; 1 ends now
  auto ended = r.take_ended();
  ASSERT_TRUE(ended);
  ASSERT_EQ(ended->done.size(), 1u);
  EXPECT_EQ(ended->done[0].id, 1u);
  ev = r.finish_step(s2->id, sampled(*s2, 31), 0.01);
  EXPECT_TRUE(ev.tokens.empty());
  EXPECT_FALSE(r.next_step());
  ended = r.take_ended();
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->done[0].id, 2u);
  EXPECT_EQ(ended->done[0].reason, FinishReason::Cancelled);
  EXPECT_EQ(r.blocks_used(), 0);
}

TEST(ReplicaScheduler, NothingIsPreemptedWhileAStepRunsAhead) {
  ReplicaScheduler r(ahead_options(6));  // 24 positions
  r.add(assignment(1, std::vector<int>(8, 5), 20));
  r.add(assignment(2, std::vector<int>(8, 6), 20));
  auto s = r.next_step();
  r.finish_step(s->id, sampled(*s, 9), 0.01);  // 9 tokens each: 3 blocks each next
  int preemptions = 0, planned_ahead = 0;
  for (int i = 0; i < 20; ++i) {
    auto a = r.next_step();  // may preempt: no step runs
    ASSERT_TRUE(a);
    const int preempted = int(r.take_released().size());
    auto b = r.next_step();  // would need a block only preemption frees
    const auto released = r.take_released();
    if (b) {
      EXPECT_TRUE(released.empty()) << "preempted while a step ran";
      for (const auto& x : b->items)
        for (const auto& y : a->items)
          if (y.seq != x.seq) {
            for (int blk : x.blocks)
              EXPECT_EQ(std::count(y.blocks.begin(), y.blocks.end(), blk), 0);
          }
    }
    r.finish_step(a->id, sampled(*a, 9), 0.01);
    if (b) r.finish_step(b->id, sampled(*b, 9), 0.01);
    EXPECT_LE(r.blocks_used(), 6);
    preemptions += preempted;
    planned_ahead += b.has_value();
  }
  EXPECT_GT(preemptions, 0);  // the pressure was there
  EXPECT_GT(planned_ahead, 0);
}

// A model whose next token is a function of everything a sequence fed it,
// and an engine that keeps what each sequence wrote where: a step planned
// ahead must feed the token its predecessor sampled, at the right position,
// in blocks no other live sequence writes. Each request's tokens are then
// the same with and without lookahead, and the model's own continuation.
struct ToyModel {
  static int next(const std::vector<int>& fed) {
    uint64_t h = 1469598103934665603ull;
    for (int t : fed) h = (h ^ uint64_t(t)) * 1099511628211ull;
    return h % 13 == 0 ? 2 : 3 + int(h % 40);  // EOS (2) now and then
  }
};

struct Expected {
  std::vector<int> tokens;
  FinishReason reason;
};

Expected continuation(const Assignment& a, const StopRule& stop) {
  std::vector<int> fed = a.tokens;
  Expected e;
  for (int g = a.generated;; ++g) {
    const int tok = ToyModel::next(fed);
    const auto o = stop.judge(tok, g, a.max_tokens, int(fed.size()), a.ignore_eos);
    if (o.deliver) {
      e.tokens.push_back(tok);
      fed.push_back(tok);
    }
    if (o.finish) {
      e.reason = *o.finish;
      return e;
    }
  }
}

// Checks each request that ended against the toy model's continuation (a
// cancelled one, its start) and forgets it; `completed` sees the others.
template <class F>
void settle_ended(std::map<uint64_t, Assignment>& asked, std::map<uint64_t, FinishReason>& ended,
                  std::map<uint64_t, std::vector<int>>& got, const std::set<uint64_t>& cancelled,
                  const StopRule& stop, F&& completed) {
  for (auto it = asked.begin(); it != asked.end();) {
    const uint64_t id = it->first;
    if (!ended.count(id)) {
      ++it;
      continue;
    }
    const Expected want = continuation(it->second, stop);
    if (ended[id] == FinishReason::Cancelled) {
      ASSERT_TRUE(cancelled.count(id));
      ASSERT_LE(got[id].size(), want.tokens.size());
      EXPECT_TRUE(std::equal(got[id].begin(), got[id].end(), want.tokens.begin()));
    } else {
      ASSERT_EQ(got[id], want.tokens) << "request " << id;
      EXPECT_EQ(ended[id], want.reason) << "request " << id;
      completed(it->second, want);
    }
    it = asked.erase(it);
  }
}

TEST(ReplicaScheduler, LookaheadDeliversWhatOneStepAtATimeDoes) {
  for (bool ahead : {false, true}) {
    for (int blocks : {7, 40}) {
      SCOPED_TRACE(std::string(ahead ? "ahead" : "one at a time") + ", " + std::to_string(blocks) +
                   " blocks");
      auto o = options(blocks);
      o.lookahead = ahead;
      ReplicaScheduler r(o);
      std::mt19937 rng(5);
      std::map<uint64_t, Assignment> asked;
      std::map<uint64_t, std::vector<int>> got;
      std::map<uint64_t, FinishReason> ended;
      std::map<uint64_t, std::vector<int>> kv;  // the engine's: what each sequence wrote
      std::map<uint64_t, int> last;             // the worker's: last sampled id
      std::deque<PlannedStep> flying;
      std::set<uint64_t> cancelled;
      int planned_ahead = 0, dropped = 0;
      uint64_t next_id = 1;
      auto take = [&](const StepEvents& ev) {
        for (const auto& t : ev.tokens) {
          ASSERT_EQ(t.index, int(got[t.id].size())) << "request " << t.id;
          got[t.id].push_back(t.token);
        }
        for (const auto& d : ev.done) {
          ASSERT_FALSE(ended.count(d.id)) << "request " << d.id << " ended twice";
          ended[d.id] = d.reason;
          EXPECT_EQ(d.completion_tokens, int(got[d.id].size()));
        }
      };
      auto answer = [&] {
        PlannedStep s = std::move(flying.front());
        flying.pop_front();
        std::vector<int> ids;
        for (auto& it : s.items) {
          if (it.feeds_sampled_token()) {
            ASSERT_TRUE(last.count(it.seq));
            it.tokens[0] = last[it.seq];
          }
          std::vector<int>& w = kv[it.seq];
          ASSERT_LE(it.position, int(w.size())) << "a gap in sequence " << it.seq;
          w.resize(size_t(it.position));  // a preempted sequence writes again
          w.insert(w.end(), it.tokens.begin(), it.tokens.end());
          ASSERT_LE(int(w.size()), int(it.blocks.size()) * 4);
          ids.push_back(it.sample ? ToyModel::next(w) : -1);
          if (it.sample) last[it.seq] = ids.back();
        }
        take(r.finish_step(s.id, ids, 0.01));
        for (uint64_t id : r.take_released()) last.erase(id);
      };
      for (int round = 0; round < 4000 || !asked.empty(); ++round) {
        ASSERT_LT(round, 100000) << "no progress";
        const unsigned op = rng() % 10;
        if (round < 4000 && op < 2 && asked.size() < 10) {
          const int len = 1 + int(rng() % 14);
          std::vector<int> prompt(static_cast<size_t>(len), 0);
          for (int& t : prompt) t = 3 + int(rng() % 40);
          Assignment a = assignment(next_id, prompt, 1 + int(rng() % 12));
          asked[next_id] = a;
          r.add(a);
          ++next_id;
        } else if (round < 4000 && op == 2 && !asked.empty() && rng() % 8 == 0) {
          auto it = std::next(asked.begin(), long(rng() % asked.size()));
          cancelled.insert(it->first);
          r.cancel(it->first);
        } else if (ahead && op == 9 && rng() % 16 == 0) {
          r.set_lookahead(!r.lookahead());  // the batcher's turns, mid-flight
        } else if (op < 7 && r.can_launch()) {
          if (auto s = r.next_step()) {
            // Live sequences never share a block with another step's.
            for (const PlannedStep& f : flying)
              for (const auto& x : f.items)
                for (const auto& y : s->items)
                  if (x.seq != y.seq) {
                    for (int b : y.blocks) {
                      ASSERT_EQ(std::count(x.blocks.begin(), x.blocks.end(), b), 0)
                          << "block " << b << " of " << x.seq << " given to " << y.seq;
                    }
                  }
            for (const auto& it : s->items) planned_ahead += it.feeds_sampled_token();
            flying.push_back(std::move(*s));
          }
          if (auto e = r.take_ended()) take(*e);
          for (uint64_t id : r.take_released()) last.erase(id);
        } else if (!flying.empty()) {
          answer();
        }
        settle_ended(asked, ended, got, cancelled, o.stop,
                     [&](const Assignment&, const Expected& want) {
                       dropped += ahead && want.reason == FinishReason::Stop;
                     });
      }
      while (!flying.empty()) answer();
      EXPECT_FALSE(r.next_step());
      EXPECT_EQ(r.blocks_used(), 0);
      EXPECT_EQ(r.running(), 0);
      if (ahead) {
        EXPECT_GT(planned_ahead, 100);
        EXPECT_GT(dropped, 10);
      } else {
        EXPECT_EQ(planned_ahead, 0);
      }
    }
  }
}

// ---- prefix caching ----

ReplicaSchedulerOptions caching_options(int blocks) {
  ReplicaSchedulerOptions o = options(blocks);
  o.prefix_caching = true;
  return o;
}

// Runs steps until request `id` ends, answering every sampled item with
// `token`; returns its done event.
DoneEvent run_to_end(ReplicaScheduler& r, uint64_t id, int token,
                     std::vector<PlannedStep>* steps = nullptr) {
  for (int i = 0; i < 100; ++i) {
    auto s = r.next_step();
    if (!s) break;
    if (steps) steps->push_back(*s);
    for (const DoneEvent& d : r.finish_step(s->id, sampled(*s, token), 0.01).done)
      if (d.id == id) return d;
  }
  ADD_FAILURE() << "request " << id << " did not end";
  return {};
}

TEST(ReplicaScheduler, APromptStartingWithAComputedPrefixTakesItsBlocks) {
  ReplicaScheduler r(caching_options(32));
  const std::vector<int> prompt{5, 6, 7, 8, 9, 10, 11, 12, 13, 14};  // 2 full blocks + 2
  r.add(assignment(1, prompt, 2));
  std::vector<PlannedStep> first;
  EXPECT_EQ(run_to_end(r, 1, 40, &first).cached_tokens, 0);
  EXPECT_EQ(r.blocks_used(), 0);
  EXPECT_EQ(r.blocks_cached(), 2);  // the prompt's full blocks (its last is 11 + 1 long)

  r.add(assignment(2, prompt, 2));
  auto s = r.next_step();
  ASSERT_TRUE(s);
  ASSERT_EQ(s->items.size(), 1u);
  EXPECT_EQ(s->items[0].position, 8);
  EXPECT_EQ(s->items[0].tokens, (std::vector<int>{13, 14}));
  EXPECT_EQ(
      std::vector<int>(s->items[0].blocks.begin(), s->items[0].blocks.begin() + 2),
      std::vector<int>(first[0].items[0].blocks.begin(), first[0].items[0].blocks.begin() + 2));
  const StepEvents ev = r.finish_step(s->id, sampled(*s, 40), 0.01);
  EXPECT_EQ(ev.prefix_queried, 10);
  EXPECT_EQ(ev.prefix_hits, 8);
  EXPECT_EQ(ev.prefill_tokens, 2);
  EXPECT_EQ(run_to_end(r, 2, 40).cached_tokens, 8);

  // A prompt of exactly two blocks leaves its last token to compute: one
  // block is taken. One that differs inside the second block takes the first.
  r.add(assignment(3, {5, 6, 7, 8, 9, 10, 11, 12}, 1));
  s = r.next_step();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->items[0].position, 4);
  r.finish_step(s->id, sampled(*s, 2), 0.01);
  r.add(assignment(4, {5, 6, 7, 8, 9, 10, 99, 12, 13}, 1));
  s = r.next_step();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->items[0].position, 4);
  r.finish_step(s->id, sampled(*s, 2), 0.01);

  // Asking for the prompt's log-probabilities computes every row.
  Assignment lp = assignment(5, prompt, 1);
  lp.sampling.prompt_logprobs = 0;
  r.add(lp);
  s = r.next_step();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->items[0].position, 0);
  r.finish_step(s->id, sampled(*s, 2), 0.01);

  // Off, nothing is kept.
  ReplicaScheduler off(options(32));
  off.add(assignment(1, prompt, 1));
  run_to_end(off, 1, 40);
  EXPECT_EQ(off.blocks_cached(), 0);
  off.add(assignment(2, prompt, 1));
  s = off.next_step();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->items[0].position, 0);
}

TEST(ReplicaScheduler, RunningSequencesShareTheirPrefixAndPreemptionCountsOnlyWhatItFrees) {
  // 8 blocks of 4: a 13-token prompt holds 4; a second with the same 12
  // first tokens shares 3 and adds 1 (5 used, where 8 would be without).
  ReplicaScheduler r(caching_options(8));
  std::vector<int> prompt(13);
  for (int i = 0; i < 13; ++i) prompt[size_t(i)] = 10 + i;
  r.add(assignment(1, prompt, 20));
  auto s = r.next_step();  // 8 tokens
  r.finish_step(s->id, sampled(*s, 3), 0.01);
  s = r.next_step();  // 5 more, samples
  r.finish_step(s->id, sampled(*s, 3), 0.01);
  EXPECT_EQ(r.blocks_cached(), 3);
  std::vector<int> other = prompt;
  other.back() = 99;
  r.add(assignment(2, other, 20));
  s = r.next_step();
  ASSERT_TRUE(s);
  ASSERT_EQ(s->items.size(), 2u);
  EXPECT_EQ(s->items[1].position, 12);
  EXPECT_EQ(r.blocks_used(), 5);
  // Decoding both until the pool runs out: the newest is preempted (its
  // own block freed, the shared ones kept), and both still end.
  std::set<uint64_t> ended;
  int preempted = 0;
  for (int i = 0; i < 200 && ended.size() < 2; ++i) {
    if (!s) s = r.next_step();
    ASSERT_TRUE(s) << "step " << i;
    for (const DoneEvent& d : r.finish_step(s->id, sampled(*s, 3), 0.01).done) {
      EXPECT_EQ(d.reason, FinishReason::Length);
      EXPECT_EQ(d.completion_tokens, 20);
      ended.insert(d.id);
    }
    for (uint64_t id : r.take_released()) preempted += r.holds(id);
    s.reset();
  }
  EXPECT_EQ(ended.size(), 2u);
  EXPECT_GT(preempted, 0);
  EXPECT_EQ(r.blocks_used(), 0);
}

// The engine's cache as blocks: a position holds what a model's keys and
// values would, a function of the tokens up to it (ToyModel's running hash),
// written where the block table says and read back through it. A block
// shared wrongly, overwritten or read before it was written changes the
// tokens sampled after it; the expected ones come from the token lists alone.
TEST(ReplicaScheduler, PrefixCachingDeliversWhatComputingEverythingDoes) {
  for (bool ahead : {false, true}) {
    for (int blocks : {9, 24, 80}) {
      SCOPED_TRACE(std::string(ahead ? "ahead" : "one at a time") + ", " + std::to_string(blocks) +
                   " blocks");
      auto o = caching_options(blocks);
      o.lookahead = ahead;
      ReplicaScheduler r(o);
      std::mt19937 rng(7 + blocks);
      constexpr uint64_t kUnwritten = 0;
      std::vector<uint64_t> cache(size_t(blocks) * 4, kUnwritten);
      std::map<uint64_t, Assignment> asked;
      std::map<uint64_t, std::vector<int>> got;
      std::map<uint64_t, FinishReason> ended;
      std::map<uint64_t, int> last;
      std::deque<PlannedStep> flying;
      std::set<uint64_t> cancelled;
      std::vector<std::vector<int>> finished;  // prompts and answers, for later turns
      std::vector<std::vector<int>> prefixes;
      for (int p = 0; p < 4; ++p) {
        std::vector<int> t(size_t(rng() % 18));
        for (int& x : t) x = 3 + int(rng() % 40);
        prefixes.push_back(t);
      }
      int64_t queried = 0, hits = 0, cached_reported = 0, preempted = 0;
      auto let_go = [&] {
        for (uint64_t id : r.take_released()) {
          last.erase(id);
          preempted += r.holds(id);
        }
      };
      uint64_t next_id = 1;
      auto take = [&](const StepEvents& ev) {
        queried += ev.prefix_queried;
        hits += ev.prefix_hits;
        for (const auto& t : ev.tokens) {
          ASSERT_EQ(t.index, int(got[t.id].size())) << "request " << t.id;
          got[t.id].push_back(t.token);
        }
        for (const auto& d : ev.done) {
          ASSERT_FALSE(ended.count(d.id)) << "request " << d.id << " ended twice";
          ended[d.id] = d.reason;
          cached_reported += d.cached_tokens;
        }
      };
      auto answer = [&] {
        PlannedStep s = std::move(flying.front());
        flying.pop_front();
        std::vector<int> ids;
        for (auto& it : s.items) {
          if (it.feeds_sampled_token()) {
            ASSERT_TRUE(last.count(it.seq));
            it.tokens[0] = last[it.seq];
          }
          auto at = [&](int pos) -> uint64_t& {
            return cache[size_t(it.blocks[size_t(pos / 4)]) * 4 + size_t(pos % 4)];
          };
          ASSERT_LE(it.position + int(it.tokens.size()), int(it.blocks.size()) * 4);
          uint64_t h = 1469598103934665603ull;
          if (it.position > 0) {
            h = at(it.position - 1);
            ASSERT_NE(h, kUnwritten) << "sequence " << it.seq << " reads an unwritten position";
          }
          for (size_t k = 0; k < it.tokens.size(); ++k) {
            h = (h ^ uint64_t(it.tokens[k])) * 1099511628211ull;
            at(it.position + int(k)) = h;
          }
          ids.push_back(it.sample ? (h % 13 == 0 ? 2 : 3 + int(h % 40)) : -1);
          if (it.sample) last[it.seq] = ids.back();
        }
        take(r.finish_step(s.id, ids, 0.01));
        let_go();
      };
      for (int round = 0; round < 5000 || !asked.empty(); ++round) {
        ASSERT_LT(round, 100000) << "no progress";
        const unsigned op = rng() % 10;
        if (round < 5000 && op < 2 && asked.size() < 8) {
          std::vector<int> prompt;
          if (!finished.empty() && rng() % 4 == 0) {
            prompt = finished[rng() % finished.size()];  // the next turn of a conversation
          } else {
            prompt = prefixes[rng() % prefixes.size()];
          }
          const int extra = 1 + int(rng() % 6);
          for (int k = 0; k < extra; ++k) prompt.push_back(3 + int(rng() % 40));
          if (prompt.size() > 26) prompt.resize(26);
          Assignment a = assignment(next_id, prompt, 1 + int(rng() % 5));
          asked[next_id] = a;
          r.add(a);
          ++next_id;
        } else if (round < 5000 && op == 2 && !asked.empty() && rng() % 8 == 0) {
          auto it = std::next(asked.begin(), long(rng() % asked.size()));
          cancelled.insert(it->first);
          r.cancel(it->first);
        } else if (op < 7 && r.can_launch()) {
          if (auto s = r.next_step()) flying.push_back(std::move(*s));
          if (auto e = r.take_ended()) take(*e);
          let_go();
        } else if (!flying.empty()) {
          answer();
        }
        settle_ended(asked, ended, got, cancelled, o.stop,
                     [&](const Assignment& a, const Expected& want) {
                       std::vector<int> turn = a.tokens;
                       turn.insert(turn.end(), want.tokens.begin(), want.tokens.end());
                       finished.push_back(turn);
                     });
      }
      while (!flying.empty()) answer();
      EXPECT_FALSE(r.next_step());
      EXPECT_EQ(r.blocks_used(), 0);
      EXPECT_EQ(r.running(), 0);
      EXPECT_GT(hits, queried / 10) << "the workload shares prefixes";
      EXPECT_GT(cached_reported, 0);
      EXPECT_LE(cached_reported, hits);
      if (blocks == 9) {
        EXPECT_GT(preempted, 0) << "the pool ran short";
      }
    }
  }
}

TEST(ReplicaScheduler, BadInputIsRefused) {
  ReplicaScheduler r(options(4));
  r.add(assignment(1, {1}, 4));
  EXPECT_THROW(r.add(assignment(1, {1}, 4)), std::logic_error);
  auto o = options(4);
  o.limits.max_batch_tokens = 0;
  EXPECT_THROW(ReplicaScheduler bad(o), std::invalid_argument);
  o = options(4);
  o.groups = 0;
  EXPECT_THROW(ReplicaScheduler bad(o), std::invalid_argument);
  o = options(4, 2);
  o.lookahead = true;  // a pipeline's groups overlap already
  EXPECT_THROW(ReplicaScheduler bad(o), std::invalid_argument);
  ReplicaScheduler groups(options(4, 2));
  EXPECT_THROW(groups.set_lookahead(true), std::invalid_argument);
}

}  // namespace
}  // namespace troupe
