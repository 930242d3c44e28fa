#pragma once
// Reading a request's JSON fields with OpenAI-style errors: each reader
// throws Invalid (a 400 naming the field) and parsed() turns it into the
// returned ApiError, so that each rule is one line in a parser. Shared by
// the OpenAI API parsers (openai_api, responses_api); not a public API.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "net/openai_api.h"

namespace troupe::openai {

struct Invalid {
  ApiError error;
};

[[noreturn]] void fail(std::string message, std::string param = {}, std::string code = {});
// "`name`". Called qualified: for a std::string argument, ADL would pick
// std::quoted.
std::string quoted(std::string_view name);
[[noreturn]] void wrong_type(std::string_view name, std::string_view expected,
                             const nlohmann::json& got);
[[noreturn]] void unsupported(std::string_view name, std::string_view detail = {});
// The field, or nullptr when absent or null (null means "the default").
const nlohmann::json* field(const nlohmann::json& body, std::string_view name);
double get_number(const nlohmann::json& v, std::string_view name);
bool get_bool(const nlohmann::json& v, std::string_view name);
const std::string& get_string(const nlohmann::json& v, std::string_view name);
// The body as a JSON object (a 400 for bad JSON or another value).
nlohmann::json parse_body(std::string_view body);

// The request's body with its objects' keys in the client's order, which
// `json` (sorted) loses and a template's `tojson` shows (and a schema's
// properties are generated in): read again, only when a chat has tools or
// tool calls, or a request a JSON schema.
class OrderedBody {
 public:
  explicit OrderedBody(std::string_view text) : text_(text) {}
  // The value at `path` (keys and indices), in the client's order; `sorted`
  // (the same value as `json` has it) where the two readings disagree, as
  // they may on a body with duplicate keys.
  template <class... Step>
  nlohmann::ordered_json at(const nlohmann::json& sorted, const Step&... path) {
    try {
      if (!parsed_) parsed_ = nlohmann::ordered_json::parse(text_);
      const nlohmann::ordered_json* v = &*parsed_;
      ((v = &v->at(path)), ...);
      return *v;
    } catch (const nlohmann::json::exception&) {
      return nlohmann::ordered_json(sorted);
    }
  }

 private:
  std::string_view text_;
  std::optional<nlohmann::ordered_json> parsed_;
};

// The parser's value, or the error it threw.
template <class T, class Parse>
Result<T> parsed(Parse parse) {
  try {
    return parse();
  } catch (const Invalid& e) {
    return e.error;
  }
}

}  // namespace troupe::openai
