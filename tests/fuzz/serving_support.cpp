#include "serving_support.h"

#include "fuzz_support.h"

namespace troupe::fuzz {

const Tokenizer& fortune_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(source_path("models/fortune/tokenizer.model"));
  return tok;
}

openai::ModelLimits fortune_limits() {
  openai::ModelLimits limits;
  limits.name = "fortune";
  limits.context_length = 256;
  limits.vocab_size = fortune_tokenizer().vocab_size();
  limits.max_tokens_cap = 4096;
  return limits;
}

}  // namespace troupe::fuzz
