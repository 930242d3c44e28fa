#pragma once
// Text <-> token ids through a SentencePiece model (tokenizer.model), llama2.c's
// tokenizer.bin, a Hugging Face byte-level BPE (tokenizer.json: Llama 3,
// Qwen2, SmolLM, GPT-2, ...), or the vocabulary of a GGUF file.
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class Tokenizer {
 public:
  // A `.json` path is read as a Hugging Face tokenizer.json (with the
  // tokenizer_config.json beside it, for the EOS token), a `.bin` as
  // llama2.c's tokenizer.bin, a `.gguf` (or any file with GGUF's magic) as
  // the vocabulary in a llama.cpp model file, anything else as a
  // SentencePiece model, with the added tokens of the Hugging Face
  // tokenizer beside it (read_added_tokens: Phi-3's <|user|>, a ChatML
  // fine-tune's <|im_start|>), which may extend its vocabulary; with
  // `model_vocab` > 0, those at ids the model has no row for are left out
  // (logged), as llama.cpp's converter leaves them out.
  // Throws std::runtime_error naming `path` (and the reader's own message)
  // when the file is missing, unreadable or not a model this runtime
  // computes.
  static Tokenizer load(const std::filesystem::path& path, int model_vocab = 0);

  // The spellings of the special tokens ("<s>", "</s>", "<unk>"; a
  // tokenizer.json's added tokens) in `text` are those tokens, as Hugging
  // Face's tokenizers and llama.cpp read a prompt; the text between them is
  // encoded piece by piece. `add_bos` adds the tokens the model's tokenizer
  // adds (BOS; a tokenizer.json's post-processor's). Throws
  // std::runtime_error if add_bos is asked of a model without BOS.
  std::vector<int> encode(std::string_view text, bool add_bos) const;
  // Control ids (BOS, EOS) decode to nothing. Throws std::out_of_range naming
  // the id and the vocabulary size for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;  // -1 when the model has none
  bool is_control(int id) const;
  // The raw piece ("▁the", "<0x0A>", "<s>"; "Ġthe" in a byte-level BPE);
  // throws std::out_of_range.
  const std::string& piece(int id) const;
  // The bytes one token stands for, alone: its piece with "▁" as a space, a
  // byte-fallback piece as its byte (maybe part of a UTF-8 character), a
  // control piece as it is spelled ("</s>"); a byte-level BPE token's bytes.
  // Throws std::out_of_range.
  std::string token_bytes(int id) const;

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
  // Each token's bytes stand alone (a byte-level BPE): decode() is their
  // concatenation as UTF-8, control tokens left out.
  bool is_byte_level() const;
  std::string decode_checked(const std::vector<int>& ids) const;

  std::shared_ptr<const Impl> impl_;
};

}  // namespace troupe
