#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <stdexcept>

#include "grammar/utf8.h"

namespace troupe::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& control)
    : bytes_(std::move(bytes)), control_(bytes_.size(), 0) {
  if (control.size() != bytes_.size())
    throw std::invalid_argument("TokenVocabulary: " + std::to_string(control.size()) +
                                " control flags for " + std::to_string(bytes_.size()) + " tokens");
  nodes_.emplace_back();
  for (size_t id = 0; id < bytes_.size(); ++id) {
    control_[id] = control[id] ? 1 : 0;
    const std::string& b = bytes_[id];
    if (control[id] || b.empty()) continue;
    int32_t node = 0;
    size_t at = 0;
    bool whole = true;
    while (at < b.size()) {
      size_t len = 0;
      const uint32_t cp = decode_utf8(std::string_view(b).substr(at), &len);
      if (len == 0) {
        whole = false;
        break;
      }
      auto& kids = nodes_[size_t(node)].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(cp, int32_t(-1)));
      if (it != kids.end() && it->first == cp) {
        node = it->second;
      } else {
        const auto child = int32_t(nodes_.size());
        kids.insert(it, {cp, child});
        nodes_.emplace_back();
        node = child;
      }
      at += len;
    }
    if (whole) {
      nodes_[size_t(node)].ids.push_back(int32_t(id));
      continue;
    }
    uint32_t lo = 0, hi = 0;
    const std::string rest = b.substr(at);
    if (utf8_prefix_range(rest, &lo, &hi))
      nodes_[size_t(node)].partial.emplace_back(rest, int32_t(id));
    else
      loose_.push_back(int32_t(id));
  }
}

}  // namespace troupe::grammar
