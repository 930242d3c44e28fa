#pragma once
// The tokens a Hugging Face tokenizer adds to its model's vocabulary
// (Phi-3's <|user|> and <|end|>, a fine-tune's ChatML <|im_start|>): in a
// text their spellings are those tokens, matched before the model sees it.
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "text/special_tokens.h"

namespace troupe {

struct AddedToken {
  SpecialTokens::Token token;  // spelling, id, lstrip, rstrip, single_word
  // Special tokens decode to nothing, as transformers decodes with
  // skip_special_tokens; the others to their spelling.
  bool special = false;
};

// One entry of tokenizer.json's "added_tokens" (with its "id") or of
// tokenizer_config.json's "added_tokens_decoder" (the id given apart).
// Throws nlohmann::json's exceptions for a missing or mistyped field.
AddedToken added_token_from_json(const nlohmann::json& entry, int id);

// The added tokens of the Hugging Face tokenizer in `dir` that accompany its
// SentencePiece model: tokenizer.json's "added_tokens", else
// tokenizer_config.json's "added_tokens_decoder", else added_tokens.json (as
// transformers' slow tokenizer reads them). Empty when there is none of the
// three. Throws std::runtime_error naming the file that cannot be read.
std::vector<AddedToken> read_added_tokens(const std::filesystem::path& dir);

}  // namespace troupe
