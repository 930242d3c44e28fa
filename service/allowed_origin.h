#pragma once
// What server.allowed_origins may hold: "*" or a web origin as browsers send
// it in the Origin header, "scheme://host[:port]". Checked when the
// configuration is read; the policy that applies it is net/cors.h.
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace troupe {

// Why `entry` is not "*" or an origin, or nothing.
inline std::optional<std::string> invalid_origin(std::string_view entry) {
  if (entry == "*") return std::nullopt;
  // Appended, not '+': GCC 12 warns falsely (-Wrestrict) on "'" + string.
  std::string quoted(1, '\'');
  quoted.append(entry).push_back('\'');
  const std::string not_one =
      quoted + " is not an origin: write scheme://host[:port] (e.g. http://localhost:3000) or *";
  const size_t sep = entry.find("://");
  if (sep == std::string_view::npos || sep == 0 || sep + 3 == entry.size()) return not_one;
  for (char c : entry.substr(0, sep))
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.'))
      return not_one;
  for (char c : entry.substr(sep + 3)) {
    if (c == '/' || c == '?' || c == '#')
      return quoted + " has a path; an origin is scheme://host[:port] only";
    if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c)))
      return not_one;
  }
  return std::nullopt;
}

}  // namespace troupe
