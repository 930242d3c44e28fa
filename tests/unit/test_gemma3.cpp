// Gemma 3's text model, from a GGUF file (as llama.cpp converts it) and from
// a Hugging Face directory (as transformers writes it): the same model, and
// llama.cpp's greedy ids for the fixture (tests/data/gguf/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpu/checkpoint.h"
#include "gpu/generate.h"
#include "gpu/loaders/safetensors.h"
#include "gpu/model.h"
#include "support/error_messages.h"
#include "support/test_support.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

const fs::path kFixture = "gguf/gemma3-q8_0.gguf";

json fixture_case() {
  std::ifstream in(test::data_path("gguf/models.expected.json"));
  const json expected = json::parse(in);
  for (const json& c : expected["cases"])
    if (c["file"] == kFixture.filename().string()) return c;
  ADD_FAILURE() << "no case for " << kFixture;
  return {};
}

std::vector<int> greedy(const fs::path& model, const std::vector<int>& prompt) {
  GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = 32;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  return generate(*Model::load(model, DType::F32), 2, req).ids;
}

// A tensor in f32, plus `add` to every element.
Tensor f32(const Tensor& t, float add = 0) {
  std::vector<float> v = t.to_f32();
  for (float& x : v) x += add;
  Tensor out = Tensor::zeros(t.shape(), DType::F32);
  std::copy(v.begin(), v.end(), static_cast<float*>(out.raw_mut()));
  return out;
}

// The fixture written as transformers writes Gemma 3: its norms less the 1
// llama.cpp's converter added, the FFN's input norm as
// pre_feedforward_layernorm, the attention output's as
// post_attention_layernorm.
json write_as_hf(const Checkpoint& g, const fs::path& dir) {
  const ModelConfig& c = g.config;
  NamedTensors ts{{"model.embed_tokens.weight", f32(g.tok_embedding)},
                  {"model.norm.weight", f32(g.final_norm, -1)}};
  for (size_t l = 0; l < g.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerTensors& t = g.layers[l];
    ts.insert(ts.end(), {{p + "input_layernorm.weight", f32(t.attn_norm, -1)},
                         {p + "self_attn.q_proj.weight", f32(t.wq)},
                         {p + "self_attn.k_proj.weight", f32(t.wk)},
                         {p + "self_attn.v_proj.weight", f32(t.wv)},
                         {p + "self_attn.o_proj.weight", f32(t.wo)},
                         {p + "self_attn.q_norm.weight", f32(t.q_norm, -1)},
                         {p + "self_attn.k_norm.weight", f32(t.k_norm, -1)},
                         {p + "post_attention_layernorm.weight", f32(t.post_attn_norm, -1)},
                         {p + "pre_feedforward_layernorm.weight", f32(t.ffn_norm, -1)},
                         {p + "post_feedforward_layernorm.weight", f32(t.post_ffn_norm, -1)},
                         {p + "mlp.gate_proj.weight", f32(t.w_gate)},
                         {p + "mlp.up_proj.weight", f32(t.w_up)},
                         {p + "mlp.down_proj.weight", f32(t.w_down)}});
  }
  const json cfg = {{"architectures", {"Gemma3ForCausalLM"}},
                    {"model_type", "gemma3_text"},
                    {"hidden_size", c.dim},
                    {"intermediate_size", c.hidden_dim},
                    {"num_hidden_layers", c.n_layers},
                    {"num_attention_heads", c.n_heads},
                    {"num_key_value_heads", c.n_kv_heads},
                    {"head_dim", c.head_dim},
                    {"vocab_size", c.vocab_size},
                    {"max_position_embeddings", c.max_seq_len},
                    {"rms_norm_eps", c.norm_eps},
                    {"rope_theta", c.rope_theta},
                    {"rope_local_base_freq", c.rope_theta_sliding},
                    {"rope_scaling", nullptr},
                    {"sliding_window", c.sliding_window},
                    {"sliding_window_pattern", 6},
                    {"query_pre_attn_scalar", c.head_dim},
                    {"hidden_activation", "gelu_pytorch_tanh"},
                    {"final_logit_softcapping", nullptr},
                    {"attn_logit_softcapping", nullptr},
                    {"bos_token_id", 1},
                    {"eos_token_id", 2}};
  test::write_file(dir / "config.json", cfg.dump(2));
  write_safetensors(dir / "model.safetensors", ts, {{"format", "pt"}});
  return cfg;
}

TEST(Gemma3, TheGgufReadsAsLlamaCppDoes) {
  const ModelConfig c = load_checkpoint(test::data_path(kFixture)).config;
  EXPECT_EQ(c.activation, FfnActivation::GeluTanh);
  EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(128.0f));
  EXPECT_EQ(c.norm_offset, 0);  // the converter added the 1
  EXPECT_TRUE(c.post_norms && c.qk_norm);
  EXPECT_EQ(c.rope, RopeLayout::RotateHalf);
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.max_seq_len, 256);  // not cut to the window: full layers see it all
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rope_theta_sliding, 1e4f);
  EXPECT_TRUE(c.tied_classifier);
}

// The prompt (38 tokens) and the 32 steps pass the window of 16: the
// sliding layers' answers differ from full attention's (checked by hand:
// with sliding_window 1000 the ids differ from the first on); every layout
// gives them too (CliGenerate.Gemma3GivesLlamaCppsIdsInEveryLayout).
TEST(Gemma3, HuggingFaceAndGgufGiveLlamaCppsTokens) {
  const json want = fixture_case();
  const std::vector<int> prompt = want["prompt_ids"], ids = want["ids"];
  EXPECT_EQ(greedy(test::data_path(kFixture), prompt), ids);
  test::TempDir dir;
  const json cfg = write_as_hf(load_checkpoint(test::data_path(kFixture)), dir.path());
  const Checkpoint hf = load_checkpoint(dir.path());
  EXPECT_EQ(hf.config.norm_offset, 1);
  EXPECT_FLOAT_EQ(hf.config.attn_scale, 0.125f);
  EXPECT_EQ(hf.config.sliding_layers, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(greedy(dir.path(), prompt), ids);
  // layer_types, as newer transformers writes the pattern, says the same.
  json typed = cfg;
  typed.erase("sliding_window_pattern");
  typed["layer_types"] = json::array();
  for (int l = 0; l < 6; ++l)
    typed["layer_types"].push_back(l == 5 ? "full_attention" : "sliding_attention");
  test::write_file(dir / "config.json", typed.dump());
  EXPECT_EQ(load_checkpoint(dir.path()).config.sliding_layers, hf.config.sliding_layers);
  // transformers 5's rope_parameters, one per kind of layer, say the same
  // as rope_theta and rope_local_base_freq (left out: Gemma's defaults
  // would be 1e6 and 1e4 anyway, so other values show they are read).
  json v5 = cfg;
  v5.erase("rope_theta");
  v5.erase("rope_local_base_freq");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 5e5}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 2e4}}}};
  test::write_file(dir / "config.json", v5.dump());
  const ModelConfig c5 = load_checkpoint(dir.path()).config;
  EXPECT_FLOAT_EQ(c5.rope_theta, 5e5f);
  EXPECT_EQ(c5.rope_scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_FLOAT_EQ(c5.rope_theta_sliding, 2e4f);
}

TEST(Gemma3, WhatIsNotImplementedIsRefusedByName) {
  test::TempDir dir;
  const json cfg = write_as_hf(load_checkpoint(test::data_path(kFixture)), dir.path());
  const auto refused = [&](const char* key, const json& value,
                           std::initializer_list<std::string> words) {
    json c = cfg;
    c[key] = value;
    test::write_file(dir / "config.json", c.dump());
    const std::string e = test::message_of<CheckpointError>([&] { load_checkpoint(dir.path()); });
    EXPECT_TRUE(test::mentions(e, words)) << e;
  };
  refused("final_logit_softcapping", 30.0, {"final_logit_softcapping", "not supported"});
  refused("hidden_activation", "gelu", {"hidden_activation", "gelu_pytorch_tanh"});
  refused("rope_parameters", {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}},
          {"rope_parameters", "sliding-window"});
  refused("model_type", "gemma3", {"vision", "gemma3_text"});
  refused("model_type", "gemma2", {"model_type", "not supported"});
  refused("layer_types", json::array({"full_attention"}), {"layer_types", "one type per layer"});
  refused("use_bidirectional_attention", true, {"bidirectional"});
}

}  // namespace
}  // namespace troupe
