#include "scheduler/replica_link.h"

#include <algorithm>

namespace troupe {

SequenceCheck::Verdict SequenceCheck::accept(uint64_t seq) {
  if (seq <= last_) return Verdict::Duplicate;
  if (seq != last_ + 1) return Verdict::Gap;
  last_ = seq;
  return Verdict::Next;
}

std::string SequenceCheck::describe_gap(uint64_t seq) const {
  return "expected message " + std::to_string(last_ + 1) + ", got " + std::to_string(seq);
}

uint64_t ReplicaLink::send(double now) {
  unacked_at_.push_back(now);
  return ++sent_;
}

SequenceCheck::Verdict ReplicaLink::receive(uint64_t seq, uint64_t acked) {
  const SequenceCheck::Verdict v = in_.accept(seq);
  if (v != SequenceCheck::Verdict::Next) return v;
  // Never beyond what was sent: a replica cannot acknowledge the future.
  acked = std::min(acked, sent_);
  while (acked_ < acked) {
    ++acked_;
    unacked_at_.pop_front();
  }
  return v;
}

double ReplicaLink::waiting_s(double now) const {
  return unacked_at_.empty() ? 0.0 : now - unacked_at_.front();
}

ReplicaLink::Action ReplicaLink::tick(double now) {
  const double waited = waiting_s(now);
  if (unacked_at_.empty()) return Action::None;
  if (waited >= options_.timeout_s) return Action::Broken;
  if (waited >= options_.probe_after_s && now - last_probe_ >= options_.probe_after_s) {
    last_probe_ = now;
    return Action::Probe;
  }
  return Action::None;
}

}  // namespace troupe
