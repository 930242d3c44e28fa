#include "net/admin_endpoint.h"

#include <nlohmann/json.hpp>

#include "faults/fault_json.h"
#include "net/bearer_auth.h"

namespace troupe {

namespace {

// The key a refusal is about, for the error's `param`: refusals start with
// it ("factor: must be above 1"), or name an unknown one ("unknown key 'x'").
std::string refused_key(const std::string& why) {
  constexpr std::string_view kUnknown = "unknown key '";
  if (why.starts_with(kUnknown)) {
    const size_t end = why.find('\'', kUnknown.size());
    return end == std::string::npos ? std::string()
                                    : why.substr(kUnknown.size(), end - kUnknown.size());
  }
  const size_t colon = why.find(':');
  if (colon == 0 || colon == std::string::npos) return {};
  for (size_t i = 0; i < colon; ++i)
    if (!((why[i] >= 'a' && why[i] <= 'z') || why[i] == '_')) return {};
  return why.substr(0, colon);
}

}  // namespace

Response answer_faults(FaultAdmin& admin, const std::string& token, std::string_view method,
                       std::string_view authorization, std::string_view body) {
  static const BearerRefusal kRefusal{
      "The admin endpoints need \"Authorization: Bearer <admin.token>\".",
      "The admin token is wrong.", "unauthorized"};
  if (auto refused = refuse_bearer(authorization, token, kRefusal)) return *refused;
  Response r;
  // HEAD is a GET without the body (the server drops it): never an injection.
  if (method == "GET" || method == "HEAD") {
    nlohmann::json list = nlohmann::json::array();
    for (const FaultEntry& e : admin.faults()) list.push_back(fault_entry_json(e));
    nlohmann::json resumes = nlohmann::json::array();
    for (const FaultBook::Resume& x : admin.resumes()) resumes.push_back({x.down, x.next_token});
    // The book's clock now, so that a client can place the times on its own.
    r.body = nlohmann::json{{"now_s", admin.now()}, {"faults", list}, {"resumes", resumes}}.dump();
    return r;
  }
  auto injected = admin.inject_json(body);
  if (auto* why = std::get_if<std::string>(&injected))
    return error_response(
        openai::bad_request("Fault refused: " + *why + ".", refused_key(*why), "invalid_fault"));
  r.status = 201;
  r.body = fault_entry_json(std::get<FaultEntry>(injected)).dump();
  return r;
}

}  // namespace troupe
