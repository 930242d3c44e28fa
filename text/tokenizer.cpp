#include "text/tokenizer.h"

#include <sentencepiece_processor.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe_tokenizer.h"
#include "text/byte_piece.h"
#include "text/gguf_vocab.h"
#include "text/llama2c_tokenizer.h"
#include "text/special_tokens.h"
#include "text/tokenizer_file.h"
#include "text/unicode.h"
#include "util/gguf_file.h"

namespace troupe {

// One of three readers: SentencePiece (sp); when bpe is set, a
// tokenizer.json's byte-level BPE; when l2c is, llama2.c's tokenizer.bin.
struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::unique_ptr<BpeTokenizer> bpe;
  std::unique_ptr<Llama2cTokenizer> l2c;
  std::string name;  // the file, for error messages
  int vocab = 0;
  bool adds_bos = true;   // false: a GGUF vocabulary whose encodings start without BOS
  bool adds_eos = false;  // a GGUF vocabulary whose encodings with BOS end with EOS
  // The special tokens' spellings ("<s>", "</s>", "<unk>") and ids: in a
  // text they stand for those tokens, as Hugging Face's tokenizers and
  // llama.cpp read them.
  SpecialTokens specials;
  // A SentencePiece model's added tokens past its own pieces (Phi-3's
  // <|user|>): id sp_size + i is extra[i]; an id no added token names (a
  // gap) has token.id -1 and stands for nothing.
  int sp_size = 0;
  std::vector<AddedToken> extra;

  bool is_extra(int id) const { return !bpe && !l2c && id >= sp_size; }
  const AddedToken& extra_at(int id) const { return extra[size_t(id - sp_size)]; }
  // No text: a control piece, or an added token that is special (or none).
  bool is_extra_control(int id) const {
    const AddedToken& a = extra_at(id);
    return a.special || a.token.id < 0;
  }
  std::string decode_sp(const std::vector<int>& ids) const;
  void add_added_tokens(std::vector<AddedToken> added);

  // ids += the plain text's tokens (SentencePiece's own encoding).
  void encode_plain(std::string_view text, std::vector<int>& ids) const {
    if (text.empty()) return;
    if (l2c) return l2c->encode_ordinary(text, ids);
    std::vector<int> part;
    const auto status = sp.Encode(text, &part);
    if (!status.ok())
      throw std::runtime_error("tokenizer: encoding failed (" + name + "): " + status.ToString());
    ids.insert(ids.end(), part.begin(), part.end());
  }
};

namespace {

// Real SentencePiece models are a few MB at most; the cap turns "pointed the
// tokenizer at a 10 GB checkpoint" into an error instead of a huge read.
constexpr std::uintmax_t kMaxModelBytes = 256u << 20;

// --- a look at the pieces before SentencePiece builds its trie ------------
//
// SentencePiece hands each piece to Darts as a C string: a piece that is
// empty or starts with a NUL byte is a zero-length key (one with a NUL
// inside is cut short there), and Darts throws through a frame that cannot
// pass an exception on: std::terminate, whatever the caller catches.
// So the serialized ModelProto's pieces are read here first (protobuf wire
// format: ModelProto field 1 is `repeated SentencePiece pieces`, whose field
// 1 is `string piece`). Bytes this reader does not follow are left to
// SentencePiece's parser to refuse.

bool read_varint(std::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in.empty()) return false;
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Skips one field's value of wire type `type`; false if the input ends first.
bool skip_field(std::string_view& in, uint64_t type, int depth) {
  uint64_t n = 0;
  switch (type) {
    case 0:
      return read_varint(in, n);
    case 1:
    case 5:
      n = type == 1 ? 8 : 4;
      break;
    case 2:
      if (!read_varint(in, n)) return false;
      break;
    case 3:  // a group: fields up to its end-group key
      if (depth > 32) return false;
      for (uint64_t key = 0;;) {
        if (!read_varint(in, key)) return false;
        if ((key & 7) == 4) return true;
        if (!skip_field(in, key & 7, depth + 1)) return false;
      }
    default:
      return false;
  }
  if (n > in.size()) return false;
  in.remove_prefix(size_t(n));
  return true;
}

// What is wrong with a piece, or an empty string.
std::string pieces_problem(std::string_view in) {
  int index = 0;
  for (uint64_t key = 0; read_varint(in, key);) {
    if (key != ((1u << 3) | 2)) {
      if (!skip_field(in, key & 7, 0)) return {};
      continue;
    }
    uint64_t n = 0;
    if (!read_varint(in, n) || n > in.size()) return {};
    std::string_view message = in.substr(0, size_t(n));
    in.remove_prefix(size_t(n));
    std::string_view piece;  // the last one counts, as in protobuf
    for (uint64_t k = 0; read_varint(message, k);) {
      if (k == ((1u << 3) | 2)) {
        uint64_t m = 0;
        if (!read_varint(message, m) || m > message.size()) return {};
        piece = message.substr(0, size_t(m));
        message.remove_prefix(size_t(m));
      } else if (!skip_field(message, k & 7, 0)) {
        return {};
      }
    }
    if (piece.empty()) return "piece " + std::to_string(index) + " is empty";
    if (piece.find('\0') != std::string_view::npos)
      return "piece " + std::to_string(index) + " holds a NUL byte";
    ++index;
  }
  return {};
}

}  // namespace

std::string read_tokenizer_file(const std::filesystem::path& path, const char* kind) {
  const std::string name = path.string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    throw std::runtime_error("tokenizer: cannot open '" + name + "': no such file");
  }
  // SentencePiece's own Load() aborts the process on a directory (an
  // uncaught iostream exception), so the file is read here.
  if (!std::filesystem::is_regular_file(status)) {
    throw std::runtime_error("tokenizer: '" + name + "' is not a regular file");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    throw std::runtime_error("tokenizer: cannot stat '" + name + "': " + ec.message());
  }
  if (size > kMaxModelBytes) {
    throw std::runtime_error("tokenizer: '" + name + "' is " + std::to_string(size) +
                             " bytes, too large for a " + std::string(kind));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer: cannot open '" + name + "' for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("tokenizer: error reading '" + name + "'");
  return bytes;
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path, int model_vocab) {
  auto impl = std::make_shared<Impl>();
  impl->name = path.string();
  if (path.extension() == ".gguf" || GgufFile::has_magic(path)) {
    GgufVocabulary v;
    try {
      v = read_gguf_vocabulary(GgufFile::open(path));
    } catch (const GgufError& e) {
      throw std::runtime_error(std::string("tokenizer: ") + e.what());
    }
    impl->bpe = std::move(v.bpe);
    impl->l2c = std::move(v.spm);
    impl->adds_bos = v.add_bos;
    impl->adds_eos = v.add_eos;
    impl->vocab = impl->bpe ? impl->bpe->vocab_size() : impl->l2c->vocab_size();
    for (auto& token : v.specials) impl->specials.add(std::move(token));
    return Tokenizer(std::move(impl));
  }
  if (path.extension() == ".json") {
    const std::string json = read_tokenizer_file(path, "tokenizer.json");
    std::string config;
    if (const auto beside = path.parent_path() / "tokenizer_config.json";
        std::filesystem::is_regular_file(beside))
      config = read_tokenizer_file(beside, "tokenizer_config.json");
    impl->bpe = BpeTokenizer::parse(json, impl->name, config);
    impl->vocab = impl->bpe->vocab_size();
    return Tokenizer(std::move(impl));
  }
  if (path.extension() == ".bin") {
    impl->l2c = Llama2cTokenizer::parse(read_tokenizer_file(path, "tokenizer.bin"), impl->name);
    impl->vocab = impl->l2c->vocab_size();
    for (int id : {impl->l2c->unk_id(), impl->l2c->bos_id(), impl->l2c->eos_id()})
      if (id >= 0) impl->specials.add({impl->l2c->piece(id), id});
    return Tokenizer(std::move(impl));
  }
  const std::string bytes = read_tokenizer_file(path, "SentencePiece model");
  if (const std::string problem = pieces_problem(bytes); !problem.empty())
    throw std::runtime_error("tokenizer: '" + impl->name +
                             "' is not a valid SentencePiece model: " + problem);
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer: '" + impl->name +
                             "' is not a valid SentencePiece model: " + status.ToString());
  }
  impl->vocab = impl->sp_size = impl->sp.GetPieceSize();
  if (impl->vocab <= 0) {
    throw std::runtime_error("tokenizer: '" + impl->name + "' has an empty vocabulary");
  }
  std::vector<AddedToken> added = read_added_tokens(path.parent_path());
  if (model_vocab > 0) {
    const size_t before = added.size();
    std::erase_if(added, [&](const AddedToken& a) { return a.token.id >= model_vocab; });
    if (added.size() < before)
      spdlog::warn(
          "tokenizer: {} added token(s) beside '{}' have ids past the model's {} rows; "
          "left out",
          before - added.size(), impl->name, model_vocab);
  }
  impl->add_added_tokens(std::move(added));
  return Tokenizer(std::move(impl));
}

// The added tokens first, with their own stripping rules, then the model's
// control and unknown pieces that none of them spells.
void Tokenizer::Impl::add_added_tokens(std::vector<AddedToken> added) {
  std::set<std::string> spelled;
  for (const AddedToken& a : added) {
    spelled.insert(a.token.spelling);
    specials.add(a.token);
    if (a.token.id < sp_size) continue;
    if (size_t(a.token.id - sp_size) >= extra.size())
      extra.resize(size_t(a.token.id - sp_size) + 1, AddedToken{{"", -1}, true});
    extra[size_t(a.token.id - sp_size)] = a;
  }
  vocab = sp_size + int(extra.size());
  for (int id = 0; id < sp_size; ++id)
    if ((sp.IsControl(id) || sp.IsUnknown(id)) && !sp.IdToPiece(id).empty() &&
        !spelled.count(sp.IdToPiece(id)))
      specials.add({sp.IdToPiece(id), id});
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos) const {
  if (add_bos && bos_id() < 0) {
    throw std::runtime_error("tokenizer: BOS requested but '" + impl_->name +
                             "' defines no BOS token");
  }
  if (impl_->bpe) return impl_->bpe->encode(text, add_bos);
  // Each piece of text between special tokens is encoded on its own, so it
  // starts with SentencePiece's space prefix, as Hugging Face's Llama
  // tokenizers and llama.cpp encode it.
  std::vector<int> ids;
  if (add_bos) ids.push_back(bos_id());
  impl_->specials.split(
      text, [&](std::string_view plain) { impl_->encode_plain(plain, ids); },
      [&](int id) { ids.push_back(id); });
  if (add_bos && impl_->adds_eos) ids.push_back(eos_id());
  return ids;
}

void Tokenizer::check_id(int id) const {
  if (id < 0 || id >= impl_->vocab) {
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) +
                            " is outside the vocabulary [0, " + std::to_string(impl_->vocab) + ")");
  }
}

std::string Tokenizer::decode_checked(const std::vector<int>& ids) const {
  if (impl_->l2c) return impl_->l2c->decode(ids);
  if (impl_->bpe) {
    std::string bytes;
    for (int id : ids)
      if (!impl_->bpe->is_special(id)) bytes += impl_->bpe->bytes(id);
    return unicode::utf8_lossy(bytes);
  }
  if (impl_->extra.empty()) return impl_->decode_sp(ids);
  // Special added tokens drop out as control pieces do (the text around
  // them decodes as one run); another added token is its spelling, and the
  // run after it keeps the leading space SentencePiece strips at the start
  // of a text, as transformers decodes.
  std::string text;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string part = impl_->decode_sp(run);
    const auto first =
        std::find_if(run.begin(), run.end(), [&](int id) { return !impl_->sp.IsControl(id); });
    if (!text.empty() && first != run.end() &&
        impl_->decode_sp({*first}).size() < token_bytes(*first).size())
      part.insert(0, 1, ' ');
    text += part;
    run.clear();
  };
  for (int id : ids) {
    if (!impl_->is_extra(id)) {
      run.push_back(id);
    } else if (!impl_->is_extra_control(id)) {
      flush();
      text += impl_->extra_at(id).token.spelling;
    }
  }
  flush();
  return text;
}

std::string Tokenizer::Impl::decode_sp(const std::vector<int>& ids) const {
  std::string text;
  const auto status = sp.Decode(ids, &text);
  if (!status.ok())
    throw std::runtime_error("tokenizer: decoding failed (" + name + "): " + status.ToString());
  return text;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  // SentencePiece reports a bad id as a status, but its message names neither
  // the vocabulary size nor the kind of error callers can catch separately.
  for (int id : ids) check_id(id);
  return decode_checked(ids);
}

int Tokenizer::vocab_size() const {
  return impl_->vocab;
}
int Tokenizer::bos_id() const {
  if (impl_->l2c) return impl_->adds_bos ? impl_->l2c->bos_id() : -1;
  return impl_->bpe ? impl_->bpe->bos_id() : impl_->sp.bos_id();
}
int Tokenizer::eos_id() const {
  if (impl_->l2c) return impl_->l2c->eos_id();
  return impl_->bpe ? impl_->bpe->eos_id() : impl_->sp.eos_id();
}

bool Tokenizer::is_control(int id) const {
  check_id(id);
  if (impl_->l2c) return impl_->l2c->is_control(id);
  if (impl_->is_extra(id)) return impl_->is_extra_control(id);
  return impl_->bpe ? impl_->bpe->is_special(id) : impl_->sp.IsControl(id);
}

const std::string& Tokenizer::piece(int id) const {
  check_id(id);
  if (impl_->l2c) return impl_->l2c->piece(id);
  if (impl_->is_extra(id)) return impl_->extra_at(id).token.spelling;
  return impl_->bpe ? impl_->bpe->piece(id) : impl_->sp.IdToPiece(id);
}

bool Tokenizer::is_byte_level() const {
  return impl_->bpe != nullptr;
}

std::string Tokenizer::token_bytes(int id) const {
  const std::string& p = piece(id);
  if (impl_->bpe) return impl_->bpe->bytes(id);
  if (impl_->l2c) return impl_->l2c->bytes(id);
  if (impl_->is_extra(id)) return p;
  if (const int b = byte_value(id); b >= 0) return std::string(1, char(b));
  if (impl_->sp.IsControl(id)) return p;
  return spm_spaces_to_ascii(p);
}

int Tokenizer::byte_value(int id) const {
  if (impl_->l2c) return impl_->l2c->byte_value(id);
  if (impl_->bpe || impl_->is_extra(id) || !impl_->sp.IsByte(id)) return -1;
  // Byte-fallback pieces are spelled "<0xNN>" by SentencePiece's trainer.
  const std::string& p = impl_->sp.IdToPiece(id);
  const int value = byte_piece_value(p);
  if (value < 0) {
    throw std::runtime_error("tokenizer: byte piece " + std::to_string(id) + " is spelled '" + p +
                             "', not <0xNN> (" + impl_->name + ")");
  }
  return value;
}

// An anchor's text does not depend on what precedes it, and once it is out
// SentencePiece no longer strips a leading space, so decoding may restart at
// it. Control, unknown and unused pieces are left out to stay clear of the
// special cases SentencePiece has for them.
bool Tokenizer::is_anchor(int id) const {
  if (impl_->bpe) return true;
  if (impl_->l2c)
    return impl_->l2c->byte_value(id) < 0 && !impl_->l2c->is_control(id) &&
           id != impl_->l2c->unk_id();
  if (impl_->is_extra(id)) return !impl_->is_extra_control(id);
  const auto& sp = impl_->sp;
  return !sp.IsByte(id) && !sp.IsControl(id) && !sp.IsUnknown(id) && !sp.IsUnused(id);
}

}  // namespace troupe
