#pragma once
// Which endpoint a request names: path and method to an endpoint, or the 404
// or 405 (with Allow) for a request that names none. Apart from the
// connection code, so that the table is the one place an endpoint is added.
#include <string>
#include <string_view>
#include <variant>

#include "net/response.h"

namespace troupe {

// Model: GET /v1/models/{id}, one model (its id is what follows the prefix).
// StoredResponse: GET /v1/responses/{id}, which is never found (nothing is
// stored), said as such.
enum class Endpoint {
  Completions,
  ChatCompletions,
  Responses,
  StoredResponse,
  Models,
  Model,
  Tokenize,
  Detokenize,
  Health,
  Ready,
  Version,
  Metrics,
  Faults,
  Options  // OPTIONS on any known path: a CORS preflight (net/cors.h), or what Allow says
};

inline constexpr std::string_view kCompletionsPath = "/v1/completions";
inline constexpr std::string_view kChatCompletionsPath = "/v1/chat/completions";
inline constexpr std::string_view kResponsesPath = "/v1/responses";
inline constexpr std::string_view kStoredResponsePrefix = "/v1/responses/";
inline constexpr std::string_view kModelPathPrefix = "/v1/models/";

// The endpoints that generate: counted in the request metrics, refused while
// the server shuts down.
inline bool generates(Endpoint e) {
  return e == Endpoint::Completions || e == Endpoint::ChatCompletions || e == Endpoint::Responses;
}
// The endpoints server.api_key guards: the model's (as OpenAI's /v1/*, and
// vLLM's tokenizer). Probes, metrics and the version stay open, and the
// admin endpoints have their own token.
inline bool needs_api_key(Endpoint e) {
  return generates(e) || e == Endpoint::Models || e == Endpoint::Model || e == Endpoint::Tokenize ||
         e == Endpoint::Detokenize || e == Endpoint::StoredResponse;
}
inline bool generates_path(std::string_view path) {
  return path == kCompletionsPath || path == kChatCompletionsPath || path == kResponsesPath;
}

// The target's path: without its query string, and for the absolute form a
// proxy sends ("http://host:port/path?q", which servers must accept) without
// the scheme and authority.
std::string_view path_of(std::string_view target);

// A path segment with its %XX escapes decoded (a model id such as
// "org%2Fmodel", as clients that URI-encode it send it); a '%' that starts no
// escape stays as it is.
std::string percent_decoded(std::string_view segment);

// The methods `path` takes, as Allow lists them ("POST", "GET, HEAD"); empty
// for a path that names no endpoint.
std::string allowed_methods(std::string_view path, bool admin = false);

// Is `path` one of the admin endpoints' (whatever the configuration)?
bool is_admin_path(std::string_view path);

// The endpoint for `method` on `target`, or the error response to send: 404
// for an unknown path (paths match exactly, but for kModelPathPrefix and an id), 405 with Allow
// (the methods the path takes) for a known path asked with another method. HEAD is taken wherever
// GET is, as GET without the body. The admin paths exist only with `admin` (the configuration
// turned them on). OPTIONS is taken on every known path (Endpoint::Options).
std::variant<Endpoint, Response> route(std::string_view method, std::string_view target,
                                       bool admin = false);

}  // namespace troupe
