#include "scheduler/replica_scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe {

namespace {
constexpr uint64_t kProbeSeq = ~uint64_t(0);
}  // namespace

ReplicaScheduler::ReplicaScheduler(ReplicaSchedulerOptions o)
    : options_(std::move(o)),
      policy_(options_.limits, options_.block_tokens),
      blocks_(options_.kv_blocks) {
  if (options_.groups < 1) throw std::invalid_argument("a replica needs at least one step group");
}

void ReplicaScheduler::add(Assignment a) {
  const uint64_t id = a.id;
  if (seqs_.count(id))
    throw std::logic_error("request " + std::to_string(id) + " is already on replica " +
                           std::to_string(options_.replica));
  Sequence q;
  q.tokens = a.tokens;
  q.prefill_end = int(a.tokens.size());
  q.a = std::move(a);
  seqs_.emplace(id, std::move(q));
  waiting_.push_back(id);
}

void ReplicaScheduler::cancel(uint64_t id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end()) it->second.cancelled = true;
}

bool ReplicaScheduler::can_launch() const {
  return int(in_flight_.size()) < options_.groups;
}

void ReplicaScheduler::end(StepEvents& ev, uint64_t id, FinishReason reason) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  ev.done.push_back({id, reason, it->second.a.generated});
  blocks_.release(it->second.blocks);
  seqs_.erase(it);
  std::erase(running_, id);
  std::erase(waiting_, id);
  released_.push_back(id);
}

void ReplicaScheduler::fill_load(StepEvents& ev) const {
  ev.replica = options_.replica;
  ev.epoch = options_.epoch;
  ev.running = running();
  ev.queued_tokens = queued_tokens();
  ev.blocks_used = blocks_used();
  ev.blocks_free = blocks_free();
}

int ReplicaScheduler::queued_tokens() const {
  int n = 0;
  for (const auto& [id, q] : seqs_) n += std::max(0, q.prefill_end - q.cached);
  return n;
}

void ReplicaScheduler::preempt(uint64_t id) {
  // Recomputed later from its tokens: the KV state is dropped, not lost.
  Sequence& q = seqs_.at(id);
  blocks_.release(q.blocks);
  q.blocks.clear();
  q.cached = 0;
  q.prefill_end = int(q.tokens.size());
  std::erase(running_, id);
  waiting_.push_front(id);
  released_.push_back(id);
}

std::optional<PlannedStep> ReplicaScheduler::next_step() {
  if (!can_launch()) return std::nullopt;
  // Cancelled sequences leave before the next step, freeing their blocks
  // (those in a step in flight leave once it is answered).
  {
    std::vector<uint64_t> gone;
    for (const auto& [id, q] : seqs_)
      if (q.cancelled && q.step == 0) gone.push_back(id);
    if (!gone.empty()) {
      if (!ended_) ended_.emplace();
      for (uint64_t id : gone) end(*ended_, id, FinishReason::Cancelled);
      fill_load(*ended_);
    }
  }
  std::vector<SeqView> running, waiting;
  int busy = 0;
  for (uint64_t id : running_) {
    const Sequence& q = seqs_.at(id);
    if (q.step != 0) {
      ++busy;
      continue;
    }
    running.push_back({id, int(q.tokens.size()) - q.cached, q.cached, int(q.blocks.size())});
  }
  for (uint64_t id : waiting_) {
    const Sequence& q = seqs_.at(id);
    waiting.push_back({id, int(q.tokens.size()), 0, 0});
  }
  // With G groups, a step takes its share of the live sequences, so that
  // the other groups' steps fill the pipeline's other stages.
  int cap = 0;
  if (options_.groups > 1) {
    const int live = int(running_.size() + waiting_.size());
    cap = std::max(1, (live + options_.groups - 1) / options_.groups);
  }
  const BatchPlan plan =
      policy_.plan(running, waiting, refusing_ ? 0 : blocks_.free_count(), cap, busy);
  if (refusing_ && (!plan.preempted.empty() || plan.admitted.size() < waiting.size())) ++refusals_;
  for (uint64_t id : plan.preempted) preempt(id);
  for (uint64_t id : plan.admitted) {
    std::erase(waiting_, id);
    running_.push_back(id);
  }
  if (plan.entries.empty()) return std::nullopt;
  PlannedStep step;
  step.id = next_step_++;
  step.items.reserve(plan.entries.size());
  for (const auto& e : plan.entries) {
    Sequence& q = seqs_.at(e.id);
    const int need = policy_.blocks_for(q.cached + e.tokens) - int(q.blocks.size());
    if (need > 0) blocks_.allocate(need, q.blocks);
    StepItem it;
    it.seq = e.id;
    it.tokens.assign(q.tokens.begin() + q.cached, q.tokens.begin() + q.cached + e.tokens);
    it.position = q.cached;
    it.blocks = q.blocks;
    it.sample = q.cached + e.tokens == int(q.tokens.size());
    it.sampling = q.a.sampling;
    it.generated = q.a.generated;
    q.step = step.id;
    step.items.push_back(std::move(it));
  }
  in_flight_.emplace(step.id, step.items);
  return step;
}

StepEvents ReplicaScheduler::finish_step(uint64_t step, const std::vector<int>& ids,
                                         double step_s) {
  auto node = in_flight_.extract(step);
  if (node.empty()) throw std::logic_error("step " + std::to_string(step) + " is not in flight");
  const std::vector<StepItem>& items = node.mapped();
  if (ids.size() != items.size())
    throw std::logic_error("step " + std::to_string(step) + " returned " +
                           std::to_string(ids.size()) + " ids for " + std::to_string(items.size()) +
                           " items");
  StepEvents ev;
  ev.step_s = step_s;
  ev.batch_sequences = int(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& item = items[i];
    const int n = int(item.tokens.size());
    ev.batch_tokens += n;
    auto it = seqs_.find(item.seq);
    if (it == seqs_.end()) continue;
    Sequence& q = it->second;
    ev.prefill_tokens += std::max(0, std::min(item.position + n, q.prefill_end) - item.position);
    q.cached += n;
    q.step = 0;
    if (!item.sample || q.cancelled) continue;
    const int tok = ids[i];
    const int fed = int(q.tokens.size());
    const auto outcome =
        options_.stop.judge(tok, q.a.generated, q.a.max_tokens, fed, q.a.ignore_eos);
    if (outcome.deliver) {
      ev.tokens.push_back({q.a.id, q.a.generated, tok});
      ++q.a.generated;
      q.tokens.push_back(tok);
    }
    if (outcome.finish) end(ev, item.seq, *outcome.finish);
  }
  fill_load(ev);
  return ev;
}

PlannedStep ReplicaScheduler::probe_step() {
  if (!probe_blocks_.empty()) throw std::logic_error("a probe step is already in flight");
  blocks_.allocate(1, probe_blocks_);
  PlannedStep step;
  step.id = next_step_++;
  StepItem it;
  it.seq = kProbeSeq;
  it.tokens = {options_.bos};
  it.blocks = probe_blocks_;
  it.sample = true;
  it.sampling.temperature = 0;
  step.items.push_back(std::move(it));
  in_flight_.emplace(step.id, step.items);
  return step;
}

void ReplicaScheduler::finish_probe(uint64_t step) {
  in_flight_.erase(step);
  blocks_.release(probe_blocks_);
  probe_blocks_.clear();
  released_.push_back(kProbeSeq);
}

std::optional<StepEvents> ReplicaScheduler::take_ended() {
  std::optional<StepEvents> out;
  out.swap(ended_);
  return out;
}

std::vector<uint64_t> ReplicaScheduler::take_released() {
  std::vector<uint64_t> out;
  out.swap(released_);
  return out;
}

}  // namespace troupe
