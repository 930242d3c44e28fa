// Config overrides: `--set KEY=VALUE` pairs, one per input line (cut at the
// first '='), through apply_overrides over the default config, as `troupe
// serve --set ...` applies them. Oracles: only ConfigError escapes; a
// refused set leaves the config untouched; an accepted one keeps what every
// accepted config keeps (config_checks.h).
#include <string>
#include <utility>
#include <vector>

#include "config_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  std::vector<std::pair<std::string, std::string>> sets;
  for (std::string_view line : split(as_text(data, size), "\n", 16)) {
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      sets.emplace_back(std::string(line), "");
    } else {
      sets.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    }
  }
  const Config before = default_config();
  Config config = before;
  if (expect_only<ConfigError>([&] { apply_overrides(config, sets); })) {
    check_accepted(config);
  } else if (!(config == before)) {
    violated("a refused override changed the config");
  }
  return 0;
}
