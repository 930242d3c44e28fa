// llama2.c's legacy version-0 `.bin`: seven int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size marks an
// untied classifier stored last), then f32 arrays in run.c's order, each
// covering all layers contiguously.
#include <spdlog/spdlog.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/checkpoint.h"
#include "gpu/loaders/mmap_file.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

constexpr size_t kHeaderFields = 7;
constexpr size_t kHeaderBytes = kHeaderFields * sizeof(int32_t);

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw CheckpointError(path.string() + ": " + what);
}

struct Header {
  int64_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool tied;
  int64_t head_size() const { return dim / n_heads; }
  int64_t kv_dim() const { return n_kv_heads * head_size(); }
};

int32_t read_i32_le(const uint8_t* p) {
  return int32_t(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                 uint32_t(p[3]) << 24);
}

// Bounds well above any real llama2.c export, low enough that every size
// computed from them fits comfortably in 64 bits.
void check_field(const fs::path& path, const char* name, int64_t v, int64_t limit) {
  if (v <= 0)
    fail(path, "llama2.c header field " + std::string(name) + " must be positive, got " +
                   std::to_string(v));
  if (v > limit)
    fail(path, "llama2.c header field " + std::string(name) + " = " + std::to_string(v) +
                   " is implausibly large (limit " + std::to_string(limit) + ")");
}

Header parse_header(const MappedFile& file) {
  const fs::path& path = file.path();
  if (file.size() < kHeaderBytes)
    fail(path, "is " + std::to_string(file.size()) + " bytes, too short for the " +
                   std::to_string(kHeaderBytes) + "-byte llama2.c header (truncated)");
  int64_t f[kHeaderFields];
  for (size_t i = 0; i < kHeaderFields; ++i) f[i] = read_i32_le(file.data() + 4 * i);
  Header h{f[0], f[1], f[2], f[3], f[4], f[5] < 0 ? -f[5] : f[5], f[6], f[5] > 0};
  check_field(path, "dim", h.dim, 1 << 16);
  check_field(path, "hidden_dim", h.hidden_dim, 1 << 18);
  check_field(path, "n_layers", h.n_layers, 1 << 10);
  check_field(path, "n_heads", h.n_heads, 1 << 12);
  check_field(path, "n_kv_heads", h.n_kv_heads, 1 << 12);
  check_field(path, "vocab_size", h.vocab_size, 1 << 22);
  check_field(path, "seq_len", h.seq_len, 1 << 22);
  if (h.dim % h.n_heads != 0)
    fail(path, "dim " + std::to_string(h.dim) + " is not divisible by n_heads " +
                   std::to_string(h.n_heads));
  if (h.n_heads % h.n_kv_heads != 0)
    fail(path, "n_kv_heads " + std::to_string(h.n_kv_heads) + " does not divide n_heads " +
                   std::to_string(h.n_heads));
  if (h.head_size() % 2 != 0)
    fail(path, "head size " + std::to_string(h.head_size()) + " must be even for RoPE");
  return h;
}

// Floats in the file after the header, in run.c's order.
uint64_t expected_floats(const Header& h) {
  const uint64_t L = h.n_layers, dim = h.dim, hid = h.hidden_dim, kv = h.kv_dim();
  uint64_t n = h.vocab_size * dim;            // token_embedding
  n += L * dim * 2;                           // rms_att, rms_ffn
  n += L * dim * dim * 2 + L * dim * kv * 2;  // wq, wo, wk, wv
  n += L * hid * dim * 3;                     // w1, w2, w3
  n += dim;                                   // rms_final
  n += uint64_t(h.seq_len) * h.head_size();   // freq_cis real + imag (head_size/2 each)
  if (!h.tied) n += h.vocab_size * dim;       // wcls
  return n;
}

std::string header_text(const Header& h) {
  return "dim " + std::to_string(h.dim) + ", hidden_dim " + std::to_string(h.hidden_dim) +
         ", n_layers " + std::to_string(h.n_layers) + ", n_heads " + std::to_string(h.n_heads) +
         ", n_kv_heads " + std::to_string(h.n_kv_heads) + ", vocab_size " +
         std::to_string(h.vocab_size) + (h.tied ? "" : " (untied)") + ", seq_len " +
         std::to_string(h.seq_len);
}

void check_size(const MappedFile& file, const Header& h) {
  const uint64_t want = kHeaderBytes + expected_floats(h) * sizeof(float);
  const uint64_t have = file.size();
  if (want == have) return;
  fail(file.path(), "expected " + std::to_string(want) + " bytes for a llama2.c checkpoint with " +
                        header_text(h) + ", but the file is " + std::to_string(have) + " bytes (" +
                        (have < want ? "truncated" : "trailing bytes") + ")");
}

// Hands out consecutive f32 arrays of the (already size-checked) file.
class Cursor {
 public:
  explicit Cursor(std::shared_ptr<const MappedFile> file)
      : file_(std::move(file)), p_(reinterpret_cast<const float*>(file_->data() + kHeaderBytes)) {}

  // All layers' copies of one tensor; take(layers * rows * cols) in one go.
  const float* take(int64_t n) {
    const float* at = p_;
    p_ += n;
    return at;
  }
  Tensor view(const float* data, std::vector<int64_t> shape) const {
    return Tensor::view(data, std::move(shape), DType::F32, file_);
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  const float* p_;
};

ModelConfig config_from(const Header& h) {
  ModelConfig c;
  c.dim = int(h.dim);
  c.hidden_dim = int(h.hidden_dim);
  c.n_layers = int(h.n_layers);
  c.n_heads = int(h.n_heads);
  c.n_kv_heads = int(h.n_kv_heads);
  c.head_dim = int(h.head_size());
  c.vocab_size = int(h.vocab_size);
  c.max_seq_len = int(h.seq_len);
  c.rope_theta = 10000.0f;  // what run.c hard-codes
  c.norm_eps = 1e-5f;
  c.tied_classifier = h.tied;
  c.rope = RopeLayout::Interleaved;
  c.bos_id = 1;
  // run.c ends a sample when the model emits BOS (1): llama2.c models are
  // trained with BOS between documents. 2 is the Llama tokenizer's EOS.
  c.eos_ids = {1, 2};
  return c;
}

// llama2.c keeps one tokenizer per model family, often one level up from the
// weights (models/fortune/llama2c/model.bin -> models/fortune/tokenizer.model):
// SentencePiece's own file first, else the tokenizer.bin llama2.c exports.
fs::path find_tokenizer(const fs::path& file) {
  const fs::path dir = file.parent_path();
  for (const char* name : {"tokenizer.model", "tokenizer.bin"})
    for (const fs::path& candidate : {dir / name, dir.parent_path() / name})
      if (fs::is_regular_file(candidate) && !fs::equivalent(candidate, file)) return candidate;
  return {};
}

}  // namespace

Checkpoint load_llama2c(const fs::path& file) {
  const auto mapping = MappedFile::open(file);
  const Header h = parse_header(*mapping);
  check_size(*mapping, h);

  Checkpoint ck;
  ck.source = file;
  ck.config = config_from(h);
  try {
    ck.config.validate(file.string());
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }

  const int64_t L = h.n_layers, dim = h.dim, hid = h.hidden_dim, kv = h.kv_dim();
  Cursor cur(mapping);
  const float* emb = cur.take(h.vocab_size * dim);
  const float* rms_att = cur.take(L * dim);
  const float* wq = cur.take(L * dim * dim);
  const float* wk = cur.take(L * kv * dim);
  const float* wv = cur.take(L * kv * dim);
  const float* wo = cur.take(L * dim * dim);
  const float* rms_ffn = cur.take(L * dim);
  const float* w1 = cur.take(L * hid * dim);
  const float* w2 = cur.take(L * dim * hid);
  const float* w3 = cur.take(L * hid * dim);
  const float* rms_final = cur.take(dim);
  cur.take(h.seq_len * h.head_size());  // freq_cis tables: RoPE is computed, not read
  const float* wcls = h.tied ? emb : cur.take(h.vocab_size * dim);

  ck.tok_embedding = cur.view(emb, {h.vocab_size, dim});
  for (int64_t l = 0; l < L; ++l) {
    LayerTensors t;
    t.attn_norm = cur.view(rms_att + l * dim, {dim});
    t.wq = cur.view(wq + l * dim * dim, {dim, dim});
    t.wk = cur.view(wk + l * kv * dim, {kv, dim});
    t.wv = cur.view(wv + l * kv * dim, {kv, dim});
    t.wo = cur.view(wo + l * dim * dim, {dim, dim});
    t.ffn_norm = cur.view(rms_ffn + l * dim, {dim});
    t.w_gate = cur.view(w1 + l * hid * dim, {hid, dim});
    t.w_down = cur.view(w2 + l * dim * hid, {dim, hid});
    t.w_up = cur.view(w3 + l * hid * dim, {hid, dim});
    ck.layers.push_back(std::move(t));
  }
  ck.final_norm = cur.view(rms_final, {dim});
  ck.classifier = h.tied ? ck.tok_embedding : cur.view(wcls, {h.vocab_size, dim});
  ck.tokenizer_path = find_tokenizer(file);
  spdlog::debug("{}: loaded llama2.c checkpoint ({})", file.string(), header_text(h));
  return ck;
}

}  // namespace troupe
