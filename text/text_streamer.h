#pragma once
// A streaming detokenizer: generated ids in, text out as soon as it is final.
#include <span>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace troupe {

// Decodes generated ids one at a time. put() returns only text that is final:
// a UTF-8 character split over byte-fallback pieces (<0xE2><0x98><0x83>) comes
// out once its last byte arrives, and the leading-space rule of decode() is
// kept, so that put(id_0) + put(id_1) + ... + finish() == decode({id_0, ...}).
//
// Why a window and not piece-by-piece decoding: SentencePiece decodes bytes in
// runs and strips the dummy-prefix space only at the start of the text, so a
// piece's text depends on what came before it. The streamer keeps the ids
// since the last "anchor" (an ordinary piece whose text stands on its own),
// decodes that short window, and emits what is new past the text already out.
class TextStreamer {
 public:
  explicit TextStreamer(Tokenizer tokenizer);

  // Throws std::out_of_range (as Tokenizer::decode) for a bad id; the
  // streamer's state is then unchanged.
  std::string put(int id);
  // Whatever is still held back (an incomplete UTF-8 byte run, which decode()
  // renders as U+FFFD), then back to the start-of-text state for reuse.
  std::string finish();
  void reset();
  // Starts over as the text that follows `prompt` (its last ids are
  // enough: kContinuationIds), so that a first piece's leading space is kept:
  // "The meaning of life" continues " is ...", not "is ...", and prompt +
  // completion reads as one text. With no prompt, or one that ends inside a
  // UTF-8 character, the text starts as a text does (decode()'s rule).
  // Throws std::out_of_range for a bad id.
  void continue_after(std::span<const int> prompt);
  static constexpr size_t kContinuationIds = 5;  // an ordinary piece + a character's bytes

  // Control tokens whose text put() writes, as they are spelled ("[TOOL_CALLS]"),
  // where decode() leaves every control token out: a tool-call parser reads
  // them. The text around one reads as if it were not there (its spacing; a
  // character whose bytes it splits comes out after it, whole). Ids that are
  // not control tokens are written anyway. Throws std::out_of_range for a bad
  // id.
  void spell(std::span<const int> control_ids);

 private:
  std::string put_bytes(int id);  // a byte-level tokenizer's put()
  bool tail_is_incomplete_utf8() const;
  size_t last_char_start() const;

  bool is_spelled(int id) const;

  Tokenizer tok_;
  std::vector<int> spelled_;  // sorted
  std::vector<int> window_;   // ids since the last anchor (or the start)
  std::string text_;          // the part of decode(window_) already returned;
                              // byte-level: the bytes of a character still to come
};

}  // namespace troupe
