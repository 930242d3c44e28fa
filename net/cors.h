#pragma once
// Cross-origin requests (CORS): which web pages may call the API from a
// browser. A browser sends `Origin` with a page's request and asks first
// (OPTIONS, a "preflight") before a POST with a JSON body; without the
// answers below it hides the response from the page. vLLM and llama-server
// allow every origin by default, so web UIs work against them; the policy
// here is the same, set by server.allowed_origins. Plain data, no socket:
// the server asks it for headers.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/response.h"

namespace troupe {

class CorsPolicy {
 public:
  // `allowed_origins`: "*" (any page) or origins as browsers write them,
  // "scheme://host[:port]"; empty: no page may read an answer (the browser
  // enforces it; clients that are not browsers are not affected).
  // Throws std::invalid_argument for an entry that is not one
  // (service/allowed_origin.h).
  explicit CorsPolicy(std::vector<std::string> allowed_origins = {"*"});

  // The headers a response to a request with this Origin carries (none when
  // the request has no Origin or the origin is not allowed).
  HeaderList response_headers(std::string_view origin) const;

  // The answer to OPTIONS on `path`, whose methods are `methods` ("POST",
  // "GET, HEAD": what Allow says). A preflight (Origin and
  // Access-Control-Request-Method given) from an allowed origin for one of
  // the methods gets 204 with the CORS headers, allowing the request headers
  // the browser asked for; a refused one gets 403 naming why. A plain
  // OPTIONS gets 204 with Allow.
  Response preflight(std::string_view path, std::string_view methods, std::string_view origin,
                     std::string_view request_method, std::string_view request_headers) const;

 private:
  // The Access-Control-Allow-Origin value for `origin`, if it is allowed.
  std::optional<std::string> allow_origin(std::string_view origin) const;

  std::vector<std::string> origins_;  // lower case
  bool any_ = false;
};

}  // namespace troupe
