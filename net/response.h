#pragma once
// A response as an endpoint or the completion exchange decides it, before it
// is framed for the wire (net/http_framing.h). Plain data, so that routing and
// the exchange are tested without a socket.
#include <string>
#include <utility>
#include <vector>

#include "net/openai_api.h"

namespace troupe {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HeaderList headers;  // beyond the defaults: Allow, Retry-After
};

// OpenAI's error object with the error's status, and Retry-After in whole
// seconds when the error asks for one (429, 503).
Response error_response(const openai::ApiError& e);

}  // namespace troupe
