#include "net/bearer_auth.h"

#include <cctype>

namespace troupe {

namespace {

// Compares without stopping at the first difference, so that the time taken
// does not tell how much of a guess was right.
bool same_secret(std::string_view given, std::string_view secret) {
  if (secret.empty() || given.size() != secret.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ secret[i]);
  return diff == 0;
}

bool is_bearer(std::string_view authorization) {
  constexpr std::string_view kBearer = "bearer ";
  if (authorization.size() < kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kBearer[i]) return false;
  return true;
}

}  // namespace

std::optional<Response> refuse_bearer(std::string_view authorization, std::string_view secret,
                                      const BearerRefusal& refusal) {
  const bool bearer = is_bearer(authorization);
  if (bearer && same_secret(authorization.substr(7), secret)) return std::nullopt;
  openai::ApiError e =
      openai::bad_request(bearer ? refusal.wrong : refusal.missing, {}, refusal.code);
  e.status = 401;
  e.type = "authentication_error";
  Response r = error_response(e);
  r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

}  // namespace troupe
