// A client reading a streamed completion: untrusted server bytes through
// net/sse_parser (SseParser, sse_events) and net/completion_stream
// (CompletionStream), whole and split into pieces, as they arrive from a
// socket. The first byte seeds the piece sizes; the rest is the body.
// Oracle: no exception escapes, and the split reading sees exactly what the
// whole one sees (the parser promises that bytes may arrive split anywhere).
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "net/completion_stream.h"
#include "net/sse_parser.h"

namespace troupe::fuzz {
namespace {

// Piece sizes 1..64 from a small LCG, so that one seed byte gives a whole
// pattern of splits, line ends cut in two among them.
std::vector<std::string_view> pieces(std::string_view body, uint8_t seed) {
  std::vector<std::string_view> out;
  uint32_t state = seed * 2654435761u + 1;
  while (!body.empty()) {
    state = state * 1664525u + 1013904223u;
    const size_t n = std::min<size_t>(body.size(), 1 + (state >> 26));
    out.push_back(body.substr(0, n));
    body.remove_prefix(n);
  }
  return out;
}

struct StreamSummary {
  bool done;
  std::string error, detail;
  int output, counted;
  bool has_usage, has_first, has_last;
  bool operator==(const StreamSummary&) const = default;
};

StreamSummary summary(const CompletionStream& s) {
  return {s.done(),
          s.error(),
          s.error_detail(),
          s.output_tokens(),
          s.counted_tokens(),
          s.has_usage(),
          s.first_token().has_value(),
          s.last_token().has_value()};
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  if (size == 0) return 0;
  const std::string_view body = as_text(data + 1, size - 1);
  const auto split = pieces(body, data[0]);

  const std::vector<std::string> whole = sse_events(body);
  std::vector<std::string> events;
  SseParser parser;
  for (std::string_view piece : split)
    parser.feed(piece, [&](const std::string& e) { events.push_back(e); });
  if (events != whole) violated("SSE events differ when the body arrives in pieces");

  const auto now = CompletionStream::Clock::now();
  CompletionStream at_once, in_pieces;
  at_once.feed(body, now);
  for (std::string_view piece : split) in_pieces.feed(piece, now);
  if (!(summary(at_once) == summary(in_pieces)))
    violated("CompletionStream reads differently when the body arrives in pieces");
  return 0;
}
