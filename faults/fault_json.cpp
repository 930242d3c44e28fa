#include "faults/fault_json.h"

#include <cmath>

namespace troupe {

namespace {

using json = nlohmann::json;

struct Refusal {
  std::string what;
};

int integer(const json& j, const char* key, int lo, int hi) {
  const json& v = j.at(key);
  if (!v.is_number_integer())
    throw Refusal{std::string(key) + ": expected an integer, got " + v.dump()};
  const auto n = v.get<int64_t>();
  if (n < lo || n > hi)
    throw Refusal{std::string(key) + ": " + std::to_string(n) + " is out of range [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]"};
  return int(n);
}

double number(const json& j, const char* key, double lo) {
  const json& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw Refusal{std::string(key) + ": expected a number, got " + v.dump()};
  const double x = v.get<double>();
  if (x < lo) throw Refusal{std::string(key) + ": " + v.dump() + " is below " + json(lo).dump()};
  return x;
}

std::string text(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_string()) throw Refusal{std::string(key) + ": expected a string, got " + v.dump()};
  return v.get<std::string>();
}

// A time in seconds: a number in [lo, kMaxFaultSeconds].
double seconds(const json& j, const char* key, double lo) {
  const double x = number(j, key, lo);
  if (x > kMaxFaultSeconds)
    throw Refusal{std::string(key) + ": " + j.at(key).dump() + " is above " +
                  json(kMaxFaultSeconds).dump() + " (a week, the longest a fault waits or lasts)"};
  return x;
}

double optional_time(double t) {
  return t < 0 ? -1 : t;
}

}  // namespace

std::variant<FaultRequest, std::string> parse_fault_request(std::string_view body, int replicas,
                                                            int devices) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return std::string("the body is not JSON");
  if (!j.is_object()) return std::string("expected a JSON object such as {\"kind\": \"kill\"}");
  try {
    static const char* const kKeys[] = {"kind",   "role", "replica",   "device",
                                        "factor", "at_s", "duration_s"};
    for (const auto& [key, value] : j.items()) {
      bool known = false;
      for (const char* k : kKeys) known = known || key == k;
      if (!known)
        throw Refusal{"unknown key '" + key +
                      "'; known: kind, role, replica, device, factor, at_s, duration_s"};
    }
    FaultRequest r;
    if (!j.contains("kind")) throw Refusal{"kind: missing; one of " + fault_kind_names()};
    const std::string kind = text(j, "kind");
    const auto k = parse_fault_kind(kind);
    if (!k) throw Refusal{"kind: unknown '" + kind + "'; one of " + fault_kind_names()};
    r.order.kind = *k;
    if (j.contains("role")) {
      if (*k != FaultKind::Kill) throw Refusal{"role: only a kill has a role"};
      const std::string role = text(j, "role");
      const auto ro = parse_fault_role(role);
      if (!ro)
        throw Refusal{"role: unknown '" + role + "'; one of " + fault_role_names() +
                      " (the router and the supervisor are the coordinator itself: kill its "
                      "process instead)"};
      r.order.role = *ro;
    }
    if (j.contains("replica")) r.order.replica = integer(j, "replica", 0, replicas - 1);
    if (j.contains("device")) r.order.device = integer(j, "device", 0, 4095);
    const bool per_device = (*k == FaultKind::Kill && (r.order.role == FaultRole::Shard ||
                                                       r.order.role == FaultRole::Member));
    if (r.order.device >= 0 && !fault_names_device(*k, r.order.role))
      throw Refusal{"device: a " + kind +
                    (*k == FaultKind::Kill ? " of a " + std::string(fault_role_name(r.order.role))
                                           : std::string(" fault")) +
                    " acts on the whole replica; it names no device"};
    if (per_device && r.order.device < 0)
      throw Refusal{"device: a kill of a " + std::string(fault_role_name(r.order.role)) +
                    " names which one"};
    // Known here, so refused now rather than failed later where it lands. A
    // member's number counts the replica's parts on other nodes: fewer
    // than its devices, so this bound holds for it too.
    if (devices > 0 && r.order.device >= devices)
      throw Refusal{"device: a replica has " + std::to_string(devices) + " device(s), 0 to " +
                    std::to_string(devices - 1) + "; no device " + std::to_string(r.order.device)};
    if (devices == 1 && per_device)
      throw Refusal{"device: a replica has one device, so no " +
                    std::string(fault_role_name(r.order.role)) +
                    " of its own to kill (kill its "
                    "worker instead)"};
    if (j.contains("factor")) {
      if (*k != FaultKind::Slow) throw Refusal{"factor: only a slow fault has a factor"};
      r.order.factor = number(j, "factor", 1);
      if (r.order.factor <= 1) throw Refusal{"factor: must be above 1"};
      if (r.order.factor > kMaxSlowFactor)
        throw Refusal{"factor: " + json(r.order.factor).dump() + " is above " +
                      json(kMaxSlowFactor).dump()};
    } else if (*k == FaultKind::Slow) {
      throw Refusal{"factor: missing; a slow fault makes each step this many times as long"};
    }
    if (j.contains("at_s")) r.at_s = seconds(j, "at_s", 0);
    if (fault_lasts(*k)) {
      if (!j.contains("duration_s"))
        throw Refusal{"duration_s: missing; a " + kind + " fault lasts for a time"};
      r.duration_s = seconds(j, "duration_s", 0);
      if (r.duration_s <= 0) throw Refusal{"duration_s: must be above 0"};
    } else if (j.contains("duration_s")) {
      throw Refusal{"duration_s: a " + kind + " fault happens once; it has no duration"};
    }
    return r;
  } catch (const Refusal& r) {
    return r.what;
  }
}

json fault_request_json(const FaultRequest& r) {
  json j = {{"kind", fault_kind_name(r.order.kind)}, {"replica", r.order.replica}};
  if (r.order.kind == FaultKind::Kill) j["role"] = fault_role_name(r.order.role);
  if (r.order.device >= 0) j["device"] = r.order.device;
  if (r.order.kind == FaultKind::Slow) j["factor"] = r.order.factor;
  if (r.at_s > 0) j["at_s"] = r.at_s;
  if (fault_lasts(r.order.kind)) j["duration_s"] = r.duration_s;
  return j;
}

json fault_entry_json(const FaultEntry& e) {
  json j = fault_request_json({e.order, e.at_s, e.duration_s});
  j["id"] = e.order.id;
  j["state"] = fault_state_name(e.state);
  const auto put = [&](const char* key, double t) {
    if (t >= 0) j[key] = t;
  };
  put("added_s", e.added);
  put("started_s", optional_time(e.started));
  put("confirmed_s", e.confirmed);
  put("ended_s", e.ended);
  put("detected_s", e.detected);
  put("recovered_s", e.recovered);
  put("withdrawn_s", e.withdrawn);
  put("died_late_s", e.died_late);
  if (!e.effect.empty()) j["effect"] = e.effect;
  if (!e.error.empty()) j["error"] = e.error;
  return j;
}

}  // namespace troupe
