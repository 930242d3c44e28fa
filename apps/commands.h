#pragma once
// Each subcommand registers its options and a callback on the main app.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

namespace troupe::app {

void register_generate(CLI::App& app);
void register_synth_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);

// The bundled default model: models/fortune under the working directory, or
// beside the build directory of this executable.
std::filesystem::path default_model_path();
// Resolves the tokenizer for a model: --tokenizer PATH, else the one beside it.
std::filesystem::path resolve_tokenizer(const std::filesystem::path& model_tokenizer,
                                        const std::string& option);
int default_threads();

// Thrown for invalid command-line values; main prints it and exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace troupe::app
