// `troupe`: the command-line front door. Subcommands live in cmd_*.cpp.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <thread>

#include "apps/commands.h"

namespace troupe::app {

std::filesystem::path default_model_path() {
  const std::filesystem::path here = "models/fortune";
  if (std::filesystem::exists(here)) return here;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / "models/fortune")) return dir / "models/fortune";
    }
  }
  return here;
}

std::filesystem::path resolve_tokenizer(const std::filesystem::path& model_tokenizer,
                                        const std::string& option) {
  if (!option.empty()) return option;
  return model_tokenizer;
}

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

}  // namespace troupe::app

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("troupe");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"troupe: serve transformer models split across devices, built as actors"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });
  troupe::app::register_serve(app);
  troupe::app::register_generate(app);
  troupe::app::register_bench(app);
  troupe::app::register_synth_model(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const troupe::app::UsageError& e) {
    std::cerr << "troupe: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "troupe: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
