// A llama.cpp GGUF file, as `troupe serve -m x.gguf` reads it: the weights
// through load_checkpoint, and the vocabulary it carries through
// Tokenizer::load, then a text with spelled special tokens encoded and
// decoded. Oracles: only CheckpointError escapes the loader and only
// std::runtime_error the tokenizer's loading; a loaded checkpoint has the
// shapes its config says, every tensor byte inside the file, and the model
// builds from it; every id encode() gives is in the vocabulary.
#include <stdexcept>

#include "fuzz_support.h"
#include "loader_checks.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  const auto path = scratch_file("model.gguf", as_text(data, size));
  Checkpoint ck;
  if (expect_only<CheckpointError>([&] { ck = load_checkpoint(path); })) check_checkpoint(ck);
  expect_only<std::runtime_error>([&] {
    const Tokenizer tok = Tokenizer::load(path);
    const std::vector<int> ids =
        tok.encode("<s>the hea\nre <|user|> caf\xc3\xa9", tok.bos_id() >= 0);
    for (int id : ids)
      if (id < 0 || id >= tok.vocab_size())
        violated("encode gave id " + std::to_string(id) + " outside the vocabulary");
    (void)tok.decode(ids);
  });
  return 0;
}
