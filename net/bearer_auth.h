#pragma once
// Requests that must carry a secret as `Authorization: Bearer <secret>`: the
// API key (server.api_key) and the admin token. Plain, tested without a socket.
#include <optional>
#include <string>
#include <string_view>

#include "net/response.h"

namespace troupe {

struct BearerRefusal {
  std::string missing;  // the message when no bearer secret was sent
  std::string wrong;    // the message when the one sent is not the secret
  std::string code;     // the error's code
};

// Nothing when `authorization` (the header, "" when absent) is "Bearer
// <secret>" (the scheme in any case, RFC 9110 11.1); otherwise the 401 to
// send, with WWW-Authenticate. An empty secret matches nothing. The compare
// takes as long wherever the guess goes wrong.
std::optional<Response> refuse_bearer(std::string_view authorization, std::string_view secret,
                                      const BearerRefusal& refusal);

}  // namespace troupe
