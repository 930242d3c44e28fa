// `troupe`: the command-line front door. Subcommands live in cmd_*.cpp.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "apps/commands.h"
#include "service/version.h"

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("troupe");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"troupe: serve transformer models split across devices, built as actors"};
  app.set_version_flag("--version", std::string(troupe::kVersion));
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });
  troupe::app::register_serve(app);
  troupe::app::register_node(app);
  troupe::app::register_generate(app);
  troupe::app::register_bench(app);
  troupe::app::register_synth_model(app);
  troupe::app::register_simulate(app);
  troupe::app::register_chaos(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and the like are 0; a command line CLI11 refuses (an unknown
    // flag, a value of the wrong type, a missing --join) is a usage error,
    // 2 like the ones the commands refuse themselves, not CLI11's 104-109
    // (which `troupe chaos` callers would read as neither PASS, FAIL nor
    // INCOMPLETE).
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const troupe::app::ExitStatus& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return e.status();
  } catch (const troupe::app::UsageError& e) {
    std::cerr << "troupe: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "troupe: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
