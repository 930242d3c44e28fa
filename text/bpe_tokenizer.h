#pragma once
// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Llama 3,
// Qwen2, SmolLM, StarCoder, ...): added tokens, the NFC normalizer, pre-tokenizer (Split by regex,
// Digits, ByteLevel, Sequence), the BPE model over bytes, the post-processor's
// special tokens (TemplateProcessing, BOS first) and the ByteLevel decoder,
// computed as the tokenizers library computes them. What a file asks for that
// this does not compute (another model, normalizer or pre-tokenizer) is
// refused when it is loaded, with the part named.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/pretoken_regex.h"
#include "text/special_tokens.h"

namespace troupe {

class BpeTokenizer {
 public:
  BpeTokenizer();
  ~BpeTokenizer();

  // `json` is the file's text; `name` names it in errors (std::runtime_error).
  // `config_json`, tokenizer_config.json's text when there is one, gives the
  // EOS token.
  static std::unique_ptr<BpeTokenizer> parse(std::string_view json, const std::string& name,
                                             std::string_view config_json = {});

  // Added tokens split the text first; `add_special` adds the
  // post-processor's tokens (Llama 3's <|begin_of_text|>).
  std::vector<int> encode(std::string_view text, bool add_special) const;
  // The ordinary text's ids, without added tokens or the post-processor's.
  void encode_ordinary(std::string_view text, std::vector<int>& ids) const;
  // The pieces the normalizer and pre-tokenizer make of an ordinary text,
  // each then encoded on its own (tokenizers' pre_tokenize_str, as bytes).
  std::vector<std::string> pre_tokenize_str(std::string_view text) const;

  int vocab_size() const { return int(bytes_.size()); }
  int bos_id() const { return prefix_.empty() ? -1 : prefix_[0]; }
  int eos_id() const { return eos_; }
  bool is_special(int id) const { return special_[size_t(id)]; }
  // As spelled in the file ("Ġthe").
  const std::string& piece(int id) const { return pieces_[size_t(id)]; }
  // The bytes the token stands for (an added token: its content).
  const std::string& bytes(int id) const { return bytes_[size_t(id)]; }

 private:
  struct PreStep;
  void pre_tokenize(std::string_view text, std::vector<std::string>& pieces) const;
  void bpe(std::string_view word, std::vector<int>& ids) const;

  std::vector<std::string> pieces_, bytes_;
  std::vector<bool> special_;
  std::unordered_map<std::string, int> by_bytes_;  // the model's vocabulary, by bytes
  int byte_token_[256];
  struct Merge {
    int rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> the merge
  bool ignore_merges_ = false;
  bool nfc_ = false;  // the NFC normalizer
  int unk_ = -1;      // the model's unknown token, for a byte it cannot spell
  bool fuse_unk_ = false;
  std::vector<PreStep> pre_steps_;
  SpecialTokens added_;
  std::vector<int> prefix_, suffix_;
  int eos_ = -1;
};

}  // namespace troupe
