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
  q.tokens = std::move(a.tokens);
  q.prefill_end = int(q.tokens.size());
  q.a = std::move(a);
  queued_ += queued_of(q);
  seqs_.emplace(id, std::move(q));
  waiting_.push_back(id);
}

void ReplicaScheduler::cancel(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.cancelled) return;
  it->second.cancelled = true;
  ++cancelled_;
}

bool ReplicaScheduler::can_launch() const {
  return int(in_flight_.size()) < options_.groups;
}

void ReplicaScheduler::end(StepEvents& ev, uint64_t id, FinishReason reason) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Sequence& q = it->second;
  ev.done.push_back({id, reason, q.a.generated});
  blocks_.release(q.blocks);
  queued_ -= queued_of(q);
  if (q.cancelled) --cancelled_;
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

StepEvents ReplicaScheduler::load_report() const {
  StepEvents ev;
  fill_load(ev);
  return ev;
}

void ReplicaScheduler::preempt(uint64_t id) {
  // Recomputed later from its tokens: the KV state is dropped, not lost.
  Sequence& q = seqs_.at(id);
  blocks_.release(q.blocks);
  q.blocks.clear();
  queued_ -= queued_of(q);
  q.cached = 0;
  q.prefill_end = int(q.tokens.size());
  queued_ += queued_of(q);
  std::erase(running_, id);
  waiting_.push_front(id);
  released_.push_back(id);
}

ReplicaScheduler::InFlight& ReplicaScheduler::start_flight(uint64_t step) {
  if (spare_.empty()) {
    in_flight_.emplace_back();
  } else {
    in_flight_.push_back(std::move(spare_.back()));
    spare_.pop_back();
  }
  InFlight& f = in_flight_.back();
  f.step = step;
  f.items.clear();
  return f;
}

std::optional<PlannedStep> ReplicaScheduler::next_step() {
  PlannedStep step;
  if (!next_step(step)) return std::nullopt;
  return step;
}

bool ReplicaScheduler::next_step(PlannedStep& step) {
  if (!can_launch()) return false;
  // Cancelled sequences leave before the next step, freeing their blocks
  // (those in a step in flight leave once it is answered).
  if (cancelled_ > 0) {
    std::vector<uint64_t> gone;
    for (const auto& [id, q] : seqs_)
      if (q.cancelled && q.step == 0) gone.push_back(id);
    if (!gone.empty()) {
      if (!ended_) ended_.emplace();
      for (uint64_t id : gone) end(*ended_, id, FinishReason::Cancelled);
      fill_load(*ended_);
    }
  }
  std::vector<SeqView>& running = running_view_;
  std::vector<SeqView>& waiting = waiting_view_;
  running.clear();
  waiting.clear();
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
  BatchPlan& plan = plan_;
  policy_.plan(running, waiting, refusing_ ? 0 : blocks_.free_count(), cap, busy, plan);
  if (refusing_ && (!plan.preempted.empty() || plan.admitted.size() < waiting.size())) ++refusals_;
  for (uint64_t id : plan.preempted) preempt(id);
  for (uint64_t id : plan.admitted) {
    // Admitted in queue order, so almost always from the front.
    if (!waiting_.empty() && waiting_.front() == id)
      waiting_.pop_front();
    else
      std::erase(waiting_, id);
    running_.push_back(id);
  }
  if (plan.entries.empty()) return false;
  step.id = next_step_++;
  step.items.resize(plan.entries.size());
  InFlight& flight = start_flight(step.id);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const PlanEntry& e = plan.entries[i];
    Sequence& q = seqs_.at(e.id);
    const int need = policy_.blocks_for(q.cached + e.tokens) - int(q.blocks.size());
    if (need > 0) blocks_.allocate(need, q.blocks);
    StepItem& it = step.items[i];
    it.seq = e.id;
    it.tokens.assign(q.tokens.begin() + q.cached, q.tokens.begin() + q.cached + e.tokens);
    it.position = q.cached;
    it.blocks.assign(q.blocks.begin(), q.blocks.end());
    it.sample = q.cached + e.tokens == int(q.tokens.size());
    it.sampling = q.a.sampling;
    it.generated = q.a.generated;
    q.step = step.id;
    flight.items.push_back({it.seq, it.position, e.tokens, it.sample});
  }
  return true;
}

StepEvents ReplicaScheduler::finish_step(uint64_t step, const std::vector<int>& ids,
                                         double step_s) {
  StepEvents ev;
  finish_step(step, ids, step_s, ev);
  return ev;
}

void ReplicaScheduler::finish_step(uint64_t step, const std::vector<int>& ids, double step_s,
                                   StepEvents& ev) {
  auto flight = std::find_if(in_flight_.begin(), in_flight_.end(),
                             [&](const InFlight& f) { return f.step == step; });
  if (flight == in_flight_.end())
    throw std::logic_error("step " + std::to_string(step) + " is not in flight");
  const std::vector<Launched>& items = flight->items;
  if (ids.size() != items.size())
    throw std::logic_error("step " + std::to_string(step) + " returned " +
                           std::to_string(ids.size()) + " ids for " + std::to_string(items.size()) +
                           " items");
  {
    // A fresh report in the caller's buffers.
    std::vector<TokenEvent> tokens = std::move(ev.tokens);
    std::vector<DoneEvent> done = std::move(ev.done);
    tokens.clear();
    done.clear();
    ev = StepEvents{};
    ev.tokens = std::move(tokens);
    ev.done = std::move(done);
  }
  ev.step_s = step_s;
  ev.batch_sequences = int(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const Launched& item = items[i];
    const int n = item.tokens;
    ev.batch_tokens += n;
    auto it = seqs_.find(item.seq);
    if (it == seqs_.end()) continue;
    Sequence& q = it->second;
    ev.prefill_tokens += std::max(0, std::min(item.position + n, q.prefill_end) - item.position);
    queued_ -= queued_of(q);
    q.cached += n;
    queued_ += queued_of(q);
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
  spare_.push_back(std::move(*flight));
  if (&*flight != &in_flight_.back()) *flight = std::move(in_flight_.back());
  in_flight_.pop_back();
  fill_load(ev);
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
  start_flight(step.id).items.push_back({it.seq, it.position, 1, it.sample});
  step.items.push_back(std::move(it));
  return step;
}

void ReplicaScheduler::finish_probe(uint64_t step) {
  std::erase_if(in_flight_, [&](const InFlight& f) { return f.step == step; });
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
