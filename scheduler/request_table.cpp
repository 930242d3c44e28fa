#include "scheduler/request_table.h"

#include <algorithm>
#include <stdexcept>

namespace troupe {

RequestTable::RequestTable(RequestTableOptions options, std::unique_ptr<RoutingPolicy> policy,
                           ReplicaChannel& replicas)
    : options_(std::move(options)),
      policy_(std::move(policy)),
      channel_(replicas),
      queue_(options_.admission),
      replicas_(size_t(std::max(0, options_.replicas))),
      loads_(replicas_.size()) {
  if (options_.replicas < 1) throw std::invalid_argument("a request table needs a replica");
  if (!policy_) throw std::invalid_argument("a request table needs a routing policy");
  for (size_t i = 0; i < loads_.size(); ++i) {
    loads_[i].index = i;
    loads_[i].live = false;  // as counted in with_capacity_
    refresh(i);
  }
}

void RequestTable::refresh(size_t i) {
  const ReplicaView& rep = replicas_[i];
  ReplicaLoad& l = loads_[i];
  const bool was = l.live;
  l.live = has_capacity(rep);
  l.outstanding = rep.outstanding;
  l.queued_tokens = rep.queued_tokens;
  l.running = rep.running;
  l.max_batch_sequences = size_t(options_.max_batch_sequences);
  if (l.live != was) l.live ? ++with_capacity_ : --with_capacity_;
}

RequestInfo RequestTable::info(const Request& r) const {
  return {r.req.id, r.req.prompt.size() + r.delivered.size(), size_t(r.req.max_tokens),
          &r.req.prompt};
}

int RequestTable::live_replicas() const {
  int live = 0;
  for (const auto& r : replicas_) live += r.live ? 1 : 0;
  return live;
}

size_t RequestTable::running() const {
  size_t n = 0;
  for (const auto& r : replicas_) n += r.running;
  return n;
}

std::optional<int> RequestTable::placement(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.replica < 0) return std::nullopt;
  return it->second.replica;
}

std::vector<int> RequestTable::delivered(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? std::vector<int>{} : it->second.delivered;
}

RequestTable::Request RequestTable::take(uint64_t id) {
  auto node = requests_.extract(id);
  queue_.remove(id);
  std::erase(resume_, id);
  return std::move(node.mapped());
}

void RequestTable::end_with_error(uint64_t id, ServiceErrorKind kind, const std::string& message,
                                  double retry_after) {
  if (!requests_.count(id)) return;
  Request r = take(id);
  if (r.replica >= 0) {
    ReplicaView& rep = replicas_[size_t(r.replica)];
    if (rep.outstanding > 0) --rep.outstanding;
    refresh(size_t(r.replica));
    if (rep.live) channel_.cancel(r.replica, id);
  }
  r.sink->on_error(ServiceError{kind, message, retry_after});
}

void RequestTable::end_cancelled(uint64_t id) {
  if (!requests_.count(id)) return;
  Request r = take(id);
  r.sink->on_done(FinishReason::Cancelled, int(r.req.prompt.size()), int(r.delivered.size()), 0);
}

bool RequestTable::has_capacity(const ReplicaView& r) const {
  return r.live &&
         r.outstanding < size_t(options_.max_batch_sequences + options_.max_waiting_per_replica);
}

std::optional<size_t> RequestTable::choose(const Request& r, double now) {
  return policy_->choose(loads_, info(r), now);
}

void RequestTable::place(Request& r, size_t replica, double now) {
  ReplicaView& rep = replicas_[replica];
  Assignment a;
  a.id = r.req.id;
  a.tokens = r.req.prompt;
  a.tokens.insert(a.tokens.end(), r.delivered.begin(), r.delivered.end());
  a.generated = int(r.delivered.size());
  a.max_tokens = r.req.max_tokens;
  a.sampling = r.req.sampling;
  a.ignore_eos = r.req.ignore_eos;
  a.priority = r.req.priority;
  r.replica = int(replica);
  r.resuming = false;
  ++rep.outstanding;
  rep.queued_tokens += a.tokens.size();
  refresh(replica);
  policy_->on_dispatch(replica, info(r), now);
  channel_.assign(int(replica), std::move(a));
}

void RequestTable::dispatch(double now) {
  // Resumed requests first: their clients are already waiting mid-stream.
  while (!resume_.empty()) {
    Request& r = requests_.at(resume_.front());
    if (r.delivered.size() >= size_t(r.req.max_tokens)) {
      // Its replica died after its last token, before saying it was done:
      // there is nothing left to generate (another replica would sample one
      // token past max_tokens).
      Request done = take(resume_.front());
      done.sink->on_done(FinishReason::Length, int(done.req.prompt.size()),
                         int(done.delivered.size()), 0);
      continue;
    }
    const auto target = choose(r, now);
    if (!target) return;
    resume_.pop_front();
    place(r, *target, now);
  }
  while (!queue_.empty()) {
    if (with_capacity_ == 0) return;
    const auto id = queue_.pop(now);
    if (!id) return;
    auto it = requests_.find(*id);
    if (it == requests_.end()) continue;
    const auto target = choose(it->second, now);
    if (!target) {
      resume_.push_back(*id);  // keeps its turn
      return;
    }
    place(it->second, *target, now);
  }
}

void RequestTable::submit(CompletionRequest req, std::shared_ptr<CompletionSink> sink, double now) {
  const uint64_t id = req.id;
  if (requests_.count(id)) {
    sink->on_error({ServiceErrorKind::BadRequest, "duplicate request id", 0});
    return;
  }
  if (req.prompt.empty() || int(req.prompt.size()) > options_.max_seq_len) {
    sink->on_error({ServiceErrorKind::BadRequest,
                    "the prompt must have 1 to " + std::to_string(options_.max_seq_len) + " tokens",
                    0});
    return;
  }
  if (failed_ == replicas_.size()) {
    sink->on_error({ServiceErrorKind::Unavailable, "no live replica: all replicas failed", 5});
    return;
  }
  const auto res = queue_.push(id, req.priority, now);
  if (!res.admitted()) {
    if (res.status == AdmitStatus::InvalidPriority)
      sink->on_error(
          {ServiceErrorKind::BadRequest,
           "priority must be between 0 and " + std::to_string(queue_.priority_levels() - 1), 0});
    else
      sink->on_error(
          {ServiceErrorKind::QueueFull, "the admission queue is full", res.retry_after_s});
    return;
  }
  Request r;
  r.deadline = req.timeout_s > 0 ? now + req.timeout_s : 0;
  if (r.deadline > 0) deadlines_.emplace(r.deadline, id);
  r.req = std::move(req);
  r.sink = std::move(sink);
  requests_.emplace(id, std::move(r));
  dispatch(now);
}

void RequestTable::cancel(uint64_t id, double /*now*/) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  if (r.replica >= 0 && replicas_[size_t(r.replica)].live) {
    r.cancelled = true;
    channel_.cancel(r.replica, id);
    return;  // the replica reports it done (cancelled) within a step
  }
  end_cancelled(id);
}

void RequestTable::on_events(const StepEvents& ev, double now) {
  if (ev.replica < 0 || size_t(ev.replica) >= replicas_.size()) return;
  ReplicaView& rep = replicas_[size_t(ev.replica)];
  rep.running = size_t(ev.running);
  rep.queued_tokens = size_t(ev.queued_tokens);
  refresh(size_t(ev.replica));
  // The policy learns decode speed from decode steps and prefill speed from
  // steps that prefilled (a mixed step's time counts against its prefill,
  // which underestimates the rate: the conservative side).
  if (ev.batch_sequences > 0) {
    if (ev.prefill_tokens > 0)
      policy_->on_prefill(size_t(ev.replica), size_t(ev.prefill_tokens), ev.step_s, now);
    else
      policy_->on_step(size_t(ev.replica), ev.step_s, size_t(ev.batch_sequences), now);
  }
  // Once per request, before its first token: a replica that took over a
  // request after a crash computes them again.
  for (const auto& p : ev.prompts) {
    auto it = requests_.find(p.id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    if (r.prompt_logprobs_sent || !r.delivered.empty()) continue;
    r.prompt_logprobs_sent = true;
    r.sink->on_prompt_logprobs(p.entries);
  }
  for (const auto& t : ev.tokens) {
    auto it = requests_.find(t.id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    // Exactly once: a resumed sequence regenerates from the first token the
    // client has not seen, and a late token from a dead replica is the same
    // token (deterministic sampling), so index order decides.
    if (size_t(t.index) != r.delivered.size()) continue;
    if (r.orphaned_at >= 0) {
      if (resumed_) resumed_(r.orphaned_at, now);
      r.orphaned_at = -1;
    }
    r.delivered.push_back(t.token);
    r.sink->on_token(t.token, t.has_logprobs ? &t.logprobs : nullptr);
  }
  for (const auto& d : ev.done) {
    auto it = requests_.find(d.id);
    if (it == requests_.end() || it->second.replica != ev.replica) continue;
    Request& r = it->second;
    if (d.reason != FinishReason::Cancelled && size_t(d.completion_tokens) != r.delivered.size())
      continue;  // a stale replica's view; the live one will finish it
    if (rep.outstanding > 0) --rep.outstanding;
    refresh(size_t(ev.replica));
    policy_->on_complete(size_t(ev.replica), info(r), now);
    Request done = take(d.id);
    done.sink->on_done(d.reason, int(done.req.prompt.size()), int(done.delivered.size()),
                       d.cached_tokens);
  }
  dispatch(now);
}

void RequestTable::replica_up(int replica, double now) {
  if (replica < 0 || size_t(replica) >= replicas_.size()) return;
  if (replicas_[size_t(replica)].failed) --failed_;
  replicas_[size_t(replica)] = ReplicaView{true, false, 0, 0, 0};
  refresh(size_t(replica));
  if (replicas_changed_) replicas_changed_();
  dispatch(now);
}

size_t RequestTable::replica_down(int replica, bool permanent, double now) {
  if (replica < 0 || size_t(replica) >= replicas_.size()) return 0;
  ReplicaView& rep = replicas_[size_t(replica)];
  if (rep.failed != permanent) permanent ? ++failed_ : --failed_;
  rep = ReplicaView{false, permanent, 0, 0, 0};
  refresh(size_t(replica));
  if (replicas_changed_) replicas_changed_();
  std::vector<uint64_t> orphans;
  for (auto& [id, r] : requests_)
    if (r.replica == replica) orphans.push_back(id);
  // Oldest first, ahead of everything queued.
  std::sort(orphans.begin(), orphans.end());
  size_t resumed = 0;
  for (auto it = orphans.rbegin(); it != orphans.rend(); ++it) {
    Request& r = requests_.at(*it);
    if (r.cancelled) {  // the client is gone: nothing to resume for
      end_cancelled(*it);
      continue;
    }
    r.replica = -1;
    r.resuming = true;
    if (r.orphaned_at < 0) r.orphaned_at = now;
    resume_.push_front(*it);
    ++resumed;
  }
  if (failed_ == replicas_.size()) {
    // Nothing will come back: everything waiting ends now with a clear error.
    shutdown("no live replica: all replicas failed");
    return 0;
  }
  dispatch(now);
  return resumed;
}

void RequestTable::tick(double now) {
  const std::vector<uint64_t> expired = queue_.expire(now);
  if (!expired.empty()) {
    // With every replica down (their nodes dead), the client learns why
    // nothing took its request, not only that it waited.
    const std::string why =
        live_replicas() > 0
            ? "timed out waiting in the admission queue"
            : "timed out waiting in the admission queue: no replica is up (0 of " +
                  std::to_string(replicas_.size()) + "; down ones wait to be placed again)";
    for (uint64_t id : expired)
      end_with_error(id, ServiceErrorKind::Unavailable, why, queue_.retry_after_s(now));
  }
  std::vector<std::pair<uint64_t, bool>> late;
  while (!deadlines_.empty() && deadlines_.top().first <= now) {
    const auto [deadline, id] = deadlines_.top();
    deadlines_.pop();
    auto it = requests_.find(id);
    if (it != requests_.end() && it->second.deadline == deadline)
      late.emplace_back(id, it->second.resuming);
  }
  for (auto [id, resuming] : late) {
    if (resuming)
      end_with_error(id, ServiceErrorKind::Unavailable,
                     "its replica failed and no live replica could resume it before its deadline",
                     5);
    else
      end_with_error(id, ServiceErrorKind::Timeout, "request timed out");
  }
  dispatch(now);
}

void RequestTable::shutdown(const std::string& why) {
  std::vector<uint64_t> all;
  for (const auto& [id, r] : requests_) all.push_back(id);
  for (uint64_t id : all) end_with_error(id, ServiceErrorKind::Unavailable, why, 5);
}

}  // namespace troupe
