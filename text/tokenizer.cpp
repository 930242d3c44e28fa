#include "text/tokenizer.h"

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

}  // namespace troupe
