#include "text/text_streamer.h"

#include <utility>

namespace troupe {

namespace {

// Lead byte -> length of the UTF-8 sequence it starts. Invalid leads count as
// 1: they never complete, so there is nothing to wait for.
int utf8_sequence_length(int lead) {
  if (lead >= 0xF0 && lead <= 0xF7) return 4;
  if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}

bool is_continuation(int byte) {
  return (byte & 0xC0) == 0x80;
}

}  // namespace

TextStreamer::TextStreamer(Tokenizer tokenizer) : tok_(std::move(tokenizer)) {}

void TextStreamer::reset() {
  window_.clear();
  text_.clear();
}

bool TextStreamer::tail_is_incomplete_utf8() const {
  // Walk back over at most 4 trailing byte pieces to the last lead byte; the
  // run is incomplete when fewer bytes follow it than it announces. Leads that
  // can never be valid (0xF8..) count as complete: waiting would not help.
  int count = 0;
  for (auto it = window_.rbegin(); it != window_.rend() && count < 4; ++it) {
    const int b = tok_.byte_value(*it);
    if (b < 0) return false;
    ++count;
    if (!is_continuation(b)) return count < utf8_sequence_length(b);
  }
  return false;
}

size_t TextStreamer::last_char_start() const {
  // SentencePiece parses a byte run greedily and skips one byte on an invalid
  // sequence, so every lead byte starts a fresh character: decoding from the
  // last one gives the same text as decoding the whole run.
  size_t i = window_.size();
  for (int count = 0; i > 0 && count < 4; ++count) {
    --i;
    const int b = tok_.byte_value(window_[i]);
    if (b < 0) return std::string::npos;
    if (!is_continuation(b)) return i;
  }
  return std::string::npos;
}

std::string TextStreamer::put(int id) {
  tok_.check_id(id);
  window_.push_back(id);
  const bool is_byte = tok_.byte_value(id) >= 0;
  if (is_byte && tail_is_incomplete_utf8()) return {};

  std::string text;
  try {
    text = tok_.decode_checked(window_);
    if (text.compare(0, text_.size(), text_) != 0) {
      // Cannot happen with SentencePiece's decoder as it is; failing loudly
      // beats streaming text that differs from decode().
      throw std::logic_error("TextStreamer: decoded text of the window changed retroactively");
    }
  } catch (...) {
    window_.pop_back();
    throw;
  }
  std::string out = text.substr(text_.size());

  // Shrink the window so each put() decodes only a few pieces.
  size_t start = std::string::npos;
  if (!is_byte) {
    if (tok_.is_anchor(id)) start = window_.size() - 1;
  } else {
    start = last_char_start();
  }
  if (start != std::string::npos && start > 0) {
    std::vector<int> tail(window_.begin() + static_cast<std::ptrdiff_t>(start), window_.end());
    std::string standalone = tok_.decode_checked(tail);
    // Empty text (a lone "▁", stripped at the start) cannot be checked against
    // the full text, and SentencePiece versions differ on whether it ends the
    // leading-space rule, so it does not anchor.
    if (!standalone.empty() && text.size() >= standalone.size() &&
        text.compare(text.size() - standalone.size(), standalone.size(), standalone) == 0) {
      window_ = std::move(tail);
      text = std::move(standalone);
    }
  }
  text_ = std::move(text);
  return out;
}

std::string TextStreamer::finish() {
  std::string out;
  if (!window_.empty()) {
    std::string text = tok_.decode_checked(window_);
    if (text.compare(0, text_.size(), text_) != 0) {
      throw std::logic_error("TextStreamer: decoded text of the window changed retroactively");
    }
    out = text.substr(text_.size());
  }
  reset();
  return out;
}

}  // namespace troupe
