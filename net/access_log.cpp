#include "net/access_log.h"

#include <spdlog/fmt/fmt.h>

namespace troupe {

std::string access_line(const AccessRecord& r) {
  std::string line =
      fmt::format("{} \"{}\" {} {:.1f} ms", r.peer.empty() ? "-" : r.peer,
                  r.request_line.empty() ? "-" : r.request_line, r.status, r.seconds * 1e3);
  if (const ExchangeFigures* f = r.figures) {
    line +=
        fmt::format(", prompt {}, completion {} tokens", f->prompt_tokens, f->completion_tokens);
    if (f->ttft_s) line += fmt::format(", first token {:.1f} ms", *f->ttft_s * 1e3);
  }
  if (!r.request_id.empty()) line.append(", id ").append(r.request_id);
  return line;
}

}  // namespace troupe
