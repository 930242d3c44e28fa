#pragma once
// Finds the spelled-out special tokens in a prompt ("<s>", "<|eot_id|>", ...):
// in a text they stand for those tokens, as Hugging Face's tokenizers and
// llama.cpp read a prompt, and the text between them is encoded on its own.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class SpecialTokens {
 public:
  struct Token {
    std::string spelling;
    int id = -1;
    // As Hugging Face's added tokens: swallow the white space to the left or
    // right of the spelling; match only where no letter, digit or '_' is
    // next to it.
    bool lstrip = false, rstrip = false, single_word = false;
  };

  void add(Token token);
  bool empty() const { return tokens_.empty(); }

  // Calls on_text for each stretch of ordinary text (never empty) and
  // on_token for each special token, in order. Where spellings overlap, the
  // earliest wins, then the longest there. Each spelling's next place is
  // searched for only once the cursor passes it, so the text is scanned once
  // per spelling.
  void split(std::string_view text, const std::function<void(std::string_view)>& on_text,
             const std::function<void(int id)>& on_token) const;

 private:
  std::vector<Token> tokens_;
};

}  // namespace troupe
