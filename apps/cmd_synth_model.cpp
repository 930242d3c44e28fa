// `troupe synth-model`: writes a seeded random-weight checkpoint.
#include <spdlog/spdlog.h>

#include <iostream>

#include "apps/commands.h"
#include "gpu/checkpoint_writer.h"
#include "gpu/synth_model.h"

namespace troupe::app {

namespace {

struct SynthOptions {
  std::string preset = "tiny";
  std::string dtype = "bf16";
  uint64_t seed = 1;
  std::string out;
  int dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, context = 0;
  bool tied = false;
  bool qkv_bias = false;
  bool qk_norm = false;
};

void run_synth(const SynthOptions& o) {
  const auto dtype = parse_dtype(o.dtype);
  if (!dtype) throw UsageError("--dtype must be f32, f16 or bf16, got '" + o.dtype + "'");
  if (o.out.empty()) throw UsageError("--out DIR is required");
  ModelConfig c = synth_preset(o.preset);
  auto set = [](int& field, int v) {
    if (v != 0) field = v;
  };
  set(c.dim, o.dim);
  set(c.hidden_dim, o.hidden);
  set(c.n_layers, o.layers);
  set(c.n_heads, o.heads);
  set(c.n_kv_heads, o.kv_heads ? o.kv_heads : (o.heads ? o.heads : 0));
  set(c.vocab_size, o.vocab);
  set(c.max_seq_len, o.context);
  if (o.tied) c.tied_classifier = true;
  if (o.qkv_bias) c.qkv_bias = true;
  if (o.qk_norm) c.qk_norm = true;
  if (c.qkv_bias && c.qk_norm)
    throw UsageError("--qkv-bias and --qk-norm: pick one (Qwen2 or Qwen3)");
  if (o.heads && c.dim % c.n_heads != 0)
    throw UsageError("--dim " + std::to_string(c.dim) + " is not divisible by --heads " +
                     std::to_string(c.n_heads));
  c.head_dim = c.dim / c.n_heads;
  try {
    c.validate("synth-model");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const auto ck = synth_checkpoint(c, o.seed, *dtype);
  write_hf_checkpoint(ck, o.out);
  std::cerr << "wrote " << o.out << ": dim " << c.dim << ", hidden " << c.hidden_dim << ", "
            << c.n_layers << " layers, " << c.n_heads << " heads (" << c.n_kv_heads
            << " kv), vocab " << c.vocab_size << ", context " << c.max_seq_len << ", "
            << dtype_name(*dtype) << ", seed " << o.seed << "\n";
}

}  // namespace

void register_synth_model(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  auto* cmd = app.add_subcommand("synth-model",
                                 "Write a seeded random-weight checkpoint (Hugging Face layout)");
  cmd->add_option("--preset", o->preset, "tiny | 110m | 1b")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "f32 | f16 | bf16")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed: the same seed writes the same weights")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Output directory")->required();
  cmd->add_option("--dim", o->dim, "Override: hidden size");
  cmd->add_option("--hidden", o->hidden, "Override: FFN intermediate size");
  cmd->add_option("--layers", o->layers, "Override: number of layers");
  cmd->add_option("--heads", o->heads, "Override: attention heads");
  cmd->add_option("--kv-heads", o->kv_heads, "Override: key/value heads (default: --heads)");
  cmd->add_option("--vocab", o->vocab, "Override: vocabulary size");
  cmd->add_option("--context", o->context, "Override: context length");
  cmd->add_flag("--tied", o->tied, "Tie the classifier to the embedding");
  cmd->add_flag("--qkv-bias", o->qkv_bias,
                "Biases on the q, k and v projections: a Qwen2 checkpoint (model_type qwen2)");
  cmd->add_flag("--qk-norm", o->qk_norm,
                "RMS norms on each query and key head: a Qwen3 checkpoint (model_type qwen3)");
  cmd->callback([o] { run_synth(*o); });
}

}  // namespace troupe::app
