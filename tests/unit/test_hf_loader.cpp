// Hugging Face checkpoints: config.json parsing, single-file and sharded
// safetensors, agreement with the llama2.c copy of the same weights, and bad
// configs or tensors refused with a message naming the file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/loaders/safetensors.h"
#include "support/error_messages.h"
#include "support/test_support.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The CheckpointError message `f` throws.
std::string error_of(const std::function<void()>& f) {
  return test::message_of<CheckpointError>(f);
}
using test::mentions;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// ---- a tiny synthetic model: hidden 8, ffn 12, 2 layers, 2 heads, 1 kv head

json tiny_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 8},
          {"intermediate_size", 12},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"vocab_size", 16},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling", nullptr},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

// Tensor k holds k*1000 + i, so any mix-up of tensors shows.
Tensor filled(std::vector<int64_t> shape, DType dtype, int k) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(k * 1000 + int(i));
  convert_from_f32(v.data(), dtype, t.raw_mut(), v.size());
  return t;
}

// Every tensor the config asks for, shaped from the config itself.
NamedTensors tiny_tensors(const json& cfg, DType dtype = DType::F32) {
  const int64_t d = cfg["hidden_size"], h = cfg["intermediate_size"], v = cfg["vocab_size"];
  const int64_t heads = cfg["num_attention_heads"];
  const int64_t kv_heads = cfg.value("num_key_value_heads", heads);
  const int64_t hd = d / heads;
  NamedTensors out;
  int k = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.emplace_back(name, filled(std::move(shape), dtype, k++));
  };
  add("model.embed_tokens.weight", {v, d});
  for (int l = 0; l < int(cfg["num_hidden_layers"]); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d});
    add(p + "self_attn.q_proj.weight", {heads * hd, d});
    add(p + "self_attn.k_proj.weight", {kv_heads * hd, d});
    add(p + "self_attn.v_proj.weight", {kv_heads * hd, d});
    add(p + "self_attn.o_proj.weight", {d, heads * hd});
    add(p + "post_attention_layernorm.weight", {d});
    add(p + "mlp.gate_proj.weight", {h, d});
    add(p + "mlp.up_proj.weight", {h, d});
    add(p + "mlp.down_proj.weight", {d, h});
  }
  add("model.norm.weight", {d});
  add("lm_head.weight", {v, d});
  return out;
}

void write_model(const fs::path& dir, const json& cfg, const NamedTensors& tensors) {
  test::write_file(dir / "config.json", cfg.dump(2));
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
}

const Tensor& by_name(const NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts)
    if (n == name) return t;
  throw std::runtime_error("test bug: no tensor " + name);
}

void drop(NamedTensors& ts, const std::string& name) {
  std::erase_if(ts, [&](const auto& p) { return p.first == name; });
}

// Every named tensor of a checkpoint, in Hugging Face naming.
NamedTensors hf_named(const Checkpoint& ck) {
  NamedTensors out{{"model.embed_tokens.weight", ck.tok_embedding}};
  for (size_t l = 0; l < ck.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerTensors& t = ck.layers[l];
    out.insert(out.end(), {{p + "input_layernorm.weight", t.attn_norm},
                           {p + "self_attn.q_proj.weight", t.wq},
                           {p + "self_attn.k_proj.weight", t.wk},
                           {p + "self_attn.v_proj.weight", t.wv},
                           {p + "self_attn.o_proj.weight", t.wo},
                           {p + "post_attention_layernorm.weight", t.ffn_norm},
                           {p + "mlp.gate_proj.weight", t.w_gate},
                           {p + "mlp.up_proj.weight", t.w_up},
                           {p + "mlp.down_proj.weight", t.w_down}});
  }
  out.emplace_back("model.norm.weight", ck.final_norm);
  if (!ck.config.tied_classifier) out.emplace_back("lm_head.weight", ck.classifier);
  return out;
}

// ---- the bundled model

TEST(HfLoader, LoadsFortune) {
  const fs::path dir = test::model_path("fortune");
  const Checkpoint ck = load_checkpoint(dir);
  const ModelConfig& c = ck.config;
  EXPECT_EQ(c.dim, 192);
  EXPECT_EQ(c.hidden_dim, 512);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 6);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.vocab_size, 2000);
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_TRUE(c.tied_classifier);
  EXPECT_EQ(c.rope, RopeLayout::RotateHalf);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(ck.source, dir);
  EXPECT_EQ(ck.tokenizer_path, dir / "tokenizer.model");
  ASSERT_EQ(ck.layers.size(), 5u);
  EXPECT_EQ(ck.classifier.raw(), ck.tok_embedding.raw());
  EXPECT_EQ(ck.layers[2].wk.shape(), (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(ck.layers[2].w_down.shape(), (std::vector<int64_t>{192, 512}));
}

// Hugging Face stores q/k rows permuted for rotate-half RoPE: within each
// head, HF row i (< head_dim/2) is llama2.c row 2i and HF row head_dim/2 + i
// is llama2.c row 2i + 1. Counts the rows that break that rule.
int permuted_row_mismatches(const Tensor& hf, const Tensor& l2c, int heads, int head_dim) {
  const int64_t cols = hf.dim(1);
  const size_t row_bytes = size_t(cols) * sizeof(float);
  const float* a = hf.data<float>();
  const float* b = l2c.data<float>();
  int bad = 0;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < head_dim / 2; ++i) {
      const int64_t base = int64_t(h) * head_dim;
      bad += std::memcmp(a + (base + i) * cols, b + (base + 2 * i) * cols, row_bytes) != 0;
      bad += std::memcmp(a + (base + head_dim / 2 + i) * cols, b + (base + 2 * i + 1) * cols,
                         row_bytes) != 0;
    }
  return bad;
}

TEST(HfLoader, FortuneMatchesItsLlama2cCopy) {
  const Checkpoint hf = load_hf_dir(test::model_path("fortune"));
  const Checkpoint l2 = load_llama2c(test::model_path("fortune") / "llama2c" / "model.bin");
  const ModelConfig &a = hf.config, &b = l2.config;
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.tied_classifier, b.tied_classifier);
  EXPECT_EQ(b.rope, RopeLayout::Interleaved);

  EXPECT_TRUE(same_bytes(hf.tok_embedding, l2.tok_embedding));
  EXPECT_TRUE(same_bytes(hf.final_norm, l2.final_norm));
  EXPECT_TRUE(same_bytes(hf.classifier, l2.classifier));
  ASSERT_EQ(hf.layers.size(), l2.layers.size());
  for (size_t l = 0; l < hf.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerTensors &x = hf.layers[l], &y = l2.layers[l];
    ASSERT_EQ(x.wq.shape(), y.wq.shape());
    ASSERT_EQ(x.wk.shape(), y.wk.shape());
    EXPECT_EQ(permuted_row_mismatches(x.wq, y.wq, a.n_heads, a.head_dim), 0);
    EXPECT_EQ(permuted_row_mismatches(x.wk, y.wk, a.n_kv_heads, a.head_dim), 0);
    EXPECT_FALSE(same_bytes(x.wq, y.wq));  // the permutation is real, not the identity
    EXPECT_TRUE(same_bytes(x.wv, y.wv));
    EXPECT_TRUE(same_bytes(x.wo, y.wo));
    EXPECT_TRUE(same_bytes(x.attn_norm, y.attn_norm));
    EXPECT_TRUE(same_bytes(x.ffn_norm, y.ffn_norm));
    EXPECT_TRUE(same_bytes(x.w_gate, y.w_gate));
    EXPECT_TRUE(same_bytes(x.w_up, y.w_up));
    EXPECT_TRUE(same_bytes(x.w_down, y.w_down));
  }
}

// ---- synthetic models

TEST(HfLoader, LoadsUntiedModelWithItsOwnSettings) {
  TempDir dir;
  const json cfg = tiny_config();
  const NamedTensors ts = tiny_tensors(cfg);
  write_model(dir.path(), cfg, ts);
  const Checkpoint ck = load_hf_dir(dir.path());
  EXPECT_EQ(ck.config.head_dim, 4);
  EXPECT_EQ(ck.config.n_kv_heads, 1);
  EXPECT_FLOAT_EQ(ck.config.rope_theta, 500000.0f);
  EXPECT_FALSE(ck.config.tied_classifier);
  EXPECT_EQ(ck.config.eos_ids, std::vector<int>{2});
  EXPECT_TRUE(ck.tokenizer_path.empty());
  for (const auto& [name, t] : hf_named(ck)) EXPECT_TRUE(same_bytes(t, by_name(ts, name))) << name;
}

TEST(HfLoader, AppliesHuggingFaceDefaults) {
  TempDir dir;
  json cfg = tiny_config();
  for (const char* key : {"num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings",
                          "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_scaling"})
    cfg.erase(key);
  cfg["eos_token_id"] = json::array({2, 3});
  write_model(dir.path(), cfg, tiny_tensors(cfg));
  const ModelConfig c = load_hf_dir(dir.path()).config;
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.tied_classifier);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{2, 3}));
}

// generation_config.json's EOS ids join config.json's (Llama 3 Instruct ends
// a turn with <|eot_id|>, which only that file may name).
TEST(HfLoader, GenerationConfigEosIdsEndSequencesToo) {
  TempDir dir;
  json cfg = tiny_config();
  write_model(dir.path(), cfg, tiny_tensors(cfg));
  test::write_file(dir / "generation_config.json",
                   R"({"eos_token_id": [2, 7, 9], "temperature": 0.6})");
  EXPECT_EQ(load_hf_dir(dir.path()).config.eos_ids, (std::vector<int>{2, 7, 9}));
  test::write_file(dir / "generation_config.json", R"({"eos_token_id": 5})");
  EXPECT_EQ(load_hf_dir(dir.path()).config.eos_ids, (std::vector<int>{2, 5}));
  test::write_file(dir / "generation_config.json", R"({"do_sample": true})");
  EXPECT_EQ(load_hf_dir(dir.path()).config.eos_ids, (std::vector<int>{2}));
  test::write_file(dir / "generation_config.json", R"({"eos_token_id": 99})");
  EXPECT_THROW(load_hf_dir(dir.path()), CheckpointError) << "outside the vocabulary";
  test::write_file(dir / "generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_THROW(load_hf_dir(dir.path()), CheckpointError);
}

TEST(HfLoader, TiedClassifierIsTheEmbedding) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["tie_word_embeddings"] = true;
  NamedTensors ts = tiny_tensors(cfg);
  drop(ts, "lm_head.weight");
  write_model(dir.path(), cfg, ts);
  const Checkpoint ck = load_hf_dir(dir.path());
  EXPECT_EQ(ck.classifier.raw(), ck.tok_embedding.raw());
  EXPECT_EQ(ck.classifier.shape(), (std::vector<int64_t>{16, 8}));
}

// What changes nothing loads: RoPE's saved frequencies, a tied model's copy
// of its classifier.
TEST(HfLoader, TensorsThatChangeNothingAreIgnored) {
  TempDir dir;
  json cfg = tiny_config();
  cfg["tie_word_embeddings"] = true;
  cfg["model_type"] = "llama";
  NamedTensors ts = tiny_tensors(cfg);  // lm_head.weight kept
  ts.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", filled({2}, DType::F32, 99));
  write_model(dir.path(), cfg, ts);
  const Checkpoint ck = load_hf_dir(dir.path());
  EXPECT_EQ(ck.classifier.raw(), ck.tok_embedding.raw());
}

// Mistral's sliding window: the context is cut to it (full attention is the
// same only within it); null, off, or no smaller than the context: unchanged.
TEST(HfLoader, ASlidingWindowBoundsTheContext) {
  TempDir dir;
  const auto context = [&](const json& window, std::optional<bool> use = std::nullopt) {
    json cfg = tiny_config();
    cfg["model_type"] = "mistral";
    cfg["sliding_window"] = window;
    if (use) cfg["use_sliding_window"] = *use;
    write_model(dir.path(), cfg, tiny_tensors(cfg));
    return load_hf_dir(dir.path()).config.max_seq_len;
  };
  EXPECT_EQ(context(16), 16);
  EXPECT_EQ(context(nullptr), 32);
  EXPECT_EQ(context(4096), 32);
  EXPECT_EQ(context(16, false), 32);
}

// rope_scaling: linear and llama3 (under either key), "default" as null.
TEST(HfLoader, ReadsRopeScaling) {
  TempDir dir;
  const auto scaling = [&](const json& rs) {
    json cfg = tiny_config();
    cfg["rope_scaling"] = rs;
    write_model(dir.path(), cfg, tiny_tensors(cfg));
    return load_hf_dir(dir.path()).config.rope_scaling;
  };
  const RopeScaling linear = scaling({{"type", "linear"}, {"factor", 4.0}});
  EXPECT_EQ(linear.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(linear.factor, 4.0f);
  const RopeScaling llama3 = scaling({{"rope_type", "llama3"},
                                      {"factor", 32.0},
                                      {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0},
                                      {"original_max_position_embeddings", 8192}});
  EXPECT_EQ(llama3.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(llama3.factor, 32.0f);
  EXPECT_EQ(llama3.high_freq_factor, 4.0f);
  EXPECT_EQ(llama3.original_max_position, 8192);
  EXPECT_EQ(scaling({{"rope_type", "default"}}).kind, RopeScaling::Kind::None);
}

// transformers 5 writes rope_theta and rope_scaling as rope_parameters:
// a Llama 3.1 saved so rotates by its own theta and scaling, not the
// defaults.
TEST(HfLoader, ReadsTransformers5RopeParameters) {
  TempDir dir;
  json cfg = tiny_config();
  cfg.erase("rope_theta");
  cfg.erase("rope_scaling");
  cfg["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                            {"factor", 8.0},           {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  write_model(dir.path(), cfg, tiny_tensors(cfg));
  ModelConfig c = load_hf_dir(dir.path()).config;
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  cfg["rope_parameters"] = {{"rope_theta", 250000.0}};  // the type left out: default
  write_model(dir.path(), cfg, tiny_tensors(cfg));
  c = load_hf_dir(dir.path()).config;
  EXPECT_EQ(c.rope_theta, 250000.0f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::None);
  cfg["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_model(dir.path(), cfg, tiny_tensors(cfg));
  EXPECT_TRUE(
      mentions(error_of([&] { load_hf_dir(dir.path()); }), {"rope_parameters", "not supported"}));
}

TEST(HfLoader, HalfPrecisionWeightsKeepTheirDtype) {
  for (DType dtype : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    TempDir dir;
    const json cfg = tiny_config();
    write_model(dir.path(), cfg, tiny_tensors(cfg, dtype));
    const Checkpoint ck = load_hf_dir(dir.path());
    EXPECT_EQ(ck.layers[1].w_up.dtype(), dtype);
    // Tensor 0 holds 0, 1, 2, ...: exact in both half formats up to 256.
    const std::vector<float> emb = ck.tok_embedding.to_f32();
    for (size_t i = 0; i < 128; ++i) ASSERT_EQ(emb[i], float(i));
  }
}

TEST(HfLoader, LoadsShardedCheckpoint) {
  TempDir dir;
  const fs::path src = test::model_path("fortune");
  const Checkpoint single = load_hf_dir(src);
  const NamedTensors all = hf_named(single);
  // Shard 1: the embedding and the first layers; shard 2: the rest.
  const NamedTensors first(all.begin(), all.begin() + 1 + 2 * 9);
  const NamedTensors second(all.begin() + 1 + 2 * 9, all.end());
  write_safetensors(dir / "model-00001-of-00002.safetensors", first, {{"format", "pt"}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", second, {{"format", "pt"}});
  json index = {{"metadata", {{"total_size", 9408768}}}, {"weight_map", json::object()}};
  for (const auto& [n, t] : first) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, t] : second) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  test::write_file(dir / "model.safetensors.index.json", index.dump(2));
  test::write_file(dir / "config.json", test::read_file(src / "config.json"));

  const Checkpoint sharded = load_checkpoint(dir.path());
  EXPECT_EQ(sharded.config.dim, 192);
  EXPECT_EQ(sharded.classifier.raw(), sharded.tok_embedding.raw());
  const NamedTensors got = hf_named(sharded);
  ASSERT_EQ(got.size(), all.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, all[i].first);
    EXPECT_TRUE(same_bytes(got[i].second, all[i].second)) << got[i].first;
  }
}

// ---- bad configs

class HfLoaderBadInput : public ::testing::Test {
 protected:
  // Writes `cfg` with tensors that fit tiny_config() and returns the load error.
  std::string config_error(const json& cfg) {
    write_model(dir_.path(), cfg, tiny_tensors(tiny_config()));
    return error_of([&] { load_hf_dir(dir_.path()); });
  }
  std::string with(const char* key, const json& value) {
    json cfg = tiny_config();
    cfg[key] = value;
    return config_error(cfg);
  }
  std::string config_file() const { return (dir_ / "config.json").string(); }
  std::string weights_file() const { return (dir_ / "model.safetensors").string(); }

  TempDir dir_;
};

TEST_F(HfLoaderBadInput, MissingPathAndDirectoryWithoutConfig) {
  const fs::path missing = dir_ / "nope";
  EXPECT_TRUE(
      mentions(error_of([&] { load_checkpoint(missing); }), {missing.string(), "does not exist"}));
  EXPECT_TRUE(mentions(error_of([&] { load_checkpoint(dir_.path()); }),
                       {dir_.path().string(), "no config.json"}));
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(missing); }), {missing.string()}));
}

TEST_F(HfLoaderBadInput, NoWeightsFile) {
  test::write_file(dir_ / "config.json", tiny_config().dump());
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {dir_.path().string(), "model.safetensors"}));
}

TEST_F(HfLoaderBadInput, MalformedConfigJson) {
  test::write_file(dir_ / "config.json", "{\"hidden_size\": 8,");
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }), {config_file(), "malformed"}));
  test::write_file(dir_ / "config.json", "[8]");
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }), {config_file(), "object"}));
  test::write_file(dir_ / "config.json", "");
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }), {config_file(), "empty"}));
}

TEST_F(HfLoaderBadInput, WrongTypesNameTheKey) {
  EXPECT_TRUE(
      mentions(with("hidden_size", "big"), {config_file(), "hidden_size", "integer", "big"}));
  EXPECT_TRUE(mentions(with("num_attention_heads", 2.5), {config_file(), "num_attention_heads"}));
  EXPECT_TRUE(mentions(with("tie_word_embeddings", "yes"), {config_file(), "tie_word_embeddings"}));
  EXPECT_TRUE(mentions(with("rms_norm_eps", "small"), {config_file(), "rms_norm_eps", "number"}));
  EXPECT_TRUE(
      mentions(with("eos_token_id", json::array({2, "x"})), {config_file(), "eos_token_id"}));
  EXPECT_TRUE(
      mentions(with("vocab_size", 1000000000000), {config_file(), "vocab_size", "out of range"}));
  EXPECT_TRUE(
      mentions(with("num_hidden_layers", json::object()), {config_file(), "num_hidden_layers"}));
}

TEST_F(HfLoaderBadInput, MissingRequiredKey) {
  json cfg = tiny_config();
  cfg.erase("intermediate_size");
  EXPECT_TRUE(mentions(config_error(cfg), {config_file(), "missing", "intermediate_size"}));
}

TEST_F(HfLoaderBadInput, UnsupportedFeatures) {
  for (const char* kind : {"dynamic", "yarn", "longrope"})
    EXPECT_TRUE(mentions(with("rope_scaling", {{"rope_type", kind}, {"factor", 2.0}}),
                         {config_file(), "rope_scaling", kind, "not supported"}))
        << kind;
  EXPECT_TRUE(mentions(with("rope_scaling", {{"rope_type", "linear"}}), {"factor"}));
  EXPECT_TRUE(mentions(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}),
                       {"original_max_position_embeddings"}));
  EXPECT_TRUE(
      mentions(with("hidden_act", "gelu"), {config_file(), "hidden_act", "gelu", "not supported"}));
  EXPECT_TRUE(
      mentions(with("attention_bias", true), {config_file(), "attention_bias", "not supported"}));
}

// Other architectures name their tensors as Llama does: refused by their
// model_type, or by a tensor Llama has not (it would be silently ignored).
TEST_F(HfLoaderBadInput, OtherArchitecturesAreRefused) {
  for (const char* type : {"gemma", "qwen3_moe", "phi"})
    EXPECT_TRUE(mentions(with("model_type", type),
                         {config_file(), "model_type", type, "not supported", "llama, mistral"}))
        << type;
  NamedTensors ts = tiny_tensors(tiny_config());
  ts.emplace_back("model.layers.1.self_attn.q_proj.bias", filled({8}, DType::F32, 77));
  write_model(dir_.path(), tiny_config(), ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "model.layers.1.self_attn.q_proj.bias", "wrong"}));
  ts = tiny_tensors(tiny_config());
  ts.emplace_back("model.layers.0.self_attn.q_norm.weight", filled({4}, DType::F32, 78));
  write_model(dir_.path(), tiny_config(), ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {"model.layers.0.self_attn.q_norm.weight"}));
  EXPECT_TRUE(mentions(with("sliding_window", 0), {config_file(), "sliding_window"}));
}

// The rows of `parts` stacked, as Phi-3 stores its fused projections.
Tensor stacked(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.dim(0);
  Tensor out = Tensor::zeros({rows, parts[0].dim(1)}, parts[0].dtype());
  size_t at = 0;
  for (const Tensor& t : parts) {
    std::memcpy(static_cast<char*>(out.raw_mut()) + at, t.raw(), t.nbytes());
    at += t.nbytes();
  }
  return out;
}

// A Llama checkpoint's tensors as Phi-3 names them: q, k and v in one
// qkv_proj, gate and up in one gate_up_proj.
NamedTensors as_phi3(const NamedTensors& llama, int layers) {
  NamedTensors out;
  for (const auto& [name, t] : llama)
    if (name.find("q_proj") == std::string::npos && name.find("k_proj") == std::string::npos &&
        name.find("v_proj") == std::string::npos && name.find("gate_proj") == std::string::npos &&
        name.find("up_proj") == std::string::npos)
      out.emplace_back(name, t);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.emplace_back(p + "self_attn.qkv_proj.weight",
                     stacked({by_name(llama, p + "self_attn.q_proj.weight"),
                              by_name(llama, p + "self_attn.k_proj.weight"),
                              by_name(llama, p + "self_attn.v_proj.weight")}));
    out.emplace_back(p + "mlp.gate_up_proj.weight",
                     stacked({by_name(llama, p + "mlp.gate_proj.weight"),
                              by_name(llama, p + "mlp.up_proj.weight")}));
  }
  return out;
}

// Phi-3 is Llama with fused projections: split, they are Llama's tensors
// byte for byte, so the model computes what the Llama would.
TEST(HfLoader, Phi3FusedProjectionsAreLlamasOwn) {
  TempDir llama_dir, phi_dir;
  const json cfg = tiny_config();
  const NamedTensors llama = tiny_tensors(cfg, DType::BF16);
  write_model(llama_dir.path(), cfg, llama);
  json phi_cfg = cfg;
  phi_cfg["model_type"] = "phi3";
  phi_cfg["architectures"] = {"Phi3ForCausalLM"};
  phi_cfg["partial_rotary_factor"] = 1.0;
  write_model(phi_dir.path(), phi_cfg, as_phi3(llama, cfg["num_hidden_layers"]));
  const Checkpoint a = load_hf_dir(llama_dir.path()), b = load_hf_dir(phi_dir.path());
  EXPECT_EQ(a.config.q_dim(), b.config.q_dim());
  EXPECT_EQ(b.config.rope, RopeLayout::RotateHalf);
  const NamedTensors want = hf_named(a), got = hf_named(b);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(same_bytes(want[i].second, got[i].second)) << want[i].first;
}

TEST_F(HfLoaderBadInput, Phi3FusedProjectionsHaveTheirShapes) {
  json cfg = tiny_config();
  cfg["model_type"] = "phi3";
  NamedTensors ts = as_phi3(tiny_tensors(cfg), cfg["num_hidden_layers"]);
  drop(ts, "model.layers.1.mlp.gate_up_proj.weight");
  ts.emplace_back("model.layers.1.mlp.gate_up_proj.weight", filled({12, 8}, DType::F32, 90));
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {"model.layers.1.mlp.gate_up_proj.weight", "shape", "[24, 8]"}));
  EXPECT_TRUE(mentions(with("partial_rotary_factor", 0.75),
                       {config_file(), "partial_rotary_factor", "not supported"}));
}

// Qwen2 is Llama with q, k and v biases: each layer must have all three, of
// its heads' sizes.
TEST_F(HfLoaderBadInput, Qwen2NeedsItsProjectionBiases) {
  json cfg = tiny_config();
  cfg["model_type"] = "qwen2";
  write_model(dir_.path(), cfg, tiny_tensors(tiny_config()));
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "model.layers.0.self_attn.q_proj.bias", "missing"}));
  const int64_t q = cfg["hidden_size"].get<int64_t>();
  const int64_t kv = q / cfg["num_attention_heads"].get<int64_t>() *
                     cfg.value("num_key_value_heads", cfg["num_attention_heads"].get<int64_t>());
  NamedTensors ts = tiny_tensors(tiny_config());
  for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    ts.emplace_back(p + "q_proj.bias", filled({q}, DType::F32, 80));
    ts.emplace_back(p + "k_proj.bias", filled({kv}, DType::F32, 81));
    ts.emplace_back(p + "v_proj.bias", filled({l == 1 ? kv + 1 : kv}, DType::F32, 82));
  }
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {"model.layers.1.self_attn.v_proj.bias", "shape"}));
}

// Qwen3 normalises each query and key head: both norms, of head_dim.
TEST_F(HfLoaderBadInput, Qwen3NeedsItsHeadNorms) {
  json cfg = tiny_config();
  cfg["model_type"] = "qwen3";
  write_model(dir_.path(), cfg, tiny_tensors(tiny_config()));
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "model.layers.0.self_attn.q_norm.weight", "missing"}));
  const int64_t hd = cfg["hidden_size"].get<int64_t>() / cfg["num_attention_heads"].get<int64_t>();
  NamedTensors ts = tiny_tensors(tiny_config());
  for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    ts.emplace_back(p + "q_norm.weight", filled({hd}, DType::F32, 83));
    ts.emplace_back(p + "k_norm.weight", filled({l == 1 ? hd * 2 : hd}, DType::F32, 84));
  }
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {"model.layers.1.self_attn.k_norm.weight", "shape"}));
}

TEST_F(HfLoaderBadInput, InconsistentDimensions) {
  EXPECT_TRUE(mentions(with("hidden_size", 9), {config_file(), "9", "not divisible", "heads 2"}));
  EXPECT_TRUE(
      mentions(with("num_key_value_heads", 3), {config_file(), "kv heads 3", "does not divide"}));
  EXPECT_TRUE(mentions(with("num_hidden_layers", 0), {config_file(), "n_layers", "positive"}));
  EXPECT_TRUE(
      mentions(with("num_attention_heads", 0), {config_file(), "num_attention_heads", "positive"}));
  EXPECT_TRUE(mentions(with("bos_token_id", 99), {config_file(), "bos_token_id 99"}));
}

// ---- bad tensors

TEST_F(HfLoaderBadInput, MissingTensor) {
  const json cfg = tiny_config();
  NamedTensors ts = tiny_tensors(cfg);
  drop(ts, "model.layers.1.mlp.up_proj.weight");
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "model.layers.1.mlp.up_proj.weight", "missing"}));
}

TEST_F(HfLoaderBadInput, UntiedWithoutLmHead) {
  const json cfg = tiny_config();
  NamedTensors ts = tiny_tensors(cfg);
  drop(ts, "lm_head.weight");
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "lm_head.weight", "missing"}));
}

TEST_F(HfLoaderBadInput, TensorOfWrongShape) {
  const json cfg = tiny_config();
  NamedTensors ts = tiny_tensors(cfg);
  for (auto& [n, t] : ts)
    if (n == "model.layers.0.self_attn.k_proj.weight") t = filled({8, 8}, DType::F32, 7);
  write_model(dir_.path(), cfg, ts);
  EXPECT_TRUE(mentions(error_of([&] { load_hf_dir(dir_.path()); }),
                       {weights_file(), "model.layers.0.self_attn.k_proj.weight", "shape [8, 8]",
                        "expected [4, 8]"}));
}

TEST_F(HfLoaderBadInput, CorruptWeightsFile) {
  const json cfg = tiny_config();
  write_model(dir_.path(), cfg, tiny_tensors(cfg));
  const std::string bytes = test::read_file(dir_ / "model.safetensors");
  test::write_file(dir_ / "model.safetensors", bytes.substr(0, bytes.size() - 10));
  EXPECT_TRUE(
      mentions(error_of([&] { load_hf_dir(dir_.path()); }), {weights_file(), "past the end"}));
}

// Writes the tiny model as two shards plus an index whose weight_map is
// then edited by `tweak`, and returns the load error.
std::string sharded_error(const TempDir& dir, const std::function<void(json&)>& tweak) {
  const json cfg = tiny_config();
  const NamedTensors ts = tiny_tensors(cfg);
  const size_t half = ts.size() / 2;
  write_safetensors(dir / "a.safetensors", NamedTensors(ts.begin(), ts.begin() + half));
  write_safetensors(dir / "b.safetensors", NamedTensors(ts.begin() + half, ts.end()));
  json index = {{"weight_map", json::object()}};
  for (size_t i = 0; i < ts.size(); ++i)
    index["weight_map"][ts[i].first] = i < half ? "a.safetensors" : "b.safetensors";
  tweak(index);
  test::write_file(dir / "config.json", cfg.dump());
  test::write_file(dir / "model.safetensors.index.json", index.dump());
  return error_of([&] { load_checkpoint(dir.path()); });
}

TEST_F(HfLoaderBadInput, ShardedIndexProblems) {
  const std::string index = (dir_ / "model.safetensors.index.json").string();
  EXPECT_TRUE(mentions(
      sharded_error(dir_, [](json& j) { j["weight_map"]["model.norm.weight"] = "c.safetensors"; }),
      {index, (dir_ / "c.safetensors").string(), "does not exist"}));
  EXPECT_TRUE(mentions(
      sharded_error(dir_,
                    [](json& j) { j["weight_map"].erase("model.layers.1.mlp.down_proj.weight"); }),
      {index, "model.layers.1.mlp.down_proj.weight", "weight_map"}));
  EXPECT_TRUE(mentions(
      sharded_error(dir_, [](json& j) { j["weight_map"]["model.norm.weight"] = "a.safetensors"; }),
      {(dir_ / "a.safetensors").string(), "model.norm.weight", "missing", index}));
  EXPECT_TRUE(mentions(
      sharded_error(dir_,
                    [](json& j) { j["weight_map"]["model.norm.weight"] = "../b.safetensors"; }),
      {index, "../b.safetensors", "inside the checkpoint directory"}));
  EXPECT_TRUE(mentions(sharded_error(dir_, [](json& j) { j["weight_map"] = json::array(); }),
                       {index, "weight_map"}));
}

}  // namespace
}  // namespace troupe
