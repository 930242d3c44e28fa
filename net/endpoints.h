#pragma once
// Which endpoint a request names: path and method to an endpoint, or the 404
// or 405 (with Allow) for a request that names none. Apart from the
// connection code, so that the table is the one place an endpoint is added.
#include <string_view>
#include <variant>

#include "net/response.h"

namespace troupe {

enum class Endpoint { Completions, Models, Health, Ready, Metrics, Faults };

inline constexpr std::string_view kCompletionsPath = "/v1/completions";

// The target without its query string.
std::string_view path_of(std::string_view target);

// The endpoint for `method` on `target`, or the error response to send: 404
// for an unknown path, 405 with Allow (the methods the path takes) for a
// known path asked with another method. The admin paths exist only with
// `admin` (the configuration turned them on).
std::variant<Endpoint, Response> route(std::string_view method, std::string_view target,
                                       bool admin = false);

}  // namespace troupe
