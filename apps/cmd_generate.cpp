// `troupe generate`: one prompt, one sequence, on this machine's CPU.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>

#include "apps/commands.h"
#include "deploy/engine_builder.h"
#include "gpu/generate.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"

namespace troupe::app {

namespace {

struct GenerateOptions {
  ConfigFlags config;
  EngineFlags engine;
  std::string tokenizer;
  std::string prompt;
  std::string prompt_ids;
  int max_tokens = 64;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  float presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  float min_p = 0;
  int min_tokens = 0;
  bool print_ids = false;
  bool echo = false;
  bool ignore_eos = false;
};

std::vector<int> parse_ids(const std::string& text, const char* option) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos)
      throw UsageError(std::string(option) + ": empty id in '" + text + "'");
    const std::string tok = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || v < INT32_MIN || v > INT32_MAX)
      throw UsageError(std::string(option) + ": '" + tok + "' is not an integer token id");
    ids.push_back(int(v));
  }
  if (ids.empty()) throw UsageError(std::string(option) + ": no token ids given");
  return ids;
}

void run_generate(const GenerateOptions& o) {
  if (o.max_tokens < 1)
    throw UsageError("--max-tokens must be at least 1, got " + std::to_string(o.max_tokens));
  if (!o.prompt.empty() && !o.prompt_ids.empty())
    throw UsageError("give either --prompt or --prompt-ids, not both");
  if (o.prompt.empty() && o.prompt_ids.empty())
    throw UsageError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");
  auto flags = engine_overrides(o.engine);
  if (!o.tokenizer.empty()) flags.emplace_back("model.tokenizer", o.tokenizer);
  const Config config = command_config(o.config, flags, o.engine.threads);
  const DType dtype = config.model.dtype;
  const std::filesystem::path model_path = config.model.path;
  auto ckpt = configured_checkpoint(load_checkpoint(model_path), config.model);
  const ModelConfig& cfg = ckpt->config;
  // One sequence runs on one replica: replica 0's devices, with a KV cache
  // for one full-context sequence.
  if (config.parallel.replicas > 1)
    spdlog::info("generate runs one sequence on one replica; parallel.replicas = {} is not used",
                 config.parallel.replicas);
  auto builder = std::make_shared<EngineBuilder>(ckpt, dtype);
  EngineSpec spec = engine_spec(config, cfg, 0);
  spec.blocks = (cfg.max_seq_len + spec.block_tokens - 1) / spec.block_tokens;
  std::unique_ptr<StepEngine> engine;
  try {
    engine = builder->build(builder->resolve(spec));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("layout: ") + e.what());
  }
  spdlog::info("loaded {}: dim {}, {} layers, {} heads ({} kv), vocab {}, context {}, {} weights",
               model_path.string(), cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
               cfg.vocab_size, cfg.max_seq_len, dtype_name(dtype));

  std::optional<Tokenizer> tokenizer;
  const auto tok_path = tokenizer_path(config, ckpt->tokenizer_path);
  auto open_tokenizer = [&] {
    if (tok_path.empty())
      throw UsageError(
          "model " + model_path.string() +
          " has no tokenizer.model or tokenizer.json beside it: pass --tokenizer PATH, or use "
          "--prompt-ids and --ids");
    tokenizer = load_tokenizer(tok_path, cfg.vocab_size);
  };
  if (!o.prompt.empty()) open_tokenizer();

  GenerateRequest req;
  req.prompt = o.prompt.empty() ? parse_ids(o.prompt_ids, "--prompt-ids")
                                : tokenizer->encode(o.prompt, tokenizer->bos_id() >= 0);
  if (spdlog::should_log(spdlog::level::debug)) {
    std::string ids;
    for (int id : req.prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    spdlog::debug("prompt ids: {}", ids);
  }
  req.max_tokens = o.max_tokens;
  req.ignore_eos = o.ignore_eos;
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  req.sampling.seed = o.seed ? *o.seed : std::random_device{}();
  req.sampling.presence_penalty = o.presence_penalty;
  req.sampling.frequency_penalty = o.frequency_penalty;
  req.sampling.repetition_penalty = o.repetition_penalty;
  req.sampling.min_p = o.min_p;
  req.sampling.min_tokens = o.min_tokens;
  try {
    validate_request(cfg, req);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(o.prompt.empty() ? "--prompt-ids: " : "--prompt: ") + e.what());
  }
  // Bad sampling parameters are refused before any work.
  {
    Sampler check(req.sampling);
    LogitPenalties penalties(req.sampling);
  }
  if (!o.print_ids && !tokenizer) open_tokenizer();

  std::optional<TextStreamer> streamer;
  if (!o.print_ids) {
    streamer.emplace(*tokenizer);
    streamer->continue_after(req.prompt);
    if (o.echo) std::cout << o.prompt << std::flush;
  }
  auto on_token = [&](int id) {
    if (streamer) std::cout << streamer->put(id) << std::flush;
    return true;
  };
  const GenerateResult r = generate(*engine, cfg, req, on_token);
  if (o.print_ids) {
    for (size_t i = 0; i < r.ids.size(); ++i) std::cout << (i ? "," : "") << r.ids[i];
    std::cout << "\n";
  } else {
    std::cout << streamer->finish() << "\n";
  }
  const double decode_tps =
      r.ids.size() > 1 && r.decode_s > 0 ? double(r.ids.size()) / r.decode_s : 0;
  const double prefill_tps = r.prefill_s > 0 ? double(req.prompt.size()) / r.prefill_s : 0;
  std::fprintf(stderr,
               "prompt tokens: %zu, generated tokens: %zu (%s), prefill %.1f tokens/s, decode %.1f "
               "tokens/s, %d threads, %s weights%s, seed %llu\n",
               req.prompt.size(), r.ids.size(),
               r.finish_reason == FinishReason::Stop ? "stop" : "length", prefill_tps, decode_tps,
               spec.threads_of(0), dtype_name(dtype),
               ckpt->quant_products == QuantProducts::Int8 ? " (int8 products)" : "",
               static_cast<unsigned long long>(req.sampling.seed));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd =
      app.add_subcommand("generate", "Generate text (or token ids) from one prompt on the CPU");
  cmd->add_option("--model,-m", opts->engine.model,
                  "Checkpoint: a llama2.c .bin file, a GGUF file or a Hugging Face directory "
                  "(default: the config's "
                  "model.path, models/fortune)");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "SentencePiece tokenizer.model, Hugging Face tokenizer.json or llama2.c "
                  "tokenizer.bin, or a GGUF file's vocabulary (default: the model's own)");
  cmd->add_option("--prompt,-p", opts->prompt,
                  "Prompt text (the tokenizer's BOS, if it has one, is prepended)");
  cmd->add_option(
      "--prompt-ids", opts->prompt_ids,
      "Prompt as comma-separated token ids, e.g. 1,300,40 (for models without a tokenizer)");
  cmd->add_option("--max-tokens,-n", opts->max_tokens, "Maximum tokens to generate (>= 1)")
      ->capture_default_str();
  cmd->add_option("--temperature,-t", opts->temperature, "Sampling temperature; 0 means greedy")
      ->capture_default_str();
  cmd->add_option("--top-p", opts->top_p, "Nucleus sampling: keep the smallest set with this mass")
      ->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "Keep only the k most likely tokens (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed,
                  "Random seed; the same seed gives the same text (default: random, printed)");
  cmd->add_option("--presence-penalty", opts->presence_penalty,
                  "Subtracted from the logit of every token already generated, in [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", opts->frequency_penalty,
                  "Subtracted once per time a token was generated, in [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", opts->repetition_penalty,
                  "Divides the positive logits (multiplies the negative) of every token in the "
                  "prompt or generated, in (0, 2]; 1: off")
      ->capture_default_str();
  cmd->add_option("--min-p", opts->min_p,
                  "Tokens less likely than this times the likeliest are not drawn, in [0, 1]; "
                  "0: off")
      ->capture_default_str();
  cmd->add_option("--min-tokens", opts->min_tokens,
                  "Tokens generated before an end-of-sequence token may end the text")
      ->capture_default_str();
  cmd->add_flag("--ids", opts->print_ids,
                "Print the generated ids as one comma-separated line instead of text");
  cmd->add_flag("--echo", opts->echo, "Print the prompt text before the generated text");
  cmd->add_flag("--ignore-eos", opts->ignore_eos,
                "Keep generating past EOS until --max-tokens (as the API's ignore_eos)");
  cmd->add_option("--dtype", opts->engine.dtype,
                  "Weights in memory: f32 | f16 | bf16 (default: the config's model.dtype)");
  cmd->add_option("--quantized-products", opts->engine.quantized_products,
                  "A GGUF's quantized weights: exact | int8 (x in 8 bits, as llama.cpp; default: "
                  "the config's model.quantized_products)");
  cmd->add_option("--kv-dtype", opts->engine.kv_dtype,
                  "KV cache elements: f32 | f16 | bf16 (default: the config's kv_cache.dtype)");
  cmd->add_option("--threads", opts->engine.threads,
                  "CPU threads per device (default: the config's devices[].threads)");
  cmd->add_option("--pipeline", opts->engine.pipeline,
                  "Layout: pipeline stages (default: the config's parallel.pipeline)");
  cmd->add_option(
      "--tensor", opts->engine.tensor,
      "Layout: tensor-parallel shards per stage (default: the config's parallel.tensor)");
  add_config_flags(cmd, opts->config);
  cmd->callback([opts] { run_generate(*opts); });
}

}  // namespace troupe::app
