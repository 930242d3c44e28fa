#pragma once
// Each subcommand registers its options and a callback on the main app; the
// helpers here give serve, generate and bench one way to build their
// configuration.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "deploy/config.h"
#include "gpu/checkpoint.h"
#include "gpu/logit_penalties.h"
#include "text/tokenizer.h"

namespace troupe::app {

void register_generate(CLI::App& app);
void register_synth_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);
void register_node(CLI::App& app);
void register_simulate(CLI::App& app);
void register_chaos(CLI::App& app);

// Thrown for invalid command-line values; main prints it and exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Ends a command with this exit status; main prints "troupe: WHAT".
class ExitStatus : public std::runtime_error {
 public:
  ExitStatus(int status, const std::string& what) : std::runtime_error(what), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// For a process that has decided to exit: past `limit`, it ends with
// `code` (saying so on stderr) whatever its teardown still waits for.
// CAF 0.17's actor_system destructor waits until every detached actor is
// destroyed, and one still referenced (a pending timer's message, say)
// can keep it waiting for ever; a shutdown must stay bounded.
void exit_if_stuck(std::chrono::milliseconds limit, int code, const std::string& who);

// The directory holding the bundled models/ and configs/: the working
// directory when it has them, else the nearest directory above the
// executable that does.
std::filesystem::path bundle_root();

// The tokenizer at `path` for a model with `model_vocab` rows: it may have
// fewer tokens than the model (Qwen's embeddings are padded) but not more.
// Throws UsageError naming both sizes.
Tokenizer load_tokenizer(const std::filesystem::path& path, int model_vocab);

// The engines' vocabulary for structured output (EngineBuilder::
// set_vocabulary): the tokenizer at `path` read and its tokens' text walked
// into a trie once, for every engine, in the background from the start (a
// request with a grammar that comes first waits for it). Null, logged once,
// when the tokenizer cannot be read or does not fit the model.
VocabularySource vocabulary_source(const std::filesystem::path& path, int model_vocab);
// The same from a tokenizer already loaded (troupe serve's, which its front
// end holds: not read a second time).
VocabularySource vocabulary_source(Tokenizer tokenizer);

// `given`, or when it is empty the TROUPE_API_KEY environment variable (or "").
std::string api_key_or_env(const std::string& given);

// --config and --set, the same in every command that runs a model.
struct ConfigFlags {
  std::string file;
  std::vector<std::string> overrides;  // KEY=VALUE
};
void add_config_flags(CLI::App* cmd, ConfigFlags& flags);

// The engine flags generate and bench share, as config overrides: --model,
// --dtype, --kv-dtype, --pipeline and --tensor (empty or 0: the config's). Throws
// UsageError naming the flag for a bad value.
struct EngineFlags {
  std::string model;
  std::string dtype;
  std::string kv_dtype;
  std::string quantized_products;
  int threads = 0;
  int pipeline = 0;
  int tensor = 0;
};
std::vector<std::pair<std::string, std::string>> engine_overrides(const EngineFlags& flags);

// A checkpoint with the deployment's options for running it
// (model.quantized_products), shared by the engines built from it.
std::shared_ptr<const Checkpoint> configured_checkpoint(Checkpoint checkpoint,
                                                        const ModelSection& model);

// The configuration a command runs with, validated: the --config file (by
// default the bundle's configs/default.yaml, else the built-in defaults),
// then --set, then the command's own flags as (key, value) overrides (with
// threads > 0: every device's threads). A relative model.path that is not
// found from the working directory is taken from the bundle, so the bundled
// model works from anywhere. `role` says what its devices list describes
// (deploy/config.h: a layout's devices, or the devices a node offers).
Config command_config(
    const ConfigFlags& flags,
    const std::vector<std::pair<std::string, std::string>>& command_overrides = {}, int threads = 0,
    ConfigRole role = ConfigRole::Deployment);

}  // namespace troupe::app
