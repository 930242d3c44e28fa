#pragma once
// Server-sent events (text/event-stream) as a client reads them.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// Incremental SSE parser (the WHATWG event-stream rules we need: data lines,
// comments, CR/LF/CRLF line ends, blank line dispatches). Bytes may arrive
// split anywhere, even inside a line ending.
class SseParser {
 public:
  using EventFn = std::function<void(const std::string& data)>;
  void feed(std::string_view bytes, const EventFn& on_event);

 private:
  void line(std::string_view text, const EventFn& on_event);
  std::string pending_;  // an unfinished line
  std::string data_;     // data lines of the event being built
  bool has_data_ = false;
  bool after_cr_ = false;  // last byte was CR: a following LF ends nothing
};

// The data of each complete event of a whole body, in order.
std::vector<std::string> sse_events(std::string_view body);

}  // namespace troupe
