#include "faults/fault_order.h"

#include <array>
#include <utility>

namespace troupe {

namespace {

constexpr std::array<std::pair<std::string_view, FaultKind>, 4> kKinds = {{
    {"kill", FaultKind::Kill},
    {"step_error", FaultKind::StepError},
    {"slow", FaultKind::Slow},
    {"kv_alloc_fail", FaultKind::KvAllocFail},
}};

constexpr std::array<std::pair<std::string_view, FaultRole>, 4> kRoles = {{
    {"worker", FaultRole::Worker},
    {"batcher", FaultRole::Batcher},
    {"shard", FaultRole::Shard},
    {"member", FaultRole::Member},
}};

template <class Table>
std::string joined(const Table& t) {
  std::string s;
  for (const auto& [name, value] : t) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

}  // namespace

std::chrono::nanoseconds fault_delay(double seconds) {
  // Written so that NaN goes to 0: every comparison with it is false.
  const double s = seconds > 0 ? (seconds < kMaxFaultSeconds ? seconds : kMaxFaultSeconds) : 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}

bool fault_names_device(FaultKind kind, FaultRole role) {
  return kind == FaultKind::StepError ||
         (kind == FaultKind::Kill && (role == FaultRole::Shard || role == FaultRole::Member));
}

bool fault_lasts(FaultKind kind) {
  return kind == FaultKind::Slow || kind == FaultKind::KvAllocFail;
}

std::string_view fault_kind_name(FaultKind kind) {
  for (const auto& [name, k] : kKinds)
    if (k == kind) return name;
  return "?";
}

std::optional<FaultKind> parse_fault_kind(std::string_view name) {
  for (const auto& [n, k] : kKinds)
    if (n == name) return k;
  return std::nullopt;
}

std::string_view fault_role_name(FaultRole role) {
  for (const auto& [name, r] : kRoles)
    if (r == role) return name;
  return "?";
}

std::optional<FaultRole> parse_fault_role(std::string_view name) {
  for (const auto& [n, r] : kRoles)
    if (n == name) return r;
  return std::nullopt;
}

std::string fault_kind_names() {
  return joined(kKinds);
}
std::string fault_role_names() {
  return joined(kRoles);
}

}  // namespace troupe
