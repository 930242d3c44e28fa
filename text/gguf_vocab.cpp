#include "text/gguf_vocab.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "util/gguf_file.h"
#include "util/utf8.h"

namespace troupe {
namespace {

using json = nlohmann::json;

enum TokenKind {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// tokenizer.json's pre-tokenizer regexes, as the models' own files spell
// them; llama.cpp's are the same expressions.
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

[[noreturn]] void refuse(const GgufFile& f, const std::string& what) {
  throw std::runtime_error("tokenizer: '" + f.path().string() + "': " + what);
}

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}

// tokenizer.ggml.pre, as llama.cpp groups the names, to a tokenizer.json
// pre-tokenizer; `ignore_merges` as llama.cpp sets it for the group.
json pre_tokenizer(const GgufFile& f, const std::string& pre, bool& ignore_merges) {
  auto split = [](const char* regex) {
    return json{{"type", "Split"},
                {"pattern", {{"Regex", regex}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  };
  // The names as llama.cpp groups them by the regex they share.
  if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                   "lfm2", "jina-v5-nano"})) {
    ignore_merges = true;
    return {{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Regex), byte_level(false)}}};
  }
  if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"}))
    return {{"type", "Sequence"}, {"pretokenizers", {split(kQwen2Regex), byte_level(false)}}};
  if (one_of(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                   "a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe",
                   "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling"}))
    return byte_level(true);
  if (one_of(pre,
             {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}))
    return {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  refuse(f, "tokenizer.ggml.pre '" + pre +
                "' is not a pre-tokenizer this runtime computes (llama-bpe, qwen2, gpt-2 and "
                "smollm and their kin are)");
}

int id_or(const GgufFile& f, const char* key, int fallback, size_t vocab) {
  const auto v = f.integer(key);
  if (!v) return fallback;
  if (*v < 0 || size_t(*v) >= vocab) return -1;  // llama.cpp's "none" is -1 or out of range
  return int(*v);
}

// llama.cpp swallows the white space after every special token of a model
// whose general.name says Phi-3 (<unk>, <s> and <|endoftext|> excepted):
// the rstrip of Phi-3's chat tags, which the file does not hold.
void strip_as_llama_cpp_does(const GgufFile& f, std::vector<SpecialTokens::Token>& specials) {
  std::string name = f.text("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  for (SpecialTokens::Token& t : specials)
    t.rstrip = !one_of(t.spelling, {"<unk>", "<s>", "<|endoftext|>"});
}

}  // namespace

GgufVocabulary read_gguf_vocabulary(const GgufFile& f) {
  const std::string model = f.text("tokenizer.ggml.model").value_or("");
  const auto* tokens = f.texts("tokenizer.ggml.tokens");
  if (model.empty() || !tokens || tokens->empty())
    refuse(f, "holds no vocabulary (tokenizer.ggml.model and tokenizer.ggml.tokens)");
  const size_t n = tokens->size();
  std::vector<int> kinds(n, kNormal);
  if (const auto* types = f.numbers("tokenizer.ggml.token_type")) {
    if (types->size() != n)
      refuse(f, "tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
                    std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) kinds[i] = int((*types)[i]);
  }
  // What llama.cpp ends a generation on is a control token, whatever the
  // file says (Qwen2's vocabulary has "</s>" as a normal one).
  const std::vector<int> file_kinds = kinds;
  for (size_t i = 0; i < n; ++i)
    if (gguf_ends_generation((*tokens)[i])) kinds[i] = kControl;
  GgufVocabulary v;
  if (model == "llama") {
    Llama2cTokenizer::Vocab spm;
    spm.pieces = *tokens;
    spm.kinds = kinds;
    if (const auto* scores = f.numbers("tokenizer.ggml.scores")) {
      if (scores->size() != n) refuse(f, "tokenizer.ggml.scores does not match the tokens");
      spm.scores.assign(scores->begin(), scores->end());
    }
    spm.bos = id_or(f, "tokenizer.ggml.bos_token_id", 1, n);
    spm.eos = id_or(f, "tokenizer.ggml.eos_token_id", 2, n);
    spm.unk = id_or(f, "tokenizer.ggml.unknown_token_id", 0, n);
    spm.space_prefix = f.boolean("tokenizer.ggml.add_space_prefix").value_or(true);
    v.add_bos = f.boolean("tokenizer.ggml.add_bos_token").value_or(true) && spm.bos >= 0;
    v.add_eos = f.boolean("tokenizer.ggml.add_eos_token").value_or(false) && spm.eos >= 0;
    for (size_t id = 0; id < n; ++id)
      if ((kinds[id] == kControl || kinds[id] == kUserDefined || int(id) == spm.unk) &&
          !(*tokens)[id].empty())
        v.specials.push_back({(*tokens)[id], int(id)});
    strip_as_llama_cpp_does(f, v.specials);
    v.spm = Llama2cTokenizer::from_vocab(spm);
    return v;
  }
  if (model != "gpt2")
    refuse(f, "tokenizer.ggml.model '" + model +
                  "' is not one this runtime computes (llama and gpt2 are)");
  // A byte-level BPE's tokens are UTF-8 text (its bytes spelled as code
  // points), as are its merges; the reader here takes them as JSON text.
  for (size_t id = 0; id < n; ++id)
    if (!valid_utf8((*tokens)[id]))
      refuse(f, "token " + std::to_string(id) + " of a gpt2 vocabulary is not valid UTF-8");
  const auto* merges = f.texts("tokenizer.ggml.merges");
  if (!merges || merges->empty())
    refuse(f, "a gpt2 vocabulary without tokenizer.ggml.merges cannot be encoded");
  for (size_t i = 0; i < merges->size(); ++i)
    if (!valid_utf8((*merges)[i])) refuse(f, "merge " + std::to_string(i) + " is not valid UTF-8");
  const std::string pre = f.text("tokenizer.ggml.pre").value_or("default");
  bool ignore_merges = false;
  json j;
  j["pre_tokenizer"] = pre_tokenizer(f, pre, ignore_merges);
  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < n; ++id) {
    if (kinds[id] == kControl || kinds[id] == kUserDefined)
      added.push_back(
          {{"id", int(id)}, {"content", (*tokens)[id]}, {"special", kinds[id] == kControl}});
    // A token made control above stays in the model's vocabulary too, where
    // merges may make it.
    if ((kinds[id] != kControl && kinds[id] != kUserDefined) || file_kinds[id] == kNormal)
      vocab[(*tokens)[id]] = int(id);
  }
  j["model"] = {{"type", "BPE"},
                {"vocab", std::move(vocab)},
                {"merges", *merges},
                {"ignore_merges", ignore_merges}};
  j["added_tokens"] = std::move(added);
  j["decoder"] = byte_level(true);
  // llama.cpp adds BOS for the Llama 3 group whatever the file says.
  const int bos = id_or(f, "tokenizer.ggml.bos_token_id", -1, n);
  const bool add_bos =
      bos >= 0 && (ignore_merges || f.boolean("tokenizer.ggml.add_bos_token").value_or(false));
  const int eos = id_or(f, "tokenizer.ggml.eos_token_id", -1, n);
  const bool add_eos = eos >= 0 && f.boolean("tokenizer.ggml.add_eos_token").value_or(false);
  if (add_bos || add_eos) {
    json single = json::array(), specials = json::object();
    auto special = [&](int id) {
      const std::string& spelling = (*tokens)[size_t(id)];
      single.push_back({{"SpecialToken", {{"id", spelling}, {"type_id", 0}}}});
      specials[spelling] = {{"id", spelling}, {"ids", {id}}};
    };
    if (add_bos) special(bos);
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) special(eos);
    j["post_processor"] = {
        {"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
  }
  json config = json::object();
  if (eos >= 0) config["eos_token"] = (*tokens)[size_t(eos)];
  v.bpe = BpeTokenizer::parse(j.dump(), f.path().string(), config.dump());
  v.add_bos = add_bos;
  return v;
}

}  // namespace troupe
