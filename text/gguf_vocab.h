#pragma once
// The vocabulary a GGUF file carries (tokenizer.ggml.*), read into the
// tokenizers here as llama.cpp reads it: model "llama" (SentencePiece-style
// scores) into a Llama2cTokenizer, model "gpt2" (byte-level BPE with merges)
// into a BpeTokenizer with the pre-tokenizer tokenizer.ggml.pre names. What
// else a file asks for (another model, a pre-tokenizer not listed in the
// message) is refused with std::runtime_error naming it.
#include <memory>
#include <string>
#include <vector>

#include "text/bpe_tokenizer.h"
#include "text/llama2c_tokenizer.h"
#include "text/special_tokens.h"

namespace troupe {

class GgufFile;

struct GgufVocabulary {
  std::unique_ptr<Llama2cTokenizer> spm;  // one of these two
  std::unique_ptr<BpeTokenizer> bpe;
  // SentencePiece-style only: control and user-defined pieces, found by
  // their spelling in a prompt; whether an encoding starts with BOS.
  std::vector<SpecialTokens::Token> specials;
  bool add_bos = true;
  bool add_eos = false;  // SentencePiece-style: an encoding with BOS ends with EOS
};

GgufVocabulary read_gguf_vocabulary(const GgufFile& file);

}  // namespace troupe
