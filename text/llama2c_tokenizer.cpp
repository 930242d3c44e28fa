#include "text/llama2c_tokenizer.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "text/bpe_merge.h"
#include "text/byte_piece.h"
#include "text/unicode.h"

namespace troupe {

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw std::runtime_error("tokenizer: '" + name + "' is not a llama2.c tokenizer.bin: " + what);
}

template <class T>
T read_raw(std::string_view& in, const std::string& name, const char* what) {
  if (in.size() < sizeof(T)) fail(name, std::string("it ends inside ") + what);
  T v;
  std::memcpy(&v, in.data(), sizeof v);
  in.remove_prefix(sizeof v);
  return v;
}

}  // namespace

std::unique_ptr<Llama2cTokenizer> Llama2cTokenizer::parse(std::string_view in,
                                                          const std::string& name) {
  auto t = std::make_unique<Llama2cTokenizer>();
  const int max_len = read_raw<int32_t>(in, name, "its header");
  if (max_len <= 0 || max_len > 4096)
    fail(name, "its longest piece is said to be " + std::to_string(max_len) + " bytes");
  std::fill(std::begin(t->byte_piece_), std::end(t->byte_piece_), -1);
  while (!in.empty()) {
    const float score = read_raw<float>(in, name, "a piece's score");
    const int32_t len = read_raw<int32_t>(in, name, "a piece's length");
    if (len < 0 || len > max_len || size_t(len) > in.size())
      fail(name, "piece " + std::to_string(t->pieces_.size()) + " has length " +
                     std::to_string(len) + " (at most " + std::to_string(max_len) + ")");
    std::string piece(in.substr(0, size_t(len)));
    in.remove_prefix(size_t(len));
    const int id = int(t->pieces_.size());
    const int b = byte_piece_value(piece);
    t->byte_of_.push_back(b);
    if (b >= 0) t->byte_piece_[b] = id;
    if (piece == "\n<s>\n")
      t->bos_ = id;
    else if (piece == "\n</s>\n")
      t->eos_ = id;
    else if (piece == "<unk>")
      t->unk_ = id;
    else if (b < 0)
      t->by_text_.emplace(piece, id);  // the first of equal pieces, as run.c
    t->pieces_.push_back(std::move(piece));
    t->scores_.push_back(score);
  }
  if (t->pieces_.empty()) fail(name, "it has no pieces");
  t->control_.assign(t->pieces_.size(), false);
  for (int id : {t->bos_, t->eos_})
    if (id >= 0) t->control_[size_t(id)] = true;
  for (size_t id = 0; id < t->pieces_.size(); ++id) {
    std::string s;
    if (int(id) == t->bos_)
      s = "<s>";
    else if (int(id) == t->eos_)
      s = "</s>";
    else
      for (const char c : t->pieces_[id])
        if (c == ' ')
          s += kSpmSpace;
        else
          s += c;
    t->spelled_.push_back(std::move(s));
  }
  return t;
}

std::unique_ptr<Llama2cTokenizer> Llama2cTokenizer::from_vocab(const Vocab& v) {
  enum { kUnknown = 2, kControl = 3, kUnused = 5, kByte = 6 };
  auto t = std::make_unique<Llama2cTokenizer>();
  std::fill(std::begin(t->byte_piece_), std::end(t->byte_piece_), -1);
  t->bos_ = v.bos;
  t->eos_ = v.eos;
  t->unk_ = v.unk;
  t->space_prefix_ = v.space_prefix;
  t->spm_spaces_ = true;
  const size_t n = v.pieces.size();
  t->spelled_ = v.pieces;
  t->scores_.assign(n, 0.0f);
  t->control_.assign(n, false);
  for (size_t id = 0; id < n; ++id) {
    const int kind = id < v.kinds.size() ? v.kinds[id] : 1;
    if (id < v.scores.size()) t->scores_[id] = v.scores[id];
    if (kind == kUnknown && t->unk_ < 0) t->unk_ = int(id);
    t->control_[id] = kind == kControl;
    const int b = byte_piece_value(v.pieces[id]);
    t->byte_of_.push_back(kind == kByte || b >= 0 ? b : -1);
    if (b >= 0 && t->byte_piece_[b] < 0) t->byte_piece_[b] = int(id);
    std::string piece = spm_spaces_to_ascii(v.pieces[id]);
    if (b < 0 && kind != kControl && kind != kUnknown && kind != kUnused)
      t->by_text_.emplace(piece, int(id));
    t->pieces_.push_back(std::move(piece));
  }
  for (int id : {t->bos_, t->eos_})
    if (id >= 0 && size_t(id) < n) t->control_[size_t(id)] = true;
  return t;
}

void Llama2cTokenizer::encode_ordinary(std::string_view text, std::vector<int>& ids) const {
  if (text.empty()) return;
  std::string spaced;
  if (spm_spaces_ && text.find(kSpmSpace) != std::string_view::npos) {
    spaced = spm_spaces_to_ascii(text);
    text = spaced;
  }
  std::vector<int> tokens;
  if (const auto space = by_text_.find(" "); space_prefix_ && space != by_text_.end())
    tokens.push_back(space->second);  // the dummy prefix
  // One piece per character where there is one, else its bytes.
  const unicode::CodePoints cps = unicode::decode_utf8(text);
  for (size_t i = 0; i < cps.points.size(); ++i) {
    const std::string_view ch = text.substr(cps.offsets[i], cps.offsets[i + 1] - cps.offsets[i]);
    if (const auto it = by_text_.find(std::string(ch)); it != by_text_.end()) {
      tokens.push_back(it->second);
      continue;
    }
    for (const char byte : ch) {
      const int id = byte_piece_[uint8_t(byte)];
      if (id >= 0)
        tokens.push_back(id);
      else if (unk_ >= 0)
        tokens.push_back(unk_);
    }
  }
  // The pair whose join scores best merges first (the leftmost of equals), as
  // run.c picks it.
  std::string joined;
  merge_pairs(tokens, [&](int l, int r) -> std::optional<PairMerge> {
    joined = pieces_[size_t(l)];
    joined += pieces_[size_t(r)];
    const auto it = by_text_.find(joined);
    if (it == by_text_.end()) return std::nullopt;
    return PairMerge{-double(scores_[size_t(it->second)]), it->second};
  });
  ids.insert(ids.end(), tokens.begin(), tokens.end());
}

std::string Llama2cTokenizer::bytes(int id) const {
  if (control_[size_t(id)]) return spelled_[size_t(id)];
  if (const int b = byte_of_[size_t(id)]; b >= 0) return std::string(1, char(b));
  return pieces_[size_t(id)];
}

std::string Llama2cTokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (const int id : ids) {
    if (is_control(id)) continue;
    out += id == unk_ ? " \xe2\x81\x87 " : bytes(id);  // SentencePiece's " ⁇ " for <unk>
  }
  if (space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return unicode::utf8_lossy(out);
}

}  // namespace troupe
