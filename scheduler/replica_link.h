#pragma once
// Sequence numbers on the router <-> replica channel. Between processes CAF
// carries messages over TCP, in order and once, but a link that drops,
// duplicates or reorders them (a faulty middlebox, an injected link fault)
// would otherwise lose an assignment or a token without anyone noticing, and
// its request would wait forever. Each direction numbers its messages from 1
// per placement; a duplicate is dropped, and a gap (a message lost, or
// overtaken) breaks the channel: the replica is failed and its requests
// resume elsewhere, token-exact, which is always safe. A loss at the tail
// (the last message, with nothing after it to show the gap) is found by
// probing: the router asks a replica that has not acknowledged what it was
// sent, and a replica that does not answer in time is failed too.
#include <cstdint>
#include <deque>
#include <string>

namespace troupe {

// The receiving end of one direction.
class SequenceCheck {
 public:
  enum class Verdict { Next, Duplicate, Gap };
  Verdict accept(uint64_t seq);
  uint64_t last() const { return last_; }
  // What a gap looks like, for logs and errors.
  std::string describe_gap(uint64_t seq) const;

 private:
  uint64_t last_ = 0;
};

struct ReplicaLinkOptions {
  double probe_after_s = 0.25;  // unacknowledged this long: ask the replica
  double timeout_s = 2;         // unacknowledged this long, probes and all: broken
};

// The router's end of one replica's channel, for one placement.
class ReplicaLink {
 public:
  explicit ReplicaLink(ReplicaLinkOptions options = {}) : options_(options) {}

  // The sequence number of the next message to the replica.
  uint64_t send(double now);
  // A message from the replica: its own sequence number and the last of the
  // router's it had received.
  SequenceCheck::Verdict receive(uint64_t seq, uint64_t acked);
  const SequenceCheck& incoming() const { return in_; }

  enum class Action { None, Probe, Broken };
  // Probe: send the replica a probe (numbered by send()) that it answers at
  // once; Broken: something sent timeout_s ago is still unacknowledged.
  Action tick(double now);
  uint64_t sent() const { return sent_; }
  uint64_t acked() const { return acked_; }
  // Seconds the oldest unacknowledged message has waited (0: none waits).
  double waiting_s(double now) const;

 private:
  ReplicaLinkOptions options_;
  SequenceCheck in_;
  uint64_t sent_ = 0;
  uint64_t acked_ = 0;
  std::deque<double> unacked_at_;  // send times of messages acked_+1 .. sent_
  double last_probe_ = -1e300;
};

}  // namespace troupe
