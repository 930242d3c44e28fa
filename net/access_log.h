#pragma once
// One line per answered request (server.access_log), as web servers keep
// them: who asked, what, the status, how long it took, and for a completion
// its token counts and time to the first token. Plain, so the format is
// tested without a socket.
#include <string>
#include <string_view>

#include "net/completion_exchange.h"

namespace troupe {

struct AccessRecord {
  std::string_view peer;          // "ip:port" of the client
  std::string_view request_line;  // "POST /v1/completions"; "" when none was read
  int status = 0;
  double seconds = 0;                        // from the request's header to its answer
  const ExchangeFigures* figures = nullptr;  // a completion's, when it ran
  std::string_view request_id;               // its X-Request-Id ("" when none)
};

// 127.0.0.1:53422 "POST /v1/completions" 200 210.5 ms, prompt 12, completion
// 32 tokens, first token 12.3 ms, id cmpl-...
std::string access_line(const AccessRecord& r);

}  // namespace troupe
