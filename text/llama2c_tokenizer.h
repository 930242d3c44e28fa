#pragma once
// llama2.c's tokenizer.bin (the format its tokenizer.py exports and run.c
// reads): each piece's score and bytes, "▁" already a space, byte-fallback
// pieces spelled <0xNN>, BOS and EOS as "\n<s>\n" and "\n</s>\n". Encoded as
// run.c encodes: a dummy-prefix space, one piece per character (else its
// bytes), then the adjacent pair whose join scores best merges, until none.
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe {

class Llama2cTokenizer {
 public:
  // `bytes` is the file; `name` names it in errors (std::runtime_error).
  static std::unique_ptr<Llama2cTokenizer> parse(std::string_view bytes, const std::string& name);

  // The ordinary text's ids (no special tokens spelled in it).
  void encode_ordinary(std::string_view text, std::vector<int>& ids) const;
  // The text of `ids` as SentencePiece decodes it: control pieces give
  // nothing, byte pieces their byte, and the text's leading space (the
  // dummy prefix) is dropped.
  std::string decode(const std::vector<int>& ids) const;

  int vocab_size() const { return int(pieces_.size()); }
  int bos_id() const { return bos_; }
  int eos_id() const { return eos_; }
  int unk_id() const { return unk_; }
  bool is_control(int id) const { return id == bos_ || id == eos_; }
  int byte_value(int id) const { return byte_of_[size_t(id)]; }  // -1 for an ordinary piece
  // As SentencePiece spells it ("▁the", "<0x0A>", "<s>").
  const std::string& piece(int id) const { return spelled_[size_t(id)]; }
  // The bytes it stands for alone ("\n<s>\n" is "<s>").
  std::string bytes(int id) const;

 private:
  std::vector<std::string> pieces_;   // as the file has them
  std::vector<std::string> spelled_;  // as SentencePiece spells them
  std::vector<float> scores_;
  std::vector<int> byte_of_;
  std::unordered_map<std::string, int> by_text_;
  int byte_piece_[256];
  int bos_ = -1, eos_ = -1, unk_ = -1;
};

}  // namespace troupe
