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
  struct Node {
    // Children by code point, ascending: (code point, node index).
    std::vector<std::pair<uint32_t, int32_t>> children;
    std::vector<int32_t> ids;  // tokens whose text ends here
    // Tokens whose text ends here and then goes on with the first bytes of a
    // code point the next token completes: (those bytes, id).
    std::vector<std::pair<std::string, int32_t>> partial;
  };

  // bytes[id] is what token id adds to the text; control ids (BOS, EOS,
  // chat markers) are never text a grammar matches.
  TokenVocabulary(std::vector<std::string> bytes, const std::vector<bool>& control);

  int size() const { return int(bytes_.size()); }
  const std::string& bytes(int id) const { return bytes_[size_t(id)]; }
  bool is_control(int id) const { return control_[size_t(id)] != 0; }
  const std::vector<Node>& trie() const { return nodes_; }  // nodes_[0] is the root
  // Tokens outside the trie that are not control tokens: text that is not
  // UTF-8 on its own (a lone continuation byte), matched only token by token.
  const std::vector<int32_t>& loose() const { return loose_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> control_;
  std::vector<Node> nodes_;
  std::vector<int32_t> loose_;
};

}  // namespace troupe::grammar
