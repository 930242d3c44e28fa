#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <stdexcept>

#include "grammar/utf8.h"

namespace troupe::grammar {

namespace {

// The trie while it is built: a node per prefix, children found by search.
struct BuildNode {
  std::vector<std::pair<uint32_t, int32_t>> children;  // ascending code point
  std::vector<int32_t> ids;
  std::vector<std::pair<std::string, int32_t>> partial;
};

}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& control)
    : bytes_(std::move(bytes)), control_(bytes_.size(), 0) {
  if (control.size() != bytes_.size())
    throw std::invalid_argument("TokenVocabulary: " + std::to_string(control.size()) +
                                " control flags for " + std::to_string(bytes_.size()) + " tokens");
  std::vector<BuildNode> build(1);
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
      auto& kids = build[size_t(node)].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(cp, int32_t(-1)));
      if (it != kids.end() && it->first == cp) {
        node = it->second;
      } else {
        const auto child = int32_t(build.size());
        kids.insert(it, {cp, child});
        build.emplace_back();
        node = child;
      }
      at += len;
    }
    if (whole) {
      build[size_t(node)].ids.push_back(int32_t(id));
      continue;
    }
    uint32_t lo = 0, hi = 0;
    std::string rest = b.substr(at);
    if (utf8_prefix_range(rest, &lo, &hi))
      build[size_t(node)].partial.emplace_back(std::move(rest), int32_t(id));
    else
      loose_.push_back(int32_t(id));
  }
  // Depth-first numbering; a node's edges are written when it is numbered
  // and point at its children's numbers once those are known.
  nodes_.resize(build.size());
  edges_.reserve(build.size());
  std::vector<std::pair<int32_t, int32_t>> todo{{0, -1}};  // (build node, edge to fill)
  int32_t next = 0;
  while (!todo.empty()) {
    const auto [b, edge] = todo.back();
    todo.pop_back();
    const int32_t n = next++;
    if (edge >= 0) edges_[size_t(edge)].node = n;
    Node& out = nodes_[size_t(n)];
    const BuildNode& in = build[size_t(b)];
    out.ids_begin = uint32_t(ids_.size());
    ids_.insert(ids_.end(), in.ids.begin(), in.ids.end());
    out.ids_end = uint32_t(ids_.size());
    out.partial_begin = uint32_t(partials_.size());
    partials_.insert(partials_.end(), in.partial.begin(), in.partial.end());
    out.partial_end = uint32_t(partials_.size());
    out.edges_begin = uint32_t(edges_.size());
    for (const auto& [cp, child] : in.children) edges_.push_back({cp, -1});
    out.edges_end = uint32_t(edges_.size());
    // Pushed in reverse, so the first child is numbered next.
    for (size_t i = in.children.size(); i-- > 0;)
      todo.emplace_back(in.children[i].second, int32_t(out.edges_begin + i));
  }
}

}  // namespace troupe::grammar
