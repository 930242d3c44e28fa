// A llama.cpp GGUF file: architectures llama (Llama 1-3, Mistral, TinyLlama,
// SmolLM as converted), qwen2, qwen3 and phi3. Tensors in f32, f16 or bf16 are
// viewed where they lie, and so are block-quantized ones (q4_0 ... q6_K),
// which the model dequantizes row by row as it packs them (as ggml computes
// them), so the file is never copied whole. llama.cpp's converter stores a llama's query and key
// rows in llama2.c's interleaved RoPE order (it permutes Hugging Face's back), and a qwen's
// unpermuted (and a phi3's), so the RoPE layout follows the architecture.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "gpu/checkpoint.h"
#include "gpu/loaders/layer_names.h"
#include "util/gguf_file.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw CheckpointError(path.string() + ": " + what);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class GgufModel {
 public:
  explicit GgufModel(const fs::path& path) : path_(path), file_(GgufFile::open(path)) {
    if (const auto parts = file_.integer("split.count"); parts && *parts > 1)
      fail(path_, "is one of " + std::to_string(*parts) +
                      " parts of a split GGUF; join them first (llama-gguf-split --merge)");
    arch_ = required_text("general.architecture");
    if (arch_ != "llama" && arch_ != "qwen2" && arch_ != "qwen3" && arch_ != "phi3" &&
        arch_ != "gemma3")
      fail(path_, "architecture '" + arch_ +
                      "' is not one this runtime computes (llama, qwen2, qwen3, phi3 and gemma3 "
                      "are)");
  }

  ModelConfig config() {
    ModelConfig c;
    c.dim = int(required_int("embedding_length"));
    c.hidden_dim = int(required_int("feed_forward_length"));
    c.n_layers = int(required_int("block_count"));
    c.n_heads = int(required_int("attention.head_count"));
    c.n_kv_heads = int(arch_int("attention.head_count_kv").value_or(c.n_heads));
    c.head_dim = int(arch_int("attention.key_length").value_or(c.n_heads ? c.dim / c.n_heads : 0));
    if (const auto v = arch_int("attention.value_length"); v && *v != c.head_dim)
      fail(path_, "attention.value_length " + std::to_string(*v) + " differs from key_length " +
                      std::to_string(c.head_dim) + "; this runtime computes equal head sizes");
    if (const auto r = arch_int("rope.dimension_count"); r && *r != c.head_dim)
      fail(path_, "rope.dimension_count " + std::to_string(*r) + " is not the head size " +
                      std::to_string(c.head_dim) + " (partial RoPE is not implemented)");
    c.max_seq_len = int(required_int("context_length"));
    c.rope_theta = float(file_.real(arch_ + ".rope.freq_base").value_or(10000.0));
    const auto eps = file_.real(arch_ + ".attention.layer_norm_rms_epsilon");
    if (!eps) fail(path_, "metadata " + arch_ + ".attention.layer_norm_rms_epsilon is missing");
    c.norm_eps = float(*eps);
    c.rope = arch_ == "llama" ? RopeLayout::Interleaved : RopeLayout::RotateHalf;
    c.qkv_bias = arch_ == "qwen2";
    c.qk_norm = arch_ == "qwen3";
    const GgufTensorInfo* embd = file_.tensor("token_embd.weight");
    if (!embd || embd->ne.size() != 2)
      fail(path_, file_.tensors().empty()
                      ? "holds no tensors (a vocabulary-only file?), so it cannot serve as a model"
                      : "has no 2-D tensor token_embd.weight");
    c.vocab_size = int(embd->ne[1]);
    c.tied_classifier = file_.tensor("output.weight") == nullptr;
    rope_scaling(c);
    if (arch_ == "gemma3") {
      gemma3(c);
    } else if (const auto w = arch_int("attention.sliding_window"); w && *w > 0) {
      limit_to_sliding_window(c, int(std::min<int64_t>(*w, 1 << 30)), path_.string());
    }
    ids(c);
    try {
      c.validate(path_.string());
    } catch (const std::invalid_argument& e) {
      throw CheckpointError(e.what());
    }
    return c;
  }

  // The tensor `name` viewed in the file (a quantized one as a blocks view,
  // f32 to its readers), after checking its shape (rows first, as Tensor
  // has it: GGUF's ne reversed).
  Tensor get(const std::string& name, const std::vector<int64_t>& expected) {
    read_.insert(name);
    const GgufTensorInfo* t = file_.tensor(name);
    if (!t) fail(path_, "tensor '" + name + "' is missing");
    const std::vector<int64_t> shape(t->ne.rbegin(), t->ne.rend());
    if (shape != expected)
      fail(path_, "tensor '" + name + "' has shape " + shape_text(shape) + ", expected " +
                      shape_text(expected) + " from the metadata");
    const GgmlType* type = ggml_type(t->type);
    if (!type || !type->dequantizable)
      fail(path_, "tensor '" + name + "' is " + ggml_type_name(t->type) +
                      ", which this runtime does not read (it reads " + ggml_dequantizable_names() +
                      ")");
    if (t->type == kGgmlF32 || t->type == kGgmlF16 || t->type == kGgmlBF16) {
      const DType d = t->type == kGgmlF32   ? DType::F32
                      : t->type == kGgmlF16 ? DType::F16
                                            : DType::BF16;
      return Tensor::view(t->data, shape, d, file_.keepalive());
    }
    return Tensor::blocks_view(t->data, shape, t->type, file_.keepalive());
  }

  bool has(const std::string& name) const { return file_.tensor(name) != nullptr; }

  // Every tensor was read: one that was not would hold a part of the model
  // this runtime does not compute, and its answers would be wrong.
  void check_all_read() const {
    for (const GgufTensorInfo& t : file_.tensors())
      if (!read_.count(t.name))
        fail(path_, "tensor '" + t.name + "' is no part of the " + arch_ +
                        " model this runtime computes, so its answers would be wrong");
  }

  bool has_vocabulary() const { return file_.find("tokenizer.ggml.model") != nullptr; }
  const std::string& arch() const { return arch_; }

 private:
  // Gemma 3 as llama.cpp reads it (its norms' 1 already added by the
  // converter): every sixth layer sees every position, the others a sliding
  // window (or the pattern the file gives), rotated by rope.freq_base_swa
  // (10000 unless given); scores scaled by 1/sqrt(head_dim), but the 27B's
  // (62 layers) by 1/sqrt(dim / heads), as llama.cpp and gemma_pytorch do.
  void gemma3(ModelConfig& c) const {
    use_gemma3_layers(c);
    if (c.n_layers == 62) c.attn_scale = 1.0f / std::sqrt(float(c.dim / c.n_heads));
    if (file_.real(arch_ + ".final_logit_softcapping").value_or(0) != 0)
      fail(path_, "final_logit_softcapping is not implemented");
    const auto window = arch_int("attention.sliding_window");
    if (!window || *window <= 0) return;
    c.sliding_window = int(std::min<int64_t>(*window, 1 << 30));
    c.rope_theta_sliding = float(file_.real(arch_ + ".rope.freq_base_swa").value_or(10000.0));
    const GgufValue* pattern = file_.find(arch_ + ".attention.sliding_window_pattern");
    if (pattern && pattern->kind == GgufValue::Kind::Array) {
      if (pattern->numbers.size() != size_t(c.n_layers))
        fail(path_, "attention.sliding_window_pattern has " +
                        std::to_string(pattern->numbers.size()) + " entries for " +
                        std::to_string(c.n_layers) + " layers");
      c.sliding_layers.assign(size_t(c.n_layers), false);
      for (size_t l = 0; l < pattern->numbers.size(); ++l)
        c.sliding_layers[l] = pattern->numbers[l] != 0;
      return;
    }
    const int64_t every = arch_int("attention.sliding_window_pattern").value_or(6);
    if (every < 0)
      fail(path_, "attention.sliding_window_pattern " + std::to_string(every) + " is negative");
    c.sliding_layers = sliding_every_but_nth(c.n_layers, int(std::min<int64_t>(every, 1 << 30)));
  }

  std::string required_text(const std::string& key) const {
    const auto v = file_.text(key);
    if (!v) fail(path_, "metadata " + key + " is missing");
    return *v;
  }
  // An integer, or one per layer (llama.cpp writes head counts so for some
  // models): this runtime computes layers of one shape, so those must agree.
  std::optional<int64_t> arch_int(const std::string& key) const {
    const GgufValue* v = file_.find(arch_ + "." + key);
    if (v && v->kind == GgufValue::Kind::Array && !v->array_of_text && !v->numbers.empty()) {
      for (double x : v->numbers)
        if (x != v->numbers[0])
          fail(path_, "metadata " + arch_ + "." + key +
                          " differs between layers; this runtime computes layers of one shape");
      return int64_t(v->numbers[0]);
    }
    return file_.integer(arch_ + "." + key);
  }
  int64_t required_int(const std::string& key) const {
    const auto v = arch_int(key);
    if (!v) fail(path_, "metadata " + arch_ + "." + key + " is missing");
    if (*v <= 0 || *v > (int64_t(1) << 30))
      fail(path_,
           "metadata " + arch_ + "." + key + " = " + std::to_string(*v) + " is out of range");
    return *v;
  }

  void rope_scaling(ModelConfig& c) {
    // As llama.cpp: a factor without a type is linear scaling, and so is
    // the older rope.scale_linear.
    std::optional<double> factor = file_.real(arch_ + ".rope.scaling.factor");
    if (!factor) factor = file_.real(arch_ + ".rope.scale_linear");
    const std::string kind = file_.text(arch_ + ".rope.scaling.type")
                                 .value_or(factor && *factor != 1.0 ? "linear" : "none");
    if (kind == "linear") {
      c.rope_scaling.kind = RopeScaling::Kind::Linear;
      c.rope_scaling.factor = float(factor.value_or(1.0));
    } else if (kind != "none") {
      fail(path_, "rope.scaling.type '" + kind + "' is not implemented (none and linear are)");
    }
    // Phi-3's long-context variants (128k) rescale RoPE by one of two
    // factor sets, chosen by the sequence's length.
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"})
      if (has(name))
        fail(path_, std::string("holds ") + name +
                        ": LongRoPE scaling (Phi-3's 128k-context models) is not implemented");
    // Llama 3.1's scaling, as llama.cpp's converter stores it: a divisor
    // per frequency.
    if (has("rope_freqs.weight")) {
      const Tensor f = get("rope_freqs.weight", {c.head_dim / 2});
      if (c.rope_scaling.kind != RopeScaling::Kind::None)
        fail(path_, "has both rope.scaling.type and rope_freqs.weight");
      c.rope_scaling.kind = RopeScaling::Kind::Factors;
      c.rope_scaling.freq_factors = f.to_f32();
    }
  }

  void ids(ModelConfig& c) const {
    c.bos_id = int(file_.integer("tokenizer.ggml.bos_token_id").value_or(1));
    c.eos_ids.clear();
    auto add = [&](int64_t id) {
      if (id >= 0 && id < c.vocab_size && !c.is_eos(int(id))) c.eos_ids.push_back(int(id));
    };
    add(file_.integer("tokenizer.ggml.eos_token_id").value_or(2));
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
      if (const auto id = file_.integer(key)) add(*id);
    const auto* tokens = file_.texts("tokenizer.ggml.tokens");
    if (tokens)
      for (size_t id = 0; id < tokens->size(); ++id)
        if (gguf_ends_generation((*tokens)[id])) add(int64_t(id));
    if (c.eos_ids.empty()) c.eos_ids.push_back(2);
  }

  fs::path path_;
  GgufFile file_;
  std::string arch_;
  std::set<std::string> read_;
};

LayerTensors load_layer(GgufModel& g, const ModelConfig& c, int i) {
  const std::string p = "blk." + std::to_string(i) + ".";
  LayerNames names{p + "attn_norm.weight",
                   p + "attn_q.weight",
                   p + "attn_k.weight",
                   p + "attn_v.weight",
                   p + "attn_output.weight",
                   p + "ffn_norm.weight",
                   p + "ffn_gate.weight",
                   p + "ffn_up.weight",
                   p + "ffn_down.weight",
                   p + "attn_q.bias",
                   p + "attn_k.bias",
                   p + "attn_v.bias",
                   p + "attn_q_norm.weight",
                   p + "attn_k_norm.weight",
                   {},
                   {},
                   p + "post_attention_norm.weight",
                   p + "post_ffw_norm.weight"};
  // Phi-3 as llama.cpp converts it: q, k and v in one matrix (or apart),
  // and ffn_up holding the gate's rows, then up's.
  if (g.has(p + "attn_qkv.weight")) names.wqkv = p + "attn_qkv.weight";
  if (g.arch() == "phi3" && !g.has(p + "ffn_gate.weight")) names.w_gate_up = p + "ffn_up.weight";
  return read_layer([&](const std::string& name,
                        const std::vector<int64_t>& shape) { return g.get(name, shape); },
                    c, names);
}

Checkpoint load_gguf_file(const fs::path& file) {
  GgufModel g(file);
  Checkpoint ck;
  ck.source = file;
  ck.config = g.config();
  const ModelConfig& c = ck.config;
  ck.tok_embedding = g.get("token_embd.weight", {c.vocab_size, c.dim});
  for (int i = 0; i < c.n_layers; ++i) ck.layers.push_back(load_layer(g, c, i));
  ck.final_norm = g.get("output_norm.weight", {c.dim});
  ck.classifier =
      c.tied_classifier ? ck.tok_embedding : g.get("output.weight", {c.vocab_size, c.dim});
  g.check_all_read();
  // The vocabulary travels in the file itself.
  if (g.has_vocabulary()) ck.tokenizer_path = file;
  spdlog::debug("{}: loaded GGUF checkpoint ({}, {} layers)", file.string(), g.arch(), c.n_layers);
  return ck;
}

}  // namespace

Checkpoint load_gguf(const fs::path& file) {
  try {
    return load_gguf_file(file);
  } catch (const GgufError& e) {  // a key of the wrong kind, met while reading
    throw CheckpointError(e.what());
  }
}

}  // namespace troupe
