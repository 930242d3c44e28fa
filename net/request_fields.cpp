#include "net/request_fields.h"

namespace troupe::openai {

using nlohmann::json;

[[noreturn]] void fail(std::string message, std::string param, std::string code) {
  throw Invalid{bad_request(std::move(message), std::move(param), std::move(code))};
}

std::string quoted(std::string_view name) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "`" + std::string.
  std::string s = "`";
  s += name;
  s += '`';
  return s;
}

[[noreturn]] void wrong_type(std::string_view name, std::string_view expected, const json& got) {
  fail(
      openai::quoted(name) + " must be " + std::string(expected) + ", got " + got.type_name() + ".",
      std::string(name));
}

[[noreturn]] void unsupported(std::string_view name, std::string_view detail) {
  fail(openai::quoted(name) + " is not supported by this server" +
           (detail.empty() ? std::string(".") : "; " + std::string(detail) + "."),
       std::string(name), "unsupported_parameter");
}

const json* field(const json& body, std::string_view name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double get_number(const json& v, std::string_view name) {
  if (!v.is_number()) wrong_type(name, "a number", v);
  return v.get<double>();
}

bool get_bool(const json& v, std::string_view name) {
  if (!v.is_boolean()) wrong_type(name, "a boolean", v);
  return v.get<bool>();
}

const std::string& get_string(const json& v, std::string_view name) {
  if (!v.is_string()) wrong_type(name, "a string", v);
  return v.get_ref<const std::string&>();
}

json parse_body(std::string_view body) {
  json j;
  // what() is "[json.exception.parse_error.101] parse error at line 1,
  // column 7: ..."; the prefix is nlohmann's, the rest is for the client.
  auto reason = [](const json::exception& e) {
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    return what;
  };
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    fail("Malformed JSON in the request body (byte " + std::to_string(e.byte) + "): " + reason(e),
         {}, "invalid_json");
  } catch (const json::out_of_range& e) {
    // A number beyond a double (1e400) is out_of_range, not a parse_error;
    // uncaught it would answer the client's mistake with a 500.
    fail("Malformed JSON in the request body: " + reason(e), {}, "invalid_json");
  }
  if (!j.is_object())
    fail(std::string("The request body must be a JSON object, got ") + j.type_name() + ".");
  return j;
}

}  // namespace troupe::openai
