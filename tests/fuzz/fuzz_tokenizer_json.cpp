// A prompt's text through the tokenizer.json reader: the bundled Llama 3.1,
// Qwen (NFC) and GPT-2 tokenizers encode the input as the server does, then
// decode it, whole and streamed. Oracles: nothing throws; every id is in the
// vocabulary; a byte-level BPE loses nothing, so decoding gives the text
// back (as valid UTF-8, NFC where the tokenizer normalises) unless it spells
// a special token; streamed decoding equals decode().
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace troupe::fuzz {
namespace {

struct Bundled {
  Tokenizer tok;
  bool nfc;
};

const std::vector<Bundled>& tokenizers() {
  static const std::vector<Bundled> all = [] {
    std::vector<Bundled> v;
    for (const auto& [name, nfc] : {std::pair{"llama3_1-small", false}, {"qwen-small", true},
                                    {"gpt2-small", false}})
      v.push_back({Tokenizer::load(source_path(std::string("tests/data/tokenizers/") + name +
                                               ".tokenizer.json")),
                   nfc});
    return v;
  }();
  return all;
}

void check(const Bundled& b, const std::string& text) {
  const Tokenizer& tok = b.tok;
  const std::vector<int> ids = tok.encode(text, tok.bos_id() >= 0);
  for (int id : ids)
    if (id < 0 || id >= tok.vocab_size())
      violated("encode gave id " + std::to_string(id) + " outside the vocabulary");
  const std::string decoded = tok.decode(ids);
  const bool spells_special = text.find("<|") != std::string::npos;
  const std::string want = b.nfc ? unicode::nfc(text) : unicode::utf8_lossy(text);
  if (!spells_special && decoded != want) violated("decode(encode(text)) is not the text");
  TextStreamer streamer(tok);
  std::string streamed;
  for (int id : ids) streamed += streamer.put(id);
  streamed += streamer.finish();
  if (streamed != decoded) violated("streamed decoding differs from decode()");
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::fuzz;
  const std::string text(as_text(data, size));
  for (const Bundled& b : tokenizers()) check(b, text);
  return 0;
}
