#include "scheduler/replica_scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {

namespace {
constexpr uint64_t kProbeSeq = ~uint64_t(0);
}  // namespace

ReplicaScheduler::ReplicaScheduler(ReplicaSchedulerOptions o)
    : options_(std::move(o)),
      policy_(options_.limits, options_.block_tokens),
      blocks_(options_.kv_blocks, options_.block_tokens, options_.prefix_caching) {
  if (options_.groups < 1) throw std::invalid_argument("a replica needs at least one step group");
  set_lookahead(options_.lookahead);
}

void ReplicaScheduler::set_lookahead(bool on) {
  if (on && options_.groups != 1)
    throw std::invalid_argument(
        "scheduling ahead needs one step group (a pipeline's groups already overlap), got " +
        std::to_string(options_.groups));
  lookahead_ = on;
}

// Scheduling ahead saves each step the trip of its answer to the batcher
// and of the next step back (tens of microseconds): much of a short step,
// little of a long one, where the batcher's, router's and server's work
// running beside the step costs more (they take cores from the step's
// threads: a 110M model served about 5% fewer tokens ahead on a machine
// whose cores the device's threads filled).
void ReplicaScheduler::observe_step_time(double seconds) {
  constexpr double kShortStepS = 0.001;
  if (!options_.lookahead) return;
  step_s_ = step_s_ <= 0 ? seconds : 0.8 * step_s_ + 0.2 * seconds;
  set_lookahead(step_s_ < kShortStepS);
}

void ReplicaScheduler::add(Assignment a) {
  const uint64_t id = a.id;
  if (index_.count(id))
    throw std::logic_error("request " + std::to_string(id) + " is already on replica " +
                           std::to_string(options_.replica));
  Slot slot;
  if (free_slots_.empty()) {
    slot = Slot(slots_.size());
    slots_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  Sequence& q = slots_[slot];
  q.tokens = std::move(a.tokens);
  q.a = std::move(a);
  q.prefill_end = int(q.tokens.size());
  q.cached = 0;
  q.in_flight = 0;
  q.blocks.clear();
  q.indexed = 0;
  q.indexing = true;
  q.prompt_hit = -1;
  q.keys.clear();
  q.step = 0;
  q.ahead = 0;
  q.cancelled = false;
  q.draining = false;
  q.used = true;
  q.prompt_logprobs.clear();
  queued_ += queued_of(q);
  index_.emplace(id, slot);
  // After every waiting sequence of its priority or a higher one.
  const int priority = q.a.priority;
  auto at = std::find_if(waiting_.rbegin(), waiting_.rend(),
                         [&](Slot w) { return slots_[w].a.priority >= priority; });
  waiting_.insert(at.base(), slot);
}

void ReplicaScheduler::cancel(uint64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  Sequence& q = slots_[it->second];
  if (q.cancelled) return;
  q.cancelled = true;
  ++cancelled_;
}

bool ReplicaScheduler::can_launch() const {
  return int(in_flight_.size()) < (lookahead_ ? 2 : options_.groups);
}

void ReplicaScheduler::end(StepEvents& ev, Slot slot, FinishReason reason) {
  Sequence& q = slots_[slot];
  if (!q.used || q.draining) return;
  const uint64_t id = q.a.id;
  ev.done.push_back({id, reason, q.a.generated, std::max(0, q.prompt_hit)});
  queued_ -= queued_of(q);
  if (q.cancelled) --cancelled_;
  index_.erase(id);
  std::erase(running_, slot);
  std::erase(waiting_, slot);
  if (q.step != 0) {
    // Planned ahead: that step still writes into its blocks, and its engine
    // still samples for it. Both are let go when the step is answered.
    q.draining = true;
    return;
  }
  released_.push_back(id);
  free_slot(slot);
}

void ReplicaScheduler::free_slot(Slot slot) {
  Sequence& q = slots_[slot];
  blocks_.release(q.blocks);
  q.blocks.clear();
  q.used = false;
  q.draining = false;
  free_slots_.push_back(slot);
}

bool ReplicaScheduler::plannable_ahead(const Sequence& q) const {
  if (!lookahead_ || q.step == 0 || q.ahead != 0 || q.cancelled) return false;
  const int fed = q.cached + q.in_flight;
  const int known = int(q.tokens.size());
  if (fed < known) return true;  // a prompt chunk follows the one in flight
  // The step in flight samples: its token is fed next, unless it ends the
  // sequence by length (known now; an EOS is not, and costs one dropped item).
  return q.a.generated + 1 < q.a.max_tokens && known < options_.stop.context_length;
}

int ReplicaScheduler::view_running(bool ahead, bool exact_shares) {
  std::vector<SeqView>& running = running_view_;
  running.clear();
  int busy = 0;
  for (Slot slot : running_) {
    const Sequence& q = slots_[slot];
    // Only indexed blocks are ever held twice; not counted, all of them are
    // taken as shared (a preemption would free nothing).
    int shared = 0;
    if (exact_shares) {
      for (int i = 0; i < q.indexed; ++i) shared += blocks_.shared(q.blocks[size_t(i)]) ? 1 : 0;
    } else {
      shared = int(q.blocks.size());
    }
    if (q.step == 0) {
      running.push_back(
          {slot, int(q.tokens.size()) - q.cached, q.cached, int(q.blocks.size()), shared});
    } else if (ahead && plannable_ahead(q)) {
      const int fed = q.cached + q.in_flight;
      const int pending = std::max(1, int(q.tokens.size()) - fed);
      running.push_back({slot, pending, fed, int(q.blocks.size()), shared});
    } else {
      ++busy;
    }
  }
  return busy;
}

void ReplicaScheduler::fill_load(StepEvents& ev) const {
  ev.replica = options_.replica;
  ev.epoch = options_.epoch;
  ev.running = running();
  ev.queued_tokens = queued_tokens();
  ev.blocks_used = blocks_used();
  ev.blocks_free = blocks_free();
  ev.blocks_cached = blocks_cached();
}

int ReplicaScheduler::match_prefix(Sequence& q) {
  q.hit.clear();
  // A sequence asking for its prompt's log-probabilities computes every
  // row; at least one token is left to compute, for the logits to sample.
  if (!blocks_.prefix_caching() || (q.a.sampling.prompt_logprobs >= 0 && q.a.generated == 0))
    return 0;
  const int most = (int(q.tokens.size()) - 1) / options_.block_tokens;
  extend_keys(q, most);
  return blocks_.match(q.keys.data(), q.tokens.data(), most, q.hit) * options_.block_tokens;
}

void ReplicaScheduler::extend_keys(Sequence& q, int blocks) const {
  const size_t b = size_t(options_.block_tokens);
  while (int(q.keys.size()) < blocks) {
    const uint64_t parent = q.keys.empty() ? BlockBook::kRootKey : q.keys.back();
    q.keys.push_back(blocks_.chain_key(parent, q.tokens.data() + q.keys.size() * b));
  }
}

void ReplicaScheduler::index_filled(Sequence& q) {
  if (!blocks_.prefix_caching()) return;
  const int b = options_.block_tokens;
  while (q.indexing && (q.indexed + 1) * b <= q.cached) {
    const int parent = q.indexed == 0 ? -1 : q.blocks[size_t(q.indexed - 1)];
    extend_keys(q, q.indexed + 1);
    if (!blocks_.index(q.blocks[size_t(q.indexed)], parent, q.keys[size_t(q.indexed)],
                       q.tokens.data() + size_t(q.indexed) * b)) {
      q.indexing = false;
      return;
    }
    ++q.indexed;
  }
}

StepEvents ReplicaScheduler::load_report() const {
  StepEvents ev;
  fill_load(ev);
  return ev;
}

void ReplicaScheduler::preempt(Slot slot) {
  // Recomputed later from its tokens: the KV state is dropped, not lost.
  Sequence& q = slots_[slot];
  blocks_.release(q.blocks);
  q.blocks.clear();
  q.indexed = 0;
  q.indexing = true;
  queued_ -= queued_of(q);
  q.cached = 0;
  q.prompt_logprobs.clear();  // the prefill runs again
  q.prefill_end = int(q.tokens.size());
  queued_ += queued_of(q);
  std::erase(running_, slot);
  // First of its priority: it started before those waiting with it.
  const int priority = q.a.priority;
  waiting_.insert(std::find_if(waiting_.begin(), waiting_.end(),
                               [&](Slot w) { return slots_[w].a.priority <= priority; }),
                  slot);
  released_.push_back(q.a.id);
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
    std::vector<Slot> gone;
    for (Slot slot = 0; slot < Slot(slots_.size()); ++slot) {
      const Sequence& q = slots_[slot];
      if (q.used && !q.draining && q.cancelled && q.step == 0) gone.push_back(slot);
    }
    if (!gone.empty()) {
      // Oldest request first, whichever slots they took.
      std::sort(gone.begin(), gone.end(),
                [&](Slot x, Slot y) { return slots_[x].a.id < slots_[y].a.id; });
      if (!ended_) ended_.emplace();
      for (Slot slot : gone) end(*ended_, slot, FinishReason::Cancelled);
      fill_load(*ended_);
    }
  }
  const std::vector<SeqView>& running = running_view_;
  std::vector<SeqView>& waiting = waiting_view_;
  waiting.clear();
  const bool ahead = lookahead_ && !in_flight_.empty();
  // Which blocks are shared matters only to a preemption (what it frees),
  // which is rare: counted only when the plan preempts.
  bool exact = !blocks_.prefix_caching() || refusing_;
  int busy = view_running(ahead, exact);
  // The policy admits waiting sequences in order, at most a step's worth:
  // the rest of a long waiting list need not be looked at on every step.
  for (Slot slot : waiting_) {
    if (int(waiting.size()) >= options_.limits.max_batch_sequences) break;
    Sequence& q = slots_[slot];
    // Of a cached prefix, blocks other sequences hold are shared for free;
    // those nobody holds count as blocks to take (they are free until
    // taken). In a step that preempts, all count as blocks to take (the
    // policy), so that a block a victim held is not also counted as freed.
    const int hit = match_prefix(q);
    int held = 0;
    for (int b : q.hit) held += blocks_.held(b) ? 1 : 0;
    waiting.push_back({slot, int(q.tokens.size()) - hit, hit, held});
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
  if (!exact && !plan.preempted.empty()) {
    exact = true;
    busy = view_running(ahead, exact);
    policy_.plan(running, waiting, refusing_ ? 0 : blocks_.free_count(), cap, busy, plan);
  }
  if (ahead && !plan.preempted.empty()) {
    // Short of blocks, nothing is planned ahead: a sequence a step holds
    // cannot be preempted. Nor is any other while that step runs: its
    // answer may return the blocks (as without lookahead, the step after
    // it decides).
    busy = view_running(false, true);
    policy_.plan(running, waiting, refusing_ ? 0 : blocks_.free_count(), cap, busy, plan);
    if (!plan.preempted.empty()) return false;
  }
  if (refusing_) {
    // Refused when the step differs from the one the free blocks allow: a
    // sequence preempted, not admitted, or left out for want of a block.
    BatchPlan& allowed = unrefused_plan_;
    policy_.plan(running, waiting, blocks_.free_count(), cap, busy, allowed);
    if (allowed.entries.size() != plan.entries.size() || allowed.preempted != plan.preempted ||
        allowed.admitted != plan.admitted)
      ++refusals_;
  }
  for (uint64_t slot : plan.preempted) preempt(Slot(slot));
  for (uint64_t slot : plan.admitted) {
    // Admitted in queue order, so almost always from the front.
    if (!waiting_.empty() && waiting_.front() == slot)
      waiting_.pop_front();
    else
      std::erase(waiting_, Slot(slot));
    running_.push_back(Slot(slot));
    // Its cached prefix is taken before any block is allocated below, which
    // could otherwise evict it.
    Sequence& q = slots_[slot];
    const int hit = int(q.hit.size()) * options_.block_tokens;
    if (q.prompt_hit < 0) {
      const int prompt = int(q.tokens.size()) - q.a.generated;
      q.prompt_hit = std::min(hit, prompt);
    }
    if (!blocks_.prefix_caching()) continue;
    prefix_queried_ += int(q.tokens.size());
    prefix_hits_ += hit;
    if (q.hit.empty()) continue;
    blocks_.acquire(q.hit);
    q.blocks.swap(q.hit);
    q.hit.clear();
    q.indexed = int(q.blocks.size());
    queued_ -= queued_of(q);
    q.cached = hit;
    queued_ += queued_of(q);
  }
  if (plan.entries.empty()) return false;
  step.id = next_step_++;
  step.items.resize(plan.entries.size());
  InFlight& flight = start_flight(step.id);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const PlanEntry& e = plan.entries[i];
    const Slot slot = Slot(e.id);
    Sequence& q = slots_[slot];
    const int fed = q.cached + q.in_flight;
    const int known = int(q.tokens.size());
    const int need = policy_.blocks_for(fed + e.tokens) - int(q.blocks.size());
    if (need > 0) blocks_.allocate(need, q.blocks);
    StepItem& it = step.items[i];
    it.seq = q.a.id;
    it.position = fed;
    it.blocks.assign(q.blocks.begin(), q.blocks.end());
    it.sampling = q.a.sampling;
    it.history.clear();  // the item may be a reused one
    if (fed == known) {
      // Planned ahead of the step that samples the token it feeds.
      it.tokens.assign(1, kSampledToken);
      it.sample = true;
      it.generated = q.a.generated + 1;
    } else {
      it.tokens.assign(q.tokens.begin() + fed, q.tokens.begin() + fed + e.tokens);
      it.sample = fed + e.tokens == known;
      it.generated = q.a.generated;
      // The engine's penalties for the sequence start here, on this replica
      // or again after a preemption; a new sequence's prompt log-probabilities
      // need each row's next token.
      const bool prefill = fed < q.prefill_end;
      if (prefill && ((it.sample && it.sampling.penalizes()) ||
                      (it.sampling.prompt_logprobs >= 0 && q.a.generated == 0)))
        it.history = q.tokens;
    }
    (q.step == 0 ? q.step : q.ahead) = step.id;
    q.in_flight += e.tokens;
    flight.items.push_back({slot, it.seq, it.position, e.tokens, it.sample});
  }
  return true;
}

StepEvents ReplicaScheduler::finish_step(
    uint64_t step, const std::vector<int>& ids, double step_s,
    const std::vector<std::optional<TokenLogprobs>>& logprobs,
    const std::vector<std::vector<TokenLogprobs>>& prompt_logprobs) {
  StepEvents ev;
  finish_step(step, ids, step_s, ev, logprobs, prompt_logprobs);
  return ev;
}

void ReplicaScheduler::finish_step(uint64_t step, const std::vector<int>& ids, double step_s,
                                   StepEvents& ev,
                                   const std::vector<std::optional<TokenLogprobs>>& logprobs,
                                   const std::vector<std::vector<TokenLogprobs>>& prompt_logprobs) {
  auto flight = std::find_if(in_flight_.begin(), in_flight_.end(),
                             [&](const InFlight& f) { return f.step == step; });
  if (flight == in_flight_.end())
    throw std::logic_error("step " + std::to_string(step) + " is not in flight");
  const std::vector<Launched>& items = flight->items;
  if (ids.size() != items.size())
    throw std::logic_error("step " + std::to_string(step) + " returned " +
                           std::to_string(ids.size()) + " ids for " + std::to_string(items.size()) +
                           " items");
  if (!logprobs.empty() && logprobs.size() != items.size())
    throw std::logic_error("step " + std::to_string(step) + " returned " +
                           std::to_string(logprobs.size()) + " log-probabilities for " +
                           std::to_string(items.size()) + " items");
  if (!prompt_logprobs.empty() && prompt_logprobs.size() != items.size())
    throw std::logic_error(
        "step " + std::to_string(step) + " returned " + std::to_string(prompt_logprobs.size()) +
        " lists of prompt log-probabilities for " + std::to_string(items.size()) + " items");
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
  ev.prefix_queried = std::exchange(prefix_queried_, 0);
  ev.prefix_hits = std::exchange(prefix_hits_, 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const Launched& item = items[i];
    const int n = item.tokens;
    ev.batch_tokens += n;
    // A sequence stays while a step holds it; the id check is the guard.
    if (item.slot >= slots_.size()) continue;
    Sequence& q = slots_[item.slot];
    if (!q.used || q.a.id != item.seq) continue;
    if (q.step == step) {
      q.step = q.ahead;
      q.ahead = 0;
    } else if (q.ahead == step) {
      q.ahead = 0;
    }
    q.in_flight -= n;
    if (q.draining) {
      // Ended by an earlier step's token: this item's result means nothing.
      if (q.step == 0) {
        released_.push_back(q.a.id);
        free_slot(item.slot);
      }
      continue;
    }
    ev.prefill_tokens += std::max(0, std::min(item.position + n, q.prefill_end) - item.position);
    queued_ -= queued_of(q);
    q.cached += n;
    queued_ += queued_of(q);
    index_filled(q);
    const bool prompt_lp = q.a.sampling.prompt_logprobs >= 0 && q.a.generated == 0;
    if (prompt_lp && !prompt_logprobs.empty())
      q.prompt_logprobs.insert(q.prompt_logprobs.end(), prompt_logprobs[i].begin(),
                               prompt_logprobs[i].end());
    if (!item.sample || q.cancelled) continue;
    // The first token's step: the prompt's log-probabilities go first.
    if (prompt_lp) ev.prompts.push_back({q.a.id, std::move(q.prompt_logprobs)});
    const int tok = ids[i];
    const int fed = int(q.tokens.size());
    const auto outcome =
        options_.stop.judge(tok, q.a.generated, q.a.max_tokens, fed, q.a.ignore_eos, q.a.sampling);
    if (outcome.deliver) {
      TokenEvent& t = ev.tokens.emplace_back(TokenEvent{q.a.id, q.a.generated, tok});
      if (!logprobs.empty() && logprobs[i]) {
        t.has_logprobs = true;
        t.logprobs = *logprobs[i];
      }
      ++q.a.generated;
      q.tokens.push_back(tok);
    }
    if (outcome.finish) end(ev, item.slot, *outcome.finish);
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
  // Its slot is none of the sequences' (finish_probe, not finish_step, ends it).
  start_flight(step.id).items.push_back({~Slot(0), it.seq, it.position, 1, it.sample});
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
