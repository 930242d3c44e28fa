#pragma once
// Text <-> token ids through a SentencePiece model (tokenizer.model), plus a
// streaming decoder that turns ids into text as they are generated.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class Tokenizer {
 public:
  // Throws std::runtime_error naming `path` (and SentencePiece's own message)
  // when the file is missing, unreadable or not a valid model.
  static Tokenizer load(const std::filesystem::path& path);

  // Throws std::runtime_error if add_bos is asked of a model without BOS.
  std::vector<int> encode(std::string_view text, bool add_bos) const;
  // Control ids (BOS, EOS) decode to nothing. Throws std::out_of_range naming
  // the id and the vocabulary size for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;  // -1 when the model has none
  bool is_control(int id) const;
  // The raw piece ("▁the", "<0x0A>", "<s>"); throws std::out_of_range.
  const std::string& piece(int id) const;

  // Copies are cheap and share the loaded model, which is immutable, so they
  // may be used from several threads at once.
  Tokenizer(const Tokenizer&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) noexcept = default;
  Tokenizer& operator=(Tokenizer&&) noexcept = default;
  ~Tokenizer();

 private:
  friend class TextStreamer;
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  void check_id(int id) const;
  int byte_value(int id) const;  // 0..255 for a byte-fallback piece, else -1
  bool is_anchor(int id) const;
  std::string decode_checked(const std::vector<int>& ids) const;

  std::shared_ptr<const Impl> impl_;
};

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

 private:
  bool tail_is_incomplete_utf8() const;
  size_t last_char_start() const;

  Tokenizer tok_;
  std::vector<int> window_;  // ids since the last anchor (or the start)
  std::string text_;         // the part of decode(window_) already returned
};

}  // namespace troupe
