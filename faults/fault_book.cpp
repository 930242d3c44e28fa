#include "faults/fault_book.h"

#include <spdlog/spdlog.h>

#include <sstream>

namespace troupe {

namespace {

// 15 -> "15", 0.5 -> "0.5".
std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

}  // namespace

std::string_view fault_state_name(FaultState s) {
  switch (s) {
    case FaultState::Scheduled:
      return "scheduled";
    case FaultState::Active:
      return "active";
    case FaultState::Confirmed:
      return "confirmed";
    case FaultState::Ended:
      return "ended";
    case FaultState::Failed:
      return "failed";
  }
  return "?";
}

FaultBook::FaultBook(double confirm_within_s) : confirm_within_s_(confirm_within_s) {}

double FaultBook::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

FaultOrder FaultBook::add(FaultOrder order, double at_s, double duration_s, double now) {
  std::lock_guard<std::mutex> l(mu_);
  order.id = next_id_++;
  FaultEntry e;
  e.order = order;
  e.at_s = at_s;
  e.duration_s = duration_s;
  e.added = now;
  entries_.push_back(std::move(e));
  return order;
}

FaultEntry* FaultBook::find(uint64_t id) {
  for (auto& e : entries_)
    if (e.order.id == id) return &e;
  return nullptr;
}

std::optional<FaultEntry> FaultBook::get(uint64_t id) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& e : entries_)
    if (e.order.id == id) return e;
  return std::nullopt;
}

std::vector<FaultEntry> FaultBook::list() const {
  std::lock_guard<std::mutex> l(mu_);
  return entries_;
}

void FaultBook::started(uint64_t id, double now) {
  std::lock_guard<std::mutex> l(mu_);
  if (FaultEntry* e = find(id); e && e->state == FaultState::Scheduled) {
    e->state = FaultState::Active;
    e->started = now;
  }
}

void FaultBook::report(const FaultReport& r, double now) {
  std::lock_guard<std::mutex> l(mu_);
  FaultEntry* e = find(r.id);
  if (!e) return;
  if (r.outcome == FaultOutcome::Withdrawn) {
    // Only withdrawals the book asked for (of a fault it gave up on).
    if (e->expired && e->withdrawn < 0) {
      e->withdrawn = now;
      e->error += "; withdrawn (" + r.text + ")";
      spdlog::info("fault {}: withdrawn: {}", r.id, r.text);
    }
    return;
  }
  if (e->state == FaultState::Failed || e->state == FaultState::Ended) return;
  switch (r.outcome) {
    case FaultOutcome::Applied:
      if (e->effect.empty()) e->effect = r.text;
      break;
    case FaultOutcome::Confirmed:
      if (e->state == FaultState::Active) {
        e->state = FaultState::Confirmed;
        e->confirmed = now;
        e->effect = r.text;
      }
      break;
    case FaultOutcome::Refused:
      e->state = FaultState::Failed;
      e->error = r.text;
      spdlog::warn("fault {}: refused: {}", r.id, r.text);
      break;
    case FaultOutcome::Withdrawn:
      break;
  }
}

void FaultBook::fail(uint64_t id, const std::string& why, double now) {
  (void)now;
  std::lock_guard<std::mutex> l(mu_);
  if (FaultEntry* e = find(id);
      e && (e->state == FaultState::Scheduled || e->state == FaultState::Active)) {
    e->state = FaultState::Failed;
    e->error = why;
    spdlog::warn("fault {}: failed: {}", id, why);
  }
}

void FaultBook::ended(uint64_t id, double now) {
  std::lock_guard<std::mutex> l(mu_);
  FaultEntry* e = find(id);
  if (!e) return;
  e->ended = now;
  if (e->state == FaultState::Confirmed) {
    e->state = FaultState::Ended;
  } else if (e->state == FaultState::Active) {
    e->state = FaultState::Failed;
    e->error = "no effect seen while it lasted (did the replica run any step?)";
  }
}

void FaultBook::replica_died(int replica, const std::string& why, double now) {
  std::lock_guard<std::mutex> l(mu_);
  // A death is one fault's doing, and only an injected one's: the actor it
  // killed says so in the reason. Other deaths (a part that could not meet
  // the others, a lost node, a collective's timeout) confirm nothing, nor
  // do several faults queued for the one death that was (the others never
  // ran: they fail for want of an effect).
  if (why.find("injected fault") == std::string::npos) return;
  FaultEntry* owner = nullptr;
  for (auto& e : entries_) {
    if (e.order.replica != replica) continue;
    if (e.order.kind != FaultKind::Kill && e.order.kind != FaultKind::StepError) continue;
    if (e.expired && e.withdrawn < 0 && e.died_late < 0) {
      // Given up on, and its withdrawal not acknowledged: it may have fired
      // before the withdrawal reached it (or the withdrawal was lost).
      e.died_late = now;
      e.effect = "replica " + std::to_string(replica) +
                 " died after the fault was given up, before its withdrawal was "
                 "acknowledged: " +
                 why;
      spdlog::warn("fault {}: {}", e.order.id, e.effect);
      continue;
    }
    if (e.state != FaultState::Active) continue;
    if (!owner || e.started < owner->started) owner = &e;
  }
  if (!owner) return;
  owner->state = FaultState::Confirmed;
  owner->confirmed = owner->detected = now;
  owner->effect = "replica " + std::to_string(replica) + " died: " + why;
}

void FaultBook::replica_up(int replica, double now) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& e : entries_)
    if (e.order.replica == replica && e.detected >= 0 && e.recovered < 0) e.recovered = now;
}

void FaultBook::resumed(double down, double next_token) {
  std::lock_guard<std::mutex> l(mu_);
  resumes_.push_back({down, next_token});
  if (resumes_.size() > kMaxResumes) resumes_.pop_front();
}

std::vector<FaultBook::Resume> FaultBook::resumes() const {
  std::lock_guard<std::mutex> l(mu_);
  return {resumes_.begin(), resumes_.end()};
}

std::vector<FaultOrder> FaultBook::expire(double now) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<FaultOrder> out;
  for (auto& e : entries_) {
    if (e.state != FaultState::Active || fault_lasts(e.order.kind)) continue;
    if (now - e.started > confirm_within_s_) {
      e.state = FaultState::Failed;
      e.expired = true;
      e.error = "no effect seen within " + seconds_text(confirm_within_s_) + " s";
      spdlog::warn("fault {}: {}; withdrawing it", e.order.id, e.error);
      out.push_back(e.order);
    }
  }
  return out;
}

}  // namespace troupe
