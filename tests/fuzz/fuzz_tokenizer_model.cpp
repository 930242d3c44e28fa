// The tokenizer loader: the input as a tokenizer.model file through
// Tokenizer::load, then the loaded model used as the server uses it:
// encoding text, decoding ids, pieces, and the streaming detokenizer.
// Oracles: only std::runtime_error escapes (the loader's and the codec's
// documented failure); streamed decoding equals decode() of the same ids.
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_support.h"
#include "text/text_streamer.h"
#include "text/tokenizer.h"

namespace troupe::fuzz {
namespace {

void use(const Tokenizer& tok) {
  const int vocab = tok.vocab_size();
  std::vector<int> ids;
  for (int id = 0; id < std::min(vocab, 300); ++id) {
    (void)tok.piece(id);
    (void)tok.is_control(id);
    ids.push_back(id);
  }
  (void)tok.decode(ids);
  const std::vector<int> encoded =
      tok.encode("Hello, wörld! \xe2\x98\x83 12 345\n\ttabs", tok.bos_id() >= 0);
  for (int id : encoded)
    if (id < 0 || id >= vocab)
      violated("encode gave id " + std::to_string(id) + " outside the vocabulary");
  for (const std::vector<int>* seq : {&std::as_const(ids), &encoded}) {
    TextStreamer streamer(tok);
    std::string streamed;
    for (int id : *seq) streamed += streamer.put(id);
    streamed += streamer.finish();
    if (streamed != tok.decode(*seq)) violated("streamed decoding differs from decode()");
  }
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const auto path = scratch_file("tokenizer.model", as_text(data, size));
  expect_only<std::runtime_error>([&] { use(Tokenizer::load(path)); });
  return 0;
}
