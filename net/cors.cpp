#include "net/cors.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "net/openai_api.h"
#include "service/allowed_origin.h"

namespace troupe {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Is `method` one of the comma-separated `methods`?
bool lists(std::string_view methods, std::string_view method) {
  while (!methods.empty()) {
    const size_t comma = methods.find(',');
    if (trim(methods.substr(0, comma)) == method) return true;
    if (comma == std::string_view::npos) break;
    methods.remove_prefix(comma + 1);
  }
  return false;
}

Response refused(std::string message) {
  openai::ApiError e = openai::bad_request(std::move(message), {}, "cors_refused");
  e.status = 403;
  return error_response(e);
}

}  // namespace

CorsPolicy::CorsPolicy(std::vector<std::string> allowed_origins) {
  for (const std::string& o : allowed_origins) {
    if (auto why = invalid_origin(o)) throw std::invalid_argument(*why);
    if (o == "*")
      any_ = true;
    else
      origins_.push_back(lower(o));
  }
}

std::optional<std::string> CorsPolicy::allow_origin(std::string_view origin) const {
  if (origin.empty()) return std::nullopt;
  if (any_) return std::string("*");
  const std::string o = lower(origin);
  if (std::find(origins_.begin(), origins_.end(), o) == origins_.end()) return std::nullopt;
  return std::string(origin);
}

HeaderList CorsPolicy::response_headers(std::string_view origin) const {
  HeaderList h;
  // The answer differs by Origin unless it is "*": caches must know.
  if (!any_ && !origins_.empty()) h.emplace_back("Vary", "Origin");
  if (auto allowed = allow_origin(origin)) h.emplace_back("Access-Control-Allow-Origin", *allowed);
  return h;
}

Response CorsPolicy::preflight(std::string_view path, std::string_view methods,
                               std::string_view origin, std::string_view request_method,
                               std::string_view request_headers) const {
  Response r;
  r.status = 204;
  r.content_type.clear();
  if (origin.empty() || request_method.empty()) {
    r.headers.emplace_back("Allow", std::string(methods));
    return r;
  }
  const auto allowed = allow_origin(origin);
  if (!allowed)
    return refused("Cross-origin requests from " + std::string(origin) +
                   " are not allowed (server.allowed_origins).");
  if (!lists(methods, request_method))
    return refused("Method " + std::string(request_method) + " is not allowed on " +
                   std::string(path) + "; use " + std::string(methods) + ".");
  r.headers = response_headers(origin);
  r.headers.emplace_back("Access-Control-Allow-Methods", std::string(methods));
  // Any header the page wants to send (Authorization, OpenAI's own), as
  // vLLM allows; "*" would not cover Authorization.
  if (!trim(request_headers).empty())
    r.headers.emplace_back("Access-Control-Allow-Headers", std::string(trim(request_headers)));
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  return r;
}

}  // namespace troupe
