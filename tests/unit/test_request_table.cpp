// Every rule the request table holds, without actors: admission, placement,
// exactly-once delivery, resumption, deadlines, cancellation, and the races
// the runtime's integration tests found (cancel just before a crash, a crash
// during prefill, a deadline during resumption).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "scheduler/request_table.h"
#include "support/recording_sink.h"

namespace troupe {
namespace {

using test::RecordingSink;

// The replicas as the table sees them: what was placed and cancelled where.
struct FakeReplicas : ReplicaChannel {
  std::vector<std::pair<int, Assignment>> assigned;
  std::vector<std::pair<int, uint64_t>> cancelled;
  void assign(int replica, Assignment a) override { assigned.emplace_back(replica, std::move(a)); }
  void cancel(int replica, uint64_t id) override { cancelled.emplace_back(replica, id); }
  const Assignment* last_for(uint64_t id) const {
    for (auto it = assigned.rbegin(); it != assigned.rend(); ++it)
      if (it->second.id == id) return &it->second;
    return nullptr;
  }
  int replica_of(uint64_t id) const {
    for (auto it = assigned.rbegin(); it != assigned.rend(); ++it)
      if (it->second.id == id) return it->first;
    return -1;
  }
};

CompletionRequest request(uint64_t id, int max_tokens = 8, int priority = 0, double timeout_s = 0) {
  CompletionRequest r;
  r.id = id;
  r.prompt = {1, 5, 9};
  r.max_tokens = max_tokens;
  r.priority = priority;
  r.timeout_s = timeout_s;
  r.sampling.seed = 42;
  return r;
}

struct Table {
  explicit Table(int replicas, int max_batch = 4, int max_waiting = 0, size_t queue = 8) {
    RequestTableOptions o;
    o.replicas = replicas;
    o.max_seq_len = 64;
    o.max_batch_sequences = max_batch;
    o.max_waiting_per_replica = max_waiting;
    o.admission.max_size = queue;
    o.admission.priority_levels = 2;
    o.admission.max_wait_s = 5;
    table = std::make_unique<RequestTable>(o, make_routing_policy("round_robin", 1), replicas_);
  }
  std::shared_ptr<RecordingSink> submit(CompletionRequest r, double now = 0) {
    auto s = std::make_shared<RecordingSink>();
    table->submit(std::move(r), s, now);
    return s;
  }
  // A step of `replica` that produced these tokens (id, index, token).
  void step(int replica, std::vector<TokenEvent> tokens, std::vector<DoneEvent> done = {},
            double now = 0, int prefill = 0) {
    StepEvents ev;
    ev.replica = replica;
    ev.step_s = 0.01;
    ev.batch_sequences = 1;
    ev.prefill_tokens = prefill;
    ev.tokens = std::move(tokens);
    ev.done = std::move(done);
    table->on_events(ev, now);
  }
  FakeReplicas replicas_;
  std::unique_ptr<RequestTable> table;
};

TEST(RequestTable, AdmitsPlacesAndRefusesWithReasons) {
  Table t(2, 1, 0, 2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto a = t.submit(request(1)), b = t.submit(request(2));
  ASSERT_EQ(t.replicas_.assigned.size(), 2u);
  EXPECT_NE(t.replicas_.replica_of(1), t.replicas_.replica_of(2));  // round robin
  EXPECT_EQ(t.replicas_.last_for(1)->tokens, (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(t.replicas_.last_for(1)->generated, 0);
  EXPECT_EQ(t.replicas_.last_for(1)->sampling.seed, 42u);
  // Both replicas are full (one sequence each): the next wait in the queue.
  auto c = t.submit(request(3)), d = t.submit(request(4));
  EXPECT_EQ(t.replicas_.assigned.size(), 2u);
  EXPECT_EQ(t.table->queue_depth(), 2u);
  auto e = t.submit(request(5));
  ASSERT_TRUE(e->error());
  EXPECT_EQ(e->error()->kind, ServiceErrorKind::QueueFull);
  EXPECT_GT(e->error()->retry_after_s, 0);
  auto dup = t.submit(request(3));
  ASSERT_TRUE(dup->error());
  EXPECT_EQ(dup->error()->kind, ServiceErrorKind::BadRequest);
  EXPECT_FALSE(c->finished());  // the duplicate did not disturb the original
  auto bad_priority = t.submit(request(6, 8, 2));
  ASSERT_TRUE(bad_priority->error());
  EXPECT_NE(bad_priority->error()->message.find("priority must be between 0 and 1"),
            std::string::npos);
  CompletionRequest long_prompt = request(7);
  long_prompt.prompt.assign(65, 3);
  auto too_long = t.submit(long_prompt);
  ASSERT_TRUE(too_long->error());
  EXPECT_NE(too_long->error()->message.find("1 to 64 tokens"), std::string::npos);
  // A completion frees a slot: the oldest queued request goes there.
  t.step(t.replicas_.replica_of(1), {{1, 0, 77}}, {{1, FinishReason::Length, 1}});
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(a->tokens(), (std::vector<int>{77}));
  EXPECT_EQ(a->reason(), FinishReason::Length);
  EXPECT_EQ(a->prompt_tokens(), 3);
  EXPECT_EQ(t.replicas_.assigned.size(), 3u);
  EXPECT_EQ(t.replicas_.assigned.back().second.id, 3u);
  (void)b;
  (void)d;
}

TEST(RequestTable, HigherPriorityIsPlacedFirst) {
  Table t(1, 1);
  t.table->replica_up(0, 0);
  auto busy = t.submit(request(1));
  t.submit(request(2, 8, 0));
  t.submit(request(3, 8, 1));
  t.step(0, {{1, 0, 4}}, {{1, FinishReason::Stop, 1}});
  EXPECT_EQ(t.replicas_.assigned.back().second.id, 3u);
  (void)busy;
}

TEST(RequestTable, TokensAreDeliveredOnceAndInOrder) {
  Table t(1);
  t.table->replica_up(0, 0);
  auto s = t.submit(request(1));
  t.step(0, {{1, 0, 10}, {1, 1, 11}});
  t.step(0, {{1, 1, 11}, {1, 3, 13}});  // a repeat, and one from the future
  t.step(0, {{1, 2, 12}});
  EXPECT_EQ(s->tokens(), (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(t.table->delivered(1), (std::vector<int>{10, 11, 12}));
  // A completion that disagrees with what was delivered is a stale view.
  t.step(0, {}, {{1, FinishReason::Length, 5}});
  EXPECT_FALSE(s->finished());
  t.step(0, {}, {{1, FinishReason::Length, 3}});
  EXPECT_TRUE(s->finished());
  EXPECT_EQ(s->completion_tokens(), 3);
  EXPECT_EQ(s->violations(), 0);
}

// A request's prompt log-probabilities reach its client once, before its
// first token, though a replica that resumed it sends them again.
TEST(RequestTable, PromptLogprobsArriveOnceBeforeTheFirstToken) {
  Table t(2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto s = t.submit(request(1));
  const std::vector<TokenLogprobs> lps = {{-1.5f, {}}, {-0.25f, {}}};
  StepEvents ev;
  ev.replica = 0;
  ev.prompts = {{1, lps}, {99, lps}};  // 99: no such request
  ev.tokens = {{1, 0, 10}};
  t.table->on_events(ev, 0);
  ASSERT_EQ(s->prompt_logprobs().size(), 1u);
  EXPECT_EQ(s->prompt_logprobs()[0][1].logprob, -0.25f);
  EXPECT_EQ(s->tokens(), std::vector<int>{10});
  t.table->replica_down(0, false, 1);
  ev.replica = 1;  // where it resumed: the same again, and the next token
  ev.prompts = {{1, lps}};
  ev.tokens = {{1, 1, 11}};
  t.table->on_events(ev, 1);
  EXPECT_EQ(s->prompt_logprobs().size(), 1u);
  EXPECT_EQ(s->tokens(), (std::vector<int>{10, 11}));
  EXPECT_EQ(s->violations(), 0);
}

TEST(RequestTable, AReplicaThatDiesHasItsRequestsResumedFromWhatWasDelivered) {
  Table t(2, 4);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto a = t.submit(request(1)), b = t.submit(request(2));
  const int ra = t.replicas_.replica_of(1);
  t.step(ra, {{1, 0, 20}, {1, 1, 21}});
  EXPECT_EQ(t.table->replica_down(ra, false, 1), 1u);
  const Assignment* resumed = t.replicas_.last_for(1);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(t.replicas_.replica_of(1), 1 - ra);
  EXPECT_EQ(resumed->tokens, (std::vector<int>{1, 5, 9, 20, 21}));
  EXPECT_EQ(resumed->generated, 2);
  EXPECT_EQ(resumed->max_tokens, 8);
  // A late token of the dead replica at the next index is the same token
  // (deterministic sampling) and counts once; the live replica's repeat of
  // it does not count again.
  t.step(ra, {{1, 2, 22}});
  t.step(1 - ra, {{1, 2, 22}, {1, 3, 23}});
  EXPECT_EQ(a->tokens(), (std::vector<int>{20, 21, 22, 23}));
  // The dead replica's completion is ignored: the request now runs elsewhere.
  t.step(ra, {}, {{1, FinishReason::Length, 4}});
  EXPECT_FALSE(a->finished());
  t.step(1 - ra, {}, {{1, FinishReason::Length, 4}});
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(a->violations(), 0);
  (void)b;
}

// A replica that dies after a request's last token but before it said the
// request was done: the request has every token it asked for, so it ends
// (length) rather than being placed where one token more would be sampled.
TEST(RequestTable, ARequestWithAllItsTokensEndsInsteadOfResuming) {
  Table t(2, 4);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto a = t.submit(request(1, /*max_tokens=*/2));
  const int ra = t.replicas_.replica_of(1);
  t.step(ra, {{1, 0, 20}, {1, 1, 21}});
  const size_t assigned = t.replicas_.assigned.size();
  t.table->replica_down(ra, false, 1);
  EXPECT_EQ(t.replicas_.assigned.size(), assigned);  // not placed again
  ASSERT_TRUE(a->finished());
  EXPECT_EQ(a->reason(), FinishReason::Length);
  EXPECT_EQ(a->tokens(), (std::vector<int>{20, 21}));
  EXPECT_EQ(a->violations(), 0);
}

TEST(RequestTable, ResumedRequestsGoAheadOfTheQueue) {
  Table t(2, 1);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  t.submit(request(1));
  t.submit(request(2));
  t.submit(request(3));  // queued: both replicas are full
  const int r1 = t.replicas_.replica_of(1);
  t.table->replica_down(r1, false, 0);
  t.table->replica_up(r1, 0);
  EXPECT_EQ(t.replicas_.assigned.back().second.id, 1u);  // the resumed one, not 3
}

TEST(RequestTable, ACrashDuringPrefillResumesFromThePrompt) {
  Table t(2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto s = t.submit(request(1));
  const int r = t.replicas_.replica_of(1);
  t.table->replica_down(r, false, 0);
  const Assignment* a = t.replicas_.last_for(1);
  EXPECT_EQ(a->tokens, (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(a->generated, 0);
  EXPECT_NE(t.replicas_.replica_of(1), r);
  EXPECT_FALSE(s->finished());
}

TEST(RequestTable, CancelJustBeforeACrashEndsCancelledAndIsNotResumed) {
  Table t(2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto s = t.submit(request(1));
  const int r = t.replicas_.replica_of(1);
  t.step(r, {{1, 0, 30}});
  t.table->cancel(1, 0);
  ASSERT_EQ(t.replicas_.cancelled.size(), 1u);
  EXPECT_EQ(t.replicas_.cancelled[0], (std::pair<int, uint64_t>{r, 1}));
  EXPECT_FALSE(s->finished());  // the replica confirms within a step...
  const size_t placed = t.replicas_.assigned.size();
  t.table->replica_down(r, false, 0);  // ...but it dies first
  ASSERT_TRUE(s->finished());
  EXPECT_FALSE(s->error());
  EXPECT_EQ(s->reason(), FinishReason::Cancelled);
  EXPECT_EQ(s->completion_tokens(), 1);
  EXPECT_EQ(t.replicas_.assigned.size(), placed);  // not placed again
  EXPECT_FALSE(t.table->holds(1));
}

TEST(RequestTable, CancelEndsAQueuedRequestAtOnceAndARunningOneWhenTheReplicaSays) {
  Table t(1, 1);
  t.table->replica_up(0, 0);
  auto running = t.submit(request(1)), queued = t.submit(request(2));
  t.table->cancel(2, 0);
  EXPECT_EQ(queued->reason(), FinishReason::Cancelled);
  EXPECT_TRUE(queued->finished());
  EXPECT_EQ(t.table->queue_depth(), 0u);
  t.table->cancel(1, 0);
  EXPECT_FALSE(running->finished());
  t.step(0, {}, {{1, FinishReason::Cancelled, 0}});
  EXPECT_EQ(running->reason(), FinishReason::Cancelled);
  t.table->cancel(99, 0);  // unknown: ignored
}

TEST(RequestTable, DeadlinesEndRequestsWithTimeoutOrUnavailableWhenResuming) {
  Table t(2, 4);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto fast = t.submit(request(1, 8, 0, 1.0), 0);
  auto slow = t.submit(request(2, 8, 0, 3.0), 0);
  t.table->tick(0.9);
  EXPECT_FALSE(fast->finished());
  t.table->tick(1.0);
  ASSERT_TRUE(fast->error());
  EXPECT_EQ(fast->error()->kind, ServiceErrorKind::Timeout);
  // Its replica is told to stop it.
  EXPECT_EQ(t.replicas_.cancelled.back().second, 1u);
  // A deadline that passes while the request waits to be resumed (no live
  // replica) is the outage's fault: Unavailable, with Retry-After.
  t.table->replica_down(0, false, 1.5);
  t.table->replica_down(1, false, 1.5);
  EXPECT_FALSE(slow->finished());
  t.table->tick(3.0);
  ASSERT_TRUE(slow->error());
  EXPECT_EQ(slow->error()->kind, ServiceErrorKind::Unavailable);
  EXPECT_GT(slow->error()->retry_after_s, 0);
}

TEST(RequestTable, QueueWaitLimitEndsWithUnavailable) {
  Table t(1, 1);
  t.table->replica_up(0, 0);
  t.submit(request(1), 0);
  auto waiting = t.submit(request(2), 0);
  t.table->tick(6);  // max wait 5 s
  ASSERT_TRUE(waiting->error());
  EXPECT_EQ(waiting->error()->kind, ServiceErrorKind::Unavailable);
  EXPECT_NE(waiting->error()->message.find("admission queue"), std::string::npos);
  EXPECT_EQ(waiting->error()->message.find("no replica"), std::string::npos)
      << waiting->error()->message;
}

// With every replica down (its node dead, waiting to be placed again), a
// request waits its queue time and is told why nothing took it.
TEST(RequestTable, AQueueTimeoutWithNoReplicaUpSaysSo) {
  Table t(2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  t.table->replica_down(0, false, 0);
  t.table->replica_down(1, false, 0);
  auto waiting = t.submit(request(1), 0);
  t.table->tick(1);
  EXPECT_FALSE(waiting->finished());  // a node may come back
  t.table->tick(6);
  ASSERT_TRUE(waiting->error());
  EXPECT_EQ(waiting->error()->kind, ServiceErrorKind::Unavailable);
  EXPECT_EQ(waiting->error()->message,
            "timed out waiting in the admission queue: no replica is up (0 of 2; down ones wait "
            "to be placed again)");
}

TEST(RequestTable, WhenEveryReplicaIsGivenUpEverythingEndsAndNewRequestsAreRefused) {
  Table t(2);
  t.table->replica_up(0, 0);
  t.table->replica_up(1, 0);
  auto a = t.submit(request(1));
  t.table->replica_down(0, true, 0);
  EXPECT_FALSE(a->finished());  // replica 1 may still serve it
  t.table->replica_down(1, true, 0);
  ASSERT_TRUE(a->error());
  EXPECT_EQ(a->error()->kind, ServiceErrorKind::Unavailable);
  auto late = t.submit(request(2));
  ASSERT_TRUE(late->error());
  EXPECT_EQ(late->error()->kind, ServiceErrorKind::Unavailable);
  EXPECT_EQ(t.table->size(), 0u);
}

// Readiness is published before any client hears of a replica's death:
// a client that got its 503 never finds /ready still saying yes.
TEST(RequestTable, ReplicaChangesAreAnnouncedBeforeRequestsEnd) {
  Table t(1);
  std::vector<std::string> order;
  auto s = std::make_shared<RecordingSink>();
  t.table->on_replicas_changed([&] {
    order.push_back("changed, live " + std::to_string(t.table->live_replicas()) +
                    (s->finished() ? ", request ended" : ""));
  });
  t.table->replica_up(0, 0);
  t.table->submit(request(1), s, 0);
  t.table->replica_down(0, true, 0);
  ASSERT_TRUE(s->error());
  EXPECT_EQ(order, (std::vector<std::string>{"changed, live 1", "changed, live 0"}));
}

TEST(RequestTable, ShutdownEndsEverythingOnceWithAReason) {
  Table t(1, 1);
  t.table->replica_up(0, 0);
  auto a = t.submit(request(1)), b = t.submit(request(2));
  t.table->shutdown("the server is shutting down");
  for (auto* s : {a.get(), b.get()}) {
    ASSERT_TRUE(s->error());
    EXPECT_EQ(s->error()->message, "the server is shutting down");
    EXPECT_EQ(s->violations(), 0);
  }
  EXPECT_EQ(t.table->size(), 0u);
}

// The routing policy is fed from real events: a prefill step reports its
// prompt tokens, a decode step its batch, and the replica's queued tokens
// replace the table's estimate.
TEST(RequestTable, ThePolicySeesQueuedTokensFromTheReplicas) {
  Table t(1, 4, 4);
  t.table->replica_up(0, 0);
  t.submit(request(1));
  EXPECT_EQ(t.table->replicas()[0].queued_tokens, 3u);  // estimated at placement
  StepEvents ev;
  ev.replica = 0;
  ev.batch_sequences = 1;
  ev.prefill_tokens = 3;
  ev.running = 1;
  ev.queued_tokens = 0;
  t.table->on_events(ev, 0.1);
  EXPECT_EQ(t.table->replicas()[0].queued_tokens, 0u);
  EXPECT_EQ(t.table->replicas()[0].running, 1u);
  EXPECT_EQ(t.table->running(), 1u);
}

}  // namespace
}  // namespace troupe
