// Helpers shared by the subcommands.
#include "apps/commands.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::app {

namespace {

bool is_bundle(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "models/fortune", ec) &&
         std::filesystem::exists(dir / "configs", ec);
}

}  // namespace

void exit_if_stuck(std::chrono::milliseconds limit, int code, const std::string& who) {
  std::thread([limit, code, who] {
    std::this_thread::sleep_for(limit);
    std::fprintf(stderr, "troupe %s: shutdown still waiting after %lld ms; exiting with %d\n",
                 who.c_str(), static_cast<long long>(limit.count()), code);
    std::fflush(stderr);
    std::_Exit(code);
  }).detach();
}

Tokenizer load_tokenizer(const std::filesystem::path& path, int model_vocab) {
  Tokenizer tokenizer = Tokenizer::load(path, model_vocab);
  if (tokenizer.vocab_size() > model_vocab)
    throw UsageError("tokenizer " + path.string() + " has " +
                     std::to_string(tokenizer.vocab_size()) + " tokens but the model only " +
                     std::to_string(model_vocab) + ": they do not belong together");
  return tokenizer;
}

namespace {

std::shared_ptr<const grammar::TokenVocabulary> vocabulary_of(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(size_t(tokenizer.vocab_size()));
  std::vector<bool> control(bytes.size());
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    control[size_t(id)] = tokenizer.is_control(id);
    bytes[size_t(id)] = tokenizer.token_bytes(id);
  }
  return std::make_shared<const grammar::TokenVocabulary>(std::move(bytes), control);
}

using VocabularyBuild = std::function<std::shared_ptr<const grammar::TokenVocabulary>()>;

// The vocabulary `build` makes, made once for every caller. Built ahead, in
// the background: built by the first request with a grammar instead, it
// stalls the engine step of every sequence in that batch (about a second for
// a 150,000-token vocabulary). The thread holds only the vocabulary's state;
// the source's last copy joins it, so that it never outlives the process's
// logging.
VocabularySource built_ahead(VocabularyBuild build) {
  struct Once {
    VocabularyBuild build;
    std::mutex mu;
    bool tried = false;
    std::shared_ptr<const grammar::TokenVocabulary> vocab;
    std::shared_ptr<const grammar::TokenVocabulary> get() {
      std::lock_guard<std::mutex> lock(mu);
      if (tried) return vocab;
      tried = true;
      const auto start = std::chrono::steady_clock::now();
      try {
        vocab = build();
      } catch (const std::exception& e) {
        spdlog::error("structured output: the model's vocabulary could not be read: {}", e.what());
        return nullptr;
      }
      spdlog::info(
          "structured output: the vocabulary's {} tokens ready in {:.0f} ms", vocab->size(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      return vocab;
    }
  };
  struct Warm {
    std::thread thread;
    ~Warm() {
      if (thread.joinable()) thread.join();
    }
  };
  auto once = std::make_shared<Once>();
  once->build = std::move(build);
  auto warm = std::make_shared<Warm>();
  warm->thread = std::thread([once] { once->get(); });
  return [once, warm] { return once->get(); };
}

}  // namespace

VocabularySource vocabulary_source(const std::filesystem::path& path, int model_vocab) {
  return built_ahead(
      [path, model_vocab] { return vocabulary_of(load_tokenizer(path, model_vocab)); });
}

VocabularySource vocabulary_source(Tokenizer tokenizer) {
  return built_ahead([tokenizer = std::move(tokenizer)] { return vocabulary_of(tokenizer); });
}

std::string api_key_or_env(const std::string& given) {
  if (!given.empty()) return given;
  const char* env = std::getenv("TROUPE_API_KEY");
  return env ? env : "";
}

std::filesystem::path bundle_root() {
  if (is_bundle(".")) return ".";
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path())
      if (is_bundle(dir)) return dir;
  return ".";
}

void add_config_flags(CLI::App* cmd, ConfigFlags& flags) {
  cmd->add_option(
      "--config", flags.file,
      "Deployment YAML (default: configs/default.yaml); the command's flags override it");
  cmd->add_option("--set", flags.overrides,
                  "Override a config key, e.g. --set parallel.tensor=2 (repeatable)");
}

std::vector<std::pair<std::string, std::string>> engine_overrides(const EngineFlags& f) {
  if (!f.dtype.empty() && !parse_dtype(f.dtype))
    throw UsageError("--dtype must be f32, f16 or bf16, got '" + f.dtype + "'");
  if (!f.kv_dtype.empty() && !parse_dtype(f.kv_dtype))
    throw UsageError("--kv-dtype must be f32, f16 or bf16, got '" + f.kv_dtype + "'");
  if (!f.quantized_products.empty() && f.quantized_products != "exact" &&
      f.quantized_products != "int8")
    throw UsageError("--quantized-products must be exact or int8, got '" + f.quantized_products +
                     "'");
  if (f.threads < 0 || f.pipeline < 0 || f.tensor < 0)
    throw UsageError("--threads, --pipeline and --tensor must be at least 1");
  std::vector<std::pair<std::string, std::string>> out;
  if (!f.model.empty()) out.emplace_back("model.path", f.model);
  if (!f.dtype.empty()) out.emplace_back("model.dtype", f.dtype);
  if (!f.kv_dtype.empty()) out.emplace_back("kv_cache.dtype", f.kv_dtype);
  if (!f.quantized_products.empty())
    out.emplace_back("model.quantized_products", f.quantized_products);
  if (f.pipeline > 0) out.emplace_back("parallel.pipeline", std::to_string(f.pipeline));
  if (f.tensor > 0) out.emplace_back("parallel.tensor", std::to_string(f.tensor));
  return out;
}

std::shared_ptr<const Checkpoint> configured_checkpoint(Checkpoint checkpoint,
                                                        const ModelSection& model) {
  checkpoint.quant_products = model.quantized_products;
  const bool quantized = !checkpoint.layers.empty() && checkpoint.layers[0].w_up.is_blocks();
  if (quantized && model.quantized_products == QuantProducts::Exact)
    spdlog::info(
        "{}: block-quantized weights, multiplied exactly (x in full precision); "
        "model.quantized_products=int8 multiplies them as llama.cpp does, with x in 8 bits "
        "(on CPUs: about 1.6x faster decode of one sequence, near but not equal logits)",
        checkpoint.source.filename().string());
  return std::make_shared<const Checkpoint>(std::move(checkpoint));
}

Config command_config(const ConfigFlags& flags,
                      const std::vector<std::pair<std::string, std::string>>& command_overrides,
                      int threads, ConfigRole role) {
  Config cfg;
  if (!flags.file.empty()) {
    cfg = load_config(flags.file, role);
  } else {
    const auto def = bundle_root() / "configs" / "default.yaml";
    cfg = std::filesystem::exists(def) ? load_config(def, role) : default_config();
  }
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& kv : flags.overrides) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw UsageError("--set expects KEY=VALUE, got '" + kv + "'");
    overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  overrides.insert(overrides.end(), command_overrides.begin(), command_overrides.end());
  if (!overrides.empty()) apply_overrides(cfg, overrides, "command line", role);
  if (threads > 0) {
    std::vector<std::pair<std::string, std::string>> each;
    for (size_t i = 0; i < cfg.devices.size(); ++i)
      each.emplace_back("devices[" + std::to_string(i) + "].threads", std::to_string(threads));
    apply_overrides(cfg, each, "--threads", role);
  }
  const std::filesystem::path model = cfg.model.path;
  std::error_code ec;
  if (model.is_relative() && !std::filesystem::exists(model, ec) &&
      std::filesystem::exists(bundle_root() / model, ec))
    cfg.model.path = (bundle_root() / model).string();
  return cfg;
}

}  // namespace troupe::app
