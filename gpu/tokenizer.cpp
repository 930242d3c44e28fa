#include "gpu/tokenizer.h"

#include <sentencepiece_processor.h>

#include <charconv>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace troupe {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string name;  // the file, for error messages
  int vocab = 0;
};

namespace {

// Real SentencePiece models are a few MB at most; the cap turns "pointed the
// tokenizer at a 10 GB checkpoint" into an error instead of a huge read.
constexpr std::uintmax_t kMaxModelBytes = 256u << 20;

std::string read_model_file(const std::filesystem::path& path) {
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
                             " bytes, too large for a SentencePiece model");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer: cannot open '" + name + "' for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("tokenizer: error reading '" + name + "'");
  return bytes;
}

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

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  const std::string bytes = read_model_file(path);
  auto impl = std::make_shared<Impl>();
  impl->name = path.string();
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer: '" + impl->name +
                             "' is not a valid SentencePiece model: " + status.ToString());
  }
  impl->vocab = impl->sp.GetPieceSize();
  if (impl->vocab <= 0) {
    throw std::runtime_error("tokenizer: '" + impl->name + "' has an empty vocabulary");
  }
  return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer: encoding failed (" + impl_->name +
                             "): " + status.ToString());
  }
  if (add_bos) {
    const int bos = bos_id();
    if (bos < 0) {
      throw std::runtime_error("tokenizer: BOS requested but '" + impl_->name +
                               "' defines no BOS token");
    }
    ids.insert(ids.begin(), bos);
  }
  return ids;
}

void Tokenizer::check_id(int id) const {
  if (id < 0 || id >= impl_->vocab) {
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) +
                            " is outside the vocabulary [0, " + std::to_string(impl_->vocab) + ")");
  }
}

std::string Tokenizer::decode_checked(const std::vector<int>& ids) const {
  std::string text;
  const auto status = impl_->sp.Decode(ids, &text);
  if (!status.ok()) {
    throw std::runtime_error("tokenizer: decoding failed (" + impl_->name +
                             "): " + status.ToString());
  }
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
  return impl_->sp.bos_id();
}
int Tokenizer::eos_id() const {
  return impl_->sp.eos_id();
}

bool Tokenizer::is_control(int id) const {
  check_id(id);
  return impl_->sp.IsControl(id);
}

const std::string& Tokenizer::piece(int id) const {
  check_id(id);
  return impl_->sp.IdToPiece(id);
}

int Tokenizer::byte_value(int id) const {
  if (!impl_->sp.IsByte(id)) return -1;
  // Byte-fallback pieces are spelled "<0xNN>" by SentencePiece's trainer.
  const std::string& p = impl_->sp.IdToPiece(id);
  int value = -1;
  if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>') {
    const auto [end, ec] = std::from_chars(p.data() + 3, p.data() + 5, value, 16);
    if (ec != std::errc() || end != p.data() + 5) value = -1;
  }
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
  const auto& sp = impl_->sp;
  return !sp.IsByte(id) && !sp.IsControl(id) && !sp.IsUnknown(id) && !sp.IsUnused(id);
}

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
