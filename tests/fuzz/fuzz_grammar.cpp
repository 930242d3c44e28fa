// Structured output's grammar layer (grammar/) on what a request may send: a
// GBNF grammar (guided_grammar), or, when the input is JSON, a schema
// (guided_json) turned into one, and as a regex (guided_regex). Oracles: only GrammarError (SchemaError for
// a schema) escapes; a schema the compiler takes gives a grammar that parses
// and that a matcher starts on; the tokens the trie walk allows are exactly
// those the matcher allows one by one, at every state of a text the grammar
// leads through.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "grammar/token_vocabulary.h"

namespace troupe::fuzz {
namespace {

const grammar::TokenVocabulary& vocabulary() {
  static const grammar::TokenVocabulary v = [] {
    std::vector<std::string> bytes = {
        "</s>", "{",    "}", "[",  "]",   "\"", ",",  ":",    " ",    "\n",      "a",   "ab",
        "b",    "0",    "1", "12", "-",   ".",  "e",  "true", "null", "\"a",     "\":", "é",
        "\xC3", "\xA9", "😀", "\\", "\\n", "x",  "yz", "\t",   "{\"",  "\xF0\x9F"};
    std::vector<bool> control(bytes.size(), false);
    control[0] = true;
    return grammar::TokenVocabulary(bytes, control);
  }();
  return v;
}

// Walks the grammar a few steps, always taking the first allowed token,
// checking the walk against the one-by-one answer at each state.
void walk(const std::shared_ptr<const grammar::Grammar>& g) {
  const auto& vocab = vocabulary();
  grammar::Matcher m(g, std::make_shared<grammar::MaskCache>(4));
  std::vector<uint8_t> allowed;
  for (int step = 0; step < 12; ++step) {
    m.allowed_tokens(vocab, allowed);
    int next = -1;
    for (int id = 0; id < vocab.size(); ++id) {
      const bool one = !vocab.is_control(id) && m.allows(vocab.bytes(id));
      if ((allowed[size_t(id)] != 0) != one) violated("the walk and the matcher disagree");
      if (one && next < 0 && (step % 3 != 2 || id > 8)) next = id;
    }
    if (next < 0) return;
    if (!m.accept(vocab.bytes(next))) violated("an allowed token was refused");
  }
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  if (size > 16 * 1024) return 0;
  const std::string input(fuzz::as_text(data, size));
  const auto schema = nlohmann::ordered_json::parse(input, nullptr, false);
  std::string gbnf = input;
  if (!schema.is_discarded()) {
    if (!fuzz::expect_only<grammar::SchemaError>(
            [&] { gbnf = grammar::json_schema_grammar(schema); }))
      return 0;
    try {
      auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
      fuzz::expect_only<grammar::GrammarError>([&] { fuzz::walk(g); });
    } catch (const grammar::GrammarError& e) {
      fuzz::violated(std::string("a schema's grammar does not parse: ") + e.what() + "\n" + gbnf);
    }
    return 0;
  }
  fuzz::expect_only<grammar::GrammarError>([&] {
    auto g = std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
    fuzz::walk(g);
  });
  // The same text as a regex (guided_regex): a regex it takes gives a grammar
  // that parses, in both spellings.
  for (bool json : {false, true}) {
    std::string re;
    if (!fuzz::expect_only<grammar::GrammarError>(
            [&] { re = "root ::= " + grammar::regex_to_gbnf(input, json) + "\n"; }))
      break;
    try {
      grammar::Grammar::parse(re);
    } catch (const grammar::GrammarError& e) {
      fuzz::violated(std::string("a regex's grammar does not parse: ") + e.what() + "\n" + re);
    }
  }
  return 0;
}
