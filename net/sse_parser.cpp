#include "net/sse_parser.h"

namespace troupe {

void SseParser::feed(std::string_view bytes, const EventFn& on_event) {
  for (const char c : bytes) {
    if (after_cr_ && c == '\n') {  // the CR of this CRLF already ended the line
      after_cr_ = false;
      continue;
    }
    after_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      line(pending_, on_event);
      pending_.clear();
    } else {
      pending_ += c;
    }
  }
}

void SseParser::line(std::string_view text, const EventFn& on_event) {
  if (text.empty()) {
    if (has_data_) {
      // Moved out first so that a callback that throws leaves a clean state.
      std::string data = std::move(data_);
      data_.clear();
      has_data_ = false;
      on_event(data);
    }
    return;
  }
  if (text[0] == ':') return;  // comment (keep-alive pings)
  const size_t colon = text.find(':');
  const std::string_view field = text.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (field != "data") return;  // event, id, retry: nothing a completion stream uses
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
}

std::vector<std::string> sse_events(std::string_view body) {
  std::vector<std::string> events;
  SseParser parser;
  parser.feed(body, [&](const std::string& data) { events.push_back(data); });
  return events;
}

}  // namespace troupe
