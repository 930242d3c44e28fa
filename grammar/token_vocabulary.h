#pragma once
// What each token of a model adds to the text, as the grammar matcher needs
// it: bytes per id, and the vocabulary as a trie of code points, so that the
// tokens a grammar state allows are found by walking shared prefixes once.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::grammar {

class TokenVocabulary {
 public:
  // The trie is flat, its nodes numbered depth first so that a walk reads
  // memory in order: a node's children are edges[edges_begin, edges_end)
  // (code point ascending), the tokens whose text ends at it are
  // ids[ids_begin, ids_end), and partials[partial_begin, partial_end) are
  // tokens whose text ends here and goes on with the first bytes of a code
  // point that the next token completes.
  struct Node {
    uint32_t edges_begin = 0, edges_end = 0;
    uint32_t ids_begin = 0, ids_end = 0;
    uint32_t partial_begin = 0, partial_end = 0;
  };
  struct Edge {
    uint32_t cp = 0;
    int32_t node = 0;
  };

  // bytes[id] is what token id adds to the text; control ids (BOS, EOS,
  // chat markers) are never text a grammar matches.
  TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& control);

  int size() const { return int(bytes_.size()); }
  const std::string& bytes(int id) const { return bytes_[size_t(id)]; }
  bool is_control(int id) const { return control_[size_t(id)] != 0; }
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes()[0] is the root
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::vector<std::pair<std::string, int32_t>>& partials() const { return partials_; }
  // Tokens outside the trie that are not control tokens: text that is not
  // UTF-8 on its own (it starts with a continuation byte, or breaks off
  // inside), matched only token by token. Only these can follow a token
  // that ended inside a code point.
  const std::vector<int32_t>& loose() const { return loose_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> control_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> ids_;
  std::vector<std::pair<std::string, int32_t>> partials_;
  std::vector<int32_t> loose_;
};

}  // namespace troupe::grammar
