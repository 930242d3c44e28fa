// `troupe bench`: engine mode measures the forward pass on this machine;
// serving mode (--url) loads a running server over HTTP.
#include <filesystem>
#include <iostream>
#include <sstream>

#include "apps/bench_engine.h"
#include "apps/bench_serving.h"
#include "apps/commands.h"
#include "gpu/cpu/gemm.h"
#include "gpu/synth_model.h"

namespace troupe::app {

namespace {

struct BenchOptions {
  ConfigFlags config;
  EngineFlags engine;
  std::string preset;
  std::string batches = "1,8,32";
  int prompt_len = 256;
  int context = 16;
  int decode_tokens = 32;
  int repeats = 3;
  int microbatches = 0, groups = 0;
  bool json = false;
  std::string isa;
  std::string profile;  // --profile OUT.json: the simulator's step-time grid
  std::string grid_batch = "0,1,2,4,8,16,32", grid_context, grid_prefill = "0,32,128,512";
  serving_bench::ServingBenchOptions serving;
  // Options that belong to one mode only, to refuse them in the other.
  std::vector<CLI::Option*> engine_only, serving_only;
  CLI::Option* url_opt = nullptr;
};

void run_serving(const BenchOptions& o) {
  for (const auto* opt : o.engine_only)
    if (opt->count() > 0)
      throw UsageError(opt->get_name() +
                       " is an engine-mode option; serving mode (--url) does not use it");
  auto so = o.serving;
  so.prompt_len = o.prompt_len;
  so.api_key = api_key_or_env(so.api_key);
  serving_bench::ServingBenchResult r;
  try {
    r = serving_bench::run_serving_bench(so);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (o.json)
    std::cout << r.to_json().dump() << "\n";
  else
    std::cout << r.table();
}

std::vector<int> parse_list(const std::string& text, const std::string& flag, int min) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < min)
      throw UsageError(flag + ": '" + item + "' is not " +
                       (min > 0 ? "a positive integer" : "an integer >= 0"));
    out.push_back(v);
  }
  if (out.empty()) throw UsageError(flag + ": no values given");
  return out;
}

// Measures the grid for this layout and adds it to the profile file (made
// when missing), so one file collects a model's layouts.
void write_profile(const BenchOptions& o, std::shared_ptr<const Checkpoint> ckpt, DType dtype,
                   const std::string& name, const EngineSpec& engine) {
  StepProfileOptions po;
  po.engine = engine;
  po.batch = parse_list(o.grid_batch, "--grid-batch", 0);
  if (!o.grid_context.empty()) po.context = parse_list(o.grid_context, "--grid-context", 1);
  po.prefill = parse_list(o.grid_prefill, "--grid-prefill", 0);
  po.repeats = std::max(1, o.repeats);
  sim::StepProfile profile;
  if (std::filesystem::exists(o.profile)) {
    profile = sim::StepProfile::load(o.profile);
    if (profile.model.name != name)
      throw UsageError(o.profile + " profiles " + profile.model.name + ", not " + name +
                       "; give another file");
    if (profile.kv_dtype != dtype_name(engine.kv_dtype))
      throw UsageError(o.profile + " was measured with a " + profile.kv_dtype + " KV cache, not " +
                       dtype_name(engine.kv_dtype) + "; give another file");
  } else {
    profile.model = profile_model(ckpt->config, name, engine.kv_dtype);
    profile.dtype = dtype_name(dtype);
    profile.kv_dtype = dtype_name(engine.kv_dtype);
    profile.isa = isa_name(active_isa());
    profile.cpu = cpu_model_name();
  }
  sim::ProfileGrid grid;
  try {
    grid = measure_step_profile(ckpt, dtype, po);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::string layout = grid.describe();
  profile.put(std::move(grid));
  profile.save(o.profile);
  std::cerr << "troupe bench: step profile of " << name << ", layout " << layout << ", written to "
            << o.profile << "\n";
}

void run_bench(const BenchOptions& o) {
  if (o.url_opt->count() > 0) return run_serving(o);
  for (const auto* opt : o.serving_only)
    if (opt->count() > 0)
      throw UsageError(opt->get_name() + " is a serving-mode option; it needs --url");
  if (o.prompt_len < 1) throw UsageError("--prompt-len must be at least 1");
  if (o.context < 1) throw UsageError("--context must be at least 1");
  if (o.decode_tokens < 1) throw UsageError("--decode-tokens must be at least 1");
  if (!o.isa.empty()) {
    if (o.isa == "avx2")
      force_isa(Isa::Avx2);
    else if (o.isa == "avx512")
      force_isa(Isa::Avx512);
    else if (o.isa == "avx512_bf16")
      force_isa(Isa::Avx512Bf16);
    else if (o.isa == "scalar")
      force_isa(Isa::Scalar);
    else
      throw UsageError("--isa must be scalar, avx2, avx512 or avx512_bf16");
  }
  if (o.groups < 0) throw UsageError("--groups must be 0 (one per stage) or more");
  if (!o.preset.empty() && !o.engine.model.empty())
    throw UsageError("give either --model or --preset, not both");
  // Engine mode measures one replica: replica 0 of the config's layout.
  const Config config = command_config(o.config, engine_overrides(o.engine), o.engine.threads);
  const DType dtype = config.model.dtype;
  std::shared_ptr<const Checkpoint> ckpt;
  std::string name;
  if (!o.preset.empty()) {
    ckpt = configured_checkpoint(synth_checkpoint(synth_preset(o.preset), 1, dtype), config.model);
    name = "preset:" + o.preset;
  } else {
    ckpt = configured_checkpoint(load_checkpoint(config.model.path), config.model);
    name = config.model.path;
  }
  EngineBenchOptions eo;
  eo.engine = engine_spec(config, ckpt->config, 0);
  if (!o.profile.empty()) return write_profile(o, ckpt, dtype, name, eo.engine);
  eo.batches = parse_list(o.batches, "--batch", 1);
  eo.prompt_len = o.prompt_len;
  eo.context = o.context;
  eo.decode_tokens = o.decode_tokens;
  eo.repeats = std::max(1, o.repeats);
  eo.microbatches = o.microbatches;
  eo.groups = o.groups;
  EngineBenchResult r;
  try {
    r = run_engine_bench(ckpt, dtype, name, eo);
  } catch (const LayoutMisfit& e) {
    throw UsageError(std::string("layout: ") + e.what());
  }
  if (o.json)
    std::cout << r.to_json().dump() << "\n";
  else
    std::cout << r.table();
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Measure the engine (prefill and decode tokens/s, bandwidth bound, memory), or with --url a "
      "running server (requests/s, output tokens/s, TTFT, TPOT, latency)");
  auto& e = o->engine_only;
  add_config_flags(cmd, o->config);
  e.push_back(cmd->add_option("--model,-m", o->engine.model,
                              "Checkpoint file or directory (default: the config's model.path)"));
  e.push_back(cmd->add_option("--preset", o->preset,
                              "Random-weight model in memory instead: tiny | 110m | 1b"));
  e.push_back(cmd->add_option("--dtype", o->engine.dtype,
                              "Weights in memory: f32 | f16 | bf16 (default: the config's)"));
  e.push_back(
      cmd->add_option("--quantized-products", o->engine.quantized_products,
                      "A GGUF's quantized weights: exact | int8 (x in 8 bits, as llama.cpp; "
                      "default: the config's model.quantized_products)"));
  e.push_back(cmd->add_option("--kv-dtype", o->engine.kv_dtype,
                              "KV cache elements: f32 | f16 | bf16 (default: the config's "
                              "kv_cache.dtype)"));
  e.push_back(cmd->add_option("--threads", o->engine.threads,
                              "CPU threads per device (default: the config's devices[].threads)"));
  e.push_back(cmd->add_option("--pipeline", o->engine.pipeline,
                              "Layout: pipeline stages per replica (default: the config's)"));
  e.push_back(cmd->add_option("--tensor", o->engine.tensor,
                              "Layout: tensor-parallel shards per stage (default: the config's)"));
  e.push_back(cmd->add_option("--microbatches", o->microbatches,
                              "Pipeline micro-batches per step (0: one per stage, or one per "
                              "step with --groups > 1)"));
  e.push_back(cmd->add_option("--groups", o->groups,
                              "Pipeline: sequence groups whose steps are in flight at once (0: "
                              "one per stage; 1: whole-batch steps cut into micro-batches)"));
  e.push_back(cmd->add_option("--batch", o->batches, "Decode batch sizes, comma-separated")
                  ->capture_default_str());
  cmd->add_option("--prompt-len", o->prompt_len, "Prompt length in tokens")->capture_default_str();
  e.push_back(cmd->add_option("--context", o->context,
                              "Tokens each decoding sequence holds before the timed steps "
                              "(prefilled first, untimed)")
                  ->capture_default_str());
  e.push_back(cmd->add_option("--decode-tokens", o->decode_tokens, "Decode steps per batch size")
                  ->capture_default_str());
  e.push_back(cmd->add_option("--repeats", o->repeats, "Repeats; the best is reported")
                  ->capture_default_str());
  e.push_back(cmd->add_option(
      "--isa", o->isa,
      "Force kernels: scalar | avx2 | avx512 | avx512_bf16 (default: best available)"));
  cmd->add_flag("--json", o->json, "Print one JSON object instead of a table");
  e.push_back(cmd->add_option("--profile", o->profile,
                              "Measure the step-time grid troupe simulate interpolates in, for "
                              "this layout, into this JSON file (added to it if it exists)"));
  e.push_back(cmd->add_option("--grid-batch", o->grid_batch,
                              "--profile: decode sequences per step, comma-separated")
                  ->capture_default_str());
  e.push_back(cmd->add_option("--grid-context", o->grid_context,
                              "--profile: their context lengths (default: 16, 1/8, 1/2 and all "
                              "of the model's context)"));
  e.push_back(cmd->add_option("--grid-prefill", o->grid_prefill,
                              "--profile: prompt tokens prefilled in the same step")
                  ->capture_default_str());

  auto& s = o->serving;
  auto& so = o->serving_only;
  o->url_opt = cmd->add_option(
      "--url", s.url, "Serving mode: load this OpenAI-compatible server (http://HOST:PORT)");
  so.push_back(cmd->add_option("--concurrency,-c", s.concurrency,
                               "Serving, closed loop: clients sending requests back to back"));
  so.push_back(
      cmd->add_option("--rate", s.rate, "Serving, open loop: Poisson arrivals per second"));
  so.push_back(cmd->add_option("--requests,-n", s.requests, "Serving: requests in total")
                   ->capture_default_str());
  so.push_back(cmd->add_option("--output-len", s.output_len, "Serving: max_tokens of each request")
                   ->capture_default_str());
  so.push_back(cmd->add_option("--prefix-len", s.prefix_len,
                               "Serving: tokens every prompt starts with, before its own "
                               "--prompt-len (what a prefix cache reuses)")
                   ->capture_default_str());
  so.push_back(cmd->add_flag_callback(
      "--no-stream", [&s] { s.stream = false; },
      "Serving: ask for whole JSON responses, not event streams (then "
      "only latency is measured, not TTFT or TPOT)"));
  so.push_back(cmd->add_option("--max-inflight", s.max_inflight,
                               "Serving, open loop: cap on requests in flight")
                   ->capture_default_str());
  so.push_back(cmd->add_option("--vocab", s.vocab,
                               "Serving: prompt ids stay below this when /v1/models does not say")
                   ->capture_default_str());
  so.push_back(
      cmd->add_option("--timeout-s", s.timeout_s, "Serving: per-request timeout in seconds")
          ->capture_default_str());
  so.push_back(cmd->add_option("--seed", s.seed, "Serving: seed of the arrivals and prompts")
                   ->capture_default_str());
  so.push_back(
      cmd->add_option("--served-model", s.model,
                      "Serving: the request's \"model\" (default: the first of GET /v1/models)"));
  so.push_back(cmd->add_option("--api-key", s.api_key,
                               "Serving: sent as \"Authorization: Bearer KEY\" (default: the "
                               "TROUPE_API_KEY environment variable)"));
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace troupe::app
