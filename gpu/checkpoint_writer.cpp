#include "gpu/checkpoint_writer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "gpu/loaders/safetensors.h"

namespace troupe {

namespace {

nlohmann::json hf_config(const ModelConfig& c, DType dtype) {
  nlohmann::json j;
  j["architectures"] = {c.qkv_bias  ? "Qwen2ForCausalLM"
                        : c.qk_norm ? "Qwen3ForCausalLM"
                                    : "LlamaForCausalLM"};
  j["model_type"] = c.qkv_bias ? "qwen2" : c.qk_norm ? "qwen3" : "llama";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  if (rs.kind == RopeScaling::Kind::None)
    j["rope_scaling"] = nullptr;
  else if (rs.kind == RopeScaling::Kind::Linear)
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rs.factor}};
  else
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rs.factor},
                         {"low_freq_factor", rs.low_freq_factor},
                         {"high_freq_factor", rs.high_freq_factor},
                         {"original_max_position_embeddings", rs.original_max_position}};
  j["tie_word_embeddings"] = c.tied_classifier;
  j["hidden_act"] = "silu";
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] =
      c.eos_ids.size() == 1 ? nlohmann::json(c.eos_ids[0]) : nlohmann::json(c.eos_ids);
  j["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "bfloat16";
  return j;
}

}  // namespace

void write_hf_checkpoint(const Checkpoint& ck, const std::filesystem::path& dir) {
  if (ck.config.qkv_bias && ck.config.qk_norm)
    throw CheckpointError(dir.string() +
                          ": no Hugging Face architecture has both q/k/v biases and q/k norms");
  if (ck.config.rope != RopeLayout::RotateHalf)
    throw CheckpointError(dir.string() +
                          ": only rotate-half (Hugging Face) RoPE checkpoints can be written");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw CheckpointError(dir.string() + ": cannot create directory: " + ec.message());
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.emplace_back("model.embed_tokens.weight", ck.tok_embedding);
  for (size_t l = 0; l < ck.layers.size(); ++l) {
    const auto& t = ck.layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.emplace_back(p + "input_layernorm.weight", t.attn_norm);
    tensors.emplace_back(p + "self_attn.q_proj.weight", t.wq);
    tensors.emplace_back(p + "self_attn.k_proj.weight", t.wk);
    tensors.emplace_back(p + "self_attn.v_proj.weight", t.wv);
    tensors.emplace_back(p + "self_attn.o_proj.weight", t.wo);
    if (ck.config.qkv_bias) {
      tensors.emplace_back(p + "self_attn.q_proj.bias", t.bq);
      tensors.emplace_back(p + "self_attn.k_proj.bias", t.bk);
      tensors.emplace_back(p + "self_attn.v_proj.bias", t.bv);
    }
    if (ck.config.qk_norm) {
      tensors.emplace_back(p + "self_attn.q_norm.weight", t.q_norm);
      tensors.emplace_back(p + "self_attn.k_norm.weight", t.k_norm);
    }
    tensors.emplace_back(p + "post_attention_layernorm.weight", t.ffn_norm);
    tensors.emplace_back(p + "mlp.gate_proj.weight", t.w_gate);
    tensors.emplace_back(p + "mlp.up_proj.weight", t.w_up);
    tensors.emplace_back(p + "mlp.down_proj.weight", t.w_down);
  }
  tensors.emplace_back("model.norm.weight", ck.final_norm);
  if (!ck.config.tied_classifier) tensors.emplace_back("lm_head.weight", ck.classifier);
  write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  const auto cfg_path = dir / "config.json";
  std::ofstream f(cfg_path);
  f << hf_config(ck.config, ck.tok_embedding.dtype()).dump(2) << "\n";
  if (!f) throw CheckpointError(cfg_path.string() + ": cannot write");
}

}  // namespace troupe
