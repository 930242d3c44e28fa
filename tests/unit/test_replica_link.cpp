// The router <-> replica channel's numbering: duplicates dropped, gaps and
// silence found.
#include <gtest/gtest.h>

#include "scheduler/replica_link.h"

namespace troupe {
namespace {

using V = SequenceCheck::Verdict;
using A = ReplicaLink::Action;

TEST(SequenceCheck, AcceptsInOrderDropsDuplicatesAndFindsGaps) {
  SequenceCheck c;
  EXPECT_EQ(c.accept(1), V::Next);
  EXPECT_EQ(c.accept(2), V::Next);
  EXPECT_EQ(c.accept(2), V::Duplicate);
  EXPECT_EQ(c.accept(1), V::Duplicate);
  EXPECT_EQ(c.accept(4), V::Gap);
  EXPECT_EQ(c.last(), 2u);  // a gap does not move it
  EXPECT_EQ(c.describe_gap(4), "expected message 3, got 4");
  EXPECT_EQ(c.accept(3), V::Next);
}

TEST(SequenceCheck, AFirstMessageThatIsNotOneIsAGap) {
  SequenceCheck c;
  EXPECT_EQ(c.accept(2), V::Gap);
  EXPECT_EQ(c.accept(0), V::Duplicate);
}

TEST(ReplicaLink, NothingSentNothingToDo) {
  ReplicaLink l({0.25, 2});
  EXPECT_EQ(l.tick(100), A::None);
  EXPECT_EQ(l.waiting_s(100), 0);
}

TEST(ReplicaLink, AcknowledgedMessagesNeedNoProbe) {
  ReplicaLink l({0.25, 2});
  EXPECT_EQ(l.send(0), 1u);
  EXPECT_EQ(l.send(0.1), 2u);
  EXPECT_EQ(l.receive(1, 2), V::Next);
  EXPECT_EQ(l.acked(), 2u);
  EXPECT_EQ(l.tick(5), A::None);
}

TEST(ReplicaLink, ProbesAnUnacknowledgedMessageThenGivesUp) {
  ReplicaLink l({0.25, 2});
  l.send(0);
  EXPECT_EQ(l.tick(0.1), A::None);
  EXPECT_EQ(l.tick(0.3), A::Probe);
  l.send(0.3);                      // the probe
  EXPECT_EQ(l.tick(0.4), A::None);  // not again so soon
  EXPECT_EQ(l.tick(0.6), A::Probe);
  l.send(0.6);
  EXPECT_EQ(l.tick(2.0), A::Broken);  // the first is still unanswered
  EXPECT_NEAR(l.waiting_s(2.0), 2.0, 1e-9);
}

TEST(ReplicaLink, APartialAcknowledgementMovesTheClockToTheNextUnacknowledged) {
  ReplicaLink l({0.25, 2});
  l.send(0);
  l.send(1.5);
  EXPECT_EQ(l.receive(1, 1), V::Next);
  EXPECT_NEAR(l.waiting_s(2.0), 0.5, 1e-9);
  EXPECT_EQ(l.tick(3.4), A::Probe);
  EXPECT_EQ(l.tick(3.6), A::Broken);
}

TEST(ReplicaLink, AnAcknowledgementOfTheFutureIsCapped) {
  ReplicaLink l({0.25, 2});
  l.send(0);
  EXPECT_EQ(l.receive(1, 99), V::Next);
  EXPECT_EQ(l.acked(), 1u);
  EXPECT_EQ(l.send(1), 2u);
  EXPECT_NEAR(l.waiting_s(1.5), 0.5, 1e-9);
}

TEST(ReplicaLink, DuplicatesAndGapsFromTheReplicaDoNotAcknowledge) {
  ReplicaLink l({0.25, 2});
  l.send(0);
  EXPECT_EQ(l.receive(1, 0), V::Next);
  EXPECT_EQ(l.receive(1, 1), V::Duplicate);
  EXPECT_EQ(l.receive(3, 1), V::Gap);
  EXPECT_EQ(l.acked(), 0u);
}

}  // namespace
}  // namespace troupe
