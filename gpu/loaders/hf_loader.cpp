// Hugging Face Llama checkpoints: config.json plus model.safetensors, or a
// model.safetensors.index.json whose weight_map spreads tensors over shards.
#include <spdlog/spdlog.h>

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

#include "gpu/checkpoint.h"
#include "gpu/loaders/layer_names.h"
#include "gpu/loaders/mmap_file.h"
#include "gpu/loaders/safetensors.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw CheckpointError(path.string() + ": " + what);
}

json read_json(const fs::path& path) {
  const auto file = MappedFile::open(path);
  const char* begin = reinterpret_cast<const char*>(file->data());
  try {
    return json::parse(begin, begin + file->size());
  } catch (const json::exception& e) {
    fail(path, std::string("malformed JSON: ") + e.what());
  }
}

// Built by appending: GCC 12 warns falsely (-Wrestrict) on `"\"" + string`.
std::string quoted(const char* key) {
  std::string s = "\"";
  s += key;
  s += '"';
  return s;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return Tensor::view(nullptr, shape, DType::F32).shape_str();
}

// Typed access to config.json; every complaint names the file and the key.
// An absent key and an explicit null both mean "use the default".
class ConfigReader {
 public:
  ConfigReader(fs::path path, const json& j) : path_(std::move(path)), j_(j) {
    if (!j_.is_object()) fail(path_, "must hold a JSON object");
  }

  const json* get(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  int integer(const char* key, std::optional<int> fallback = std::nullopt) const {
    const json* v = get(key);
    if (!v) {
      if (!fallback) fail(path_, "missing required key " + quoted(key));
      return *fallback;
    }
    return to_int(key, *v);
  }

  float number(const char* key, float fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) wrong_type(key, "a number", *v);
    return v->get<float>();
  }

  bool boolean(const char* key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) wrong_type(key, "true or false", *v);
    return v->get<bool>();
  }

  // An id or a list of ids, as Hugging Face allows for eos_token_id.
  std::vector<int> ids(const char* key, std::vector<int> fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_array()) return {to_int(key, *v)};
    std::vector<int> out;
    for (const json& e : *v) out.push_back(to_int(key, e));
    return out;
  }

  [[noreturn]] void unsupported(const char* key, const json& v, const std::string& why) const {
    fail(path_, quoted(key) + ": " + v.dump() + " is not supported (" + why + ")");
  }

 private:
  int to_int(const char* key, const json& v) const {
    if (!v.is_number_integer()) wrong_type(key, "an integer", v);
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())
                               : v.get<int64_t>() < std::numeric_limits<int>::min())
      fail(path_, quoted(key) + " is out of range: " + v.dump());
    return v.get<int>();
  }

  [[noreturn]] void wrong_type(const char* key, const char* want, const json& v) const {
    fail(path_, quoted(key) + " must be " + want + ", got " + v.dump());
  }

  fs::path path_;
  const json& j_;
};

// Refuses features this runtime's Llama does not implement, rather than
// silently computing something else.
bool is_gemma3(const ConfigReader& c) {
  const json* v = c.get("model_type");
  return v && *v == "gemma3_text";
}

void check_supported(const ConfigReader& c) {
  // Other architectures share Llama's key names (Qwen2's bias terms, OLMo2's
  // extra norms, Gemma 2's scaled embeddings) and would load as Llama,
  // wrongly.
  if (const json* v = c.get("model_type");
      v && !(v->is_string() && (*v == "llama" || *v == "mistral" || *v == "qwen2" ||
                                *v == "qwen3" || *v == "phi3" || *v == "gemma3_text")))
    c.unsupported("model_type", *v,
                  *v == "gemma3"
                      ? "this is Gemma 3 with its vision tower; its text model (model_type "
                        "gemma3_text, as the 270M and 1B checkpoints are) is implemented"
                      : "only the Llama architecture (llama, mistral), Qwen's (qwen2, qwen3), "
                        "Phi-3's (phi3) and Gemma 3's text model (gemma3_text) are implemented");
  if (is_gemma3(c)) {
    // Gemma 3 computes the activation named hidden_activation (a
    // hidden_act beside it is not read by transformers either).
    if (const json* v = c.get("hidden_activation");
        v && !(v->is_string() && *v == "gelu_pytorch_tanh"))
      c.unsupported("hidden_activation", *v, "Gemma 3's gelu_pytorch_tanh is implemented");
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
      if (const json* v = c.get(key)) c.unsupported(key, *v, "soft-capping is not implemented");
    if (c.boolean("use_bidirectional_attention", false))
      c.unsupported("use_bidirectional_attention", true,
                    "an embedding model's bidirectional attention is not implemented");
  } else if (const json* v = c.get("hidden_act"); v && !(v->is_string() && *v == "silu")) {
    c.unsupported("hidden_act", *v, "only silu is implemented");
  }
  if (const json* v = c.get("partial_rotary_factor");
      v && !(v->is_number() && v->get<double>() == 1.0))
    c.unsupported("partial_rotary_factor", *v, "RoPE over part of a head is not implemented");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (c.boolean(key, false)) c.unsupported(key, true, "bias terms are not implemented");
}

// rope_scaling: null, linear (positions / factor) or llama3 (Llama 3.1's
// frequency-dependent stretch); others (dynamic, yarn, longrope) are refused.
// One object of RoPE settings, named `key` in config.json: rope_scaling
// (`type`, its older key, too), or transformers 5's rope_parameters, whose
// type may be left out for the default.
RopeScaling rope_scaling_from(const fs::path& path, const ConfigReader& c, const char* key,
                              const json& v) {
  if (!v.is_object()) c.unsupported(key, v, "it must be an object or null");
  const ConfigReader r(path, v);
  const json* type = r.get("rope_type");
  if (!type) type = r.get("type");  // the older key
  const std::string kind = type && type->is_string() ? type->get<std::string>() : "";
  RopeScaling s;
  if (kind == "default" || (!type && std::string_view(key) == "rope_parameters")) return s;
  if (kind == "linear") {
    s.kind = RopeScaling::Kind::Linear;
  } else if (kind == "llama3") {
    s.kind = RopeScaling::Kind::Llama3;
    s.low_freq_factor = r.number("low_freq_factor", s.low_freq_factor);
    s.high_freq_factor = r.number("high_freq_factor", s.high_freq_factor);
    s.original_max_position = r.integer("original_max_position_embeddings");
  } else {
    c.unsupported(key, v, "only linear and llama3 scaling are implemented");
  }
  s.factor = r.number("factor", 0);
  return s;
}

RopeScaling parse_rope_scaling(const fs::path& path, const ConfigReader& c) {
  const json* v = c.get("rope_scaling");
  return v ? rope_scaling_from(path, c, "rope_scaling", *v) : RopeScaling{};
}

// transformers 5 writes rope_theta and rope_scaling as one rope_parameters
// object; a model with two kinds of layer (Gemma 3) has one per kind. Read
// after the older keys, which it replaces: without it, a Llama 3 saved by
// transformers 5 would rotate by the default theta, silently wrong.
void read_rope_parameters(const fs::path& path, const ConfigReader& c, ModelConfig& cfg) {
  const json* v = c.get("rope_parameters");
  if (!v) return;
  if (!v->is_object()) c.unsupported("rope_parameters", *v, "it must be an object or null");
  const bool by_kind = v->contains("full_attention") || v->contains("sliding_attention");
  const json& full = by_kind ? v->value("full_attention", json::object()) : *v;
  cfg.rope_theta = ConfigReader(path, full).number("rope_theta", cfg.rope_theta);
  cfg.rope_scaling = rope_scaling_from(path, c, "rope_parameters", full);
  if (!by_kind || !v->contains("sliding_attention")) return;
  const json& sliding = (*v)["sliding_attention"];
  cfg.rope_theta_sliding = ConfigReader(path, sliding).number("rope_theta", cfg.rope_theta_sliding);
  if (rope_scaling_from(path, c, "rope_parameters", sliding).kind != RopeScaling::Kind::None)
    c.unsupported("rope_parameters", sliding, "scaling of the sliding-window layers' RoPE");
}

// Gemma 3's text model (Gemma3TextConfig's defaults): GELU, embeddings
// scaled by sqrt(hidden_size) (in f32, as llama.cpp computes it), q/k norms,
// norms stored less 1, attention and FFN outputs normed again; layers
// attend to a sliding window but every sliding_window_pattern-th (or as
// layer_types says), rotating by rope_local_base_freq unscaled; the others
// by rope_theta and rope_scaling.
void gemma3(const fs::path& path, const ConfigReader& c, ModelConfig& cfg) {
  use_gemma3_layers(cfg);
  cfg.norm_offset = 1;
  cfg.attn_scale = 1.0f / std::sqrt(c.number("query_pre_attn_scalar", 256));
  cfg.rope_theta = c.number("rope_theta", 1e6f);  // Gemma3TextConfig's default
  cfg.rope_theta_sliding = c.number("rope_local_base_freq", 10000.0f);
  const int window = c.integer("sliding_window", 4096);
  if (window <= 0) fail(path, "\"sliding_window\" must be positive, got " + std::to_string(window));
  cfg.sliding_window = window;
  cfg.sliding_layers.assign(size_t(cfg.n_layers), false);
  if (const json* types = c.get("layer_types")) {
    if (!types->is_array() || types->size() != size_t(cfg.n_layers))
      fail(path,
           "\"layer_types\" must list one type per layer (" + std::to_string(cfg.n_layers) + ")");
    for (size_t l = 0; l < types->size(); ++l) {
      const json& t = (*types)[l];
      if (t != "sliding_attention" && t != "full_attention")
        c.unsupported("layer_types", t, "sliding_attention and full_attention are implemented");
      cfg.sliding_layers[l] = t == "sliding_attention";
    }
    return;
  }
  const int every = c.integer("sliding_window_pattern", 6);
  if (every <= 0)
    fail(path, "\"sliding_window_pattern\" must be positive, got " + std::to_string(every));
  cfg.sliding_layers = sliding_every_but_nth(cfg.n_layers, every);
}

ModelConfig parse_config(const fs::path& path) {
  const json j = read_json(path);
  const ConfigReader c(path, j);
  check_supported(c);
  // Defaults are those of transformers' LlamaConfig, except for the
  // structural sizes, which a real checkpoint always states.
  ModelConfig cfg;
  cfg.dim = c.integer("hidden_size");
  cfg.hidden_dim = c.integer("intermediate_size");
  cfg.n_layers = c.integer("num_hidden_layers");
  cfg.n_heads = c.integer("num_attention_heads");
  cfg.n_kv_heads = c.integer("num_key_value_heads", cfg.n_heads);
  if (cfg.n_heads <= 0)
    fail(path, "\"num_attention_heads\" must be positive, got " + std::to_string(cfg.n_heads));
  cfg.head_dim = c.integer("head_dim", cfg.dim / cfg.n_heads);
  cfg.vocab_size = c.integer("vocab_size");
  cfg.max_seq_len = c.integer("max_position_embeddings", 2048);
  cfg.norm_eps = c.number("rms_norm_eps", 1e-6f);
  cfg.rope_theta = c.number("rope_theta", 10000.0f);
  cfg.rope_scaling = parse_rope_scaling(path, c);
  cfg.tied_classifier = c.boolean("tie_word_embeddings", is_gemma3(c));
  // Qwen2 is Llama with biases on the q, k and v projections; Qwen3, with
  // each query and key head normalised instead.
  if (const json* v = c.get("model_type")) {
    cfg.qkv_bias = *v == "qwen2";
    cfg.qk_norm = *v == "qwen3";
  }
  cfg.bos_id = c.integer("bos_token_id", 1);
  cfg.eos_ids = c.ids("eos_token_id", {2});
  cfg.rope = RopeLayout::RotateHalf;
  if (is_gemma3(c)) {
    gemma3(path, c, cfg);
  } else if (const json* w = c.get("sliding_window"); w && c.boolean("use_sliding_window", true)) {
    const int window = c.integer("sliding_window");
    if (window <= 0)
      fail(path, "\"sliding_window\" must be positive or null, got " + std::to_string(window));
    limit_to_sliding_window(cfg, window, path.string());
  }
  read_rope_parameters(path, c, cfg);
  // generation_config.json's EOS ids end a sequence too (Llama 3 Instruct's
  // <|eot_id|>, Qwen2.5's <|endoftext|>), as transformers' generate() and
  // vLLM stop on them.
  if (const fs::path gen = path.parent_path() / "generation_config.json"; fs::exists(gen)) {
    const json g = read_json(gen);
    for (int id : ConfigReader(gen, g).ids("eos_token_id", {}))
      if (!cfg.is_eos(id)) cfg.eos_ids.push_back(id);
  }
  try {
    cfg.validate(path.string());
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what());
  }
  return cfg;
}

// Where each tensor lives: one model.safetensors, or the shards that
// model.safetensors.index.json names.
class WeightSource {
 public:
  explicit WeightSource(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors";
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(single)) {
      files_.emplace("model.safetensors", read_safetensors(single));
    } else if (fs::exists(index)) {
      load_index(dir, index);
    } else {
      fail(dir, "has neither model.safetensors nor model.safetensors.index.json");
    }
  }

  // The tensor `name`, after checking that its shape is `expected`.
  Tensor get(const std::string& name, const std::vector<int64_t>& expected) {
    read_.insert(name);
    const SafetensorsFile& file = file_for(name);
    const Tensor* t = file.find(name);
    if (!t) {
      if (index_path_.empty()) fail(file.path, "tensor '" + name + "' is missing");
      fail(file.path, "tensor '" + name + "' is missing, though " + index_path_.string() +
                          " places it in this shard");
    }
    if (t->shape() != expected)
      fail(file.path, "tensor '" + name + "' has shape " + t->shape_str() + ", expected " +
                          shape_text(expected) + " from config.json");
    return *t;
  }

  bool has(const std::string& name) const {
    if (index_path_.empty()) return files_.begin()->second.find(name) != nullptr;
    return weight_map_.count(name) > 0;
  }

  // Every tensor of the checkpoint was read but those that change nothing
  // (`ignorable`): one that is not would hold a part of the model (a bias, a
  // norm) this runtime does not compute, and its answers would be wrong.
  template <class Ignorable>
  void check_all_read(Ignorable ignorable) const {
    for (const auto& [rel, file] : files_)
      for (const auto& [name, tensor] : file.tensors) {
        if (read_.count(name) || ignorable(name)) continue;
        fail(file.path, "tensor '" + name +
                            "' is no part of the Llama model this runtime computes (a bias, an "
                            "extra norm or another architecture's weight), so its answers would "
                            "be wrong");
      }
  }

 private:
  void load_index(const fs::path& dir, const fs::path& index) {
    index_path_ = index;
    const json j = read_json(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index, "must hold an object with a \"weight_map\" object");
    for (const auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string())
        fail(index, "weight_map entry for '" + name + "' must be a file name string");
      const fs::path rel = shard.get<std::string>();
      check_shard_name(index, name, rel);
      weight_map_[name] = rel.string();
      if (files_.count(rel.string())) continue;
      if (!fs::is_regular_file(dir / rel))
        fail(index, "weight_map places tensor '" + name + "' in shard " + (dir / rel).string() +
                        ", which does not exist");
      files_.emplace(rel.string(), read_safetensors(dir / rel));
    }
  }

  // Shards must sit inside the checkpoint directory.
  static void check_shard_name(const fs::path& index, const std::string& tensor,
                               const fs::path& rel) {
    bool escapes = rel.empty() || rel.is_absolute();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes)
      fail(index, "weight_map entry for '" + tensor + "' names \"" + rel.string() +
                      "\", which is not a file inside the checkpoint directory");
  }

  const SafetensorsFile& file_for(const std::string& name) const {
    if (index_path_.empty()) return files_.begin()->second;
    auto it = weight_map_.find(name);
    if (it == weight_map_.end())
      fail(index_path_, "tensor '" + name + "' is missing from weight_map");
    return files_.at(it->second);
  }

  fs::path index_path_;  // empty for a single-file checkpoint
  std::map<std::string, std::string> weight_map_;
  std::map<std::string, SafetensorsFile> files_;  // by name relative to the directory
  std::set<std::string> read_;                    // the tensors get() was asked for
};

LayerTensors load_layer(WeightSource& w, const ModelConfig& c, int i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  LayerNames names{p + "input_layernorm.weight",
                   p + "self_attn.q_proj.weight",
                   p + "self_attn.k_proj.weight",
                   p + "self_attn.v_proj.weight",
                   p + "self_attn.o_proj.weight",
                   p + "post_attention_layernorm.weight",
                   p + "mlp.gate_proj.weight",
                   p + "mlp.up_proj.weight",
                   p + "mlp.down_proj.weight",
                   p + "self_attn.q_proj.bias",
                   p + "self_attn.k_proj.bias",
                   p + "self_attn.v_proj.bias",
                   p + "self_attn.q_norm.weight",
                   p + "self_attn.k_norm.weight",
                   {},
                   {},
                   p + "post_attention_layernorm.weight",
                   p + "post_feedforward_layernorm.weight"};
  // Gemma 3: post_attention_layernorm norms the attention's output; the
  // FFN's input norm is pre_feedforward_layernorm.
  if (c.post_norms) names.ffn_norm = p + "pre_feedforward_layernorm.weight";
  // Phi-3 stores q, k and v as one matrix, and the FFN's gate and up.
  if (w.has(p + "self_attn.qkv_proj.weight")) names.wqkv = p + "self_attn.qkv_proj.weight";
  if (w.has(p + "mlp.gate_up_proj.weight")) names.w_gate_up = p + "mlp.gate_up_proj.weight";
  return read_layer([&](const std::string& name,
                        const std::vector<int64_t>& shape) { return w.get(name, shape); },
                    c, names);
}

}  // namespace

Checkpoint load_hf_dir(const fs::path& dir) {
  if (!fs::is_directory(dir)) fail(dir, "is not a directory");
  const fs::path config_path = dir / "config.json";
  if (!fs::exists(config_path))
    fail(dir, "has no config.json, so it is not a Hugging Face checkpoint directory");

  Checkpoint ck;
  ck.source = dir;
  ck.config = parse_config(config_path);
  const ModelConfig& c = ck.config;
  WeightSource weights(dir);
  ck.tok_embedding = weights.get("model.embed_tokens.weight", {c.vocab_size, c.dim});
  for (int i = 0; i < c.n_layers; ++i) ck.layers.push_back(load_layer(weights, c, i));
  ck.final_norm = weights.get("model.norm.weight", {c.dim});
  ck.classifier =
      c.tied_classifier ? ck.tok_embedding : weights.get("lm_head.weight", {c.vocab_size, c.dim});
  // Older exports saved RoPE's frequencies (recomputed here); a tied model
  // may still carry its classifier's copy of the embedding.
  weights.check_all_read([&](const std::string& name) {
    return name.ends_with(".rotary_emb.inv_freq") ||
           (c.tied_classifier && name == "lm_head.weight");
  });
  // SentencePiece's own file when there is one (Llama 2, Mistral ship both),
  // else the tokenizers library's (Llama 3, Qwen2, SmolLM ship only that).
  for (const char* file : {"tokenizer.model", "tokenizer.json"})
    if (ck.tokenizer_path.empty() && fs::is_regular_file(dir / file))
      ck.tokenizer_path = dir / file;
  spdlog::debug("{}: loaded Hugging Face checkpoint ({} layers)", dir.string(), c.n_layers);
  return ck;
}

}  // namespace troupe
