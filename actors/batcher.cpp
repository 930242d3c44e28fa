#include "actors/batcher.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <unordered_map>

#include "actors/messages.h"
#include "actors/worker.h"

namespace troupe {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kProbeSeq = ~uint64_t(0);

struct Sequence {
  Assignment a;
  std::vector<int> tokens;  // prompt + generated so far
  int cached = 0;           // tokens in the worker's KV cache
  int in_step = 0;          // tokens fed by a step in flight (0: not in one)
  bool busy = false;        // in a step in flight
  bool cancelled = false;
};

struct BatcherState {
  BatcherOptions opts;
  caf::actor router;
  caf::actor worker;
  std::unique_ptr<ContinuousBatchPolicy> policy;
  int max_seq_len = 0;
  std::vector<int> eos;
  int bos = 1;
  std::unordered_map<uint64_t, Sequence> seqs;
  std::vector<uint64_t> running;  // admission order
  std::deque<uint64_t> waiting;
  int in_flight = 0;  // steps sent, not yet answered
  bool up = false;
};

bool is_eos(const BatcherState& s, int tok) {
  for (int e : s.eos)
    if (e == tok) return true;
  return false;
}

// Counting the tokens of a step in flight: the blocks are reserved for them.
int blocks_held(const BatcherState& s, const Sequence& q) {
  return s.policy->blocks_for(q.cached + q.in_step);
}

void schedule(caf::event_based_actor* self, std::shared_ptr<BatcherState> st);

void finish(BatcherState& s, StepEvents& ev, uint64_t id, FinishReason reason,
            caf::event_based_actor* self) {
  auto it = s.seqs.find(id);
  if (it == s.seqs.end()) return;
  ev.done.push_back({id, reason, it->second.a.generated});
  if (it->second.cached > 0) self->send(s.worker, release_atom::value, id);
  s.seqs.erase(it);
  std::erase(s.running, id);
  std::erase(s.waiting, id);
}

void fill_load(const BatcherState& s, StepEvents& ev) {
  ev.replica = s.opts.replica;
  ev.running = int(s.running.size());
  ev.waiting = int(s.waiting.size());
  int used = 0;
  for (uint64_t id : s.running) used += blocks_held(s, s.seqs.at(id));
  ev.blocks_used = used;
  ev.blocks_free = s.opts.kv_blocks - used;
}

void apply_result(caf::event_based_actor* self, std::shared_ptr<BatcherState> st,
                  const std::vector<EngineItem>& items, const std::vector<int>& out,
                  double step_s) {
  BatcherState& s = *st;
  StepEvents ev;
  ev.step_s = step_s;
  ev.batch_sequences = int(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ev.batch_tokens += int(items[i].tokens.size());
    auto it = s.seqs.find(items[i].seq);
    if (it == s.seqs.end()) continue;
    Sequence& q = it->second;
    q.cached += int(items[i].tokens.size());
    q.in_step = 0;
    q.busy = false;
    if (!items[i].sample || q.cancelled) continue;
    const int tok = out[i];
    if (!q.a.ignore_eos && is_eos(s, tok)) {
      finish(s, ev, q.a.id, FinishReason::Stop, self);
      continue;
    }
    ev.tokens.push_back({q.a.id, q.a.generated, tok});
    ++q.a.generated;
    q.tokens.push_back(tok);
    // Same stop rule as generate(): max_tokens, or no room to feed the token.
    if (q.a.generated >= q.a.max_tokens || int(q.tokens.size()) - 1 >= s.max_seq_len)
      finish(s, ev, q.a.id, FinishReason::Length, self);
  }
  fill_load(s, ev);
  self->send(s.router, events_atom::value, std::move(ev));
}

// Plans and sends one step; false when there is nothing to run.
bool dispatch(caf::event_based_actor* self, std::shared_ptr<BatcherState> st) {
  BatcherState& s = *st;
  // Cancelled sequences leave before the next step, freeing their blocks
  // (those in a step in flight leave once it is answered).
  {
    StepEvents ev;
    std::vector<uint64_t> gone;
    for (auto& [id, q] : s.seqs)
      if (q.cancelled && !q.busy) gone.push_back(id);
    for (uint64_t id : gone) finish(s, ev, id, FinishReason::Cancelled, self);
    if (!gone.empty()) {
      fill_load(s, ev);
      self->send(s.router, events_atom::value, std::move(ev));
    }
  }
  std::vector<SeqView> running, waiting;
  int used = 0, busy = 0;
  for (uint64_t id : s.running) {
    const Sequence& q = s.seqs.at(id);
    used += blocks_held(s, q);
    if (q.busy) {
      ++busy;
      continue;
    }
    running.push_back({id, int(q.tokens.size()) - q.cached, q.cached, blocks_held(s, q)});
  }
  for (uint64_t id : s.waiting) {
    const Sequence& q = s.seqs.at(id);
    waiting.push_back({id, int(q.tokens.size()), 0, 0});
  }
  // With G groups, a step takes its share of the live sequences, so that
  // the other groups' steps fill the pipeline's other stages.
  int cap = 0;
  if (s.opts.groups > 1) {
    const int live = int(s.running.size() + s.waiting.size());
    cap = std::max(1, (live + s.opts.groups - 1) / s.opts.groups);
  }
  const BatchPlan plan = s.policy->plan(running, waiting, s.opts.kv_blocks - used, cap, busy);
  for (uint64_t id : plan.preempted) {
    // Recomputed later from its tokens: the KV state is dropped, not lost.
    Sequence& q = s.seqs.at(id);
    self->send(s.worker, release_atom::value, id);
    q.cached = 0;
    std::erase(s.running, id);
    s.waiting.push_front(id);
    spdlog::debug("replica {}: preempted request {}", s.opts.replica, id);
  }
  for (uint64_t id : plan.admitted) {
    std::erase(s.waiting, id);
    s.running.push_back(id);
  }
  if (plan.entries.empty()) return false;
  std::vector<EngineItem> items;
  items.reserve(plan.entries.size());
  for (const auto& e : plan.entries) {
    Sequence& q = s.seqs.at(e.id);
    EngineItem it;
    it.seq = e.id;
    it.tokens.assign(q.tokens.begin() + q.cached, q.tokens.begin() + q.cached + e.tokens);
    it.sample = q.cached + e.tokens == int(q.tokens.size());
    it.sampling = q.a.sampling;
    it.generated = q.a.generated;
    q.in_step = e.tokens;
    q.busy = true;
    items.push_back(std::move(it));
  }
  ++s.in_flight;
  const auto t0 = Clock::now();
  self->request(s.worker, caf::infinite, step_atom::value, items)
      .then(
          [=](const std::vector<int>& out) {
            --st->in_flight;
            apply_result(self, st, items, out,
                         std::chrono::duration<double>(Clock::now() - t0).count());
            schedule(self, st);
          },
          [=](caf::error& err) {
            // With several steps in flight, the others' requests fail with
            // request_receiver_down once the worker is gone; the link brings
            // the reason it died, which is what supervision should see.
            if (err == caf::sec::request_receiver_down) return;
            spdlog::error("replica {}: step failed: {}", st->opts.replica,
                          self->system().render(err));
            self->quit(err);
          });
  return true;
}

void schedule(caf::event_based_actor* self, std::shared_ptr<BatcherState> st) {
  if (!st->up) return;
  while (st->in_flight < std::max(1, st->opts.groups) && dispatch(self, st)) {
  }
}

void probe(caf::event_based_actor* self, std::shared_ptr<BatcherState> st) {
  EngineItem it;
  it.seq = kProbeSeq;
  it.tokens = {st->bos};
  it.sample = true;
  it.sampling.temperature = 0;
  ++st->in_flight;
  self->request(st->worker, caf::infinite, step_atom::value, std::vector<EngineItem>{it})
      .then(
          [=](const std::vector<int>&) {
            self->send(st->worker, release_atom::value, kProbeSeq);
            --st->in_flight;
            st->up = true;
            self->send(st->router, up_atom::value, st->opts.replica,
                       caf::actor_cast<caf::actor>(self));
            schedule(self, st);
          },
          [=](caf::error& err) { self->quit(err); });
}

}  // namespace

caf::behavior batcher_actor(caf::event_based_actor* self, caf::actor router, ModelConfig model,
                            BatcherOptions options) {
  auto st = std::make_shared<BatcherState>();
  st->opts = options;
  st->router = std::move(router);
  st->policy = std::make_unique<ContinuousBatchPolicy>(options.limits, options.block_tokens);
  st->max_seq_len = model.max_seq_len;
  st->eos = model.eos_ids;
  st->bos = model.bos_id;
  st->worker = self->spawn<caf::detached + caf::linked>(worker_actor, options.engine,
                                                        options.replica, options.metrics);
  probe(self, st);
  return {
      [=](assign_atom, Assignment& a) {
        const uint64_t id = a.id;
        Sequence q;
        q.tokens = a.tokens;
        q.a = std::move(a);
        st->seqs[id] = std::move(q);
        st->waiting.push_back(id);
        schedule(self, st);
      },
      [=](cancel_atom, uint64_t id) {
        auto it = st->seqs.find(id);
        if (it == st->seqs.end()) return;
        it->second.cancelled = true;
        schedule(self, st);
      },
      [=](crash_atom a) { self->send(st->worker, a); },
      [=](crash_atom a, int device) { self->send(st->worker, a, device); },
      [=](slow_atom a, double seconds) { self->send(st->worker, a, seconds); },
  };
}

}  // namespace troupe
