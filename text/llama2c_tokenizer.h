#pragma once
// llama2.c's tokenizer.bin (the format its tokenizer.py exports and run.c
// reads): each piece's score and bytes, "▁" already a space, byte-fallback
// pieces spelled <0xNN>, BOS and EOS as "\n<s>\n" and "\n</s>\n". Encoded as
// run.c encodes: a dummy-prefix space, one piece per character (else its
// bytes), then the adjacent pair whose join scores best merges, until none.
// llama.cpp encodes a GGUF's SentencePiece vocabulary the same way, so
// from_vocab() builds one from such a vocabulary too.
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

  // A SentencePiece vocabulary as a GGUF holds it: pieces spelled with "▁",
  // their scores, and their kinds as llama.cpp numbers them (1 normal,
  // 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). Control pieces
  // decode to nothing; control, unknown, unused and byte pieces are never
  // merged into. `space_prefix`: a text starts with a space, as
  // SentencePiece's add_dummy_prefix.
  struct Vocab {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int> kinds;
    int bos = -1, eos = -1, unk = -1;
    bool space_prefix = true;
  };
  static std::unique_ptr<Llama2cTokenizer> from_vocab(const Vocab& vocab);

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
  bool is_control(int id) const { return control_[size_t(id)]; }
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
  std::vector<bool> control_;
  std::unordered_map<std::string, int> by_text_;
  int byte_piece_[256];
  int bos_ = -1, eos_ = -1, unk_ = -1;
  bool space_prefix_ = true;
  // A SentencePiece vocabulary's: "▁" in a text is a space, as
  // SentencePiece and llama.cpp read it (run.c does not).
  bool spm_spaces_ = false;
};

}  // namespace troupe
