// The config loader: arbitrary text through parse_config, as `troupe serve
// --config FILE` reads it. Oracles: only ConfigError escapes (the loader's
// one exception, naming the key); an accepted config passes validate_config,
// its listen address parses, and to_yaml() reads back as an equal config
// (the promise --print-config rests on).
#include <string>

#include "config_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const std::string text(as_text(data, size));
  Config config;
  if (expect_only<ConfigError>([&] { config = parse_config(text, "fuzz.yaml"); }))
    check_accepted(config);
  return 0;
}
