#pragma once
// What every accepted config keeps, for the config targets.
#include <string>

#include "deploy/config.h"
#include "fuzz_support.h"

namespace troupe::fuzz {

// validate_config passes, the derived values do not throw, and to_yaml()
// reads back as an equal config.
inline void check_accepted(const Config& config) {
  validate_config(config, "accepted config");
  (void)parse_listen(config.server.listen);
  (void)served_model_name(config);
  (void)admission_queue_options(config);
  for (int d = 0; d < config.parallel.device_count(); ++d) (void)device_spec(config, d);
  const std::string yaml = to_yaml(config);
  Config again;
  try {
    again = parse_config(yaml, "to_yaml output");
  } catch (const ConfigError& e) {
    violated(std::string("to_yaml output does not read back: ") + e.what() + "\n" + yaml);
  }
  if (!(again == config)) violated("to_yaml output reads back as a different config:\n" + yaml);
}

}  // namespace troupe::fuzz
