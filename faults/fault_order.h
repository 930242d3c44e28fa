#pragma once
// A fault injected inside the runtime: what the coordinator orders, and what
// the actor owning the target (a replica's batcher, worker, shard or remote
// part, in whatever process it runs) applies. Faults on links, processes and
// HTTP clients are the chaos harness's (chaos/), not the runtime's.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

enum class FaultKind : uint8_t {
  Kill,         // an actor of a replica dies (role below)
  StepError,    // a device's next step throws
  Slow,         // every step of the replica takes `factor` times as long
  KvAllocFail,  // the replica's KV-cache block allocations are refused
};

// Which actor a Kill takes down. The router and the supervisor are not
// among them: they are the coordinator itself (the router holds the one
// record of every request's tokens that resumption replays), so killing one
// is killing the coordinator process, the single point of failure.
enum class FaultRole : uint8_t { Worker, Batcher, Shard, Member };

struct FaultOrder {
  uint64_t id = 0;
  FaultKind kind = FaultKind::Kill;
  FaultRole role = FaultRole::Worker;  // Kill only
  int replica = 0;
  int device = -1;    // Shard/Member: its index; StepError: the device (-1: the replica's engine)
  double factor = 1;  // Slow: > 1
  // Ends a lasting fault (Slow, KvAllocFail) instead of starting one; for
  // a one-shot fault (Kill, StepError), withdraws it from whatever actor
  // holds it armed (a worker's next step, a shard's), if it has not fired:
  // the coordinator gave up on its effect. Only the fault of this id ends.
  bool end = false;
};

// A slow fault's largest factor (the chaos plans' too): the worker sleeps
// (factor - 1) times each step's time, which must stay a duration.
inline constexpr double kMaxSlowFactor = 1000;

// The longest a fault may wait for its start (at_s) or last (duration_s):
// a week. A run of faults is a test, not a season; and a time must stay a
// duration that the clocks it is added to can hold.
inline constexpr double kMaxFaultSeconds = 7 * 24 * 3600;

// `seconds` as a duration for a timer, in [0, kMaxFaultSeconds] (NaN: 0),
// so that no value overflows the conversion to nanoseconds.
std::chrono::nanoseconds fault_delay(double seconds);

// Whether a fault lasts (and so needs a duration) or happens once.
bool fault_lasts(FaultKind kind);
// Whether a fault acts on one device of its replica and so may name it (a
// step error, or a shard's or member's kill, which must): the others act on
// the whole replica, and a device given to them would be ignored.
bool fault_names_device(FaultKind kind, FaultRole role);

std::string_view fault_kind_name(FaultKind kind);
std::optional<FaultKind> parse_fault_kind(std::string_view name);
std::string_view fault_role_name(FaultRole role);
std::optional<FaultRole> parse_fault_role(std::string_view name);
// "kill, step_error, ..." for messages.
std::string fault_kind_names();
std::string fault_role_names();

// What the actor that applied an order says back.
enum class FaultOutcome : uint8_t {
  Applied,    // it acted; the effect is observed elsewhere (a replica's death)
  Confirmed,  // the effect itself was observed (a step slowed, blocks refused)
  Refused,    // it cannot take effect there (no such device, ...)
  Withdrawn,  // an order to withdraw it found it armed, and disarmed it
};

struct FaultReport {
  uint64_t id = 0;
  FaultOutcome outcome = FaultOutcome::Applied;
  std::string text;
};

}  // namespace troupe
