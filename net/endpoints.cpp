#include "net/endpoints.h"

#include <array>
#include <cctype>
#include <string>

namespace troupe {

namespace {

struct Route {
  std::string_view path;
  std::string_view method;
  Endpoint endpoint;
  bool admin = false;
  bool prefix = false;  // the path and at least one more character

  bool matches(std::string_view p) const {
    if (!prefix) return p == path;
    return p.size() > path.size() && p.substr(0, path.size()) == path;
  }
};

constexpr std::array kRoutes = {
    Route{kCompletionsPath, "POST", Endpoint::Completions},
    Route{kChatCompletionsPath, "POST", Endpoint::ChatCompletions},
    Route{kResponsesPath, "POST", Endpoint::Responses},
    Route{kStoredResponsePrefix, "GET", Endpoint::StoredResponse, false, true},
    Route{"/v1/models", "GET", Endpoint::Models},
    Route{kModelPathPrefix, "GET", Endpoint::Model, false, true},
    Route{"/tokenize", "POST", Endpoint::Tokenize},
    Route{"/detokenize", "POST", Endpoint::Detokenize},
    Route{"/health", "GET", Endpoint::Health},
    Route{"/ready", "GET", Endpoint::Ready},
    Route{"/version", "GET", Endpoint::Version},
    Route{"/metrics", "GET", Endpoint::Metrics},
    Route{"/admin/faults", "GET", Endpoint::Faults, true},
    Route{"/admin/faults", "POST", Endpoint::Faults, true},
};

}  // namespace

std::string percent_decoded(std::string_view segment) {
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && hex(segment[i + 1]) >= 0 &&
        hex(segment[i + 2]) >= 0) {
      out += char(hex(segment[i + 1]) * 16 + hex(segment[i + 2]));
      i += 2;
    } else {
      out += segment[i];
    }
  }
  return out;
}

std::string_view path_of(std::string_view target) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() < scheme.size()) continue;
    bool same = true;  // schemes are case-insensitive
    for (size_t i = 0; i < scheme.size() && same; ++i)
      same = char(std::tolower(static_cast<unsigned char>(target[i]))) == scheme[i];
    if (!same) continue;
    const size_t path = target.find_first_of("/?", scheme.size());
    if (path == std::string_view::npos || target[path] == '?') return "/";
    target = target.substr(path);
    break;
  }
  return target.substr(0, target.find('?'));
}

bool is_admin_path(std::string_view path) {
  for (const Route& r : kRoutes)
    if (r.admin && r.matches(path)) return true;
  return false;
}

std::string allowed_methods(std::string_view path, bool admin) {
  std::string allow;
  for (const Route& r : kRoutes) {
    if (!r.matches(path) || (r.admin && !admin)) continue;
    if (!allow.empty()) allow += ", ";
    allow += r.method;
    if (r.method == "GET") allow += ", HEAD";
  }
  return allow;
}

std::variant<Endpoint, Response> route(std::string_view method, std::string_view target,
                                       bool admin) {
  const std::string_view path = path_of(target);
  bool admin_off = false;
  for (const Route& r : kRoutes) {
    if (r.matches(path) && r.admin && !admin) admin_off = true;
    if (!r.matches(path) || (r.admin && !admin)) continue;
    if (r.method == method || (method == "HEAD" && r.method == "GET")) return r.endpoint;
  }
  const std::string allow = allowed_methods(path, admin);
  if (allow.empty()) {
    // Said, since the path is right: only the server's config is missing.
    const std::string why =
        admin_off ? " (fault injection is off on this server: admin.faults and admin.token)" : "";
    openai::ApiError e =
        openai::bad_request("Not found: " + std::string(path) + why, {}, "not_found");
    e.status = 404;
    return error_response(e);
  }
  if (method == "OPTIONS") return Endpoint::Options;
  openai::ApiError e = openai::bad_request("Method " + std::string(method) + " is not allowed on " +
                                           std::string(path) + "; use " + allow + ".");
  e.status = 405;
  Response r = error_response(e);
  r.headers.emplace_back("Allow", allow);
  return r;
}

}  // namespace troupe
