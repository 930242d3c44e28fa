#include "text/added_tokens.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "text/tokenizer_file.h"

namespace troupe {

namespace fs = std::filesystem;
using json = nlohmann::json;

AddedToken added_token_from_json(const json& entry, int id) {
  AddedToken a;
  a.token.spelling = entry.at("content").get<std::string>();
  a.token.id = id;
  a.token.lstrip = entry.value("lstrip", false);
  a.token.rstrip = entry.value("rstrip", false);
  a.token.single_word = entry.value("single_word", false);
  a.special = entry.value("special", false);
  return a;
}

namespace {

[[noreturn]] void refuse(const fs::path& file, const std::string& what) {
  throw std::runtime_error("tokenizer: '" + file.string() + "': " + what);
}

json read_json(const fs::path& file, const char* kind) {
  try {
    return json::parse(read_tokenizer_file(file, kind));
  } catch (const json::exception& e) {
    refuse(file, std::string("not valid JSON: ") + e.what());
  }
}

int checked_id(const fs::path& file, long long id) {
  if (id < 0 || id >= (1 << 24)) refuse(file, "an added token has id " + std::to_string(id));
  return int(id);
}

}  // namespace

std::vector<AddedToken> read_added_tokens(const fs::path& dir) {
  std::vector<AddedToken> out;
  fs::path file;
  try {
    if (file = dir / "tokenizer.json"; fs::is_regular_file(file)) {
      const json j = read_json(file, "tokenizer.json");
      if (j.is_object() && j.contains("added_tokens"))
        for (const json& a : j.at("added_tokens"))
          out.push_back(added_token_from_json(a, checked_id(file, a.at("id").get<long long>())));
      return out;
    }
    if (file = dir / "tokenizer_config.json"; fs::is_regular_file(file)) {
      const json j = read_json(file, "tokenizer_config.json");
      if (j.is_object() && j.contains("added_tokens_decoder")) {
        for (const auto& [key, a] : j.at("added_tokens_decoder").items()) {
          size_t end = 0;
          const long long id = std::stoll(key, &end);
          if (end != key.size()) refuse(file, "added_tokens_decoder key '" + key + "' is no id");
          out.push_back(added_token_from_json(a, checked_id(file, id)));
        }
        return out;
      }
    }
    if (file = dir / "added_tokens.json"; fs::is_regular_file(file)) {
      // content -> id; transformers' slow tokenizers read them as plain
      // (not special) tokens.
      const json j = read_json(file, "added_tokens.json");
      for (const auto& [content, id] : j.items()) {
        AddedToken a;
        a.token.spelling = content;
        a.token.id = checked_id(file, id.get<long long>());
        out.push_back(std::move(a));
      }
    }
  } catch (const json::exception& e) {
    refuse(file, std::string("its added tokens cannot be read: ") + e.what());
  } catch (const std::logic_error& e) {  // std::stoll
    refuse(file, std::string("its added tokens cannot be read: ") + e.what());
  }
  return out;
}

}  // namespace troupe
