#include "net/response.h"

namespace troupe {

Response error_response(const openai::ApiError& e) {
  Response r;
  r.status = e.status;
  r.body = openai::error_body(e);
  if (e.retry_after_s > 0)
    r.headers.emplace_back("Retry-After",
                           std::to_string(openai::retry_after_header_seconds(e.retry_after_s)));
  return r;
}

}  // namespace troupe
