#pragma once
// Troupe's version: what `troupe --version` prints and GET /version answers.
#include <string_view>

namespace troupe {

inline constexpr std::string_view kVersion = "0.1.0";

}  // namespace troupe
