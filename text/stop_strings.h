#pragma once
// Stop strings on streamed text (OpenAI's `stop`).
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

// Takes streamed text and returns what may be shown now. A tail that could be
// the start of a stop string is held back until it can be decided; when a
// stop string appears, the text before it is released, the rest (stop string
// included, as OpenAI does) is dropped and stopped() turns true. With
// `include_stop` (vLLM's include_stop_str_in_output) the stop string is
// released too: the text ends with it.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops, bool include_stop = false);

  std::string push(std::string_view text);
  // Generation ended without a stop string: release what was held back.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  size_t held_tail_length() const;

  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;  // text not yet released
  bool stopped_ = false;
};

}  // namespace troupe
